"""Cluster mode: gateways on a 3-primary Redis Cluster with 3 replicas.

One cluster serves the module. The core paths (enqueue, lease, ack, fail, retry,
dead letter, requeue, cancel, pause, GetTask, ListQueues, ListDeadLetters) run over
queues whose hash slots lie on all three primaries, with workers whose Lease sessions
span queues of several slots; then a replica is promoted with ``CLUSTER FAILOVER``
during a workload and every task still reaches one terminal state (a completion lost in
asynchronous replication may make a task run again: tests/system/failover_support.py).
The health probe and the eviction-policy watch read every primary, not one node.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health
from redis.cluster import RedisCluster

from dtq_gateway.health_probe import HealthProbe
from dtq_gateway.store import client as client_module
from dtq_gateway.store import keys
from dtq_gateway.store.client import make_client
from dtq_gateway.store.redis_policy import EvictionPolicyWatch
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.redis_cluster import RedisClusterSetup
from tests.system.chaos_support import wait_until
from tests.system.failover_support import FailoverEnv, check_at_least_once, enqueue_spread

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

#: Queues of the tests: 12 names whose slots fall on all three primaries (asserted).
QUEUES = [f"cq{i}" for i in range(12)]
TERMINAL = {pb.TASK_STATUS_SUCCEEDED, pb.TASK_STATUS_DEAD_LETTERED, pb.TASK_STATUS_CANCELLED,
            pb.TASK_STATUS_EXPIRED}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterSetup]:
    setup = RedisClusterSetup(directory=str(tmp_path_factory.mktemp("cluster"))).start()
    try:
        yield setup
    finally:
        setup.stop()


@pytest.fixture
def env(cluster: RedisClusterSetup, tmp_path: Path) -> Iterator[FailoverEnv]:
    node = cluster.nodes[0].port
    rds = RedisCluster(host="127.0.0.1", port=node, decode_responses=True, socket_timeout=5)
    rds.flushall(target_nodes=RedisCluster.PRIMARIES)
    e = FailoverEnv(tmp_path, cluster.url, {"redis-mode": "cluster"}, rds=rds,
                    subscribe=lambda: redis.Redis(port=node, socket_timeout=2,
                                                  socket_connect_timeout=1))
    try:
        yield e
    finally:
        e.cleanup()


def primaries_of(rds: RedisCluster, queues: list[str]) -> dict[str, str]:
    """queue -> name of the primary that owns its slot."""
    return {q: rds.get_node_from_key(keys.stream(q, 0)).name for q in queues}


def test_core_operations_over_queues_on_all_three_primaries(env: FailoverEnv) -> None:
    owners = primaries_of(env.rds, QUEUES)
    assert len(set(owners.values())) == 3, f"queues should spread over 3 primaries: {owners}"
    gw = env.gateway()
    client = env.client(gw.target)
    channel = grpc.insecure_channel(gw.target)
    admin = dtq_pb2_grpc.AdminStub(channel)
    try:
        items = []
        for q in QUEUES:
            items += [{"queue": q, "task_type": "chaos.sleep", "payload": {"sleep_s": 0},
                       "priority": 9}] * 2
            items += [{"queue": q, "task_type": "chaos.sleep", "payload": {"sleep_s": 0},
                       "delay_ms": 300},
                      {"queue": q, "task_type": "chaos.fail_once",
                       "payload": {"retry_after_s": 0.2}, "max_attempts": 3},
                      {"queue": q, "task_type": "chaos.fail_always", "max_attempts": 1,
                       "idempotency_key": f"dead-{q}"}]
        ids = [r.task_id for r in client.enqueue_batch(items)]
        assert all(keys.key_slot(keys.task(t)) == keys.key_slot(keys.stream(i["queue"], 0))
                   for t, i in zip(ids, items)), "a task record outside its queue's slot"
        # a paused queue holds its task; the task is cancelled there, then the queue resumes
        admin.PauseQueue(pb.PauseQueueRequest(queue="held", reason="cluster test", create=True))
        held = client.enqueue("held", "chaos.sleep", {"sleep_s": 0})
        assert client.cancel(held.task_id).status == pb.TASK_STATUS_CANCELLED
        admin.ResumeQueue(pb.ResumeQueueRequest(queue="held"))
        # one worker reads all twelve queues (its sessions span three slots), another half
        env.worker(gw.target, "w-all", queue=",".join(QUEUES), concurrency=4)
        env.worker(gw.target, "w-half", queue=",".join(QUEUES[::2]), concurrency=2)
        tasks = wait_until(lambda: _all_terminal(client, ids), 40, "every task terminal")
        by_type = {}
        for item, tid in zip(items, ids):
            by_type.setdefault(item["task_type"], []).append(tasks[tid])
        assert all(t.status == pb.TASK_STATUS_SUCCEEDED for t in by_type["chaos.sleep"])
        assert all(t.status == pb.TASK_STATUS_SUCCEEDED and t.attempt == 2
                   for t in by_type["chaos.fail_once"])
        assert all(t.status == pb.TASK_STATUS_DEAD_LETTERED
                   for t in by_type["chaos.fail_always"])
        assert client.get_task(held.task_id).status == pb.TASK_STATUS_CANCELLED
        # the dead letters of twelve queues, merged newest first over two pages
        page1 = admin.ListDeadLetters(pb.ListDeadLettersRequest(page_size=7))
        page2 = admin.ListDeadLetters(pb.ListDeadLettersRequest(
            page_size=7, page_token=page1.next_page_token))
        listed = [d.task_id for d in list(page1.entries) + list(page2.entries)]
        assert sorted(listed) == sorted(t.task_id for t in by_type["chaos.fail_always"])
        assert page2.next_page_token == ""
        again = by_type["chaos.fail_always"][0].task_id
        admin.RequeueDeadLetter(pb.RequeueDeadLetterRequest(task_id=again))
        wait_until(lambda: client.get_task(again).metadata.get("requeues") == "1"
                   and client.get_task(again).status == pb.TASK_STATUS_DEAD_LETTERED, 20,
                   "the requeued dead letter to run and dead-letter again")
        names = [q.name for q in admin.ListQueues(pb.ListQueuesRequest(page_size=100)).queues]
        assert set(names) == {*QUEUES, "held"}
        for q in QUEUES:
            wait_until(lambda q=q: not _backlog(env.rds, q), 20, f"queue {q} empty at rest")
    finally:
        channel.close()


def _all_terminal(client, ids: list[str]) -> dict[str, pb.Task] | None:
    tasks = {t: client.get_task(t) for t in ids}
    return tasks if all(t.status in TERMINAL for t in tasks.values()) else None


def _backlog(rds: RedisCluster, queue: str) -> int:
    return sum(rds.xlen(k) for k in keys.queue_streams_desc(queue))


def test_cluster_failover_during_a_workload_every_task_terminal(
        env: FailoverEnv, cluster: RedisClusterSetup) -> None:
    gw = env.gateway()
    client = env.client(gw.target)
    ids = enqueue_spread(client, QUEUES, 360, sleep_s=0.03)
    for i in (1, 2):
        env.worker(gw.target, f"w-{i}", queue=",".join(QUEUES), concurrency=4)
    wait_until(lambda: len(env.runs("done")) >= 30, 30, "some tasks to finish")
    assert len(env.runs("done")) < len(ids) / 2, "the failover should hit a running workload"
    # promote the replica of a primary that owns some of the queues
    owners = primaries_of(env.rds, QUEUES)
    replica = next(p for p in cluster.replicas()
                   if f"127.0.0.1:{cluster.primary_of(p)}" in owners.values())

    cluster.failover(replica)

    ids += enqueue_spread(client, QUEUES, 36)
    counts = check_at_least_once(env, client, ids, QUEUES)
    assert counts["tasks"] == len(set(ids))
    print(f"cluster failover to {replica}: {counts}")


def test_chains_groups_rate_limits_and_schedules_across_primaries(env: FailoverEnv) -> None:
    """The features whose keys came with the hash-tagged layout: a chain whose steps go to
    queues on different primaries, a group whose callback queue is on another one, a
    rate-limited queue and a periodic schedule, all served by one cluster-mode gateway."""
    owners = primaries_of(env.rds, QUEUES[:4])
    assert len(set(owners.values())) >= 2, owners
    gw = env.gateway()
    client = env.client(gw.target)
    channel = grpc.insecure_channel(gw.target)
    admin = dtq_pb2_grpc.AdminStub(channel)
    sleep = {"sleep_s": 0}
    try:
        admin.SetRateLimit(pb.SetRateLimitRequest(rate_limit=pb.RateLimit(
            queue=QUEUES[3], limit=1000, period_ms=1000, burst=1000)))
        admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
            name="every-1s", interval_ms=1000, task=pb.EnqueueRequest(
                queue=QUEUES[2], task_type="chaos.sleep", payload=b'{"sleep_s": 0}'))))
        first = client.enqueue(QUEUES[0], "chaos.sleep", sleep, chain=[
            {"queue": QUEUES[1], "task_type": "chaos.sleep", "payload": sleep},
            {"queue": QUEUES[2], "task_type": "chaos.sleep", "payload": sleep}])
        assert all(keys.key_slot(keys.task(t)) == keys.key_slot(keys.stream(q, 0))
                   for t, q in zip(first.chain_task_ids, QUEUES[1:3]))
        group = client.enqueue_group(
            [{"queue": q, "task_type": "chaos.sleep", "payload": sleep} for q in QUEUES[:4]],
            callback={"queue": QUEUES[1], "task_type": "chaos.sleep", "payload": sleep})
        limited = client.enqueue(QUEUES[3], "chaos.sleep", sleep)
        env.worker(gw.target, "w-all", queue=",".join(QUEUES[:4]), concurrency=4)
        assert client.wait_chain(first, 30).status == pb.TASK_STATUS_SUCCEEDED
        assert client.wait(group.callback_task_id, 30, missing_ok=True).status \
            == pb.TASK_STATUS_SUCCEEDED
        assert client.wait(limited.task_id, 30).status == pb.TASK_STATUS_SUCCEEDED
        wait_until(lambda: admin.GetSchedule(pb.GetScheduleRequest(
            name="every-1s")).schedule.fires_total >= 1, 20, "a schedule fire")
        fired = admin.GetSchedule(pb.GetScheduleRequest(name="every-1s")).schedule.last_task_id
        assert client.wait(fired, 20).status == pb.TASK_STATUS_SUCCEEDED
    finally:
        channel.close()


async def test_health_probe_and_eviction_watch_read_every_primary(
        cluster: RedisClusterSetup) -> None:
    """A primary other than the client's default node is evicting, then full, then
    paused (its PING unanswered): each turns the probe's verdict, as on one Redis."""
    client = make_client("cluster", cluster.url)
    policy = EvictionPolicyWatch(client, require=True, interval_s=0)
    probe = HealthProbe(client, health.aio.HealthServicer(), asyncio.Event(), policy,
                        interval_s=0.5, memory_check_s=0)
    await client.initialize()
    default = client.get_default_node().name
    other = next(n for n in client.get_primaries() if n.name != default)
    node = redis.Redis(host=other.host, port=other.port, socket_timeout=5)
    try:
        await probe.check_once()
        assert probe.redis_ok and not probe.memory_full and policy.policy == "noeviction"
        node.config_set("maxmemory-policy", "allkeys-lru")
        await probe.check_once()
        assert policy.refusing and policy.policy == "allkeys-lru"
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", 1)
        await probe.check_once()
        assert probe.memory_full and not policy.refusing
        node.config_set("maxmemory", 0)
        node.client_pause(2000)  # every client of that primary waits 2 s: PING times out
        await probe.check_once()
        assert not probe.redis_ok
        deadline = time.monotonic() + 10
        while not probe.redis_ok and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await probe.check_once()
        assert probe.redis_ok and not probe.memory_full and not policy.refusing
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", 0)
        node.close()
        await client.aclose()


