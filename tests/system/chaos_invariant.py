"""The chaos environment (private Redis, processes, events) and the closing invariant.

Every chaos scenario ends with :func:`check_invariant`: every enqueued task reaches
exactly one terminal state (GetTask and the event stream agree), no task was
completed by a stale lease (the one TASK_SUCCEEDED names the attempt and worker the
record says succeeded), nothing but TASK_DUPLICATE_ABSORBED follows a terminal
event, and the queue's band streams and pending-entries lists are empty again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import redis

from dtq_gateway.store import keys
from dtq_proto import dtq_pb2
from dtq_pyworker import TERMINAL_STATUSES, Client, DtqRpcError
from tests.support.redis_server import RedisServer
from tests.system.chaos_support import (
    TERMINAL_EVENTS,
    EventRecorder,
    GatewayProc,
    Proc,
    WorkerProc,
    read_run_log,
    wait_until,
)

#: Terminal status -> the one event that announces it.
STATUS_EVENT = {
    dtq_pb2.TASK_STATUS_SUCCEEDED: "TASK_SUCCEEDED",
    dtq_pb2.TASK_STATUS_DEAD_LETTERED: "TASK_DEAD_LETTERED",
    dtq_pb2.TASK_STATUS_CANCELLED: "TASK_CANCELLED",
    dtq_pb2.TASK_STATUS_EXPIRED: "TASK_EXPIRED",
}


class ChaosEnv:
    """One scenario's world: its own redis-server (AOF), processes and recorder.

    Args:
        tmp_path: directory for logs, the run log and Redis data.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        (tmp_path / "redis").mkdir(exist_ok=True)
        self.redis = RedisServer(appendonly=True, directory=str(tmp_path / "redis")).start()
        self.run_log = tmp_path / "runs.log"
        self.procs: list[Proc] = []
        self.clients: list[Client] = []
        self.events = EventRecorder(self.redis.url).start()
        self.rds = redis.Redis.from_url(self.redis.url, decode_responses=True,
                                        socket_timeout=5)

    def gateway(self, gateway_id: str = "chaos-gw-a", **kwargs: Any) -> GatewayProc:
        """Start a gateway subprocess on this Redis and wait until it listens."""
        gw = GatewayProc(self.redis.url, self.dir, gateway_id, **kwargs)
        self.procs.append(gw)
        return gw.start()

    def worker(self, target: str, worker_id: str, **kwargs: Any) -> WorkerProc:
        """Start a dtq-pyworker subprocess running the chaos app."""
        w = WorkerProc(target, self.dir, worker_id, self.run_log, **kwargs)
        self.procs.append(w)
        return w.start()

    def client(self, target: str) -> Client:
        """A producer client (closed at cleanup)."""
        c = Client(target, timeout_s=10.0)
        self.clients.append(c)
        return c

    def runs(self, event: str | None = None, task_id: str | None = None) -> list[dict]:
        """Run-log rows, optionally only of one event and/or task."""
        return [r for r in read_run_log(self.run_log)
                if (event is None or r["event"] == event)
                and (task_id is None or r["task_id"] == task_id)]

    def logs(self) -> str:
        """Tails of every process log, for assertion messages."""
        return "\n".join(p.log() for p in self.procs)

    def cleanup(self) -> None:
        """SIGKILL every process, stop the recorder and the Redis server."""
        for c in self.clients:
            c.close()
        for p in reversed(self.procs):
            p.kill()
        self.events.stop()
        self.rds.close()
        self.redis.cleanup()


def band_backlog(rds: redis.Redis, queue: str) -> dict[str, tuple[int, int]]:
    """``{stream: (XLEN, pending)}`` of the queue's band streams that are not empty."""
    out = {}
    for stream in keys.queue_streams_desc(queue):
        if not rds.exists(stream):
            continue
        try:
            pending = rds.xpending(stream, keys.GROUP)["pending"]
        except redis.ResponseError:  # NOGROUP: nothing can be pending
            pending = 0
        length = rds.xlen(stream)
        if length or pending:
            out[stream] = (length, pending)
    return out


