"""lease_take.lua (read and activation in one call) against a private Redis, through
its typed wrapper (store.leasing.lease_take), table-driven."""

from __future__ import annotations

import time

import pytest

from dtq_gateway.leasing.sessions import Session
from dtq_gateway.store import keys
from dtq_gateway.store import leasing as store
from dtq_gateway.store.lease_replies import ActivationKind, LeaseRead
from dtq_gateway.store.leasing import LEASE_TAKE, TakeArgs
from tests.redis.test_core_scripts import BY_SLOT, Env
from tests.support.seed import seed_queue, snapshot_queue

OK, READ = ActivationKind.OK, ActivationKind.READ


@pytest.fixture
async def env(redis_url):
    e = Env(redis_url)
    await e.groups.ensure(e.redis, ["q"])
    yield e
    await e.redis.aclose()


async def take(env: Env, worker: str = "w1", types: frozenset[str] = frozenset(),
               most: int = 10) -> LeaseRead:
    session = Session(worker_id=worker, queues=["q"], max_in_flight=10)
    read = session.slot_reads[0]
    who = TakeArgs(worker, 10, types, 60)
    return await store.lease_take(env.redis, read, store.lease_take_call(read, who, most))


async def stale_entry(env: Env) -> str:
    tid = (await seed_queue(env.broker, env.settings))[0]
    await env.redis.xadd(keys.stream("q", 9), {"task_id": tid, "queue": "q", "task_type": "t",
                                               "payload": "", "attempt": "0",
                                               "max_attempts": "3", "priority": "9",
                                               "timeout_ms": "1000", "idempotency_key": ""})
    return tid


async def cancelled_after_enqueue(env: Env) -> str:
    tid = (await seed_queue(env.broker, env.settings))[0]
    # cancelled with its entry still in the stream (as if read just before the cancel)
    await env.redis.hset(keys.task(tid), "status", "cancelled")
    await env.redis.sadd(keys.cancelled("q"), tid)
    return tid


async def expired(env: Env) -> str:
    return (await seed_queue(env.broker, env.settings,
                             expires_at_ms=int(time.time() * 1000) + 30))[0]


@pytest.mark.parametrize("case, seed, kinds, statuses", [
    ("leases a queued task", lambda e: seed_queue(e.broker, e.settings),
     [OK], {"active"}),
    ("absorbs a stale entry, then leases the live one", stale_entry,
     [ActivationKind.ABSORBED, OK], {"active"}),
    ("acks away a task cancelled while queued", cancelled_after_enqueue,
     [ActivationKind.CANCELLED], set()),
])
async def test_take_outcomes(env, case, seed, kinds, statuses) -> None:
    await seed(env)
    got = await take(env)
    assert [e.activation.kind for e in got.entries] == kinds, case
    snap = await snapshot_queue(env.redis, "q")
    assert set(snap.tasks.values()) == statuses, case


async def test_expired_task_ends_expired_and_leaves_nothing(env) -> None:
    tid = await expired(env)
    deadline = time.time() + 2
    while time.time() * 1000 <= int(await env.redis.hget(keys.task(tid), "expires_at_ms")):
        assert time.time() < deadline
        await env.redis.ping()  # poll Redis time forward; no fixed sleep
    got = await take(env)
    assert [e.activation.kind for e in got.entries] == [ActivationKind.EXPIRED]
    assert await env.status(tid) == "expired"
    assert await snapshot_queue(env.redis, "q") == await snapshot_queue(env.redis, "none")


async def test_double_activation_gives_the_same_lease_to_its_consumer_only(env) -> None:
    """The script re-run after a lost reply finds the entry active: its consumer gets
    it again (activate_entry's fencing), the entry stays in the PEL."""
    (tid,) = await seed_queue(env.broker, env.settings)
    first = await take(env)
    entry = first.entries[0]
    again = await store.activate(env.redis, "w1", 60, [entry], ["a"])
    other = await store.activate(env.redis, "w2", 60, [entry], ["a"])
    assert (first.entries[0].activation.kind, again[0].activation.kind,
            other[0].activation.kind) == (OK, OK, ActivationKind.ABSORBED)
    assert again[0].activation.leased_at_ms == entry.activation.leased_at_ms
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {tid: "active"} and [c for _, c in snap.pel[5]] == ["w1"]


