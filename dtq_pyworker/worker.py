"""The Worker: handler registry, Lease session, heartbeats, drain."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast

from dtq_proto import dtq_pb2
from dtq_pyworker import _session
from dtq_pyworker._batch import BatchHandler
from dtq_pyworker._channel import DEFAULT_TARGET, RECONNECT_MAX_S, Connection, check_target
from dtq_pyworker._execute import Handler
from dtq_pyworker._procpool import ProcessPool
from dtq_pyworker._reporter import ResultReporter
from dtq_pyworker._runtime import STOP_DRAIN, Runtime
from dtq_pyworker._session import MAX_LEASE_BATCH, SessionState
from dtq_pyworker._version import SDK
from dtq_pyworker.client import Client
from dtq_pyworker.connect import ConnectConfig, connect_config, with_target
from dtq_pyworker.errors import DtqRpcError
from dtq_pyworker.handle import TaskHandle

log = logging.getLogger(__name__)

#: Shortest wait for the Lease stream to end after the draining heartbeat, in s.
DRAIN_STREAM_MIN_S = 2.0
STAT_NAMES = ("processed", "failed", "retried", "released", "cancelled", "lost", "stale",
              "timeouts", "reconnects", "refused")
#: Where handlers run: ``thread`` (a thread pool, the default) or ``process``.
POOLS = ("thread", "process")
#: Most queues one Lease session may name (LeaseRequest.queues: 1..32 names).
MAX_QUEUES = 32
#: A queue name (proto/dtq.proto, docs/protocol.md); the gateway refuses any other.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


#: Task statuses after a failure that mean it is retried. A duplicate answer (a resend
#: of a Fail the gateway had applied) gives the task's status now, so a retry already
#: leased again (ACTIVE) counts too.
_LIVE_AGAIN = frozenset({dtq_pb2.TASK_STATUS_SCHEDULED, dtq_pb2.TASK_STATUS_QUEUED})
_LIVE_AGAIN_DUPLICATE = _LIVE_AGAIN | {dtq_pb2.TASK_STATUS_ACTIVE}


def default_worker_id() -> str:
    """``<hostname>-<pid>-<6 hex>``, restricted to the characters worker ids allow."""
    host = re.sub(r"[^A-Za-z0-9_.:@-]", "_", socket.gethostname())[:96] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def check_queues(queues: Iterable[str] | str, field: str = "queues") -> list[str]:
    """The queues of a Lease session as a list (a str is one queue).

    Raises:
        ValueError: Naming ``field``: not 1..:data:`MAX_QUEUES` names, or a name that
            does not match ``[A-Za-z0-9_.-]{1,64}`` (what the gateway would refuse when
            the worker starts).
    """
    names = [queues] if isinstance(queues, str) else list(queues)
    if not 1 <= len(names) <= MAX_QUEUES:
        raise ValueError(f"{field}: 1..{MAX_QUEUES} queue names (a Lease session's limit), "
                         f"got {len(names)}")
    for name in names:
        if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
            raise ValueError(f"{field}: {name!r} is not a queue name "
                             "(1..64 of A-Z a-z 0-9 _ . -)")
    return names


class Worker:
    """Leases tasks from a dtq gateway and runs registered handlers.

    Args:
        queues: Queues to lease from (strict priority across them): 1..32 names of
            ``[A-Za-z0-9_.-]{1,64}``, else ValueError naming ``queues``.
        target: The gateway: a :class:`~dtq_pyworker.ConnectConfig` (address, TLS,
            token), or just its address (``HOST:PORT``); None = ``ConnectConfig()``
            (env ``DTQ_GATEWAY`` or 127.0.0.1:50051, ``DTQ_TOKEN``, ``DTQ_TLS``,
            ``DTQ_TLS_CA``).
        concurrency: Handler slots (sync handlers run in a thread pool this size).
            A handler's ``timeout_ms`` counts from its start (for a sync handler,
            when its thread picks it up). A sync handler still running after its
            timeout (or cancellation) is reported once and keeps its slot until
            its thread returns: no new task starts there, a warning is logged and
            heartbeats count the slot in ``active_tasks``.
        max_in_flight: Leases held at once (running + buffered); default 2 * concurrency.
            Also the most tasks per Lease stream message the worker asks for
            (batched delivery, ``LeaseRequest.max_batch``, at most 256).
            A batch handler takes one slot of ``concurrency`` but holds up to
            ``max_size`` leases: for a batch to fill, ``max_in_flight`` must be at
            least ``max_size`` (plus what other handlers hold); with less, batches
            are cut short at ``max_wait_ms`` and a warning is logged at start.
        pool: ``"thread"`` (default) or ``"process"``, else ValueError naming
            ``pool``. With ``"process"`` every handler (sync or async) runs in one
            of ``concurrency`` child processes: a handler past its ``timeout_ms`` is
            killed (SIGKILL) and fails as ``Timeout`` (retryable); a process that
            dies under its handler fails only that task, as ``HandlerProcessDied``
            (retryable); a cancelled handler's process is killed after
            ``cancel_grace_s``. Each killed or dead process is replaced. Handlers
            must be module-level functions (run_async raises ValueError naming the
            task type otherwise); payloads, results and ``ctx.progress`` cross
            the process boundary, heartbeats and acks stay in this process. See
            docs/handlers.md.
        cancel_grace_s: With ``pool="process"``, how long a cancelled handler may
            finish on its own (``ctx.cancelled`` is set) before its process is
            killed, in seconds >= 0 (default 2).
        worker_id: Stable id of this process; default ``<host>-<pid>-<random>``.
        task_types: Filter sent with the Lease request; default the registered types.
        drain_grace_s: On stop, how long running handlers may finish, in seconds.
        ack_flush_ms: How long results wait to be batched, in ms (or 256 items).
        labels: Labels shown by ListWorkers; a task whose required_labels they do not
            all contain is not leased to this worker (docs/fairness.md).
        rpc_timeout_s: Deadline of unary calls (Heartbeat, Ack, Fail), in seconds.
        reconnect_max_s: Cap of the reconnect backoff, in seconds: both the Lease
            reconnect loop and the channel's connection attempts back off from
            0.1 s up to it (with jitter), so after an outage the worker is back
            within about this long (+20 %) of the gateway serving again.
        channel_options: Extra grpc channel options (they replace the defaults of
            the same name: keepalive every 10 s with a 5 s timeout, the reconnect
            backoff above).
        token, tls, tls_ca, tls_cert, tls_key: Deprecated (a DeprecationWarning;
            gone in dtq 0.3): put them in a :class:`~dtq_pyworker.ConnectConfig`
            (``token``, ``tls=TLSConfig(ca_path, cert_path, key_path)``; ``tls=False``
            for plaintext). Passed with a ConnectConfig they raise TypeError.

    Attributes:
        stats: Counters by name (:data:`STAT_NAMES`). Each Ack/Fail item counts by
            the gateway's answer: applied or duplicate (a resend of an item whose
            reply was lost) as ``processed``, ``failed`` (+ ``retried``),
            ``released`` or ``cancelled``; STALE_LEASE as ``stale``, another
            refusal as ``refused``. A result is sent and counted even when a
            heartbeat reported its lease lost first; ``lost`` counts handlers
            stopped because their lease was lost before they had a result.

    Raises from :meth:`run` / :meth:`run_async`:
        DtqRpcError: The gateway refused the worker for good (UNAUTHENTICATED,
            PERMISSION_DENIED, or INVALID_ARGUMENT on Lease); raised after the drain.
    """

    def __init__(self, queues: Iterable[str], target: str | ConnectConfig | None = None, *,
                 concurrency: int = 8, max_in_flight: int | None = None,
                 pool: str = "thread", cancel_grace_s: float = 2.0,
                 worker_id: str | None = None, task_types: Iterable[str] | None = None,
                 drain_grace_s: float = 30.0, ack_flush_ms: float = 5,
                 labels: Mapping[str, str] | None = None, rpc_timeout_s: float = 10.0,
                 reconnect_max_s: float = RECONNECT_MAX_S,
                 channel_options: list[tuple[str, Any]] | None = None,
                 token: str | None = None, tls: bool | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None) -> None:
        self.queues = check_queues(queues)
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        config = connect_config(target, {"token": token, "tls": tls, "tls_ca": tls_ca,
                                         "tls_cert": tls_cert, "tls_key": tls_key}, "Worker")
        self.target = check_target(
            config.target or os.environ.get("DTQ_GATEWAY") or DEFAULT_TARGET,
            "target" if config.target else "DTQ_GATEWAY")
        #: How this worker reaches its gateway; ``target`` (which the CLI may set
        #: later) wins over the address in it.
        self.connect_config = with_target(config, self.target)
        self._tls_args = {"config": self.connect_config}
        self.concurrency = concurrency
        if pool not in POOLS:
            raise ValueError(f"pool: {pool!r} is not one of {', '.join(POOLS)}")
        self.pool = pool
        if not cancel_grace_s >= 0:
            raise ValueError("cancel_grace_s must be >= 0")
        self.cancel_grace_s = cancel_grace_s
        self.max_in_flight = max_in_flight or 2 * concurrency
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.worker_id = worker_id or default_worker_id()
        self.task_types = list(task_types) if task_types is not None else None
        self.drain_grace_s = drain_grace_s
        self.ack_flush_ms = ack_flush_ms
        self.labels = dict(labels or {})
        self.rpc_timeout_s = rpc_timeout_s
        if reconnect_max_s <= 0:
            raise ValueError("reconnect_max_s must be > 0")
        self.reconnect_max_s = reconnect_max_s
        self.channel_options = list(channel_options or [])
        self.hostname = socket.gethostname()
        self.handlers: dict[str, Handler | BatchHandler] = {}
        self.stats: dict[str, int] = {name: 0 for name in STAT_NAMES}
        #: the Lease and heartbeat loops' state of the current (or last) run
        self._state: SessionState | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self._stop_requested = False
        self._runtime: Runtime | None = None
        self._executor: ThreadPoolExecutor | ProcessPool | None = None
        self._fatal: DtqRpcError | None = None
        self._client: Client | None = None
        self._client_lock = threading.Lock()

    # -- registry -------------------------------------------------------------------
    def task(self, task_type: str, *, queue: str | None = None
             ) -> Callable[[Callable[..., Any]], TaskHandle]:
        """Decorator registering ``fn(payload, ctx)`` for ``task_type``.

        ``async def`` handlers run on the event loop; plain functions run in the
        thread pool.

        Args:
            task_type: Task type the handler serves.
            queue: Default queue of the handle's ``enqueue``; default the
                worker's first queue.

        Returns:
            A decorator returning a :class:`TaskHandle`: calling it calls ``fn``,
            and ``handle.enqueue(payload, client=..., **options)`` enqueues a task
            of this type.
        """
        def register(fn: Callable[..., Any]) -> TaskHandle:
            self.register(task_type, fn)
            return TaskHandle(fn, task_type, queue or self.queues[0], self.client)
        return register

    def register(self, task_type: str, fn: Callable[..., Any]) -> None:
        """Register ``fn`` as the handler of ``task_type`` (replacing any earlier one)."""
        if not task_type:
            raise ValueError("task_type must not be empty")
        if isinstance(fn, TaskHandle):
            fn = fn.fn
        self.handlers[task_type] = Handler.wrap(fn)

    def batch_task(self, task_type: str, *, max_size: int = 100, max_wait_ms: float = 50,
                   queue: str | None = None) -> Callable[[Callable[..., Any]], TaskHandle]:
        """Decorator registering a batch handler ``fn(payloads, ctxs)`` for ``task_type``.

        Leased tasks of the type gather until ``max_size`` are held or ``max_wait_ms``
        passed since the first, then ``fn`` is called once with the list of their
        decoded payloads and the list of their :class:`TaskContext` (same order),
        in one handler slot (an ``async def`` on the event loop, a plain function in
        the thread pool). ``fn`` returns ``None`` (every task succeeds with a null
        result) or a list of one result per task, in order, where an exception
        instance (e.g. ``Retry(after_s=5)``) fails that task alone; an exception
        raised by ``fn`` fails every task of the batch with it. Each task is acked
        or failed on its own, with its own retries. The batch's time limit is the
        smallest ``timeout_ms`` of its tasks; past it every task of the batch fails
        as ``Timeout`` (retryable). A cancelled task has ``ctx.cancelled`` set and
        is reported Cancelled at once; its result is ignored. See
        docs/handlers.md, "Batch handlers".

        Args:
            task_type: Task type the handler serves.
            max_size: Most tasks per call, 1..10000 (default 100).
            max_wait_ms: Longest a batch waits for more tasks after its first, in ms,
                0..60000 (default 50).
            queue: Default queue of the handle's ``enqueue``; default the worker's
                first queue.

        Returns:
            A decorator returning a :class:`TaskHandle` (``enqueue`` enqueues one
            task of this type).

        Raises:
            ValueError: Naming the field: ``max_size`` or ``max_wait_ms`` out of
                range, an empty ``task_type``, or ``pool="process"`` (batch handlers
                run in this process only).
        """
        def register(fn: Callable[..., Any]) -> TaskHandle:
            self.register_batch(task_type, fn, max_size=max_size, max_wait_ms=max_wait_ms)
            return TaskHandle(fn, task_type, queue or self.queues[0], self.client)
        return register

    def register_batch(self, task_type: str, fn: Callable[..., Any], *, max_size: int = 100,
                       max_wait_ms: float = 50) -> None:
        """Register ``fn`` as the batch handler of ``task_type`` (see :meth:`batch_task`).

        Raises:
            ValueError: As :meth:`batch_task`.
        """
        if not task_type:
            raise ValueError("task_type must not be empty")
        if self.pool == "process":
            raise ValueError(f"batch task {task_type!r}: batch handlers are not supported "
                             "with pool='process' (use the thread pool)")
        if isinstance(fn, TaskHandle):
            fn = fn.fn
        self.handlers[task_type] = BatchHandler.wrap(task_type, fn, max_size, max_wait_ms)

    def client(self) -> Client:
        """A blocking :class:`Client` to this worker's gateway with its credentials,
        made on first use and reused (what ``TaskHandle.enqueue`` uses by default)."""
        with self._client_lock:
            if self._client is None:
                self._client = Client(with_target(self.connect_config, self.target))
            return self._client

    # -- lifecycle ------------------------------------------------------------------
    def run(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop`), drain, and return."""
        asyncio.run(self.run_async())

    async def run_async(self, *, install_signal_handlers: bool = True) -> None:
        """Run on the current loop until stopped, then drain and return.

        Args:
            install_signal_handlers: Drain on SIGTERM/SIGINT (main thread only;
                a second signal cuts the grace period short).

        Raises:
            ValueError: ``pool="process"`` and a handler is not a module-level
                function (naming its task type), or ``pool`` is not a known pool.
        """
        if not self.handlers:
            raise RuntimeError("no handlers registered")
        if self.pool not in POOLS:  # the attribute may be set after __init__ (the CLI)
            raise ValueError(f"pool: {self.pool!r} is not one of {', '.join(POOLS)}")
        self._check_batches()
        # _check_batches refused batch handlers under the process pool: all are Handler
        processes = (ProcessPool(self.concurrency, {t: h for t, h in self.handlers.items()
                                                    if isinstance(h, Handler)},
                                 self.cancel_grace_s)
                     if self.pool == "process" else None)  # ValueError before any I/O
        self._loop = asyncio.get_running_loop()
        self._stop, self._force = asyncio.Event(), asyncio.Event()
        if self._stop_requested:
            self._stop.set()
        self._fatal = None
        conn = Connection.resolve(self.target, config=self._tls_args["config"])
        installed = self._install_signals() if install_signal_handlers else []
        channel = conn.channel(aio=True, options=self.channel_options,
                               reconnect_max_s=self.reconnect_max_s)
        threads: ThreadPoolExecutor | None = None
        if processes is not None:
            self._executor = processes
        else:
            self._executor = threads = ThreadPoolExecutor(self.concurrency,
                                                          thread_name_prefix="dtq-handler")
        try:
            if processes is not None:
                await processes.start()
            await self._serve(conn.stub(channel))
            if self._fatal is not None:
                raise self._fatal
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            if processes is not None:
                await processes.close()
            elif threads is not None:
                threads.shutdown(wait=False, cancel_futures=True)
            self._stop_requested = False
            await channel.close()
            log.info("worker stopped", extra={"worker_id": self.worker_id, "stats": self.stats})

    def lease_concurrency(self) -> int:
        """Tasks this worker can run at once, as said in its LeaseRequest: the slots,
        plus ``max_size - 1`` per batch handler (a batch runs ``max_size`` tasks in one
        slot). The gateway reads at most this many tasks per delivery and lets a stream
        hold twice as many unread leases, so a batch can fill between two heartbeats."""
        return self.concurrency + sum(h.max_size - 1 for h in self.handlers.values()
                                      if isinstance(h, BatchHandler))

    def lease_max_batch(self) -> int:
        """Most tasks per Lease stream message this worker asks for
        (LeaseRequest.max_batch): ``max_in_flight``, at most 256. A batch never holds
        more than the credit, so the gateway writes whatever one read activated as one
        message and the worker takes it in one step."""
        return min(MAX_LEASE_BATCH, self.max_in_flight)

    def _lease_request(self) -> dtq_pb2.LeaseRequest:
        """The LeaseRequest this worker opens its sessions with (it takes cancel notices
        on the stream: accept_cancel_notices)."""
        task_types = self.task_types if self.task_types is not None else sorted(self.handlers)
        return dtq_pb2.LeaseRequest(
            worker_id=self.worker_id, queues=self.queues, task_types=task_types,
            max_in_flight=self.max_in_flight, hostname=self.hostname, labels=self.labels,
            concurrency=self.lease_concurrency(), sdk=SDK, max_batch=self.lease_max_batch(),
            accept_cancel_notices=True)

    @property
    def session(self) -> dtq_pb2.SessionInfo | None:
        """SessionInfo of the latest Lease session (None before the first)."""
        return self._state.session if self._state is not None else None

    def _check_batches(self) -> None:
        """Refuse batch handlers under the process pool (``pool`` may be set after they
        were registered, by the CLI); warn when max_in_flight cannot fill a batch."""
        for task_type, handler in self.handlers.items():
            if not isinstance(handler, BatchHandler):
                continue
            if self.pool == "process":
                raise ValueError(f"batch task {task_type!r}: batch handlers are not "
                                 "supported with pool='process' (use the thread pool)")
            if self.max_in_flight < handler.max_size:
                log.warning("max_in_flight is below a batch handler's max_size: its "
                            "batches never fill and run at max_wait_ms", extra={
                                "task_type": task_type, "max_size": handler.max_size,
                                "max_in_flight": self.max_in_flight})

    def stop(self) -> None:
        """Request a graceful drain (safe from any thread and from signal handlers).

        A second call while draining ends the grace period at once.
        """
        self._stop_requested = True
        loop = self._loop
        if loop is None or self._stop is None:
            return
        if _on_loop_thread(loop):
            self._signal_stop()
        else:
            loop.call_soon_threadsafe(self._signal_stop)

    @property
    def active_tasks(self) -> int:
        """Handlers running now."""
        return len(self._runtime.running) if self._runtime else 0

    @property
    def threads_busy(self) -> int:
        """Sync handlers still occupying a pool thread (even after being stopped)."""
        return self._runtime.threads_busy() if self._runtime else 0

    def _stop_fatally(self, err: DtqRpcError) -> None:
        """The gateway refused this worker for good: drain, then raise ``err``."""
        if self._fatal is None:
            log.error("gateway refused the worker, stopping: %s", err)
            self._fatal = err
        self.stop()

    def _signal_stop(self) -> None:
        assert self._stop is not None and self._force is not None
        if self._stop.is_set():
            log.warning("second stop request: ending the drain grace period now")
            self._force.set()
        self._stop.set()

    def _running(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Event, asyncio.Event]:
        """The loop, stop event and force event of the current run (run_async sets them
        before anything that calls this)."""
        loop, stop, force = self._loop, self._stop, self._force
        assert loop is not None and stop is not None and force is not None, "not running"
        return loop, stop, force

    def _handler_executor(self) -> Executor:
        """The run's handler pool as Runtime takes it: a ThreadPoolExecutor, or a
        ProcessPool, which is no Executor (execute() tells it by its ``run_handler``
        method and never hands it to ``run_in_executor``)."""
        assert self._executor is not None, "run_async sets the executor first"
        return cast(Executor, self._executor)

    def _install_signals(self) -> list[int]:
        installed: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return installed
        loop, _, _ = self._running()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        return installed

    async def _serve(self, stub: Any) -> None:
        loop, stop, _ = self._running()
        reporter = ResultReporter(stub, flush_ms=self.ack_flush_ms, on_done=self._on_result,
                                  rpc_timeout_s=self.rpc_timeout_s,
                                  flush_early=self._flush_early, idle=self._idle,
                                  send_progress=lambda reports: _session.send_final_progress(
                                      state, stub, reports))
        runtime = Runtime(self.handlers, self.concurrency, self._handler_executor(), reporter,
                          self.worker_id, self._count)
        self._runtime = runtime
        state = self._state = SessionState(
            request=self._lease_request(), runtime=runtime, target=self.target,
            hostname=self.hostname, concurrency=self.concurrency,
            reconnect_max_s=self.reconnect_max_s, counters=self.counters, count=self._count,
            stop_fatally=self._stop_fatally)
        reporter.start()
        session_ready = asyncio.Event()
        lease_task = asyncio.create_task(_session.lease_loop(state, stub, session_ready),
                                         name="dtq-lease")
        hb_stop = asyncio.Event()
        hb_task = asyncio.create_task(
            _session.heartbeat_loop(state, stub, session_ready, hb_stop), name="dtq-heartbeat")
        try:
            await stop.wait()
            log.info("draining", extra={"worker_id": self.worker_id})
            deadline = loop.time() + self.drain_grace_s
            await self._end_stream(stub, state, lease_task)
            await self._drain(runtime, deadline)
            await reporter.close(timeout_s=max(5.0, self.rpc_timeout_s))
        finally:
            hb_stop.set()
            await _cancel(lease_task)
            await _cancel(hb_task)
            for handle in list(runtime.running.values()):
                handle.cancel()  # only left when the run itself was cancelled
            await asyncio.gather(*runtime.running.values(), return_exceptions=True)
            await reporter.abort()

    def _flush_early(self, queued: int) -> bool:
        """Send results now when waiting would starve the lease credit: the
        gateway sends no new task while results hold half of max_in_flight."""
        runtime = self._runtime
        credit = self.max_in_flight
        if self.session is not None and self.session.max_in_flight:
            credit = min(credit, self.session.max_in_flight)
        return runtime is None or queued * 2 >= credit

    def _idle(self) -> bool:
        """Nothing is running or buffered: results wait only the short idle window."""
        runtime = self._runtime
        return runtime is None or not (runtime.running or runtime.held)

    async def _end_stream(self, stub: Any, state: SessionState,
                          lease_task: asyncio.Task[None]) -> None:
        """Tell the gateway this worker drains and read the Lease stream to its end.

        Buffered leases are released at once, and so is every task still arriving:
        nothing new starts. A draining heartbeat makes the gateway end the stream
        with OK after every lease already sent; the wait is bounded (max(2 s, two
        heartbeat intervals)) for gateways that never end it.
        """
        state.draining = True
        runtime = state.runtime
        runtime.draining = True
        released = runtime.release_buffered()
        if released:
            log.info("released buffered tasks", extra={"count": released})
        if not state.session_open or self._fatal is not None:
            # no session (reconnect backoff, or a call still waiting for its gateway):
            # nothing in transit, no stream end to wait for
            await _cancel(lease_task)
            return
        beat = asyncio.create_task(_session.drain_heartbeat(state, stub),
                                   name="dtq-drain-heartbeat")
        bound_s = max(DRAIN_STREAM_MIN_S, 2 * state.heartbeat_interval_ms / 1000.0)
        _, _, force_event = self._running()
        force = asyncio.ensure_future(force_event.wait())
        try:
            await asyncio.wait([lease_task, force], timeout=bound_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            force.cancel()
        if not lease_task.done():
            log.warning("lease stream not ended by the gateway; closing it",
                        extra={"waited_s": bound_s})
        await _cancel(lease_task)
        await asyncio.gather(beat, return_exceptions=True)

    async def _drain(self, runtime: Runtime, deadline: float) -> None:
        """Let running handlers finish until ``deadline`` (loop time, s), then stop
        and release the rest."""
        runtime.release_buffered()  # nothing is buffered by now; kept as a safety net
        loop, _, force_event = self._running()
        force = asyncio.ensure_future(force_event.wait())
        try:
            while runtime.running and not force.done():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await asyncio.wait([*runtime.running.values(), force], timeout=remaining,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            force.cancel()
        left = runtime.running_lease_ids()
        if left:
            log.warning("drain grace over: handing %d running task(s) back to the gateway "
                        "(FAIL_MODE_RELEASE: back in their queue at once for another worker, "
                        "no attempt spent)", len(left), extra={"count": len(left)})
            runtime.stop(left, STOP_DRAIN)
            await asyncio.gather(*runtime.running.values(), return_exceptions=True)

    # -- counters ---------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def _on_result(self, item: dtq_pb2.AckItem | dtq_pb2.FailItem,
                   result: dtq_pb2.LeaseResult | None, err: DtqRpcError | None) -> None:
        """Count one answered Ack/Fail item by the gateway's answer: STALE_LEASE is
        ``stale``, another error ``refused``; an applied or duplicate item by its kind."""
        if err is not None:
            self._count("stale" if err.reason == "STALE_LEASE" else "refused")
            return
        if isinstance(item, dtq_pb2.AckItem):
            self._count("processed")
        elif item.mode == dtq_pb2.FAIL_MODE_RELEASE:
            self._count("released")
        elif item.mode == dtq_pb2.FAIL_MODE_CANCELLED:
            self._count("cancelled")
        else:
            self._count("failed")
            if result is not None and result.status in (
                    _LIVE_AGAIN_DUPLICATE if result.duplicate else _LIVE_AGAIN):
                self._count("retried")

    def counters(self) -> dtq_pb2.WorkerCounters:
        """Cumulative counters as sent in HeartbeatRequest.counters."""
        return dtq_pb2.WorkerCounters(tasks_processed=self.stats["processed"],
                                      tasks_failed=self.stats["failed"],
                                      tasks_retried=self.stats["retried"])


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def _cancel(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
