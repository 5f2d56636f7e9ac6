"""A minimal dtq worker on raw generated stubs (no dtq_pyworker), after docs/protocol.md.

Threads, blocking gRPC, one Ack/Fail per task (batching is a SHOULD, not a
MUST). It does not set LeaseRequest.max_batch, so it gets one LeasedTask per stream
message: the conformance suite's "old" worker beside the batching ones. Implements the conformance task types conf.echo, conf.sleep, conf.fail.

Environment: DTQ_GATEWAY, DTQ_QUEUES (or DTQ_QUEUE), DTQ_WORKER_ID,
DTQ_CONCURRENCY, DTQ_MAX_IN_FLIGHT, DTQ_DRAIN_GRACE_MS, DTQ_TOKEN.

Run: python examples/raw-python-worker/worker.py
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc

log = logging.getLogger("raw-worker")
C = grpc.StatusCode
FATAL = {C.UNAUTHENTICATED, C.PERMISSION_DENIED, C.INVALID_ARGUMENT}
STALE = {C.FAILED_PRECONDITION, C.NOT_FOUND}
DRAIN_STREAM_MIN_S = 2.0  # shortest wait for the stream to end after the draining heartbeat


class Stopped(Exception):
    """The handler was told to stop (cancel, timeout, lost lease, drain)."""


class TaskFailure(Exception):
    """A handler failure with an explicit retryable flag."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class Lease:
    """One held lease: buffered until a slot runs it, then running, then reporting."""

    task: pb.LeasedTask
    stop: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    phase: str = "buffered"

    def halt(self, reason: str) -> None:
        """Ask the handler to stop; the first reason wins."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()


def conf_echo(task: pb.LeasedTask, stop: threading.Event) -> bytes:
    """conf.echo: the payload bytes, unchanged."""
    return task.payload


def conf_sleep(task: pb.LeasedTask, stop: threading.Event) -> bytes:
    """conf.sleep: {"ms": N}; returns early (Stopped) when told to stop."""
    ms = int(json.loads(task.payload or b"{}").get("ms", 0))
    if stop.wait(ms / 1000):
        raise Stopped()
    return json.dumps({"slept_ms": ms}).encode()


def conf_fail(task: pb.LeasedTask, stop: threading.Event) -> bytes:
    """conf.fail: {"retryable": bool, "message": str}; always fails."""
    payload = json.loads(task.payload or b"{}")
    raise TaskFailure(str(payload.get("message", "conf.fail")), payload.get("retryable", True))


HANDLERS = {"conf.echo": conf_echo, "conf.sleep": conf_sleep, "conf.fail": conf_fail}


class RawWorker:
    """Lease session, slots, heartbeats, reports and drain on plain threads."""

    def __init__(self) -> None:
        env = os.environ
        self.queues = [q for q in (env.get("DTQ_QUEUES") or env.get("DTQ_QUEUE", "")).split(",")
                       if q]
        self.worker_id = env.get("DTQ_WORKER_ID") or f"raw-{socket.gethostname()}-{os.getpid()}"
        self.concurrency = int(env.get("DTQ_CONCURRENCY") or 4)
        self.max_in_flight = int(env.get("DTQ_MAX_IN_FLIGHT") or 2 * self.concurrency)
        self.grace_s = int(env.get("DTQ_DRAIN_GRACE_MS") or 30000) / 1000
        token = env.get("DTQ_TOKEN")
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.channel = grpc.insecure_channel(env.get("DTQ_GATEWAY", "127.0.0.1:50051"))
        self.stub = dtq_pb2_grpc.BrokerStub(self.channel)
        self.lock = threading.Lock()
        self.held: dict[str, Lease] = {}
        self.ready: queue.Queue[Lease | None] = queue.Queue()
        self.heartbeat_s = 10.0
        self.session_seen = False  # a SessionInfo arrived: heartbeat_s is the gateway's
        self.draining = threading.Event()
        self.stream_closed = threading.Event()
        self.stopped = threading.Event()
        self.stream: grpc.Future | None = None
        self.lease_thread: threading.Thread | None = None
        self.exit_code = 0
        self.stats = {"processed": 0, "failed": 0, "released": 0, "cancelled": 0, "lost": 0}

    # -- Lease session ---------------------------------------------------------------
    def lease_loop(self) -> None:
        """Open the Lease stream; reconnect with jittered exponential backoff."""
        attempt = 0
        while not self.draining.is_set():
            request = pb.LeaseRequest(worker_id=self.worker_id, queues=self.queues,
                                      max_in_flight=self.max_in_flight,
                                      task_types=list(HANDLERS), concurrency=self.concurrency,
                                      hostname=socket.gethostname(), sdk="dtq-raw-python/0.1")
            try:
                self.stream = self.stub.Lease(request, metadata=self.metadata)
                for msg in self.stream:
                    if msg.HasField("session"):
                        attempt = 0
                        self.heartbeat_s = msg.session.heartbeat_interval_ms / 1000
                        self.session_seen = True
                    else:
                        self.on_task(msg.task)
                code = C.OK
            except grpc.RpcError as exc:
                code = exc.code()
            if self.draining.is_set():  # OK after the draining heartbeat: all leases received
                log.info("lease stream ended while draining (%s)", code.name)
                return
            if code in FATAL:
                log.error("Lease refused with %s; stopping", code.name)
                self.exit_code = 3
                self.draining.set()
                self.stopped.set()
                return
            ceiling = min(5.0, 0.2 * 2 ** attempt)
            attempt += 1
            time.sleep(random.uniform(ceiling / 2, ceiling))

    def on_task(self, task: pb.LeasedTask) -> None:
        lease = Lease(task)
        with self.lock:
            self.held[task.lease_id] = lease
        if self.draining.is_set():  # in transit when the drain began: never runs
            self.stop_buffered(lease, "drain")
        else:
            self.ready.put(lease)

    # -- Running -------------------------------------------------------------------
    def slot_loop(self) -> None:
        """One handler slot: run buffered leases one at a time."""
        while True:
            lease = self.ready.get()
            if lease is None:
                return
            if self.draining.is_set() or not self.take(lease, "running"):
                continue  # draining (the drain releases it) or already stopped
            timer = threading.Timer(lease.task.timeout_ms / 1000 or 86400, lease.halt,
                                    ("timeout",))
            timer.start()
            try:
                result = HANDLERS[lease.task.task_type](lease.task, lease.stop)
                outcome: tuple = ("ok", result)
            except Stopped:
                outcome = ("stopped",)
            except TaskFailure as exc:
                outcome = ("fail", type(exc).__name__, str(exc), exc.retryable)
            except Exception as exc:  # noqa: BLE001 - any other handler error is retryable
                outcome = ("fail", type(exc).__name__, str(exc), True)
            finally:
                timer.cancel()
            if lease.stop.is_set():
                outcome = ("stopped",)
            self.finish(lease, outcome)

    def take(self, lease: Lease, phase: str) -> bool:
        """Move a buffered lease to ``phase``; False when someone else took it."""
        with self.lock:
            if lease.phase != "buffered":
                return False
            lease.phase = phase
            return True

    def stop_buffered(self, lease: Lease, reason: str) -> None:
        """Stop a lease that has not started: report it from a helper thread."""
        if self.take(lease, "reporting"):
            lease.halt(reason)
            threading.Thread(target=self.finish_stopped, args=(lease,), daemon=True).start()

    def finish(self, lease: Lease, outcome: tuple) -> None:
        lease.phase = "reporting"
        if outcome[0] == "ok":
            item = pb.AckItem(lease_id=lease.task.lease_id, result=outcome[1])
            self.report(lease, self.stub.Ack, pb.AckRequest(items=[item]), "processed")
        elif outcome[0] == "fail":
            item = pb.FailItem(lease_id=lease.task.lease_id, error_class=outcome[1],
                               error_message=outcome[2], retryable=outcome[3],
                               mode=pb.FAIL_MODE_FAILURE)
            self.report(lease, self.stub.Fail, pb.FailRequest(items=[item]), "failed")
        else:
            self.finish_stopped(lease)

    def finish_stopped(self, lease: Lease) -> None:
        if lease.reason == "timeout":
            self.finish(lease, ("fail", "Timeout", "handler exceeded timeout_ms", True))
        elif lease.reason == "cancelled":
            item = pb.FailItem(lease_id=lease.task.lease_id, mode=pb.FAIL_MODE_CANCELLED,
                               error_class="Cancelled", error_message="cancelled")
            self.report(lease, self.stub.Fail, pb.FailRequest(items=[item]), "cancelled")
        elif lease.reason == "drain":
            self.report_release(lease)
        else:  # lost: never report
            self.forget(lease, "lost")

    def report_release(self, lease: Lease) -> None:
        item = pb.FailItem(lease_id=lease.task.lease_id, mode=pb.FAIL_MODE_RELEASE,
                           error_class="Released", error_message="worker draining")
        self.report(lease, self.stub.Fail, pb.FailRequest(items=[item]), "released")

    def report(self, lease: Lease, call, request, stat: str) -> None:
        """Send a single-item Ack/Fail; resend transient errors until answered or lost."""
        delay = 0.1
        while lease.reason != "lost":
            try:
                call(request, metadata=self.metadata, timeout=10)
                return self.forget(lease, stat)
            except grpc.RpcError as exc:
                if exc.code() in STALE or exc.code() in FATAL:
                    log.info("report refused (%s): result dropped", exc.code().name)
                    return self.forget(lease, "lost")
            time.sleep(random.uniform(delay / 2, delay))
            delay = min(5.0, delay * 2)
        self.forget(lease, "lost")

    def forget(self, lease: Lease, stat: str) -> None:
        with self.lock:
            self.held.pop(lease.task.lease_id, None)
            self.stats[stat] += 1

    # -- Heartbeats ----------------------------------------------------------------
    def heartbeat_loop(self) -> None:
        """Every heartbeat interval, even with no leases, extend every held lease.

        The gateway delivers nothing to a worker whose last heartbeat is older than
        two intervals, so an idle worker must keep beating too.
        """
        last = time.monotonic()
        while not self.stopped.wait(0.05):
            # Re-read the interval each tick: the first SessionInfo usually shortens it.
            if time.monotonic() - last < self.heartbeat_s:
                continue
            last = time.monotonic()
            self.beat()

    def beat(self) -> None:
        """One Heartbeat (draining=true once draining); act on lost/cancelled leases."""
        with self.lock:
            ids = list(self.held)
            leases = dict(self.held)
        running = sum(lease.phase == "running" for lease in leases.values())
        request = pb.HeartbeatRequest(worker_id=self.worker_id, lease_ids=ids,
                                      active_tasks=running, concurrency=self.concurrency,
                                      draining=self.draining.is_set())
        try:
            reply = self.stub.Heartbeat(request, metadata=self.metadata,
                                        timeout=max(1.0, self.heartbeat_s))
        except grpc.RpcError as exc:
            log.warning("heartbeat failed: %s", exc.code().name)
            return
        for ids_, reason in ((reply.lost_lease_ids, "lost"),
                             (reply.cancelled_lease_ids, "cancelled")):
            for lid in ids_:
                lease = leases.get(lid)
                if lease is None:
                    continue
                if lease.phase == "buffered":
                    self.stop_buffered(lease, reason)
                elif lease.phase == "running" or reason == "lost":
                    lease.halt(reason)

    # -- Lifecycle -----------------------------------------------------------------
    def drain(self, *_: object) -> None:
        """SIGTERM: stop leasing, release buffered, give running handlers the grace."""
        if self.draining.is_set():
            return
        self.draining.set()
        threading.Thread(target=self.drain_steps, daemon=True).start()

    def drain_steps(self) -> None:
        """Draining heartbeat, read the stream to its end (bounded), release the rest."""
        timer = threading.Timer(self.grace_s, self.halt_running)
        timer.daemon = True
        timer.start()
        self.release_buffered()
        # From this heartbeat on the gateway sends nothing new and ends the stream with
        # OK after every lease already sent; later heartbeats repeat draining=true.
        self.beat()
        if self.lease_thread is not None:
            self.lease_thread.join(self.stream_wait_s())
        if self.stream is not None:
            self.stream.cancel()  # a gateway without draining never ends it: stop waiting
        self.stream_closed.set()
        self.release_buffered()

    def stream_wait_s(self) -> float:
        """How long to wait for the stream to end after the draining heartbeat (s)."""
        return max(DRAIN_STREAM_MIN_S, 2 * self.heartbeat_s if self.session_seen else 0.0)

    def release_buffered(self) -> None:
        with self.lock:
            leases = list(self.held.values())
        for lease in leases:
            self.stop_buffered(lease, "drain")

    def halt_running(self) -> None:
        with self.lock:
            leases = list(self.held.values())
        for lease in leases:
            if lease.phase == "running":
                lease.halt("drain")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.drain)
        signal.signal(signal.SIGINT, self.drain)
        slots = [threading.Thread(target=self.slot_loop, daemon=True)
                 for _ in range(self.concurrency)]
        for t in [*slots, threading.Thread(target=self.heartbeat_loop, daemon=True)]:
            t.start()
        self.lease_thread = threading.Thread(target=self.lease_loop, daemon=True)
        self.lease_thread.start()
        while not self.draining.wait(0.2):
            pass
        if self.exit_code == 0:
            self.stream_closed.wait(self.stream_wait_s() + 5)
        deadline = time.monotonic() + self.grace_s + 15
        while self.exit_code == 0 and time.monotonic() < deadline:
            with self.lock:
                if not self.held:
                    break
            time.sleep(0.05)
        for _ in slots:
            self.ready.put(None)
        self.stopped.set()
        self.channel.close()
        print(json.dumps({"worker": "raw-python", "worker_id": self.worker_id, **self.stats}))
        return self.exit_code


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(RawWorker().run())
