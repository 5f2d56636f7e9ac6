"""Producer clients: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Both answer typed values (:class:`~dtq_pyworker.tasks.Task`, ``EnqueueResult``,
``CancelResult``) and share one wait rule: :meth:`Client.wait` returns a task that
succeeded and raises ``TaskFailed``, ``TaskCancelled`` or ``TaskExpired`` for one
that ended otherwise (``raise_on_failure=False`` returns it instead).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker import _tracing
from dtq_pyworker._channel import Connection
from dtq_pyworker._requests import (
    EnqueueResult,
    GroupResult,
    batch_request,
    batch_results,
    enqueue_request,
    enqueue_result,
    template_request,
)
from dtq_pyworker.connect import ConnectConfig, connect_config
from dtq_pyworker.errors import DtqRpcError
from dtq_pyworker.tasks import CancelResult, Task, TaskStatus, TaskWaitTimeout, outcome_error

POLL_FIRST_S = 0.02
POLL_MAX_S = 0.5


def _next_poll(delay_s: float) -> float:
    return min(POLL_MAX_S, delay_s * 1.5)


def _finished(task: Task, raise_on_failure: bool) -> Task:
    """Return a terminal task, or raise its outcome's exception."""
    if raise_on_failure:
        err = outcome_error(task)
        if err is not None:
            raise err
    return task


def _cancel_result(resp: dtq_pb2.CancelTaskResponse) -> CancelResult:
    return CancelResult(TaskStatus.of(resp.status), resp.cancel_requested, resp.request_id)


def _or_missing(get: Callable[[], Task], missing_ok: bool) -> Task | None:
    """``get()``, or None for NOT_FOUND when ``missing_ok``."""
    try:
        return get()
    except DtqRpcError as exc:
        if missing_ok and exc.code == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def _connect(config: ConnectConfig, aio: bool, options: list[tuple[str, Any]] | None
             ) -> tuple[Connection, Any, Any]:
    """(resolved connection, channel, Broker stub) for a client. The channel resends
    read-only calls on UNAVAILABLE (``_channel.RETRIED_METHODS``)."""
    conn = Connection.of(config)
    channel = conn.channel(aio=aio, options=options, retries=True)
    return conn, channel, conn.stub(channel)


