"""Minimal dtq worker: generated stubs, synchronous grpc, plain threads.

Written from docs/protocol.md and proto/dtq.proto only (see README.md). One
thread reads the Lease stream, one heartbeats, one reports (batched Ack/Fail),
`DTQ_CONCURRENCY` slot threads run handlers; each handler runs in its own daemon
thread so that a slot can stop waiting for it (timeout, cancel, lost lease).

Environment: DTQ_GATEWAY, DTQ_QUEUES (comma-separated) or DTQ_QUEUE,
DTQ_WORKER_ID, DTQ_CONCURRENCY, DTQ_MAX_IN_FLIGHT, DTQ_DRAIN_GRACE_MS (ms),
DTQ_TOKEN, DTQ_TLS_CA (PEM file; enables TLS), DTQ_LOG_LEVEL.
"""
import collections
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
import uuid

import grpc

from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc as pbg

log = logging.getLogger("minimal-worker")
SDK = "dtq-minimal-worker/0.1.0"
SC = grpc.StatusCode
STOP_CODES = {SC.UNAUTHENTICATED, SC.PERMISSION_DENIED, SC.INVALID_ARGUMENT}
ITEM_CODES = {SC.FAILED_PRECONDITION, SC.NOT_FOUND, SC.INVALID_ARGUMENT}


class PermanentError(Exception):
    """A handler error that no retry can fix: Fail with retryable=false."""


class UnknownTaskType(PermanentError):
    """No handler for the task type."""


class BadPayload(PermanentError):
    """A JSON payload that does not decode."""


def h_echo(task, args, stop):
    """conf.echo: the payload bytes, unchanged."""
    return task.payload


def h_sleep(task, args, stop):
    """conf.sleep: wait args['ms'] ms unless stopped first."""
    ms = int(args.get("ms", 0))
    if stop.wait(ms / 1000):
        raise InterruptedError("stopped")
    return {"slept_ms": ms}


def h_fail(task, args, stop):
    """conf.fail: always fail, retryable unless args['retryable'] is false."""
    message = str(args.get("message", "conf.fail"))
    if args.get("retryable", True) is False:
        raise PermanentError(message)
    raise RuntimeError(message)


HANDLERS = {"conf.echo": h_echo, "conf.sleep": h_sleep, "conf.fail": h_fail}


def backoff_s(n, base=0.2, cap=10.0):
    """Jittered exponential delay in s for the n-th consecutive retry."""
    d = min(cap, base * 2 ** n)
    return random.uniform(d / 2, d)


def decode_args(task):
    """JSON payloads decoded (empty = {}), other media types as raw bytes."""
    ct = task.content_type.split(";")[0].strip().lower()
    if ct and ct != "application/json" and not ct.endswith("+json"):
        return task.payload
    try:
        return json.loads(task.payload) if task.payload else {}
    except ValueError as e:
        raise BadPayload(f"payload is not JSON: {e}") from e


