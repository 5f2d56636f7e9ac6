"""Which Redis failures count as "Redis cannot serve now" (store.errors)."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dtq_gateway.errors import RedisFull, Unavailable
from dtq_gateway.store.errors import as_dtq_error, is_redis_outage


def _raised_in(filename: str, source: str) -> BaseException:
    namespace: dict = {}
    exec(compile(f"def call(t):\n    {source}\n", filename, "exec"), namespace)  # noqa: S102
    try:
        namespace["call"](None)
    except Exception as exc:  # noqa: BLE001 - the exception is the value under test
        return exc
    raise AssertionError("did not raise")


def test_a_connection_closed_under_a_call_is_an_outage():
    """redis-py's asyncio connection fails this way when another call closed it (a
    cluster node died): UNAVAILABLE, not INTERNAL."""
    exc = _raised_in("/site-packages/redis/asyncio/connection.py", "t.writelines([b'x'])")
    assert isinstance(exc, AttributeError)
    assert isinstance(as_dtq_error(exc), Unavailable) and is_redis_outage(exc)


def test_the_same_error_elsewhere_stays_a_bug():
    exc = _raised_in("/work/dtq_gateway/leasing/dispatch.py", "t.writelines([b'x'])")
    assert as_dtq_error(exc) is None and not is_redis_outage(exc)


@pytest.mark.parametrize(("exc", "kind"), [
    (RedisConnectionError("refused"), Unavailable),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'"), RedisFull),
    (ResponseError("CLUSTERDOWN The cluster is down"), Unavailable),
    (ResponseError("WRONGTYPE Operation against a key"), type(None)),
])
def test_redis_errors_map_to_their_kind(exc, kind):
    assert isinstance(as_dtq_error(exc), kind)


def test_a_busy_connection_pool_is_gateway_busy_not_redis_down():
    """The pool's wait for a free connection timing out is this gateway being busy:
    UNAVAILABLE with reason GATEWAY_BUSY, not REDIS_UNAVAILABLE."""
    from redis.exceptions import MaxConnectionsError

    from dtq_gateway.store.errors import is_pool_busy

    for exc in (RedisConnectionError("No connection available."), MaxConnectionsError("x")):
        mapped = as_dtq_error(exc)
        assert is_pool_busy(exc) and isinstance(mapped, Unavailable)
        assert mapped.reason == "GATEWAY_BUSY" and mapped.retry_after_ms == 1000
    down = as_dtq_error(RedisConnectionError("Connection refused"))
    assert not is_pool_busy(RedisConnectionError("Connection refused"))
    assert down.reason == "REDIS_UNAVAILABLE"


def test_a_write_fewer_replicas_confirmed_is_unavailable_with_a_clear_message():
    from redis.exceptions import ReadOnlyError

    from dtq_gateway.store.errors import ReplicasNotAcked

    exc = ReplicasNotAcked(wanted=2, got=1, timeout_ms=1000, reply=[b"ok"])
    mapped = as_dtq_error(exc)
    assert isinstance(mapped, Unavailable) and is_redis_outage(exc)
    assert mapped.retry_after_ms == 1000
    assert "1 of the 2 replica(s) DTQ_REDIS_MIN_REPLICAS_ACK asks for" in str(mapped)
    assert "resend" in str(mapped) and exc.reply == [b"ok"]
    # a write that reaches a demoted primary (a replica now) is refused, never OK
    assert isinstance(as_dtq_error(ReadOnlyError("You can't write against a read only "
                                                 "replica.")), Unavailable)
    assert isinstance(as_dtq_error(ResponseError(
        "Command # 1 (EVALSHA x) of pipeline caused error: READONLY You can't write")),
        Unavailable)
