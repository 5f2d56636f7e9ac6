"""Property-based fuzzing of every RPC through the real gRPC API (hypothesis).

A real gateway (its own thread and event loop, auth on) and a private redis-server
receive generated requests for every method of dtq.v1.Broker, dtq.v1.Admin and
dtq.v1.Events, with and without a token, plus raw bodies that are not valid
protobuf. Asserted for every call: the status is one the protocol documents (never
INTERNAL, UNKNOWN or, with Redis up, UNAVAILABLE); nothing is logged at ERROR; the
gateway still answers afterwards; and Redis stays consistent: every live task record
has its stream entry or schedule member, and every entry and member has its record.

Then a workflow fuzz drives the features that need state to reach: chains, groups,
schedules, rate limits and progress, with leases taken and ended (Ack, Fail, retry,
progress reports, leases left to expire) and idempotency keys that copy the gateway's
internal ones (``chain:<id>``, ``group:<id>``, ``schedule:<name>:<next fire>``). After
each run Redis must hold no dangling reference (tests/support/dangling.py): every id a
record names (next step, chain head, group and its members and callback, idempotency
record, schedule's last task, pending sets, dead-letter entries) names a record.

Bounded: derandomized, no example database, a fixed number of examples per method
(about 16 s in all on a shared 2-core machine, the workflow fuzz about 6 s of it).
"""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc
import pytest
import redis
from google.protobuf import descriptor as d
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtq_gateway.server import Gateway
from dtq_proto import dtq_pb2
from tests.conftest import gateway_settings
from tests.support.dangling import assert_no_dangling_references

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
TOKENS = "fz-admin-token=admin:fuzz-admin,fz-worker-token=worker:fuzz-worker"
ADMIN = (("authorization", "Bearer fz-admin-token"),)
WORKER = (("authorization", "Bearer fz-worker-token"),)
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
           grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE,
           # the client's own deadline or cancel on a stream it stops reading
           grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

#: Values that reach deeper than random text: names the gateway accepts, known ids.
QUEUES = st.sampled_from(["fz", "fz2", "q", "a.b-c_d"])
NICE_TEXT = {
    "queue": QUEUES, "worker_id": st.sampled_from(["fw1", "fw2", "host:1@x"]),
    "task_type": st.sampled_from(["t", "a/b:c"]), "content_type": st.sampled_from(
        ["", "application/json", "text/plain", "application/x+json", "application/json;q"]),
    # schedules (CreateSchedule and the rest), rate limits, progress, internal keys
    "name": st.sampled_from(["fz-s1", "fz-s2", "fz.s_3"]),
    "cron": st.sampled_from(["* * * * *", "*/5 * * * *", "0 0 29 2 *", "@hourly", "61 * * * *",
                             "* * * *", "0 0 * * 1-5"]),
    "timezone": st.sampled_from(["", "UTC", "Europe/Berlin", "Mars/Olympus", "../etc"]),
    "idempotency_key": st.sampled_from(["k1", "k2", "schedule:fz-s1:0", "chain:x", "group:y"]),
    "message": st.sampled_from(["", "half way", "\u00e9" * 300]),
}
JSON_PAYLOADS = st.sampled_from([b"", b"{}", b'{"a": [1, 2]}', b"NaN", b"[" * 1200,
                                 b"\xff\xfe{", '{"a":1}'.encode("utf-16"), b'"x"'])


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class ThreadGateway:
    """A gateway on its own event loop in a daemon thread (the test drives it with a
    blocking client, which hypothesis needs)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        settings_ = gateway_settings(url, auth_tokens=TOKENS, max_queues=50,
                                     visibility_timeout_s=1, heartbeat_interval_s=0.25)

        async def start() -> Gateway:
            gw = Gateway(settings_, url)  # grpc.aio binds the server to the running loop
            await gw.start()
            return gw

        self.gw = self.run(start())

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.run(self.gw.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def fuzz_env(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    tg = ThreadGateway(redis_server.url)
    channel = grpc.insecure_channel(f"127.0.0.1:{tg.gw.port}")
    yield channel, client, errors
    channel.close()
    tg.stop()
    logging.getLogger().removeHandler(errors)
    client.close()


# -- generated messages -------------------------------------------------------------
_INT_RANGES = {
    d.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    d.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, -1, lo, hi, 1000, 86_400_000, 2**31, 2**53) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _scalar(field: d.FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t == d.FieldDescriptor.TYPE_STRING:
        base = st.text(max_size=40)
        if field.name in NICE_TEXT:
            return st.one_of(NICE_TEXT[field.name], NICE_TEXT[field.name], base)
        if field.name.endswith(("lease_id", "lease_ids")):
            return st.one_of(st.just("2|" + "a" * 32 + "|fz|5|1-0|1|fw1|-|" + "0" * 16 + "|"
                                     + "A" * 22), base)
        if field.name.endswith("task_id"):
            return st.one_of(st.text("0123456789abcdef", min_size=32, max_size=32), base)
        if field.name == "page_token":
            return st.one_of(st.sampled_from(["0-0", "1-1", "18446744073709551616-0", "q"]),
                             base)
        return base
    if t == d.FieldDescriptor.TYPE_BYTES:
        if field.name == "payload":
            return st.one_of(JSON_PAYLOADS, st.binary(max_size=64))
        return st.binary(max_size=64)
    if t == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == d.FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values] + [99])
    if t in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32 if t == d.FieldDescriptor.TYPE_FLOAT else 64)
    return _ints(*_INT_RANGES[t])


def messages(desc: d.Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of type ``desc`` with any subset of fields set to generated values."""
    cls = getattr(dtq_pb2, desc.name, None) if desc.file.name.endswith("dtq.proto") else None

    @st.composite
    def build(draw):
        from google.protobuf import message_factory

        msg = (cls or message_factory.GetMessageClass(desc))()
        for field in desc.fields:
            if not draw(st.booleans()):
                continue
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key_f, val_f = field.message_type.fields_by_name["key"], \
                    field.message_type.fields_by_name["value"]
                for k, v in draw(st.dictionaries(_scalar(key_f), _scalar(val_f),
                                                 max_size=3)).items():
                    getattr(msg, field.name)[k] = v
            elif field.message_type is not None:
                if depth >= 3:
                    continue
                sub = messages(field.message_type, depth + 1)
                if field.is_repeated:
                    getattr(msg, field.name).extend(draw(st.lists(sub, max_size=3)))
                else:
                    getattr(msg, field.name).CopyFrom(draw(sub))
            elif field.is_repeated:
                getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
            else:
                setattr(msg, field.name, draw(_scalar(field)))
        return msg

    return build()


