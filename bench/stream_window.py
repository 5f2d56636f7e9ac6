"""What a Lease stream whose reader never reads takes in, with and without the window.

``python -m bench.stream_window`` starts a private redis-server and an in-process
gateway, queues tasks of 100 B to 100 KB, opens a Lease stream, reads its SessionInfo
and then nothing more (as behind a frozen proxy: the connection answers pings, the
stream's HTTP/2 window fills), and after 4 s prints how many leases the gateway wrote
to it. ``concurrency 5000`` gives an unread window (protocol.md 3.3) of 10,000, so
only HTTP/2 flow control bounds the stream; ``concurrency 1`` gives the window of 4.
"""

from __future__ import annotations

import asyncio

import grpc

from bench.common import private_redis


async def _one(url: str, size: int, n: int, concurrency: int) -> None:
    import redis

    from dtq_gateway.server import Gateway
    from dtq_proto import dtq_pb2, dtq_pb2_grpc
    from tests.conftest import gateway_settings

    redis.Redis.from_url(url).flushall()
    gw = Gateway(gateway_settings(url, heartbeat_interval_s=10, visibility_timeout_s=60), url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    stub = dtq_pb2_grpc.BrokerStub(ch)
    body = b'"' + b"x" * (size - 2) + b'"'
    for i in range(0, n, 500):
        await stub.EnqueueBatch(dtq_pb2.EnqueueBatchRequest(items=[dtq_pb2.EnqueueRequest(
            queue="w", task_type="t", payload=body) for _ in range(min(500, n - i))]))
    call = stub.Lease(dtq_pb2.LeaseRequest(worker_id="w1", queues=["w"], max_in_flight=10000,
                                           concurrency=concurrency))
    await call.__aiter__().__anext__()  # SessionInfo; nothing is read after it
    await asyncio.sleep(4)
    s = next(iter(gw.dispatcher.sessions.values()))
    blocked = 1 if s.out.qsize() or s.sent_seq == n else 0
    written = s.sent_seq - (blocked if s.sent_seq < n else 0)
    print(f"concurrency {concurrency:>4}, payload {size:>6} B: {written:>5} of {n} leases "
          f"written (~{written * size // 1024} KiB of payload)", flush=True)
    call.cancel()
    await ch.close()
    await gw.stop()


async def _main() -> None:
    server = private_redis()
    try:
        for concurrency in (5000, 1):
            for size, n in ((100, 8000), (1000, 3000), (10_000, 600), (100_000, 100)):
                await _one(server.url, size, n, concurrency)
    finally:
        server.cleanup()


if __name__ == "__main__":
    asyncio.run(_main())
