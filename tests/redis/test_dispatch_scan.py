"""The dispatcher re-reads at once while lease_take's scan bound cut a read that put
entries back (dispatch.SCAN_REREADS), and stops doing so on a stream of nothing but
entries the session does not take (no busy loop: the tick reads it later)."""

from __future__ import annotations

from dtq_gateway.leasing.dispatch import LIMIT_REREADS, SCAN_REREADS
from tests.redis.dispatch_support import drained
from tests.support.seed import seed_queue

ROUNDS_MAX = 1 + SCAN_REREADS + LIMIT_REREADS


async def rounds_until_idle(env) -> int:
    """Run the first round as a tick, then one round per wake-up until none is left
    (at most ROUNDS_MAX + 5); returns how many rounds ran."""
    d = env.dispatcher
    d._wake.clear()
    await d.run_round(tick=True)
    rounds = 1
    while d._wake.is_set() and rounds < ROUNDS_MAX + 5:
        d._wake.clear()
        await d.run_round()
        rounds += 1
    return rounds


async def test_a_session_gets_past_more_entries_than_limit_rereads_scan_at_once(
        dispatch_env) -> None:
    """6 × 256 unwanted entries ahead: more than 1 + LIMIT_REREADS reads of 256."""
    s = dispatch_env.session(max_in_flight=1, task_types=frozenset({"b"}))
    dispatch_env.broker.read_ahead = None
    for _ in range(2):
        await seed_queue(dispatch_env.broker, dispatch_env.settings, count=768, task_type="a")
    tid = await dispatch_env.enqueue(task_type="b")
    await rounds_until_idle(dispatch_env)
    assert [t.task_id for t in drained(s)] == [tid]


async def test_rereads_stop_on_a_stream_of_only_unwanted_entries(dispatch_env) -> None:
    s = dispatch_env.session(max_in_flight=1, task_types=frozenset({"b"}))
    dispatch_env.broker.read_ahead = None
    await seed_queue(dispatch_env.broker, dispatch_env.settings, count=600, task_type="a")
    rounds = await rounds_until_idle(dispatch_env)
    assert rounds <= ROUNDS_MAX and drained(s) == []
    assert dispatch_env.own_reads == rounds
