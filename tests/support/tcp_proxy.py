"""A loopback TCP proxy that can black-hole its connections (no root, no iptables).

``blackhole()`` makes every open connection stop forwarding in both directions
while both sockets stay open: no FIN, no RST, bytes simply vanish, as behind a
dead NAT entry or a pulled cable. Connections accepted afterwards forward normally.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream_port``; ``accepted`` counts connections."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.accepted = 0
        self._server: asyncio.base_events.Server | None = None
        self._pipes: list[tuple[asyncio.Event, list[asyncio.Task], list]] = []

    async def start(self) -> TcpProxy:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def blackhole(self) -> None:
        """Stop forwarding on every open connection, keeping its sockets open."""
        for dead, _tasks, _writers in self._pipes:
            dead.set()

    async def stop(self) -> None:
        """Close the listener and every connection."""
        if self._server is not None:
            self._server.close()
        for _dead, tasks, writers in self._pipes:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in writers:
                writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_client(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        dead = asyncio.Event()
        tasks = [asyncio.create_task(self._pipe(reader, up_writer, dead)),
                 asyncio.create_task(self._pipe(up_reader, writer, dead))]
        self._pipes.append((dead, tasks, [writer, up_writer]))

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    dead: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while not dead.is_set():
                data = await src.read(65536)
                if not data:
                    break
                if dead.is_set():
                    break  # swallowed: the black hole
                dst.write(data)
                await dst.drain()
            if dead.is_set():  # keep reading and dropping, never close: no FIN, no RST
                while await src.read(65536):
                    pass
                await asyncio.Event().wait()
        dst.close()