class Client:
    """Blocking producer client.

    Args:
        target: The gateway: a :class:`~dtq_pyworker.ConnectConfig` (address, TLS,
            token), or just its address (``HOST:PORT``); None = ``ConnectConfig()``
            (env ``DTQ_GATEWAY`` or 127.0.0.1:50051, ``DTQ_TOKEN``, ``DTQ_TLS``,
            ``DTQ_TLS_CA``).
        timeout_s: Deadline of each call in seconds, retries included.
        channel_options: Extra grpc channel options; ``("grpc.service_config", json)``
            replaces the retry policy (``"{}"``: none), ``("grpc.enable_retries", 0)``
            turns retries off.
        token, tls, tls_ca, tls_cert, tls_key: Deprecated (a DeprecationWarning;
            gone in dtq 0.3): put them in a :class:`~dtq_pyworker.ConnectConfig`
            (``token``, ``tls=TLSConfig(ca_path, cert_path, key_path)``; ``tls=False``
            for plaintext). Passed with a ConnectConfig they raise TypeError.

    Every method raises :class:`DtqRpcError` when the gateway refuses the call.
    Read-only calls (GetTask, so also :meth:`wait`) are sent again when they fail
    with UNAVAILABLE (gateway restarting or unreachable, Redis down): up to 5
    attempts about 0.25, 0.5, 1 and 2 s apart, within ``timeout_s``; the error
    of the last attempt is raised, or DEADLINE_EXCEEDED when ``timeout_s`` passes
    first. Enqueue, EnqueueBatch and CancelTask are sent once.
    """

    def __init__(self, target: str | ConnectConfig | None = None, *, timeout_s: float = 10.0,
                 channel_options: list[tuple[str, Any]] | None = None,
                 token: str | None = None, tls: bool | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None) -> None:
        self.timeout_s = timeout_s
        config = connect_config(target, {"token": token, "tls": tls, "tls_ca": tls_ca,
                                         "tls_cert": tls_cert, "tls_key": tls_key},
                                type(self).__name__)
        self.connection, self._channel, self._stub = _connect(config, False, channel_options)
        self.target = self.connection.target

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise DtqRpcError.from_rpc_error(exc) from exc

    def enqueue(self, queue: str, task_type: str, payload: Any = None,
                **options: Any) -> EnqueueResult:
        """Enqueue one task.

        Args:
            queue: Queue name.
            task_type: Handler name.
            payload: JSON-encodable value, or bytes sent as-is.
            **options: priority, max_attempts, timeout_ms, idempotency_key, delay_ms,
                not_before_ms, expires_at_ms, ttl_ms, retry_policy, metadata,
                content_type, traceparent, tracestate (see ``EnqueueRequest``),
                ``chain``: steps run one after another once this task succeeded (dicts
                of these arguments; a step without payload gets the previous result),
                and ``debounce``: ``{"key": ..., "window_ms": ..., "mode": "keep_first"
                | "keep_last", "max_delay_ms": ...}`` (docs/handlers.md, "Debounce").

        Returns:
            EnqueueResult(task_id, deduplicated, status, chain_task_ids, debounced).

        With OpenTelemetry installed the call runs in a "dtq.enqueue" PRODUCER span
        whose context travels with the task to its handler.
        """
        req = enqueue_request(queue, task_type, payload, **options)
        with _tracing.producer_span(req):
            return enqueue_result(self._call("Enqueue", req))

    def enqueue_group(self, items: Iterable[Mapping[str, Any]],
                      callback: Mapping[str, Any]) -> GroupResult:
        """Enqueue tasks as a group whose ``callback`` task runs once all finished.

        Args:
            items: dicts like :meth:`enqueue_batch`'s (no chains), 1..1000.
            callback: dict with queue, task_type and options; without a payload the
                callback receives {"group_id", "members": [{"task_id", "status",
                "error_class", "error", "result"}...]}.

        Returns:
            GroupResult(group_id, callback_task_id, per-member results).
        """
        req = batch_request(items)
        req.group_callback.CopyFrom(template_request(callback))
        resp = self._call("EnqueueBatch", req)
        return GroupResult(resp.group_id, resp.group_callback_task_id, batch_results(resp))

    def enqueue_batch(self, items: Iterable[Mapping[str, Any]]
                      ) -> list[EnqueueResult | DtqRpcError]:
        """Enqueue many tasks in one call (up to 1000).

        Args:
            items: dicts with queue, task_type, payload and any enqueue option.

        Returns:
            Per item, in order: EnqueueResult, or DtqRpcError for a refused item.
        """
        return batch_results(self._call("EnqueueBatch", batch_request(items)))

    def get_task(self, task_id: str) -> Task:
        """Return the stored task as a :class:`Task` (payload and result decoded,
        UTC datetimes; the protobuf record in ``.raw``).

        Raises:
            DtqRpcError: NOT_FOUND when the task is unknown or its record expired.
        """
        return Task.from_proto(self._call("GetTask",
                                          dtq_pb2.GetTaskRequest(task_id=task_id)).task)

    get = get_task

    def wait(self, task_id: str, timeout_s: float = 30.0, *,
             raise_on_failure: bool = True,
             missing_ok: bool = False) -> Task:
        """Poll GetTask until the task is terminal (20 ms growing to 500 ms apart).

        Args:
            task_id: Task to wait for.
            timeout_s: Give up after this many seconds.
            raise_on_failure: Raise for a task that did not succeed (default);
                False returns every terminal task.
            missing_ok: Keep polling while the task does not exist yet (a chain step or
                group callback, created once the tasks before it finished).

        Returns:
            The SUCCEEDED task (with ``raise_on_failure=False``, also a
            DEAD_LETTERED, CANCELLED or EXPIRED one).

        Raises:
            TaskFailed: The task was dead-lettered (``.error``, ``.error_class``).
            TaskCancelled: The task was cancelled.
            TaskExpired: The task expired before it started.
            TaskWaitTimeout: Not terminal within ``timeout_s`` (a TimeoutError).
            DtqRpcError: GetTask failed (NOT_FOUND, UNAVAILABLE...).
        """
        deadline = time.monotonic() + timeout_s
        delay = POLL_FIRST_S
        while True:
            task = _or_missing(lambda: self.get_task(task_id), missing_ok)
            if task is not None and task.terminal:
                return _finished(task, raise_on_failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TaskWaitTimeout(task, timeout_s, task_id)
            time.sleep(min(delay, remaining))
            delay = _next_poll(delay)

    def wait_chain(self, first: EnqueueResult, timeout_s: float = 30.0, *,
                   raise_on_failure: bool = True) -> Task:
        """Wait for a chain: returns its last task once it succeeded. A step that ended
        otherwise broke the chain (its ``chain_state`` is ``ChainState.BROKEN``): like
        :meth:`wait`, that raises its outcome's exception, whose ``.task`` is the step;
        with ``raise_on_failure=False`` the step is returned instead.

        Raises:
            TaskFailed: A step was dead-lettered.
            TaskCancelled: A step was cancelled.
            TaskExpired: A step expired before it started.
            TaskWaitTimeout: The chain did not end within ``timeout_s`` (a TimeoutError).
        """
        deadline = time.monotonic() + timeout_s
        for task_id in (first.task_id, *first.chain_task_ids):
            task = self.wait(task_id, max(0.0, deadline - time.monotonic()), missing_ok=True,
                             raise_on_failure=False)
            if task.status != TaskStatus.SUCCEEDED:
                return _finished(task, raise_on_failure)
        return task

    def cancel(self, task_id: str, reason: str = "") -> CancelResult:
        """Cancel a queued, scheduled or running task.

        Args:
            task_id: Task to cancel.
            reason: Free-form reason for the audit stream (up to 1024 bytes).

        Returns:
            CancelResult(status, cancel_requested, request_id).

        Raises:
            DtqRpcError: NOT_FOUND (unknown task), FAILED_PRECONDITION (already
                terminal).
        """
        return _cancel_result(self._call("CancelTask", dtq_pb2.CancelTaskRequest(
            task_id=task_id, reason=reason)))

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio producer client with the same methods and arguments as :class:`Client`
    (coroutines), and the same retries of read-only calls.

    Create it inside a running event loop.
    """

    def __init__(self, target: str | ConnectConfig | None = None, *, timeout_s: float = 10.0,
                 channel_options: list[tuple[str, Any]] | None = None,
                 token: str | None = None, tls: bool | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None) -> None:
        self.timeout_s = timeout_s
        config = connect_config(target, {"token": token, "tls": tls, "tls_ca": tls_ca,
                                         "tls_cert": tls_cert, "tls_key": tls_key},
                                type(self).__name__)
        self.connection, self._channel, self._stub = _connect(config, True, channel_options)
        self.target = self.connection.target

    async def _call(self, method: str, request: Any) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise DtqRpcError.from_rpc_error(exc) from exc

    async def enqueue(self, queue: str, task_type: str, payload: Any = None,
                      **options: Any) -> EnqueueResult:
        """Enqueue one task (see :meth:`Client.enqueue`)."""
        req = enqueue_request(queue, task_type, payload, **options)
        with _tracing.producer_span(req):
            return enqueue_result(await self._call("Enqueue", req))

    async def enqueue_group(self, items: Iterable[Mapping[str, Any]],
                            callback: Mapping[str, Any]) -> GroupResult:
        """Enqueue a group with a callback (see :meth:`Client.enqueue_group`)."""
        req = batch_request(items)
        req.group_callback.CopyFrom(template_request(callback))
        resp = await self._call("EnqueueBatch", req)
        return GroupResult(resp.group_id, resp.group_callback_task_id, batch_results(resp))

    async def enqueue_batch(self, items: Iterable[Mapping[str, Any]]
                            ) -> list[EnqueueResult | DtqRpcError]:
        """Enqueue many tasks in one call (see :meth:`Client.enqueue_batch`)."""
        return batch_results(await self._call("EnqueueBatch", batch_request(items)))

    async def get_task(self, task_id: str) -> Task:
        """Return the stored task (see :meth:`Client.get_task`)."""
        resp = await self._call("GetTask", dtq_pb2.GetTaskRequest(task_id=task_id))
        return Task.from_proto(resp.task)

    get = get_task

    async def wait(self, task_id: str, timeout_s: float = 30.0, *,
                   raise_on_failure: bool = True, missing_ok: bool = False) -> Task:
        """Poll GetTask until the task is terminal (see :meth:`Client.wait`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = POLL_FIRST_S
        while True:
            try:
                task = await self.get_task(task_id)
            except DtqRpcError as exc:
                if not (missing_ok and exc.code == grpc.StatusCode.NOT_FOUND):
                    raise
                task = None
            if task is not None and task.terminal:
                return _finished(task, raise_on_failure)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TaskWaitTimeout(task, timeout_s, task_id)
            await asyncio.sleep(min(delay, remaining))
            delay = _next_poll(delay)

    async def wait_chain(self, first: EnqueueResult, timeout_s: float = 30.0, *,
                         raise_on_failure: bool = True) -> Task:
        """Wait for a chain; a broken step raises like :meth:`wait` (see
        :meth:`Client.wait_chain`)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        for task_id in (first.task_id, *first.chain_task_ids):
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            task = await self.wait(task_id, left, missing_ok=True,
                                   raise_on_failure=False)
            if task.status != TaskStatus.SUCCEEDED:
                return _finished(task, raise_on_failure)
        return task

    async def cancel(self, task_id: str, reason: str = "") -> CancelResult:
        """Cancel a queued, scheduled or running task (see :meth:`Client.cancel`)."""
        return _cancel_result(await self._call("CancelTask", dtq_pb2.CancelTaskRequest(
            task_id=task_id, reason=reason)))

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