def _all_terminal(client: Client, events: EventRecorder, ids: list[str],
                  events_complete: bool) -> dict[str, dtq_pb2.Task] | None:
    try:
        tasks = {tid: client.get_task(tid) for tid in ids}
    except DtqRpcError as err:  # a pooled connection that predates a Redis restart
        if err.code != grpc.StatusCode.UNAVAILABLE:
            raise
        return None
    if any(t.status not in TERMINAL_STATUSES for t in tasks.values()):
        return None
    if events_complete:
        by_task = events.by_task()
        if any(not any(e["type"] in TERMINAL_EVENTS for e in by_task.get(tid, []))
               for tid in ids):
            return None
    return tasks


def check_task_events(task: dtq_pb2.Task, evs: list[dict], events_complete: bool) -> None:
    """One task's events agree with its record: one terminal event, of the right type,
    nothing but absorbed duplicates after it, and a success by the current lease."""
    tid = task.task_id
    records = {a.attempt: (a.worker_id, a.outcome) for a in task.attempts}
    for ev in evs:  # every failure came from the lease that held that attempt
        if ev["type"] == "TASK_FAILED":
            assert records.get(ev["attempt"]) == (ev["worker_id"], "failed"), (tid, ev, records)
    terminal = [i for i, e in enumerate(evs) if e["type"] in TERMINAL_EVENTS]
    if events_complete:
        assert len(terminal) == 1, f"{tid}: terminal events {[evs[i] for i in terminal]}"
    else:
        assert len(terminal) <= 1, f"{tid}: terminal events {[evs[i] for i in terminal]}"
    if not terminal:
        return
    ev = evs[terminal[0]]
    assert ev["type"] == STATUS_EVENT[task.status], f"{tid}: {ev} vs status {task.status}"
    after = [e["type"] for e in evs[terminal[0] + 1:]]
    assert set(after) <= {"TASK_DUPLICATE_ABSORBED"}, f"{tid}: events after {ev['type']}: {after}"
    if task.status == dtq_pb2.TASK_STATUS_SUCCEEDED:
        assert (ev["attempt"], ev["worker_id"]) == (task.attempt, task.worker_id), (tid, ev)
        outcomes = [(a.attempt, a.outcome, a.worker_id) for a in task.attempts]
        assert [o for o in outcomes if o[1] == "succeeded"] == [
            (task.attempt, "succeeded", task.worker_id)], f"{tid}: attempts {outcomes}"


def check_invariant(env: ChaosEnv, client: Client, task_ids: Iterable[str], queue: str = "chaos",
                    *, events_complete: bool = True,
                    timeout_s: float = 30.0) -> dict[str, dtq_pb2.Task]:
    """Wait until every task is terminal, then assert the suite's invariant.

    Args:
        env: the scenario's environment.
        client: producer client on a live gateway.
        task_ids: every task the scenario enqueued.
        queue: the queue whose band streams must end empty.
        events_complete: False when the recorder may have missed events (Redis
            restarts): then at most one terminal event per task is required.
        timeout_s: how long tasks and streams may take to settle (s).

    Returns:
        The final task records by id.
    """
    ids = list(dict.fromkeys(task_ids))
    try:
        tasks = wait_until(lambda: _all_terminal(client, env.events, ids, events_complete),
                           timeout_s, "every task to reach a terminal state")
    except AssertionError:
        open_ = {t: client.get_task(t).status for t in ids}
        open_ = {t: s for t, s in open_.items() if s not in TERMINAL_STATUSES}
        raise AssertionError(f"tasks not terminal: {open_}\n{env.logs()}") from None
    by_task = env.events.by_task()
    for tid, task in tasks.items():
        check_task_events(task, by_task.get(tid, []), events_complete)
    try:
        wait_until(lambda: not band_backlog(env.rds, queue), timeout_s,
                   "empty band streams and PELs")
    except AssertionError as err:
        raise AssertionError(f"{err}: {band_backlog(env.rds, queue)}") from None
    return tasks
