"""Periodic schedules through dtq.v1.Admin on an in-process gateway and real Redis.

The gateway is the scheduler leader (it is alone); its firer ticks every 0.5 s.
Fire times are read back from the tasks' metadata (``dtq.fire_ms``) and idempotency
keys, so each test checks which fires became tasks, not only how many.
"""

from __future__ import annotations

import grpc
import pytest

from dtq_gateway.domain.schedule_plan import ON_TIME_MS
from dtq_gateway.store import keys
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc
from tests.support.leasing import error_field, error_reason, poll

H = 3_600_000


@pytest.fixture
def admin(channel):
    return dtq_pb2_grpc.AdminStub(channel)


@pytest.fixture
def redis(gateway):
    return gateway.redis


def task(queue: str = "sched", **kw) -> pb.EnqueueRequest:
    return pb.EnqueueRequest(queue=queue, task_type="tick", payload=b'{"n": 1}', **kw)


async def fires_of(redis, name: str) -> dict[int, dict]:
    """fire_ms -> task hash of every task the schedule ``name`` enqueued."""
    out = {}
    for tid in await redis.zrange(keys.RECENT_TASKS, 0, -1):
        h = await redis.hgetall(keys.task(tid.decode()))
        if h.get(b"idem_key", b"").startswith(f"schedule:{name}:".encode()):
            fire = int(h[b"idem_key"].rsplit(b":", 1)[1])
            assert fire not in out, "one fire enqueued twice"
            out[fire] = h
    return out


async def test_interval_schedule_fires_once_per_period(admin, redis) -> None:
    created = await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
        name="every-second", interval_ms=1000, task=task(priority=7, max_attempts=2))))
    assert created.created and created.schedule.next_fire_ms == \
        created.schedule.created_at_ms + 1000
    info = await poll(lambda: admin.GetSchedule(pb.GetScheduleRequest(name="every-second")),
                      lambda r: r.schedule.fires_total >= 3, timeout_s=15)  # ~3.5 s
    fires = await fires_of(redis, "every-second")
    anchor = info.schedule.created_at_ms
    assert sorted(fires)[:3] == [anchor + 1000, anchor + 2000, anchor + 3000]
    first = fires[anchor + 1000]
    assert (first[b"queue"], first[b"task_type"], first[b"priority"], first[b"max_attempts"]) \
        == (b"sched", b"tick", b"7", b"2")
    assert b'"dtq.schedule": "every-second"' in first[b"metadata"] or \
        b'"dtq.schedule":"every-second"' in first[b"metadata"]
    assert info.schedule.last_fire_ms in fires
    assert info.schedule.next_fire_ms > info.schedule.last_fire_ms


async def rewind(redis, name: str, done_ms: int) -> None:
    """Pretend no gateway ran since ``done_ms``: the schedule is due at once."""
    await redis.hset(keys.periodic_schedule(name), "done_ms", done_ms)
    await redis.zadd(keys.SCHEDULES, {name: 0})