METHODS = [(svc.name, m) for svc in dtq_pb2.DESCRIPTOR.services_by_name.values()
           for m in svc.methods]


def _call(channel, service: str, method: d.MethodDescriptor, body: bytes,
          metadata) -> grpc.StatusCode:
    path = f"/dtq.v1.{service}/{method.name}"
    try:
        if method.server_streaming:
            call = channel.unary_stream(path)(body, metadata=metadata, timeout=0.5)
            for n, _ in enumerate(call):
                if n >= 2:
                    call.cancel()
                    return grpc.StatusCode.OK
            return grpc.StatusCode.OK
        channel.unary_unary(path)(body, metadata=metadata, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def _check(code: grpc.StatusCode, path: str, errors: ErrorLog) -> None:
    assert code in ALLOWED, (path, code)
    assert not errors.records, [r.getMessage() for r in errors.records]


@pytest.mark.parametrize(("service", "method"), METHODS,
                         ids=[f"{s}.{m.name}" for s, m in METHODS])
def test_generated_requests_get_documented_statuses(fuzz_env, service, method):
    channel, _, errors = fuzz_env

    @FUZZ
    @given(msg=messages(method.input_type), who=st.sampled_from([ADMIN, WORKER, ()]))
    def run(msg, who):
        code = _call(channel, service, method, msg.SerializeToString(), who)
        _check(code, method.full_name, errors)

    run()


@FUZZ
@given(body=st.one_of(st.binary(max_size=80), st.sampled_from([
    bytes.fromhex("0a04773434ff"), bytes.fromhex("0a0a7734"), b"\xff" * 10, b"\x08" + b"\xff" * 11,
    bytes.fromhex("1a03") + b"\xc3\x28\x00", b"\x0a\x80\x80\x80\x80\x10"])),
    index=st.integers(0, len(METHODS) - 1), who=st.sampled_from([ADMIN, ()]))
def test_raw_malformed_bodies_get_documented_statuses(fuzz_env, body, index, who):
    channel, _, errors = fuzz_env
    service, method = METHODS[index]
    code = _call(channel, service, method, body, who)
    _check(code, method.full_name, errors)
    if not who:
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method.full_name, code)


