"""The events channel's pub/sub subscription: the Redis side of the events hub.

The Lua scripts publish lifecycle events on :data:`CHANNEL` (format:
:mod:`dtq_gateway.events.events_wire`). :class:`dtq_gateway.events.events_hub.EventsHub`
holds one :class:`ChannelReader` at a time, reads it and fans the events out; after
a failure it closes the reader and opens a new one (resubscribing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client

#: The pub/sub channel of the lifecycle events.
CHANNEL = keys.EVENTS_CHANNEL


class ChannelReader:
    """One pub/sub connection (taken from the client's pool) for one channel.

    Use: :meth:`subscribe`, then iterate :meth:`listen`; :meth:`close` in a
    ``finally``. Errors are redis-py's (``dtq_gateway.store.errors.OUTAGE_ERRORS`` for
    a lost connection).

    Args:
        redis: the gateway's client.
        channel: the channel to read.
    """

    def __init__(self, redis: Client, channel: str = CHANNEL) -> None:
        self.channel = channel
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)

    async def subscribe(self) -> None:
        """SUBSCRIBE to the channel (connects first)."""
        await self._pubsub.subscribe(self.channel)

    def listen(self) -> AsyncIterator[dict[str, Any]]:
        """Every frame received, as redis-py gives it: ``{"type": "message", "data":
        bytes, ...}`` for a published message, other types (``pong``) otherwise.

        A blocking read per frame with no timeout (see :meth:`drop_connection`);
        redis-py resubscribes by itself when it reconnects. The iterator is redis-py's
        own: no extra layer per message on this hot path.
        """
        return self._pubsub.listen()

    async def ping(self) -> None:
        """PING on the subscribed connection; the PONG arrives through :meth:`listen`."""
        await self._pubsub.ping()

    async def drop_connection(self) -> None:
        """Disconnect the socket under a blocked :meth:`listen` (a half-open TCP
        connection never errors by itself): the read then fails or reconnects."""
        if self._pubsub.connection is not None:  # None before the first subscribe
            await self._pubsub.connection.disconnect()

    async def close(self) -> None:
        """Unsubscribe and give the connection back."""
        await self._pubsub.aclose()
