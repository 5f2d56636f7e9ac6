"""Redis outages: UNAVAILABLE to callers, health NOT_SERVING, recovery after restart."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.exceptions import ConnectionError as RedisConnectionError

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.conftest import gateway_settings
from tests.support.leasing import LeaseStream, error_reason, poll
from tests.support.redis_server import port_held


async def test_outage_is_unavailable_and_not_serving_then_recovers(own_redis):
    gw = Gateway(gateway_settings(own_redis.url), own_redis.url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    broker = dtq_pb2_grpc.BrokerStub(ch)
    health = health_pb2_grpc.HealthStub(ch)

    async def status():
        return (await health.Check(health_pb2.HealthCheckRequest(service=""))).status

    try:
        assert await status() == health_pb2.HealthCheckResponse.SERVING
        done = await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
        own_redis.kill()
        with port_held(own_redis.port):  # no other test's server takes it meanwhile
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await broker.Enqueue(pb.EnqueueRequest(queue="q", task_type="t"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(err.value) == "REDIS_UNAVAILABLE"
            await poll(status, lambda s: s == health_pb2.HealthCheckResponse.NOT_SERVING)
        own_redis.start()  # same port and directory: the AOF brings the task back
        await poll(status, lambda s: s == health_pb2.HealthCheckResponse.SERVING)
        lease = await LeaseStream(broker, "w1", ["q"]).open()
        task = await lease.next(timeout_s=10)
        assert task.task_id == done.task_id
        lease.close()
    finally:
        await ch.close()
        await gw.stop()


async def test_a_busy_connection_pool_is_not_a_redis_outage(redis_url, caplog):
    """Every connection of the calls' pool held (a burst of admin calls): the health
    probe still reaches Redis on its own connection, so health stays SERVING and
    nothing logs Redis as unreachable; once the pool frees up, calls go through."""
    gw = Gateway(gateway_settings(redis_url, redis_max_connections=4), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    health = health_pb2_grpc.HealthStub(ch)
    pool = gw.redis.connection_pool
    held, wait_s = [], pool.timeout
    pool.timeout = 0.5
    try:
        while True:  # take every connection the pool has (events and duties hold some)
            held.append(await pool.get_connection())
    except RedisConnectionError:
        pool.timeout = wait_s  # the pool is empty now
    try:
        for _ in range(3):
            await gw.probe.check_once()  # before: the PING waited in the pool, 2 s, failed
            assert gw.probe.redis_ok
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        pool.timeout = 0.5  # a call that finds no free connection in time: busy, not down
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await dtq_pb2_grpc.AdminStub(ch).ListQueues(pb.ListQueuesRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(err.value) == "GATEWAY_BUSY"
    finally:
        pool.timeout = wait_s
        for conn in held:
            await pool.release(conn)
    assert "redis unreachable" not in caplog.text
    try:
        admin = dtq_pb2_grpc.AdminStub(ch)
        await admin.ListQueues(pb.ListQueuesRequest())
    finally:
        await ch.close()
        await gw.stop()
