"""The empty-gRPC floor: a grpc.aio service with no work, and the client loops.

The server runs as its own process (``python -m bench.grpc_floor PORT``) so that its
CPU time can be read from /proc. It has two methods registered through a generic
handler with bytes in and out (no codegen): ``/bench.Floor/Unary`` answers an empty
message, ``/bench.Floor/Stream`` sends N messages of 100 bytes (N is the request,
ASCII digits).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from bench.common import PAYLOAD_BYTES, REPO, proc_cpu_s, stop_process
from tests.support.redis_server import free_port

UNARY = "/bench.Floor/Unary"
STREAM = "/bench.Floor/Stream"
_MSG = b"x" * PAYLOAD_BYTES


def _ident(b: bytes) -> bytes:
    return b


async def _unary(request: bytes, context: Any) -> bytes:
    return b""


async def _stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for _ in range(int(request)):
        yield _MSG


async def serve(port: int) -> None:
    """Serve the empty service on 127.0.0.1:``port`` until killed."""
    handler = grpc.method_handlers_generic_handler("bench.Floor", {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary, _ident, _ident),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream, _ident, _ident),
    })
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _wait_ready(channel: grpc.aio.Channel) -> None:
    await asyncio.wait_for(channel.channel_ready(), timeout=15)


async def _unary_rate(channel: grpc.aio.Channel, n: int, in_flight: int) -> float:
    """Calls/s of ``n`` empty unary calls with ``in_flight`` callers."""
    call = channel.unary_unary(UNARY, _ident, _ident)

    async def caller(count: int) -> None:
        for _ in range(count):
            await call(b"")
    t0 = time.perf_counter()
    await asyncio.gather(*(caller(n // in_flight) for _ in range(in_flight)))
    return (n // in_flight) * in_flight / (time.perf_counter() - t0)


async def _stream_rate(channel: grpc.aio.Channel, n: int) -> float:
    """Messages/s of one server stream of ``n`` 100-byte messages."""
    call = channel.unary_stream(STREAM, _ident, _ident)
    t0 = time.perf_counter()
    got = 0
    async for _ in call(str(n).encode()):
        got += 1
    return got / (time.perf_counter() - t0)


async def _measure(port: int, pid: int, n_unary: int, n_stream: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await _wait_ready(channel)
        await _unary_rate(channel, 200, 1)  # warm-up
        cpu0 = proc_cpu_s(pid)
        one = await _unary_rate(channel, n_unary, 1)
        cpu1 = proc_cpu_s(pid)
        sixteen = await _unary_rate(channel, n_unary * 2, 16)
        cpu2 = proc_cpu_s(pid)
        streamed = await _stream_rate(channel, n_stream)
        cpu3 = proc_cpu_s(pid)
    return {"grpc_unary_1_per_s": round(one, 1),
            "grpc_unary_cpu_us": round((cpu1 - cpu0) / n_unary * 1e6, 1),
            "grpc_unary_16_per_s": round(sixteen, 1),
            "grpc_unary_16_cpu_us": round((cpu2 - cpu1) / (n_unary * 2) * 1e6, 1),
            "grpc_stream_msgs_per_s": round(streamed, 1),
            "grpc_stream_cpu_us": round((cpu3 - cpu2) / n_stream * 1e6, 2)}


def measure(n_unary: int, n_stream: int) -> dict[str, float]:
    """Start the empty server, run the three client loops, stop the server.

    Args:
        n_unary: calls for the one-at-a-time loop (twice that with 16 in flight).
        n_stream: messages in the server-streamed call.

    Returns:
        Calls/s, messages/s and server CPU per call/message (µs).
    """
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", str(port)], cwd=REPO,
                            start_new_session=True)
    try:
        return asyncio.run(_measure(port, proc.pid, n_unary, n_stream))
    finally:
        stop_process(proc)


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