async def clear_of_the_hour(redis, after_ms: int = ON_TIME_MS + 5_000,
                            before_ms: int = 15_000) -> None:
    """Return once Redis's clock is at least ``after_ms`` past a full UTC hour and
    ``before_ms`` before the next one. The fire at the full hour is then a missed one:
    up to ON_TIME_MS after it, it is on time and enqueued whatever the policy (SKIP
    too). And the next hour's real fire cannot fall inside the test, where it would be
    told apart from a caught-up fire by nothing but luck. Waits at most
    ``after_ms + before_ms`` ms, by polling Redis's clock."""
    async def into_hour() -> int:
        sec, usec = await redis.time()
        return (int(sec) * 1000 + int(usec) // 1000) % H
    await poll(into_hour, lambda ms: after_ms <= ms <= H - before_ms,
               timeout_s=(after_ms + before_ms) / 1000 + 5, interval_s=0.2)


@pytest.mark.parametrize("catch_up, expected", [
    (pb.SCHEDULE_CATCH_UP_SKIP, []),
    (pb.SCHEDULE_CATCH_UP_LATEST, [0]),
    (pb.SCHEDULE_CATCH_UP_ALL, [-2, -1, 0]),
])
async def test_cron_with_time_zone_and_missed_fire_policy(admin, redis, catch_up, expected
                                                          ) -> None:
    """Half past every hour in Kolkata (UTC+5:30) is every full hour in UTC. Three
    hourly fires are missed while "no gateway ran"; the policy decides which are
    enqueued once a leader runs again."""
    name = f"kolkata-{catch_up}"
    await clear_of_the_hour(redis)
    await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
        name=name, cron="30 * * * *", timezone="Asia/Kolkata", task=task(),
        catch_up=catch_up, catch_up_max_fires=5)))
    sec, _ = await redis.time()
    hour = int(sec) * 1000 // H * H
    await rewind(redis, name, hour - 3 * H + 1)
    await poll(lambda: redis.zscore(keys.SCHEDULES, name), lambda s: s == hour + H,
               timeout_s=5)  # the leader handled it: the next fire is in the registry
    assert sorted(await fires_of(redis, name)) == [hour + k * H for k in expected]
    info = await admin.GetSchedule(pb.GetScheduleRequest(name=name))
    assert info.schedule.fires_total == len(expected)
    assert info.schedule.next_fire_ms == hour + H


async def test_pause_trigger_resume_delete(admin, redis) -> None:
    await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
        name="manual", interval_ms=1000, task=task(), paused=True)))
    got = (await admin.GetSchedule(pb.GetScheduleRequest(name="manual"))).schedule
    assert got.schedule.paused and got.next_fire_ms == 0
    assert await redis.zscore(keys.SCHEDULES, "manual") == float("inf")

    trig = await admin.TriggerSchedule(pb.TriggerScheduleRequest(name="manual"))
    assert await redis.hget(keys.task(trig.task_id), "queue") == b"sched"
    got = (await admin.GetSchedule(pb.GetScheduleRequest(name="manual"))).schedule
    assert (got.last_task_id, got.fires_total) == (trig.task_id, 0)

    resumed = (await admin.ResumeSchedule(pb.ResumeScheduleRequest(name="manual"))).schedule
    assert not resumed.schedule.paused and resumed.next_fire_ms > 0
    await poll(lambda: admin.GetSchedule(pb.GetScheduleRequest(name="manual")),
               lambda r: r.schedule.fires_total >= 1, timeout_s=10)  # ~1.5 s
    paused = (await admin.PauseSchedule(pb.PauseScheduleRequest(name="manual"))).schedule
    assert paused.schedule.paused

    listed = await admin.ListSchedules(pb.ListSchedulesRequest())
    assert [s.schedule.name for s in listed.schedules] == ["manual"]
    assert (await admin.DeleteSchedule(pb.DeleteScheduleRequest(name="manual"))).deleted
    assert not (await admin.DeleteSchedule(pb.DeleteScheduleRequest(name="manual"))).deleted
    assert not await redis.exists(keys.periodic_schedule("manual"))
    assert await redis.zcard(keys.SCHEDULES) == 0
    for call, req in ((admin.GetSchedule, pb.GetScheduleRequest(name="manual")),
                      (admin.TriggerSchedule, pb.TriggerScheduleRequest(name="manual")),
                      (admin.PauseSchedule, pb.PauseScheduleRequest(name="manual"))):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(req)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_list_schedules_pages_by_name(admin) -> None:
    for i in (3, 1, 2):
        await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
            name=f"s{i}", cron="@daily", task=task())))
    first = await admin.ListSchedules(pb.ListSchedulesRequest(page_size=2))
    assert [s.schedule.name for s in first.schedules] == ["s1", "s2"]
    rest = await admin.ListSchedules(pb.ListSchedulesRequest(page_token=first.next_page_token))
    assert [s.schedule.name for s in rest.schedules] == ["s3"] and not rest.next_page_token