async def test_cluster_client_makes_calls_wait_and_never_resends_them(
        cluster: RedisClusterSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    """400 concurrent pipelines (a read and a script) through a client allowed 4 calls
    in flight: every one completes, none fails for want of a connection (redis-py's
    cluster pool would fail them at once). A script whose reply times out is not re-sent
    (redis-py's cluster client would, up to 10 times): it ran once."""
    client = make_client("cluster", cluster.url, max_connections=4)
    await client.initialize()
    try:
        async def one(i: int) -> list:
            async with client.pipeline(transaction=False) as pipe:
                pipe.hget(f"h{{cq{i % 12}}}", "f")
                pipe.eval("return redis.call('INCR', KEYS[1])", 1, f"n{{cq{i % 12}}}")
                return await pipe.execute()

        await asyncio.gather(*(one(i) for i in range(400)))
        counts = [int(await client.get(f"n{{cq{q}}}")) for q in range(12)]
        assert sum(counts) == 400

        await client.aclose()
        monkeypatch.setattr(client_module, "SOCKET_TIMEOUT_S", 0.3)
        client = make_client("cluster", cluster.url)
        slow = ("redis.call('INCR', KEYS[1]); local t = redis.call('TIME'); repeat "
                "local n = redis.call('TIME') until (n[1] - t[1]) * 1000000 + (n[2] - t[2]) "
                "> 800000; return 1")
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.eval(slow, 1, "once{cq0}")
        node = client.get_node_from_key("once{cq0}")
        direct = redis.Redis(host=node.host, port=node.port, socket_timeout=10)
        try:  # a normal timeout: this GET waits for the script to end
            assert direct.get("once{cq0}") == b"1"
        finally:
            direct.close()
    finally:
        await client.aclose()


async def test_a_failing_node_fails_only_its_own_calls_of_a_pipeline(
        cluster: RedisClusterSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    """Script calls of one pipeline on all three primaries while one primary's connection
    fails as the calls are sent (a killed node): that primary's calls get the error, the
    others' replies stand. redis-py's cluster pipeline raises one error for all of them,
    and EnqueueBatch then reported items stored on healthy primaries as failed."""
    from dtq_gateway.store.errors import is_redis_outage
    from dtq_gateway.store.scripts import call_each

    client = make_client("cluster", cluster.url)
    await client.initialize()
    keys_ = [f"p{{cq{i}}}" for i in range(12)]
    nodes = {k: client.get_node_from_key(k).name for k in keys_}
    assert len(set(nodes.values())) == 3
    dead = client.get_node_from_key(keys_[0])

    from redis.asyncio.cluster import ClusterNode

    send = ClusterNode.execute_pipeline

    async def refused_by_dead(node, commands):
        if node.name == dead.name:
            raise redis.exceptions.ConnectionError(f"Error 111 connecting to {node.name}")
        return await send(node, commands)

    monkeypatch.setattr(ClusterNode, "execute_pipeline", refused_by_dead)
    try:
        replies = await call_each(client, _incr_script(), [([k], []) for k in keys_])
        for k, reply in zip(keys_, replies):
            if nodes[k] == dead.name:
                assert is_redis_outage(reply), (k, reply)
            else:
                assert reply == 1, (k, reply)
    finally:
        await client.aclose()


def _incr_script():
    """A Script whose body is INCR of its one key, run by Script's own queue/call paths
    (EVALSHA, then EVAL of the source on NOSCRIPT)."""
    from dtq_gateway.store.scripts import Script

    script = Script.__new__(Script)
    script.name, script.source = "incr", "return redis.call('INCR', KEYS[1])"
    script.sha = hashlib.sha1(script.source.encode()).hexdigest()
    return script


def test_bulk_cancels_search_and_keep_finished_across_primaries(env: FailoverEnv) -> None:
    """PurgeQueue, CancelTasks and SearchTasks over queues on all three primaries, and
    DTQ_KEEP_FINISHED trimmed by the acks and the bulk cancels themselves: every
    script touches one queue's slot (the trimmed records carry its slot tag)."""
    gw = env.gateway(extra={"keep-finished": "2"})
    client = env.client(gw.target)
    channel = grpc.insecure_channel(gw.target)
    admin = dtq_pb2_grpc.AdminStub(channel)
    try:
        items = [{"queue": q, "task_type": "chaos.sleep", "payload": {"sleep_s": 0},
                  "metadata": {"m": q, "half": str(i % 2)}}
                 for q in QUEUES for i in range(4)]
        ids = [r.task_id for r in client.enqueue_batch(items)]
        found = admin.SearchTasks(pb.SearchTasksRequest(filter=pb.TaskFilter(
            metadata={"m": "cq3"})))
        assert sorted(t.task_id for t in found.tasks) == sorted(
            t for t, i in zip(ids, items) if i["queue"] == "cq3")
        for n, q in enumerate(QUEUES):
            if n % 2:
                done = admin.PurgeQueue(pb.PurgeQueueRequest(queue=q))
                assert (done.matched, done.cancelled) == (4, 4)
            else:
                done = admin.CancelTasks(pb.CancelTasksRequest(filter=pb.TaskFilter(
                    queue=q, metadata={"half": "1"})))
                assert (done.matched, done.cancelled) == (2, 2)
        for q in QUEUES:
            assert env.rds.zcard(keys.finished(q)) == 2
        # the remaining half runs; the acks keep two finished records per queue too
        env.worker(gw.target, "w-all", queue=",".join(QUEUES), concurrency=4)
        survivors = [t for t, i in zip(ids, items)
                     if QUEUES.index(i["queue"]) % 2 == 0 and i["metadata"]["half"] == "0"]
        wait_until(lambda: all(client.get_task(t).status == pb.TASK_STATUS_SUCCEEDED
                               for t in survivors), 30, "every survivor succeeded")
        assert all(env.rds.zcard(keys.finished(q)) == 2 for q in QUEUES)
        # the newest two of each queue: the last two purged (in stream order), or the
        # two survivors, whose acks came after the cancels
        purged_last = {t for n, t in enumerate(ids)
                       if QUEUES.index(items[n]["queue"]) % 2 and n % 4 >= 2}
        assert {t for t in ids if env.rds.exists(keys.task(t))} == purged_last | {*survivors}
    finally:
        channel.close()


def test_debounce_on_all_three_primaries_through_two_gateways(env: FailoverEnv) -> None:
    """Each enqueue.lua call names only keys of its queue's slot (a cross-slot call
    fails on a cluster): bursts on queues of every primary, through two gateways."""
    a = env.client(env.gateway("deb-a").target)
    b = env.client(env.gateway("deb-b").target)
    last = {"key": "k", "window_ms": 60_000, "mode": "keep_last", "max_delay_ms": 120_000}
    first = {"key": "k", "window_ms": 60_000, "mode": "keep_first"}
    for q in QUEUES:
        burst = [c.enqueue(q, "chaos.sleep", {"n": n}, debounce=last)
                 for n, c in enumerate([a, b, a, b])]
        assert {r.task_id for r in burst} == {burst[0].task_id}
        assert [r.debounced for r in burst] == [False, True, True, True]
        assert a.get_task(burst[0].task_id).payload == {"n": 3}
        kept = [c.enqueue(f"{q}-first", "chaos.sleep", {"n": n}, debounce=first)
                for n, c in enumerate([b, a, b])]
        assert {r.task_id for r in kept} == {kept[0].task_id}
        assert [r.debounced for r in kept] == [False, True, True]