async def test_task_type_not_taken_is_put_back_at_the_tail(env) -> None:
    (a,) = await seed_queue(env.broker, env.settings, task_type="a")
    (b,) = await seed_queue(env.broker, env.settings, task_type="b")
    got = await take(env, types=frozenset({"b"}))
    assert [(e.task_id, e.activation.kind) for e in got.entries] == [
        (a, ActivationKind.REQUEUED), (b, OK)]
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {a: "queued", b: "active"} and len(snap.streams[5]) == 2


async def test_paused_queue_is_not_read(env) -> None:
    await seed_queue(env.broker, env.settings)
    await env.redis.set(keys.paused("q"), "1")
    got = await take(env)
    assert got.entries == [] and got.live_streams == 1


async def test_queue_wide_rate_limit_caps_the_take_and_returns_unused_tokens(env) -> None:
    await env.redis.hset(keys.rate_limit("q"), "cfg|*", "2 60000 2")
    tids = await seed_queue(env.broker, env.settings, count=3)
    await env.redis.hset(keys.task(tids[0]), "status", "cancelled")  # absorbed: token back
    got = await take(env)
    assert [e.activation.kind for e in got.entries] == [ActivationKind.CANCELLED, OK]
    assert got.limits.throttled == {"q"} and got.limits.wait_ms >= 1
    assert float(await env.redis.hget(keys.rate_limit("q"), "tok|*")) == pytest.approx(
        1.0, abs=0.01)


async def test_task_type_limits_leave_entries_for_the_two_step_path(env) -> None:
    await env.redis.hset(keys.rate_limit("q"), mapping={"cfg|t": "5 1000 5", "types": 1})
    (tid,) = await seed_queue(env.broker, env.settings)
    got = await take(env)
    assert [e.activation.kind for e in got.entries] == [READ]
    assert got.limits.typed == {"q"} and await env.status(tid) == "queued"


async def test_noscript_loads_the_script_and_runs_it_once(env) -> None:
    (tid,) = await seed_queue(env.broker, env.settings)
    await env.redis.script_flush()
    got = await take(env)
    assert [e.activation.kind for e in got.entries] == [OK]
    assert await env.redis.script_exists(LEASE_TAKE.current()[1]) == [True]
    assert await env.status(tid) == "active"


async def test_take_reads_at_most_the_whole_tokens_of_a_queue_wide_limit(env) -> None:
    """The queue-wide cap (docs/rate-limits.md, moved here from lease_read's test): a
    throttled task is never read, it stays queued in its stream."""
    await env.redis.hset(keys.rate_limit("q"), "cfg|*", "3 60000 3")
    tids = await seed_queue(env.broker, env.settings, count=5)
    got = await take(env)
    assert [e.task_id for e in got.entries] == tids[:3]
    assert (got.limits.limited, got.limits.throttled, got.limits.typed) == ({"q"}, {"q"}, set())
    assert 0 < got.limits.wait_ms <= 20_000
    again = await take(env)
    assert again.entries == [] and again.limits.throttled == {"q"}
    snap = await snapshot_queue(env.redis, "q")
    assert [snap.tasks[t] for t in tids] == ["active"] * 3 + ["queued"] * 2


@BY_SLOT
async def test_noscript_in_the_check_and_take_pipeline_reruns_each_call_once(
        env, read_by_slot) -> None:
    """The session's pipeline (worker_check + lease_take, or lease_take alone) after
    SCRIPT FLUSH: its calls come back NOSCRIPT (they ran nothing) and are re-run from
    source, once."""
    (tid,) = await seed_queue(env.broker, env.settings)
    await env.redis.script_flush()
    session = Session(worker_id="w1", queues=["q"], max_in_flight=10,
                      read_by_slot=read_by_slot)
    assert (await env.dispatcher.lease_now(session))[0] == 1
    assert session.out.get_nowait().task_id == tid
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {tid: "active"} and len(snap.pel[5]) == 1


