"""Workloads across a Redis failover (Sentinel or Cluster) and their invariant.

Redis replication is asynchronous: a write the old primary acknowledged may be missing
on the promoted replica. For dtq that means an Ack (or Fail) the gateway answered may
be lost; the task's record is then still ``active`` on the new primary, its lease
expires and the reaper gives it another attempt, so the task may run twice. Enqueues
may be lost the same way (the producer was told the task exists). What must hold is:

- every task whose enqueue survived reaches exactly one terminal state in its record
  (one ``succeeded`` attempt outcome at most, the status terminal),
- a task ran again only when an earlier attempt's completion is missing from the record
  (at-least-once, never two completions recorded),
- the queues' band streams and pending lists end empty.

:func:`check_at_least_once` asserts exactly that and reports how many tasks ran more
than once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
import redis

from dtq_proto import dtq_pb2
from dtq_pyworker import TERMINAL_STATUSES, Client, DtqRpcError
from tests.system.chaos_invariant import ChaosEnv, band_backlog
from tests.system.chaos_support import EventRecorder, GatewayProc, wait_until


class FailoverEnv(ChaosEnv):
    """A ChaosEnv on a Redis deployment the test started itself (not one redis-server).

    Args:
        tmp_path: directory for logs and the run log.
        url: DTQ_REDIS_URL of the deployment.
        gateway_flags: extra gateway flags (``{"redis-mode": "cluster"}`` ...).
        rds: a synchronous client of the deployment (for band backlogs and checks).
        subscribe: how the event recorder reaches a server to subscribe on.
    """

    def __init__(self, tmp_path: Path, url: str, gateway_flags: dict[str, str],
                 rds: Any, subscribe: Callable[[], redis.Redis]) -> None:
        self.dir = tmp_path
        self.redis = None  # type: ignore[assignment]
        self.url = url
        self.gateway_flags = gateway_flags
        self.run_log = tmp_path / "runs.log"
        self.procs = []
        self.clients = []
        self.events = EventRecorder(url, connect=subscribe).start()
        self.rds = rds

    def gateway(self, gateway_id: str = "failover-gw", **kwargs: Any) -> GatewayProc:
        """Start a gateway on the deployment and wait until it listens."""
        extra = {**self.gateway_flags, **kwargs.pop("extra", {})}
        gw = GatewayProc(self.url, self.dir, gateway_id, extra=extra, **kwargs)
        self.procs.append(gw)
        return gw.start()

    def cleanup(self) -> None:
        """SIGKILL every process and stop the recorder (the deployment is the caller's)."""
        for c in self.clients:
            c.close()
        for p in reversed(self.procs):
            p.kill()
        self.events.stop()
        self.rds.close()


def enqueue_spread(client: Client, queues: list[str], n: int, sleep_s: float = 0.02,
                   timeout_s: float = 30.0) -> list[str]:
    """Enqueue ``n`` short chaos tasks round-robin over ``queues``, retrying refusals
    while the gateway reconnects after a failover; returns the task ids."""
    items = [{"queue": queues[i % len(queues)], "task_type": "chaos.sleep",
              "payload": {"sleep_s": sleep_s}, "max_attempts": 10} for i in range(n)]

    def attempt() -> list[str] | None:
        try:
            results = client.enqueue_batch(items)
        except DtqRpcError:
            return None
        if any(isinstance(r, Exception) for r in results):
            return None  # a chunk refused mid-failover: send the batch again
        return [r.task_id for r in results]
    return wait_until(attempt, timeout_s, "the gateway to accept enqueues")


class Producer:
    """Enqueues short chaos tasks one at a time in a thread, each with its own
    idempotency key; a refused call (UNAVAILABLE during a failover, a deadline) is sent
    again with the same key until answered OK. :attr:`acked` lists (task id,
    ``time.monotonic()`` of its OK) for every task answered OK.

    Args:
        target: the gateway.
        queue: the queue to fill.
        pause_s: pause between two tasks (s).
    """

    def __init__(self, target: str, queue: str = "chaos", pause_s: float = 0.01) -> None:
        self.client = Client(target, timeout_s=5.0)
        self.queue, self.pause_s = queue, pause_s
        self.acked: list[tuple[str, float]] = []
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        """Start producing."""
        self._thread.start()
        return self

    def stop(self) -> list[tuple[str, float]]:
        """Stop after the task in hand is answered OK (or 30 s); returns :attr:`acked`."""
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.close()
        return self.acked

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"producer-{n}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    res = self.client.enqueue(self.queue, "chaos.sleep", {"sleep_s": 0},
                                              max_attempts=10, idempotency_key=key)
                except DtqRpcError:
                    self.refused += 1
                    time.sleep(0.05)
                    continue
                self.acked.append((res.task_id, time.monotonic()))
                break
            n += 1
            time.sleep(self.pause_s)


def check_at_least_once(env: FailoverEnv, client: Client, task_ids: Iterable[str],
                        queues: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until every task still known is terminal and assert the failover invariant
    (module docstring). Returns counts: ``{"tasks", "lost_enqueues", "ran_twice"}`` and
    the ids of the lost enqueues (``"lost_ids"``)."""
    ids = list(dict.fromkeys(task_ids))

    def settled() -> dict[str, dtq_pb2.Task | None] | None:
        out: dict[str, dtq_pb2.Task | None] = {}
        for tid in ids:
            try:
                out[tid] = client.get_task(tid)
            except DtqRpcError as err:
                if err.code == grpc.StatusCode.NOT_FOUND:
                    out[tid] = None  # its enqueue was lost with the old primary
                    continue
                return None
        if any(t is not None and t.status not in TERMINAL_STATUSES for t in out.values()):
            return None
        return out
    tasks = wait_until(settled, timeout_s, "every task to reach a terminal state")
    for tid, task in tasks.items():
        if task is None:
            continue
        done = [a for a in task.attempts if a.outcome == "succeeded"]
        assert len(done) <= 1, f"{tid}: two completions recorded: {task.attempts}"
        if task.status == dtq_pb2.TASK_STATUS_SUCCEEDED:
            assert len(done) == 1 and done[0].attempt == task.attempt, (tid, task)
    for q in queues:
        wait_until(lambda q=q: not band_backlog(env.rds, q), timeout_s,
                   f"empty band streams and PELs of {q}")
    runs = Counter(r["task_id"] for r in env.runs("done"))
    lost = [tid for tid, t in tasks.items() if t is None]
    return {"tasks": len(ids), "lost_enqueues": len(lost), "lost_ids": lost,
            "ran_twice": sum(1 for n in runs.values() if n > 1)}