@pytest.mark.parametrize("schedule, field", [
    (pb.Schedule(name="x", cron="not cron", task=task()), "schedule.cron"),
    (pb.Schedule(name="x", cron="* * * * *", timezone="Nowhere/Void", task=task()),
     "schedule.timezone"),
    (pb.Schedule(name="x", interval_ms=1000), "schedule.task.queue"),
    (pb.Schedule(name="x", interval_ms=1000, task=task(idempotency_key="k")),
     "schedule.task.idempotency_key"),
    (pb.Schedule(name="x", interval_ms=1000, task=task(priority=12)), "schedule.task.priority"),
])
async def test_bad_schedules_are_refused_naming_the_field(admin, redis, schedule, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_field(err.value) == field
    assert not await redis.exists(keys.SCHEDULES, keys.periodic_schedule("x"))


async def test_a_name_is_taken_until_replaced(admin) -> None:
    req = pb.CreateScheduleRequest(schedule=pb.Schedule(name="dup", cron="@hourly", task=task()))
    await admin.CreateSchedule(req)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await admin.CreateSchedule(req)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(err.value) == "ALREADY_EXISTS"
    req.replace = True
    req.schedule.cron = "@daily"
    replaced = await admin.CreateSchedule(req)
    assert not replaced.created and replaced.schedule.schedule.cron == "@daily"


async def test_schedules_are_capped_by_max_schedules(redis_url) -> None:
    """DTQ_MAX_SCHEDULES: a new name beyond it is RESOURCE_EXHAUSTED (TOO_MANY_SCHEDULES),
    stores nothing and is counted; replacing an existing schedule still works."""
    from prometheus_client import REGISTRY

    from dtq_gateway.server import Gateway
    from tests.conftest import gateway_settings

    def refused() -> float:
        return REGISTRY.get_sample_value("dtq_limit_refusals_total",
                                         {"limit": "max_schedules"}) or 0.0

    gw = Gateway(gateway_settings(redis_url, max_schedules=3), redis_url)
    await gw.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}")
    admin = dtq_pb2_grpc.AdminStub(ch)
    try:
        for i in range(3):
            await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
                name=f"s{i}", cron="@yearly", task=task())))
        before = refused()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
                name="s3", cron="@yearly", task=task())))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(err.value) == "TOO_MANY_SCHEDULES"
        assert error_field(err.value) == "schedule.name"
        assert refused() == before + 1
        assert not await gw.redis.exists(keys.periodic_schedule("s3"))
        assert await gw.redis.zcard(keys.SCHEDULES) == 3
        replaced = await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
            name="s0", cron="@monthly", task=task()), replace=True))
        assert not replaced.created and replaced.schedule.schedule.cron == "@monthly"
    finally:
        await ch.close()
        await gw.stop()


async def _command_calls(redis, command: str) -> int:
    return int((await redis.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_list_schedules_reads_only_the_page(admin, redis) -> None:
    """A page of 1 reads one schedule hash and never the whole registry, and schedules
    stored before the name index existed are listed all the same."""
    names = [f"s{i:03d}" for i in range(200)]
    for name in names:
        await admin.CreateSchedule(pb.CreateScheduleRequest(schedule=pb.Schedule(
            name=name, cron="@yearly", task=task())))
    await admin.ListSchedules(pb.ListSchedulesRequest(page_size=1))  # index checked once
    zrange, hgetall = await _command_calls(redis, "zrange"), await _command_calls(redis, "hgetall")
    page = await admin.ListSchedules(pb.ListSchedulesRequest(page_size=1, page_token="s099"))
    assert [s.schedule.name for s in page.schedules] == ["s100"]
    assert page.next_page_token == "s100"
    assert await _command_calls(redis, "zrange") == zrange  # the registry was not read
    assert await _command_calls(redis, "hgetall") == hgetall + 1
    # data from before the index: it is built once, then pages as before
    await redis.delete(keys.SCHEDULE_NAMES, keys.SCHEDULE_NAMES_BUILT)
    listed, token = [], ""
    while True:
        reply = await admin.ListSchedules(pb.ListSchedulesRequest(page_size=64,
                                                                  page_token=token))
        listed += [s.schedule.name for s in reply.schedules]
        token = reply.next_page_token
        if not token:
            break
    assert listed == names
    await admin.DeleteSchedule(pb.DeleteScheduleRequest(name="s000"))
    assert await redis.zscore(keys.SCHEDULE_NAMES, "s000") is None