async def test_an_entry_without_idem_digest_goes_the_two_step_way(env) -> None:
    """An entry written before ``idem_digest`` existed: lease_take cannot name its
    idempotency record (a SHA-256 of the key), so it leaves it to activate.lua."""
    (tid,) = await seed_queue(env.broker, env.settings, idempotency_key="k")
    stream = keys.stream("q", 5)
    ((old_id, fields),) = await env.redis.xrange(stream)
    fields.pop(b"idem_digest")
    await env.redis.xdel(stream, old_id)
    new_id = await env.redis.xadd(stream, fields)
    await env.redis.hset(keys.task(tid), "entry_id", new_id)
    got = await take(env)
    assert [(e.task_id, e.activation.kind) for e in got.entries] == [(tid, READ)]
    (done,) = await store.activate(env.redis, "w1", 60, got.entries, ["a"])
    assert done.activation.kind is OK and await env.status(tid) == "active"


async def take_one(env: Env, types: frozenset[str], scan_max: int | None = None
                   ) -> LeaseRead:
    """A lease_take for a session with max_in_flight 1 taking ``types``."""
    session = Session(worker_id="w1", queues=["q"], max_in_flight=1)
    read = session.slot_reads[0]
    who = TakeArgs("w1", 1, types, 60)
    return await store.lease_take(env.redis, read, store.lease_take_call(
        read, who, 1, scan_max=scan_max))


async def test_one_call_scans_past_unwanted_entries_to_the_wanted_one(env) -> None:
    """Credit 1 behind 40 entries the session does not take: one call puts all 40 back
    (in their order, at the tail) and leases the task behind them."""
    unwanted = await seed_queue(env.broker, env.settings, count=40, task_type="a")
    (b,) = await seed_queue(env.broker, env.settings, task_type="b")
    got = await take_one(env, frozenset({"b"}))
    assert [(e.task_id, e.activation.kind) for e in got.entries] == [
        (t, ActivationKind.REQUEUED) for t in unwanted] + [(b, OK)]
    assert not got.cut and all(e.payload == b"" for e in got.entries[:-1])
    snap = await snapshot_queue(env.redis, "q")
    assert snap.tasks == {**dict.fromkeys(unwanted, "queued"), b: "active"}
    stream = await env.redis.xrange(keys.stream("q", 5))  # b's entry first (leased)
    assert [f[b"task_id"].decode() for _, f in stream] == [b] + unwanted


async def test_the_scan_bound_caps_the_entries_one_call_reads(env) -> None:
    unwanted = await seed_queue(env.broker, env.settings, count=20, task_type="a")
    (b,) = await seed_queue(env.broker, env.settings, task_type="b")
    got = await take_one(env, frozenset({"b"}), scan_max=8)
    assert [(e.task_id, e.activation.kind) for e in got.entries] == [
        (t, ActivationKind.REQUEUED) for t in unwanted[:8]]
    assert got.cut and await env.status(b) == "queued"
    again = await take_one(env, frozenset({"b"}), scan_max=16)
    assert [e.task_id for e in again.entries] == unwanted[8:20] + [b]
    assert not again.cut and await env.status(b) == "active"


async def test_a_stream_of_only_unwanted_entries_is_read_once_per_call(env) -> None:
    """The put-back copies are not read again in the same call: 5 reads, not 256."""
    unwanted = await seed_queue(env.broker, env.settings, count=5, task_type="a")
    got = await take_one(env, frozenset({"b"}))
    assert [e.task_id for e in got.entries] == unwanted and not got.cut
    snap = await snapshot_queue(env.redis, "q")
    assert set(snap.tasks.values()) == {"queued"} and len(snap.streams[5]) == 5


async def test_scanning_past_a_band_of_unwanted_entries_reaches_a_lower_band(env) -> None:
    """Strict p9 -> p0 within the call: the p9 entries it lacks the labels for are put
    back first, then the p5 task is leased."""
    gpu = await seed_queue(env.broker, env.settings, count=3, priority=9,
                           required_labels={"gpu": "a100"})
    (plain,) = await seed_queue(env.broker, env.settings, priority=5)
    got = await take_one(env, frozenset())
    assert [(e.task_id, e.activation.kind) for e in got.entries] == [
        (t, ActivationKind.REQUEUED) for t in gpu] + [(plain, OK)]
