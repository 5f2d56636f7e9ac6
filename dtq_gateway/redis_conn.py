"""The gateway's Redis connection class: redis-py's, with a cheaper write path.

Commands are packed by hiredis in C (``hiredis.pack_command``, as redis-py's own
synchronous client does when hiredis is installed) instead of redis-py's asyncio
pure-Python packer: an enqueue EVALSHA with its ~40 arguments costs ~6 us instead of
~31 us to pack.

redis-py wraps every command write in ``asyncio.wait_for(..., socket_timeout)``,
which creates a task and a timer per command, although a write to a healthy socket
only fills the transport buffer and returns. This class writes directly and only
waits (bounded by ``socket_timeout``) when the transport buffer is above its
high-water mark or the transport is closing, i.e. exactly when the original
``drain()`` could block or fail. Reads keep redis-py's per-read timeout, so a dead
connection is still detected within ``socket_timeout``.

There is no fork-safety concern: the gateway never forks, and redis-py's asyncio
pool keeps no per-process state (the ``getpid`` calls seen in profiles come from
CPython 3.11's ``asyncio.get_running_loop``, which every timeout, lock and future
helper calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.asyncio.connection import BlockingConnectionPool, Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    hiredis = None


class FastWriteConnection(Connection):
    """A TCP connection whose command writes skip the per-write timeout task."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """RESP bytes of one command; hiredis when the encoder is the default UTF-8 one.

        Same rules as redis-py's encoder: str (UTF-8), bytes, int, float; anything
        else (bool, None) raises DataError.
        """
        enc = self.encoder
        if hiredis is None or enc.encoding != "utf-8" or enc.encoding_errors != "strict":
            return super().pack_command(*args)
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:
            if not any(isinstance(a, (bytearray, memoryview)) for a in args):
                raise DataError(str(exc)) from exc
        try:
            return [hiredis.pack_command(tuple(
                bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args))]
        except TypeError as exc:
            raise DataError(str(exc)) from exc

    async def send_packed_command(self, command: bytes | str | Iterable[bytes],
                                  check_health: bool = True) -> None:
        """Write an already packed command (see the module docstring)."""
        if not self.socket_timeout or not self.is_connected:
            return await super().send_packed_command(command, check_health)
        if check_health:
            await self.check_health()
        writer = self._writer
        if writer is None:
            return await super().send_packed_command(command, False)
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            transport: Any = writer.transport
            if (transport.is_closing() or transport.get_write_buffer_size()
                    > transport.get_write_buffer_limits()[1]):
                await asyncio.wait_for(writer.drain(), self.socket_timeout)
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {e!r}") from e
        except BaseException:
            await self.disconnect(nowait=True)
            raise
        return None


class FastPool(BlockingConnectionPool):
    """A blocking pool whose acquire/release skip the slow path while nothing waits.

    redis-py's acquire takes an ``asyncio.Condition``, arms a timeout, records
    connection-count metrics (for its OpenTelemetry hooks, unused here) and goes
    through a deprecation wrapper that inspects its arguments: ~10 % of the
    gateway's CPU on unary Enqueue. While a connection is idle (and the pool is not
    in a maintenance window) acquiring is a pop; releasing is an append while no
    caller waits and the connection has no pending re-authentication. Everything
    else (pool exhausted, waiters, maintenance, streaming credentials) takes
    redis-py's path. The event loop is single-threaded and the fast paths do not
    await between reading and changing the pool's lists, so they cannot race.
    """

    async def get_connection(self, command_name: Any = None, *keys: Any,
                             **options: Any) -> Connection:
        """An idle connection at once when there is one, else redis-py's wait."""
        if not self._available_connections or getattr(self, "_in_maintenance", True):
            return await super().get_connection()
        connection = self._available_connections.pop()
        self._in_use_connections.add(connection)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: Connection) -> None:
        """Put a connection back; redis-py's path when someone waits for one."""
        if (getattr(self, "_in_maintenance", True) or self._condition._waiters
                or getattr(connection, "_re_auth_token", None) is not None
                or connection not in self._in_use_connections):
            return await super().release(connection)
        self._in_use_connections.remove(connection)
        if connection.should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)
        return None