# -- workflow fuzz: chains, groups, schedules, rate limits, progress --------------------
FLOW = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
FLOW_QUEUES = ("fz", "fz2")
#: What a producer may copy into its idempotency key: a plain key, or the text of one of
#: the gateway's internal keys for a chain head, a group or a schedule's next fire.
IDEM = st.sampled_from(["", "", "k1", "chain", "chain", "group", "group", "schedule"])
_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=32)
OPS = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(FLOW_QUEUES), st.integers(0, 2),
              st.sampled_from(FLOW_QUEUES), IDEM, st.integers(0, 9)),
    st.tuples(st.just("batch"), st.integers(1, 3), st.sampled_from(FLOW_QUEUES), IDEM),
    st.tuples(st.just("work"), st.integers(1, 4),
              st.lists(st.tuples(st.sampled_from(["ack", "fail", "retry", "release", "keep"]),
                                 _FLOAT, st.sampled_from([b"", b"{}", b'{"n": 2}', b"\xff"])),
                       min_size=4, max_size=4)),
    st.tuples(st.just("cancel"), st.integers(0, 1000)),
    st.tuples(st.just("schedule"), st.sampled_from(["create", "trigger", "pause", "resume",
                                                    "delete"]), st.sampled_from(FLOW_QUEUES)),
    st.tuples(st.just("ratelimit"), st.sampled_from(FLOW_QUEUES),
              st.sampled_from(["", "t", "u"]), st.integers(0, 50), st.booleans()),
)


