"""Redis Cluster failovers under load with durable acknowledgements, counting every
task the gateway answered OK.

Each test starts its own 3-primary cluster with one replica per primary. A producer
enqueues one task at a time into one queue (each with its own idempotency key, resent
until answered OK) while two workers drain it; the primary that owns the queue's slot
is failed over with ``CLUSTER FAILOVER`` or SIGKILLed (and started again, rejoining as
the new primary's replica). With ``DTQ_REDIS_MIN_REPLICAS_ACK=1`` every task answered
OK exists afterwards and reaches a terminal state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from dtq_gateway.store import keys
from tests.support.redis_cluster import RedisClusterSetup
from tests.system.chaos_support import wait_until
from tests.system.failover_support import FailoverEnv, Producer, check_at_least_once

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

#: Workers x concurrency: the most tasks in flight when the primary goes.
IN_FLIGHT = 2 * 4


@pytest.fixture
def cluster_env(tmp_path: Path) -> Iterator[tuple[RedisClusterSetup, FailoverEnv, int]]:
    """A fresh cluster, its FailoverEnv, and the port of the primary of queue chaos."""
    setup = RedisClusterSetup(directory=str(tmp_path / "cluster")).start()
    rds = RedisCluster(host="127.0.0.1", port=setup.nodes[0].port, decode_responses=True,
                       socket_timeout=5)
    owner = rds.get_node_from_key(keys.stream("chaos", 0)).port
    # the event recorder subscribes on a node outside the failing shard
    other = next(p for p in setup.primaries() if p != owner)
    env = FailoverEnv(tmp_path, f"redis://127.0.0.1:{other}", {"redis-mode": "cluster"},
                      rds=rds, subscribe=lambda: redis.Redis(port=other, socket_timeout=2,
                                                             socket_connect_timeout=1))
    try:
        yield setup, env, owner
    finally:
        env.cleanup()
        setup.stop()


@pytest.mark.parametrize("kill", [False, True], ids=["cluster-failover", "sigkill"])
def test_cluster_failover_with_durable_acks_loses_no_acknowledged_task(
        cluster_env, kill: bool) -> None:
    setup, env, owner = cluster_env
    gw = env.gateway(extra={"redis-min-replicas-ack": "1"})
    client = env.client(gw.target)
    for i in (1, 2):
        env.worker(gw.target, f"w-{i}", concurrency=4)
    producer = Producer(gw.target).start()
    try:
        wait_until(lambda: len(producer.acked) >= 100, 30, "100 tasks enqueued")
        if kill:
            new = setup.kill_primary(owner)
        else:
            new = setup.failover(setup.replica_of(owner))
        assert new != owner
        after = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= after + 50, 30,
                   "50 more tasks enqueued after the failover")
    finally:
        acked = producer.stop()
    counts = check_at_least_once(env, client, [tid for tid, _ in acked], ["chaos"])
    print(f"cluster {'kill' if kill else 'failover'}, durable: {counts['tasks']} answered "
          f"OK ({producer.refused} refusals), lost {counts['lost_enqueues']}, ran twice "
          f"{counts['ran_twice']}")
    assert counts["tasks"] == len(acked) >= 150
    assert counts["lost_enqueues"] == 0, f"acknowledged tasks lost: {counts['lost_ids']}"
    assert counts["ran_twice"] <= IN_FLIGHT
