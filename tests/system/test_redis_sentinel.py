"""Sentinel mode: a gateway on a primary + replica watched by three sentinels, a forced
``SENTINEL FAILOVER`` in the middle of a workload, and every task still reaching one
terminal state (a task whose completion was lost in asynchronous replication may run
again: see tests/system/failover_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from tests.support.redis_sentinel import SERVICE, SentinelSetup
from tests.system.chaos_support import wait_until
from tests.system.failover_support import FailoverEnv, check_at_least_once, enqueue_spread

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


@pytest.fixture
def sentinel_env(tmp_path: Path) -> Iterator[tuple[SentinelSetup, FailoverEnv]]:
    setup = SentinelSetup(directory=str(tmp_path / "redis")).start()
    sentinel = Sentinel([("127.0.0.1", p) for p in setup.sentinel_ports], socket_timeout=2)
    env = FailoverEnv(
        tmp_path, setup.url, {"redis-mode": "sentinel", "redis-sentinel-master": SERVICE},
        rds=sentinel.master_for(SERVICE, decode_responses=True, socket_timeout=2),
        subscribe=lambda: sentinel.master_for(SERVICE, socket_timeout=2,
                                              socket_connect_timeout=1))
    try:
        yield setup, env
    finally:
        env.cleanup()
        setup.stop()


def test_sentinel_failover_during_a_workload_every_task_terminal(sentinel_env) -> None:
    setup, env = sentinel_env
    gw = env.gateway()
    client = env.client(gw.target)
    ids = enqueue_spread(client, ["chaos"], 300, sleep_s=0.05)
    for i in (1, 2):
        env.worker(gw.target, f"w-{i}", concurrency=4)
    wait_until(lambda: len(env.runs("done")) >= 20, 20, "some tasks to finish")
    old = setup.primary_port()
    assert len(env.runs("done")) < len(ids) / 2, "the failover should hit a running workload"

    new = setup.failover()

    assert new != old
    ids += enqueue_spread(client, ["chaos"], 30)  # accepted by the promoted replica
    counts = check_at_least_once(env, client, ids, ["chaos"])
    # the gateway writes to the promoted replica now
    primary = redis.Redis(port=new, decode_responses=True)
    try:
        assert primary.info("replication")["role"] == "master"
        assert primary.exists(f"dtq:task:{ids[-1]}") or primary.dbsize() > 0
    finally:
        primary.close()
    print(f"sentinel failover {old} -> {new}: {counts}")