class Flow:
    """One workflow run's client side: what it made, so that later steps name it."""

    def __init__(self, channel) -> None:
        from dtq_proto import dtq_pb2_grpc

        self.broker = dtq_pb2_grpc.BrokerStub(channel)
        self.admin = dtq_pb2_grpc.AdminStub(channel)
        self.channel = channel
        self.tasks: list[str] = []
        self.groups: list[str] = []
        self.workers = 0

    def call(self, fn, request):
        """One unary call as the admin; its reply, or None for a documented refusal."""
        try:
            return fn(request, metadata=ADMIN, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED, (type(request).__name__, exc.code(), exc.details())
            return None

    def idem_key(self, kind: str, pick: int = 0) -> str:
        if kind == "chain" and self.tasks:
            return f"chain:{self.tasks[pick % len(self.tasks)]}"
        if kind == "group" and self.groups:
            return f"group:{self.groups[pick % len(self.groups)]}"
        if kind == "schedule":
            got = self.call(self.admin.GetSchedule, dtq_pb2.GetScheduleRequest(name="fz-flow"))
            return f"schedule:fz-flow:{got.schedule.next_fire_ms}" if got else "k2"
        return "" if kind in ("chain", "group") else kind

    def task(self, queue: str, idem: str = "", **kw) -> dtq_pb2.EnqueueRequest:
        kw.setdefault("payload", b"{}")
        return dtq_pb2.EnqueueRequest(queue=queue, task_type="t", idempotency_key=idem, **kw)

    def run(self, op: tuple) -> None:
        getattr(self, "op_" + op[0])(*op[1:])

    def op_enqueue(self, queue, steps, step_queue, idem, pick) -> None:
        chain = [self.task(step_queue, payload=b"") for _ in range(steps)]
        r = self.call(self.broker.Enqueue, self.task(queue, self.idem_key(idem, pick),
                                                     chain=chain))
        if r:
            self.tasks.append(r.task_id)

    def op_batch(self, n, cb_queue, idem) -> None:
        r = self.call(self.broker.EnqueueBatch, dtq_pb2.EnqueueBatchRequest(
            items=[self.task(FLOW_QUEUES[i % 2], self.idem_key(idem, i)) for i in range(n)],
            group_callback=self.task(cb_queue, payload=b"")))
        if r:
            self.groups.append(r.group_id)
            self.tasks.extend(x.task_id for x in r.results if x.task_id)

    def op_work(self, n, plan) -> int:
        """Lease up to n tasks, report progress on each, then end each as planned;
        returns how many were leased."""
        self.workers += 1
        worker = f"fz-flow-{self.workers}"
        call = self.channel.unary_stream("/dtq.v1.Broker/Lease")(
            dtq_pb2.LeaseRequest(worker_id=worker, queues=list(FLOW_QUEUES),
                                 max_in_flight=n).SerializeToString(),
            metadata=ADMIN, timeout=0.6)
        leased = []
        try:
            for raw in call:
                resp = dtq_pb2.LeaseResponse.FromString(raw)
                if resp.HasField("task"):
                    leased.append(resp.task)
                    if len(leased) >= n:
                        call.cancel()
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED, exc
        for task, (how, percent, result) in zip(leased, plan):
            self.call(self.broker.Heartbeat, dtq_pb2.HeartbeatRequest(
                worker_id=worker, lease_ids=[task.lease_id], progress=[dtq_pb2.TaskProgress(
                    lease_id=task.lease_id, percent=percent, message="working")]))
            if how == "ack":
                self.call(self.broker.Ack, dtq_pb2.AckRequest(items=[dtq_pb2.AckItem(
                    lease_id=task.lease_id, result=result)]))
            elif how != "keep":  # keep: the lease expires and the reaper takes it back
                mode = dtq_pb2.FAIL_MODE_RELEASE if how == "release" else 0
                self.call(self.broker.Fail, dtq_pb2.FailRequest(items=[dtq_pb2.FailItem(
                    lease_id=task.lease_id, error_message="boom", error_class="E",
                    retryable=how == "retry", retry_after_ms=1, mode=mode)]))
        return len(leased)

    def op_cancel(self, pick) -> None:
        if self.tasks:
            self.call(self.broker.CancelTask, dtq_pb2.CancelTaskRequest(
                task_id=self.tasks[pick % len(self.tasks)]))

    def op_schedule(self, what, queue) -> None:
        if what == "create":
            self.call(self.admin.CreateSchedule, dtq_pb2.CreateScheduleRequest(
                schedule=dtq_pb2.Schedule(name="fz-flow", interval_ms=1000,
                                          task=self.task(queue)), replace=True))
            return
        cls = {"trigger": dtq_pb2.TriggerScheduleRequest, "pause": dtq_pb2.PauseScheduleRequest,
               "resume": dtq_pb2.ResumeScheduleRequest,
               "delete": dtq_pb2.DeleteScheduleRequest}[what]
        method = getattr(self.admin, what.capitalize() + "Schedule")
        r = self.call(method, cls(name="fz-flow"))
        if what == "trigger" and r:
            self.tasks.append(r.task_id)

    def op_ratelimit(self, queue, task_type, limit, delete) -> None:
        if delete:
            self.call(self.admin.DeleteRateLimit, dtq_pb2.DeleteRateLimitRequest(
                queue=queue, task_type=task_type))
        else:
            self.call(self.admin.SetRateLimit, dtq_pb2.SetRateLimitRequest(
                rate_limit=dtq_pb2.RateLimit(queue=queue, task_type=task_type, limit=limit,
                                             period_ms=1000, burst=limit)))


def test_workflows_leave_no_dangling_reference(fuzz_env):
    """Chains, groups, schedules, rate limits and progress, driven with real leases and
    with producers copying the gateway's internal idempotency keys; afterwards every
    id a record names exists (and nothing was logged at ERROR)."""
    channel, client, errors = fuzz_env
    flow = Flow(channel)
    flow.run(("schedule", "create", "fz"))

    @FLOW
    @given(ops=st.lists(OPS, min_size=3, max_size=10))
    def run(ops):
        for op in ops:
            flow.run(op)
        assert not errors.records, [r.getMessage() for r in errors.records]

    run()
    flow.run(("schedule", "delete", "fz"))
    for queue in FLOW_QUEUES:  # no limit left to slow the drain below
        for task_type in ("", "t", "u"):
            flow.run(("ratelimit", queue, task_type, 0, True))
    # whatever was generated, one chain and one group, then everything left is acked
    # (up to a bound), so chain steps and callbacks get made
    flow.run(("enqueue", "fz", 1, "fz2", "", 0))
    flow.run(("batch", 2, "fz2", ""))
    for _ in range(40):
        if not flow.op_work(8, [("ack", 50.0, b"{}")] * 8):
            break
    assert_no_dangling_references(client)
    reached = _reached(client)
    assert all(reached.values()), reached  # the run got as deep as it claims


def _reached(client: redis.Redis) -> dict[str, int]:
    """How many tasks got a next chain step, progress, a schedule fire or a planted
    internal-looking key, and how many groups got their callback."""
    out = dict.fromkeys(("chain_continued", "progress", "schedule_fire", "planted_key",
                         "group_callback"), 0)
    for key in client.scan_iter(match="dtq:task:*", count=1000, _type="hash"):
        nxt, progress, meta, idem = client.hmget(key, "next_task_id", "progress_at_ms",
                                                 "metadata", "idem_key")
        out["chain_continued"] += bool(nxt)
        out["progress"] += bool(progress and progress != b"0")
        out["schedule_fire"] += b"dtq.fire_ms" in (meta or b"")
        out["planted_key"] += bool(idem and idem.startswith((b"chain:", b"group:"))
                                   and b"dtq.parent_task_id" not in (meta or b"")
                                   and b"dtq.group_id" not in (meta or b""))
    for key in client.scan_iter(match="dtq:group:*", count=1000, _type="hash"):
        out["group_callback"] += bool(client.hget(key, "callback_task_id"))
    return out


def test_gateway_still_serves_and_redis_is_consistent(fuzz_env):
    """Runs after the fuzz tests of this module (file order)."""
    channel, client, errors = fuzz_env
    from dtq_proto import dtq_pb2_grpc

    stub = dtq_pb2_grpc.BrokerStub(channel)
    r = stub.Enqueue(dtq_pb2.EnqueueRequest(queue="fz", task_type="t", payload=b"{}"),
                     metadata=ADMIN, timeout=5)
    got = stub.GetTask(dtq_pb2.GetTaskRequest(task_id=r.task_id), metadata=ADMIN, timeout=5)
    assert got.task.task_id == r.task_id
    assert not errors.records
    _assert_redis_consistent(client)
    assert_no_dangling_references(client)


def _assert_redis_consistent(client: redis.Redis) -> None:
    """Every live task record has its stream entry or schedule member, and the reverse.

    Read with one Lua call, so that nothing moves between the reads (the gateway keeps
    running)."""
    problems = client.eval("""
        local function task_key(id)
          local tag = string.match(id, '%-(%w+)$')
          if tag then return 'dtq:task:{' .. tag .. '}:' .. id end
          return 'dtq:task:' .. id
        end
        local out = {}
        local cursor = '0'
        repeat
          local r = redis.call('SCAN', cursor, 'MATCH', 'dtq:task:*', 'COUNT', 1000)
          cursor = r[1]
          for _, key in ipairs(r[2]) do
            local h = redis.call('HMGET', key, 'status', 'queue', 'priority', 'entry_id')
            local id = string.match(key, '([^:]+)$')
            if h[1] == 'queued' or h[1] == 'active' then
              local s = 'dtq:stream:{' .. h[2] .. '}:p' .. h[3]
              local e = redis.call('XRANGE', s, h[4], h[4])
              if #e == 0 then out[#out + 1] = 'no entry for ' .. id .. ' ' .. h[1] end
            elseif h[1] == 'scheduled' then
              if not redis.call('ZSCORE', 'dtq:retry:{' .. h[2] .. '}:schedule', id) then
                out[#out + 1] = 'not scheduled: ' .. id
              end
            end
          end
        until cursor == '0'
        cursor = '0'
        repeat
          local r = redis.call('SCAN', cursor, 'MATCH', 'dtq:retry:{*}:schedule', 'COUNT', 1000)
          cursor = r[1]
          for _, z in ipairs(r[2]) do
            for _, id in ipairs(redis.call('ZRANGE', z, 0, -1)) do
              if redis.call('HGET', task_key(id), 'status') ~= 'scheduled' then
                out[#out + 1] = 'schedule member without a scheduled record: ' .. id
              end
            end
          end
        until cursor == '0'
        cursor = '0'
        repeat
          local r = redis.call('SCAN', cursor, 'MATCH', 'dtq:stream:{*}:p[0-9]', 'COUNT', 1000)
          cursor = r[1]
          for _, s in ipairs(r[2]) do
            for _, e in ipairs(redis.call('XRANGE', s, '-', '+')) do
              local f = e[2]
              local tid
              for i = 1, #f, 2 do if f[i] == 'task_id' then tid = f[i + 1] end end
              local st = redis.call('HGET', task_key(tostring(tid)), 'status')
              if st ~= 'queued' and st ~= 'active' then
                out[#out + 1] = 'entry ' .. e[1] .. ' of ' .. s .. ' without a live record'
              end
            end
          end
        until cursor == '0'
        return out
    """, 0)
    assert problems == [], problems