def encode_result(value):
    """Bytes unchanged, anything else as compact UTF-8 JSON."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class Held:
    """A lease the worker holds, from receipt until its report is answered."""

    def __init__(self, task):
        self.task = task
        self.stop = threading.Event()  # the handler should stop
        self.wake = threading.Event()  # the slot should look again
        self.running = False
        self.why = None  # "cancelled" | "lost" | "release"
        self.outcome = None  # ("ok", value) | ("err", exception)


class Worker:
    """The worker process state; see the module docstring."""

    def __init__(self, env):
        self.worker_id = env.get("DTQ_WORKER_ID") or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        raw = env.get("DTQ_QUEUES") or env.get("DTQ_QUEUE") or "default"
        self.queues = [q.strip() for q in raw.split(",") if q.strip()]
        self.concurrency = int(env.get("DTQ_CONCURRENCY") or 4)
        self.max_in_flight = int(env.get("DTQ_MAX_IN_FLIGHT") or 2 * self.concurrency)
        self.grace_s = int(env.get("DTQ_DRAIN_GRACE_MS") or 30000) / 1000
        token = env.get("DTQ_TOKEN")
        self.md = (("authorization", f"Bearer {token}"),) if token else ()
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        addr = env.get("DTQ_GATEWAY") or "127.0.0.1:50051"
        if env.get("DTQ_TLS_CA"):
            with open(env["DTQ_TLS_CA"], "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())
            channel = grpc.secure_channel(addr, creds, opts)
        else:
            channel = grpc.insecure_channel(addr, opts)
        self.stub = pbg.BrokerStub(channel)
        self.hostname = socket.gethostname()
        self.cond = threading.Condition()
        self.held = {}  # lease_id -> Held
        self.buffer = collections.deque()
        self.reports = queue.Queue()
        self.counters = pb.WorkerCounters()
        self.interval_s = None
        self.have_session = threading.Event()
        self.hb_kick = threading.Event()
        self.draining = threading.Event()
        self.grace_over = threading.Event()
        self.exit_now = threading.Event()
        self.fatal = None
        self.call = None
        self.lease_thread = None

    def start(self):
        """Start the stream, heartbeat, reporter and slot threads."""
        self.lease_thread = threading.Thread(target=self.lease_loop, daemon=True)
        targets = [self.hb_loop, self.report_loop] + [self.slot_loop] * self.concurrency
        for target in targets:
            threading.Thread(target=target, daemon=True).start()
        self.lease_thread.start()

    def die(self, what, err):
        """A status that retrying cannot fix: stop with a non-zero exit."""
        self.fatal = f"{what}: {err.code().name} {err.details()}"

    def lease_loop(self):
        """Read Lease sessions until draining; reconnect with backoff."""
        req = pb.LeaseRequest(
            worker_id=self.worker_id, queues=self.queues, max_in_flight=self.max_in_flight,
            concurrency=self.concurrency, hostname=self.hostname, sdk=SDK)
        n = 0
        while not self.draining.is_set():
            try:
                self.call = self.stub.Lease(req, metadata=self.md)
                for resp in self.call:
                    if resp.HasField("session"):
                        self.on_session(resp.session)
                        n = 0
                    elif resp.HasField("task"):
                        self.on_task(resp.task)
                log.info("lease stream ended by the gateway (OK)")
            except grpc.RpcError as e:
                if e.code() in STOP_CODES:
                    return self.die("Lease", e)
                log.warning("lease stream: %s %s", e.code().name, e.details())
            if self.draining.wait(backoff_s(n)):
                return
            n += 1

    def on_session(self, s):
        """Take the session parameters; never hard-code them."""
        log.info("session %s on %s: heartbeat %d ms, visibility %d ms, credit %d",
                 s.session_id, s.gateway_id, s.heartbeat_interval_ms,
                 s.visibility_timeout_ms, s.max_in_flight)
        self.interval_s = s.heartbeat_interval_ms / 1000
        self.have_session.set()

    def on_task(self, task):
        """Hold a new lease and buffer it for a slot."""
        h = Held(task)
        with self.cond:
            self.held[task.lease_id] = h
            self.buffer.append(h)
            self.cond.notify_all()

    def slot_loop(self):
        """One handler slot: take buffered leases while not draining."""
        while True:
            with self.cond:
                while not self.buffer or self.draining.is_set():
                    self.cond.wait()
                h = self.buffer.popleft()
                h.running = True
            try:
                self.run(h)
            finally:
                with self.cond:
                    h.running = False
                    self.cond.notify_all()

    def run(self, h):
        """Run one handler within its time limit and queue its report."""
        t = h.task
        threading.Thread(target=self.call_handler, args=(h,), daemon=True).start()
        woke = h.wake.wait(t.timeout_ms / 1000)
        h.stop.set()
        why, outcome = h.why, h.outcome
        item = pb.FailItem(lease_id=t.lease_id)
        if why == "lost":
            return
        if outcome and outcome[0] == "ok":
            return self.report(h, ack=pb.AckItem(lease_id=t.lease_id,
                                                 result=encode_result(outcome[1])))
        if why == "cancelled":
            item.mode, item.error_class = pb.FAIL_MODE_CANCELLED, "Cancelled"
        elif why == "release":
            item.mode, item.error_class = pb.FAIL_MODE_RELEASE, "Shutdown"
        elif not woke:
            item.error_class, item.retryable = "Timeout", True
            item.error_message = f"handler exceeded timeout_ms={t.timeout_ms}"
        else:
            err = outcome[1]
            item.error_class = type(err).__name__
            # the limit is 4096 bytes of UTF-8: cut the bytes, drop a split last character
            item.error_message = str(err).encode()[:4096].decode(errors="ignore")
            item.retryable = not isinstance(err, PermanentError)
        self.report(h, fail=item)

    def call_handler(self, h):
        """Handler thread: compute the outcome, then wake the slot."""
        t = h.task
        try:
            fn = HANDLERS.get(t.task_type)
            if fn is None:
                raise UnknownTaskType(f"no handler for task type {t.task_type!r}")
            h.outcome = ("ok", fn(t, decode_args(t), h.stop))
        except Exception as e:  # noqa: BLE001 - every handler error becomes a Fail
            h.outcome = ("err", e)
        h.wake.set()

    def hb_loop(self):
        """Heartbeat every interval (from the end of the previous one)."""
        self.have_session.wait()
        while not self.exit_now.is_set():
            self.hb_kick.wait(self.interval_s)
            self.hb_kick.clear()
            with self.cond:
                ids = list(self.held)
                active = sum(1 for h in self.held.values() if h.running)
            req = pb.HeartbeatRequest(
                worker_id=self.worker_id, lease_ids=ids, counters=self.counters,
                active_tasks=active, concurrency=self.concurrency,
                hostname=self.hostname, draining=self.draining.is_set())
            try:
                resp = self.stub.Heartbeat(req, metadata=self.md,
                                           timeout=max(1.0, 2 * self.interval_s))
            except grpc.RpcError as e:
                if e.code() in (SC.UNAUTHENTICATED, SC.PERMISSION_DENIED):
                    return self.die("Heartbeat", e)
                log.warning("heartbeat: %s %s", e.code().name, e.details())
                continue
            if resp.heartbeat_interval_ms:
                self.interval_s = resp.heartbeat_interval_ms / 1000
            for lid in resp.lost_lease_ids:
                self.lose(lid)
            for lid in resp.cancelled_lease_ids:
                self.cancel(lid)

    def lose(self, lid):
        """A lost lease: stop and forget it, never report it."""
        with self.cond:
            h = self.held.pop(lid, None)
            if h is None:
                return
            h.why = "lost"
            if h in self.buffer:
                self.buffer.remove(h)
            self.cond.notify_all()
        log.warning("lease of task %s lost", h.task.task_id)
        h.stop.set()
        h.wake.set()

    def cancel(self, lid):
        """A cancelled lease: stop the handler, or report a buffered one now."""
        with self.cond:
            h = self.held.get(lid)
            if h is None or h.why:
                return
            h.why = "cancelled"
            buffered = h in self.buffer
            if buffered:
                self.buffer.remove(h)
        if buffered:
            self.report(h, fail=pb.FailItem(lease_id=lid, mode=pb.FAIL_MODE_CANCELLED,
                                            error_class="Cancelled"))
        h.stop.set()
        h.wake.set()

    def report(self, h, ack=None, fail=None):
        """Queue an Ack or Fail item; the lease stays held until answered."""
        self.reports.put((h, ack, fail))

    def report_loop(self):
        """Coalesce reports for up to 5 ms or 256 items, then send them."""
        while True:
            batch = [self.reports.get()]
            end = time.monotonic() + 0.005
            while len(batch) < 256:
                try:
                    batch.append(self.reports.get(timeout=max(0.0, end - time.monotonic())))
                except queue.Empty:
                    break
            acks = [(h, a) for h, a, _ in batch if a is not None]
            fails = [(h, f) for h, _, f in batch if f is not None]
            if acks:
                self.send(self.stub.Ack, pb.AckRequest, acks)
            if fails:
                self.send(self.stub.Fail, pb.FailRequest, fails)

    def send(self, rpc, req_cls, pairs):
        """Send items until each has a per-item answer, is lost, or we exit."""
        n = 0
        while True:
            with self.cond:
                pairs = [(h, it) for h, it in pairs if self.held.get(h.task.lease_id) is h]
            if not pairs:
                return
            try:
                resp = rpc(req_cls(items=[it for _, it in pairs]), metadata=self.md, timeout=10)
                answers = [(r.error.code if r.HasField("error") else 0, r) for r in resp.results]
            except grpc.RpcError as e:
                if e.code() in (SC.UNAUTHENTICATED, SC.PERMISSION_DENIED):
                    return self.die("Ack/Fail", e)
                code = e.code().value[0] if e.code() in ITEM_CODES else SC.UNAVAILABLE.value[0]
                log.log(logging.WARNING if code == 14 else logging.INFO,
                        "report call: %s %s", e.code().name, e.details())
                answers = [(code, None)] * len(pairs)
            retry = [p for p, (code, _) in zip(pairs, answers) if code == 14]
            for (h, it), (code, r) in zip(pairs, answers):
                if code != 14:
                    self.settled(h, it, code, r)
            pairs = retry
            if pairs and self.exit_now.wait(backoff_s(n)):
                return
            n += 1

    def settled(self, h, item, code, r):
        """Forget an answered lease and count it."""
        if code == 9:
            log.info("stale lease of task %s: result dropped", h.task.task_id)
        elif code:
            log.error("report of task %s refused: code %d %s", h.task.task_id, code,
                      r.error.message if r else "")
        elif not r.duplicate:
            if isinstance(item, pb.AckItem):
                self.counters.tasks_processed += 1
            elif item.mode in (pb.FAIL_MODE_FAILURE, pb.FAIL_MODE_UNSPECIFIED):
                self.counters.tasks_failed += 1
                self.counters.tasks_retried += r.status == pb.TASK_STATUS_SCHEDULED
        with self.cond:
            if self.held.get(h.task.lease_id) is h:
                del self.held[h.task.lease_id]
            self.cond.notify_all()

    def wait_until(self, done, timeout_s, stop=None):
        """Wait on the condition until done() or timeout_s or stop is set."""
        end = time.monotonic() + timeout_s
        with self.cond:
            while not done() and time.monotonic() < end and not (stop and stop.is_set()):
                if self.fatal:
                    return
                self.cond.wait(0.1)

    def drain(self):
        """SIGTERM: draining heartbeat, read the stream to its end, hand back."""
        log.info("draining (grace %.1f s)", self.grace_s)
        grace_end = time.monotonic() + self.grace_s  # counted from the drain start
        with self.cond:
            self.cond.notify_all()
        self.hb_kick.set()  # heartbeat with draining=true now
        self.lease_thread.join(max(3.0, 4 * (self.interval_s or 1.0)))
        if self.lease_thread.is_alive() and self.call is not None:
            log.warning("lease stream did not end after draining; cancelling it")
            self.call.cancel()
        with self.cond:
            buffered = list(self.buffer)
            self.buffer.clear()
            for h in buffered:
                h.why = "release"
        for h in buffered:
            self.report(h, fail=pb.FailItem(lease_id=h.task.lease_id,
                                            mode=pb.FAIL_MODE_RELEASE, error_class="Shutdown"))
        running = lambda: [h for h in self.held.values() if h.running and not h.why]
        self.wait_until(lambda: not running(), grace_end - time.monotonic(), self.grace_over)
        with self.cond:
            late = running()
            for h in late:
                h.why = "release"
        for h in late:
            h.stop.set()
            h.wake.set()
        self.wait_until(lambda: not self.held, 15.0)
        self.exit_now.set()
        if self.held:
            log.error("exiting with %d unanswered leases", len(self.held))


def main():
    """Run until SIGTERM (drain, exit 0) or a status that stops the worker."""
    logging.basicConfig(level=(os.environ.get("DTQ_LOG_LEVEL") or "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    w = Worker(os.environ)

    def on_signal(signum, frame):
        if w.draining.is_set():
            w.grace_over.set()  # a second SIGTERM shortens the grace period
        w.draining.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("worker %s on %s, queues %s", w.worker_id, SDK, w.queues)
    w.start()
    while not w.draining.is_set() and w.fatal is None:
        time.sleep(0.05)
    if w.fatal is None:
        w.drain()
    code = 0 if w.fatal is None else 2
    if w.fatal:
        log.error("stopping: %s", w.fatal)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
