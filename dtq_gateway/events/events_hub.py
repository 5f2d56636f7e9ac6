"""One shared Redis pub/sub subscriber per gateway, fanned out to local consumers.

Lifecycle events are published by the Lua scripts on ``store.events.CHANNEL``
(pub/sub: no history, no buffering in Redis), one message per script call carrying
all of that call's events (:mod:`dtq_gateway.events.events_wire`; single-event messages are
still accepted). The hub holds the single subscription of this replica, decodes each
message once and hands every event, in order, to

* listeners (:meth:`EventsHub.add_listener`): internal, synchronous, cheap
  callbacks, e.g. the lease dispatcher waking on TASK_QUEUED / TASK_RETRIED;
* subscriptions (:meth:`EventsHub.subscribe`): bounded per-client buffers behind
  ``Events.Subscribe``, fed by :class:`~dtq_gateway.events.events_fanout.FanOut`: filtered
  by group, encoded once per event, within a gateway-wide delivery budget, with a
  cap on their number. A full buffer or a spent budget drops the event for that
  client only and counts it; the next event that fits carries the count
  (``dropped``), so a client learns exactly where it lost events and never slows
  anyone else.

After a Redis outage the hub resubscribes by itself, with jittered exponential
backoff (at most ``max_backoff_s``) and rate-limited logs. Events published while
it was disconnected are lost, as pub/sub semantics say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Collection, Iterable

from dtq_gateway.events import events_wire
from dtq_gateway.events.events_fanout import Encoder, FanOut, Subscription
from dtq_gateway.logconf import RateLimitedLog
from dtq_gateway.store import events as channel_store
from dtq_gateway.store.client import Client
from dtq_gateway.store.errors import is_redis_outage

log = logging.getLogger(__name__)

#: Silence on the subscription after which the hub PINGs it (s).
IDLE_PING_S = 15.0
#: How long the hub waits for any message (the PONG at least) after that PING (s).
PONG_TIMEOUT_S = 5.0

Event = events_wire.Event
Listener = Callable[[Event], None]
#: Cheap test on the raw message bytes: False = the listener does not need this event.
RawFilter = Callable[[bytes], bool]


class EventsHub:
    """The replica's single subscriber of the events channel.

    Args:
        redis: the gateway's client (the hub takes one connection from its pool).
        channel: pub/sub channel (default ``store.events.CHANNEL``).
        buffer_size: capacity of each subscription buffer (events).
        max_backoff_s: longest wait between resubscribe attempts (s).
        idle_ping_s: silence (s) after which the subscription is PINGed.
        pong_timeout_s: wait (s) for any message after that PING before the hub drops
            the connection and resubscribes (a half-open TCP connection never errors).
        encode: event → what subscriptions buffer, once per event (default: the
            event dict itself); None from it = not deliverable.
        event_types: event types ``encode`` can represent (None = any).
        max_subscribers: most open subscriptions (``DTQ_EVENTS_MAX_SUBSCRIBERS``).
        max_deliveries_per_s: budget of buffered deliveries per second, all
            subscriptions together (``DTQ_EVENTS_MAX_DELIVERIES_PER_S``).
    """

    def __init__(self, redis: Client, *, channel: str = channel_store.CHANNEL,
                 buffer_size: int = 1000, max_backoff_s: float = 5.0,
                 idle_ping_s: float = IDLE_PING_S, pong_timeout_s: float = PONG_TIMEOUT_S,
                 encode: Encoder | None = None, event_types: Collection[str] | None = None,
                 max_subscribers: int = 256, max_deliveries_per_s: int = 5000) -> None:
        self.redis = redis
        self.channel = channel
        self.buffer_size = buffer_size
        self.max_backoff_s = max_backoff_s
        self.idle_ping_s = idle_ping_s
        self.pong_timeout_s = pong_timeout_s
        self._received_at = 0.0
        self.pings = 0  # PINGs sent on a silent subscription
        self.silent_drops = 0  # connections dropped by the PING watchdog, for tests and logs
        self.connected = asyncio.Event()
        self.subscribe_count = 0  # successful (re)subscriptions, for tests and logs
        self.fanout = FanOut(encode, max_subscribers=max_subscribers,
                             deliveries_per_s=max_deliveries_per_s, event_types=event_types)
        self._listeners: list[tuple[Listener, RawFilter | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._outage_log = RateLimitedLog(log)
        self._bad_event_log = RateLimitedLog(log, every_s=60.0)

    def add_listener(self, callback: Listener, wants: RawFilter | None = None) -> None:
        """Call ``callback(event)`` for every event, in order (must be cheap, must not
        block).

        ``wants(raw_bytes)``, when given, is asked once per raw message (which may carry
        many events); a message no listener wants and no subscription needs is dropped
        without being decoded (this keeps the per-task cost of the hub near zero on a
        busy gateway with no subscribers).
        """
        self._listeners.append((callback, wants))

    def remove_listener(self, callback: Listener) -> None:
        """Stop calling ``callback``."""
        self._listeners = [(cb, w) for cb, w in self._listeners if cb is not callback]

    def subscribe(self, queues: Iterable[str] = (), types: Iterable[str] = (),
                  buffer_size: int | None = None) -> Subscription:
        """A new filtered subscription; pair with :meth:`unsubscribe`.

        Args:
            queues: queue filter (empty = all).
            types: event type strings (empty = all).
            buffer_size: capacity (events); default the hub's ``buffer_size``.

        Raises:
            SubscriberLimit: the hub has ``max_subscribers`` open subscriptions.
        """
        sub = Subscription(queues, types, buffer_size or self.buffer_size)
        if self._stopped:
            sub.close()
        else:
            self.fanout.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forget a subscription."""
        self.fanout.remove(sub)

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions."""
        return len(self.fanout)

    def start(self) -> asyncio.Task[None]:
        """Start the reader task (again, after it ended); returns it at once."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="dtq-events-hub")
        return self._task

    async def stop(self) -> None:
        """Stop reading and close every subscription (their streams end).

        The reader blocks in ``listen()`` (no read timeout), so it is cancelled; its
        ``finally`` closes the subscription.
        """
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=2.0)
        self.fanout.close_all()
        self.connected.clear()

    def dispatch(self, data: bytes | str) -> None:
        """Hand one raw channel message (batch or single event) to the listeners that
        want it and to the matching subscriptions, event by event, in order."""
        raw = data.encode() if isinstance(data, str) else data
        listeners = [cb for cb, wants in self._listeners if wants is None or wants(raw)]
        fanout = self.fanout.wants_raw(raw)
        if not listeners and not fanout:
            return
        events = events_wire.decode(raw)
        if events is None:
            self._bad_event_log.log(logging.WARNING, "events: ignoring malformed message")
            return
        for event in events:
            for callback in listeners:
                try:
                    callback(event)
                except Exception:
                    log.exception("events: listener failed")
            if fanout:
                self.fanout.deliver(event)

    async def _run(self) -> None:
        failures = 0
        while not self._stopped:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the hub alive
                failures += 1
                if is_redis_outage(exc):
                    self._outage_log.log(logging.WARNING, "events: subscriber lost Redis, "
                                         "resubscribing: %r", exc)
                else:  # a bug: logged with its traceback
                    self._outage_log.log(logging.ERROR, "events: subscriber failed",
                                         exc_info=True)
            self.connected.clear()
            if self._stopped:
                return
            base = min(self.max_backoff_s, 0.05 * (2 ** min(failures, 10)))
            await asyncio.sleep(random.uniform(base / 2, base))

    async def _listen(self) -> None:
        """Subscribe and deliver messages until the connection fails.

        Reads with ``ChannelReader.listen()`` (redis-py's ``PubSub.listen()``), a
        blocking read per message: about a quarter of the CPU of a
        ``get_message(timeout=...)`` poll, which sets up a timeout and a health check on
        every call (the hub reads back three events per task). A blocking read never
        times out, so :meth:`_watch` guards against a connection that went silent
        without an error.
        """
        reader = channel_store.ChannelReader(self.redis, self.channel)
        watchdog: asyncio.Task[None] | None = None
        try:
            await reader.subscribe()
            self.subscribe_count += 1
            if self.subscribe_count > 1:
                log.info("events: resubscribed", extra={"channel": self.channel})
                self._outage_log.reset()
            self.connected.set()
            self._received_at = time.monotonic()
            watchdog = asyncio.create_task(self._watch(reader), name="dtq-events-watchdog")
            async for msg in reader.listen():
                self._received_at = time.monotonic()
                if msg.get("type") == "message":
                    self.dispatch(msg["data"])
                if self._stopped:
                    return
        finally:
            self.connected.clear()
            if watchdog is not None:
                watchdog.cancel()
                await asyncio.gather(watchdog, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(reader.close(), timeout=1.0)

    async def _watch(self, reader: channel_store.ChannelReader) -> None:
        """PING the subscription after ``idle_ping_s`` of silence; when nothing (not even
        the PONG) arrives within ``pong_timeout_s``, drop the connection: a half-open TCP
        connection never errors by itself. The blocked read then fails or reconnects
        (redis-py resubscribes on reconnect); either way the hub hears events again."""
        while True:
            idle = time.monotonic() - self._received_at
            if idle < self.idle_ping_s:
                await asyncio.sleep(self.idle_ping_s - idle)
                continue
            pinged_at = time.monotonic()
            self.pings += 1
            with contextlib.suppress(Exception):  # a failed send shows up in the read
                await asyncio.wait_for(reader.ping(), timeout=self.pong_timeout_s)
            await asyncio.sleep(max(0.0, pinged_at + self.pong_timeout_s - time.monotonic()))
            if self._received_at < pinged_at:
                self.silent_drops += 1
                self._outage_log.log(logging.WARNING, "events: no reply to PING within "
                                     "%.1f s; reconnecting", self.pong_timeout_s)
                self._received_at = time.monotonic()  # the next check waits a full period
                with contextlib.suppress(Exception):
                    await reader.drop_connection()
