"""dtq.v1.Broker servicer: thin — validate, call the domain layer, convert.

Domain errors become gRPC statuses in one place (grpc_errors). Batched calls
answer per item; a single-item Ack/Fail also raises its item's error as the call
status, so one-lease clients (and grpcurl) see FAILED_PRECONDITION directly.
"""

from __future__ import annotations

import asyncio
import logging

from dtq_gateway import tracing
from dtq_gateway.domain.followup_plan import callback_task_id, plan_chain, plan_group
from dtq_gateway.domain.validation import (
    MAX_REASON_BYTES,
    check_hostname,
    check_queue,
    check_task_id,
    check_task_types,
    check_worker_id,
    check_worker_strings,
    cut_utf8,
    validate_enqueue,
)
from dtq_gateway.duties.followups import FollowUps
from dtq_gateway.errors import DtqError, InvalidArgument, Unavailable
from dtq_gateway.leasing.completion import Completion, ItemOutcome, WorkerRegistration
from dtq_gateway.leasing.dispatch import Dispatcher
from dtq_gateway.leasing.leaseid import owner_tag
from dtq_gateway.leasing.sessions import Session
from dtq_gateway.rpc import grpc_errors
from dtq_gateway.rpc.lease_stream import check_max_batch, send, write_tasks
from dtq_gateway.settings import Settings
from dtq_gateway.store.broker import Broker, Enqueued
from dtq_gateway.store.client import is_cluster
from dtq_gateway.store.groups import queue_limit
from dtq_gateway.store.task_record import STATUS_BY_NAME, task_from_hash
from dtq_proto import dtq_pb2, dtq_pb2_grpc

log = logging.getLogger(__name__)

MAX_BATCH = 1000
MAX_QUEUES = 32
#: Bounds of LeaseRequest.labels: entries, key and value length (UTF-8 bytes).
MAX_LABELS = 32
MAX_LABEL_KEY_BYTES = 64
MAX_LABEL_VALUE_BYTES = 256


def status_enum(status: str) -> dtq_pb2.TaskStatus:
    """TaskStatus value of a stored status string (UNSPECIFIED when unknown)."""
    return STATUS_BY_NAME.get(status, dtq_pb2.TASK_STATUS_UNSPECIFIED)


def _lease_result(oc: ItemOutcome) -> dtq_pb2.LeaseResult:
    res = dtq_pb2.LeaseResult(lease_id=oc.lease_id, duplicate=oc.duplicate,
                              status=status_enum(oc.status))
    if oc.error is not None:
        res.error.CopyFrom(grpc_errors.item_error(oc.error))
    return res


class BrokerServicer(dtq_pb2_grpc.BrokerServicer):
    """Implements dtq.v1.Broker. ``actor_of(context)`` names the caller for the audit log;
    ``admit()`` raises while Enqueue must be refused."""

    def __init__(self, settings: Settings, broker: Broker, completion: Completion,
                 dispatcher: Dispatcher, draining: asyncio.Event, actor_of=None,
                 request_id_of=None, admit=None, identity_of=None,
                 followups: FollowUps | None = None) -> None:
        self.settings = settings
        self.broker = broker
        self.completion = completion
        self.dispatcher = dispatcher
        self.draining = draining
        self.actor_of = actor_of or (lambda ctx: "anonymous")
        self.request_id_of = request_id_of or (lambda ctx: "")
        #: the identity worker ids and leases are bound to (auth.caller_identity)
        self.identity_of = identity_of or (lambda ctx: "")
        #: Raises a DtqError while new tasks must be refused (an evicting Redis).
        self.admit = admit or (lambda: None)
        #: Chains and groups; None refuses them (INVALID_ARGUMENT naming the field).
        self.followups = followups

    def _followups(self, field: str) -> FollowUps:
        if self.followups is None:
            raise InvalidArgument(f"{field}: chains and groups are not served here", field=field)
        return self.followups

    @grpc_errors.mapped_errors
    async def Enqueue(self, request, context):
        trace = tracing.call_trace(context)
        with tracing.span("dtq.gateway.enqueue", request.traceparent or trace[0],
                          request.tracestate if request.traceparent else trace[1],
                          attributes={"dtq.queue": request.queue,
                                      "dtq.task_type": request.task_type}):
            self.admit()
            task = validate_enqueue(request, self.settings, trace=trace)
            task, chain_ids = plan_chain(request, task, self.settings)
            if chain_ids:
                await self._followups("chain").register_queue(task.queue)
            (out,) = await self.broker.enqueue_many([task])
            if isinstance(out, Exception):
                raise out
        if out.deduplicated:
            chain_ids = []  # the earlier task's chain (if any) is the one that runs
        return dtq_pb2.EnqueueResponse(task_id=out.task_id, deduplicated=out.deduplicated,
                                       status=status_enum(out.status),
                                       chain_task_ids=chain_ids, debounced=out.debounced)

    @grpc_errors.mapped_errors
    async def EnqueueBatch(self, request, context):
        trace = tracing.call_trace(context)
        group_id = ""
        with tracing.span("dtq.gateway.enqueue_batch", *trace,
                          attributes={"dtq.items": len(request.items)}):
            self.admit()
            if not 1 <= len(request.items) <= MAX_BATCH:
                raise InvalidArgument(f"items: 1..{MAX_BATCH} items required",
                                      field="items")
            results, valid, where, chains = self._validate_batch(request, trace)
            if request.HasField("group_callback"):
                group_id, valid = plan_group(request.group_callback, valid, self.settings)
                outs = await self._followups("group_callback").create_group(
                    group_id, request.group_callback, valid)
            else:
                for q in {t.queue for t in valid if t.extra_json}:  # chain heads
                    await self._followups("items").register_queue(q)
                outs = await self.broker.enqueue_many(valid) if valid else []
        for i, out in zip(where, outs):
            if isinstance(out, Enqueued):
                results[i] = dtq_pb2.EnqueueBatchResult(
                    task_id=out.task_id, deduplicated=out.deduplicated,
                    status=status_enum(out.status), debounced=out.debounced,
                    chain_task_ids=[] if out.deduplicated else chains.get(i, []))
            else:
                results[i] = dtq_pb2.EnqueueBatchResult(error=grpc_errors.item_error(out))
        return dtq_pb2.EnqueueBatchResponse(
            results=results, group_id=group_id,
            group_callback_task_id=(callback_task_id(group_id, request.group_callback.queue)
                                    if group_id else ""))

    def _validate_batch(self, request, trace: tuple[str, str]
                        ) -> tuple[list, list, list[int], dict[int, list[str]]]:
        """Validate every item: (results with the refused items' errors filled in,
        valid tasks, their indices, chain step ids by index). With a group callback
        any refused item refuses the call (a group must be exactly the items sent)."""
        grouped = request.HasField("group_callback")
        results: list = [None] * len(request.items)
        valid, where, chains = [], [], {}
        for i, item in enumerate(request.items):
            try:
                for name, used in (("chain", bool(item.chain)),
                                   ("debounce", item.HasField("debounce"))):
                    if grouped and used:
                        raise InvalidArgument(f"items[{i}].{name}: not allowed in a group",
                                              field=f"items[{i}].{name}")
                task = validate_enqueue(item, self.settings, prefix=f"items[{i}].", trace=trace)
                task, chains[i] = plan_chain(item, task, self.settings, prefix=f"items[{i}].")
                valid.append(task)
                where.append(i)
            except DtqError as exc:
                if grouped:
                    raise
                results[i] = dtq_pb2.EnqueueBatchResult(error=grpc_errors.item_error(exc))
        return results, valid, where, chains

    def _session(self, request: dtq_pb2.LeaseRequest, identity: str) -> Session:
        check_labels(request.labels)
        check_worker_id(request.worker_id)
        if not 1 <= len(request.queues) <= MAX_QUEUES:
            raise InvalidArgument(f"queues: 1..{MAX_QUEUES} queue names required",
                                  field="queues")
        queues = list(dict.fromkeys(check_queue(q, "queues") for q in request.queues))
        if request.max_in_flight < 1:
            raise InvalidArgument("max_in_flight: must be >= 1", field="max_in_flight")
        check_task_types(request.task_types)
        check_hostname(request.hostname)
        check_worker_strings(request)
        return Session(worker_id=request.worker_id, queues=queues,
                       max_in_flight=min(request.max_in_flight, self.settings.max_in_flight_cap),
                       task_types=frozenset(request.task_types),
                       concurrency=request.concurrency, owner=owner_tag(identity),
                       cancel_notices=request.accept_cancel_notices,
                       labels=dict(list(request.labels.items())[:64]),
                       read_by_slot=is_cluster(self.broker.redis))

    async def Lease(self, request, context) -> None:
        try:
            identity = self.identity_of(context)
            session, max_batch = await self._open_session(request, identity)
        except Exception as exc:  # noqa: BLE001
            await grpc_errors.abort(context, exc)
        # registered before SessionInfo goes out: a client that has its SessionInfo is
        # a candidate for the next read (the finally below unregisters it)
        session.handler = asyncio.current_task()
        self.dispatcher.register(session)
        log.info("lease session opened", extra={"worker_id": session.worker_id,
                                                 "session_id": session.session_id,
                                                 "queues": session.queues})
        try:
            if not await send(context, self._session_info(session, max_batch)):
                return
            if not await write_tasks(context, session, self.dispatcher, max_batch,
                                     self.settings.max_payload_bytes):
                return  # the worker went away: its leases expire and are reclaimed
        except asyncio.CancelledError:
            if not session.not_reading:
                raise
            # the dispatcher ended this stream: it stopped reading (Dispatcher._stall)
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # in a task
        finally:
            await self._close_session(session, request.hostname, identity)
        if session.not_reading:
            await grpc_errors.abort(context, Unavailable(
                "lease stream is not reading: its unread tasks were handed back; reconnect",
                reason="NOT_READING"))
        if not session.worker_draining:
            await grpc_errors.abort(context, Unavailable("gateway is draining; reconnect",
                                                         reason="DRAINING"))

    async def _open_session(self, request: dtq_pb2.LeaseRequest, identity: str
                            ) -> tuple[Session, int]:
        """Validate a LeaseRequest, make sure its queues exist and record the worker as
        started: (the session, the granted max_batch: 0 = one task per message).

        Raises:
            Unavailable: The gateway is draining (reason ``DRAINING``).
            InvalidArgument: A field of the request, named.
            DtqError: The queue limit, or Redis.
        """
        if self.draining.is_set():
            raise Unavailable("gateway is draining", reason="DRAINING")
        session = self._session(request, identity)
        max_batch = check_max_batch(request.max_batch)
        refused = await self.broker.groups.ensure_some(self.broker.redis, session.queues)
        if refused:
            raise queue_limit(min(refused), self.broker.groups.max_queues, field="queues")
        await self.completion.worker_event(session.worker_id, request.hostname, "started",
                                           request.concurrency, caller=identity,
            registration=WorkerRegistration(check_labels(request.labels), session.queues,
                                            sorted(session.task_types)))
        return session, max_batch

    def _session_info(self, session: Session, max_batch: int) -> dtq_pb2.LeaseResponse:
        """The first message of a Lease stream."""
        s = self.settings
        return dtq_pb2.LeaseResponse(session=dtq_pb2.SessionInfo(
            session_id=session.session_id, heartbeat_interval_ms=s.heartbeat_interval_ms,
            visibility_timeout_ms=s.visibility_timeout_ms,
            max_in_flight=session.max_in_flight, gateway_id=s.gateway_id,
            result_max_bytes=s.result_max_bytes, lease_grace_ms=s.lease_grace_ms,
            max_batch=max_batch))

    async def _close_session(self, session: Session, hostname: str, identity: str) -> None:
        """Unregister a Lease session and record the worker's stop (best effort)."""
        await self.dispatcher.unregister(session)
        try:
            await self.completion.worker_event(session.worker_id, hostname, "stopped",
                                               caller=identity)
        except Exception as exc:  # noqa: BLE001 - best effort on a closing stream
            log.debug("could not record worker stop", extra={"error": repr(exc)})
        log.info("lease session closed", extra={"worker_id": session.worker_id,
                                                 "session_id": session.session_id})

    @grpc_errors.mapped_errors
    async def Heartbeat(self, request, context):
        check_worker_id(request.worker_id)
        check_hostname(request.hostname)
        if len(request.lease_ids) > 10000:
            raise InvalidArgument("lease_ids: at most 10000", field="lease_ids")
        if len(request.progress) > 10000:
            raise InvalidArgument("progress: at most 10000", field="progress")
        lost, cancelled = await self.completion.heartbeat(
            request, caller=self.identity_of(context))
        self.dispatcher.received(request.worker_id, request.lease_ids)
        if request.draining:
            self.dispatcher.end_worker(request.worker_id)
        else:
            self.dispatcher.worker_alive(request.worker_id)
        return dtq_pb2.HeartbeatResponse(
            lost_lease_ids=lost, cancelled_lease_ids=cancelled,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms)

    async def _complete(self, items, op, context):
        if not 1 <= len(items) <= MAX_BATCH:
            raise InvalidArgument(f"items: 1..{MAX_BATCH} items required", field="items")
        outcomes = await op(items, caller=self.identity_of(context))
        if len(outcomes) == 1 and outcomes[0].error is not None:
            await grpc_errors.abort(context, outcomes[0].error)
        return [_lease_result(oc) for oc in outcomes]

    @grpc_errors.mapped_errors
    async def Ack(self, request, context):
        results = await self._complete(request.items, self.completion.ack, context)
        return dtq_pb2.AckResponse(results=results)

    @grpc_errors.mapped_errors
    async def Fail(self, request, context):
        results = await self._complete(request.items, self.completion.fail, context)
        return dtq_pb2.FailResponse(results=results)

    @grpc_errors.mapped_errors
    async def GetTask(self, request, context):
        check_task_id(request.task_id)
        fields, result = await self.broker.get(request.task_id)
        return dtq_pb2.GetTaskResponse(task=task_from_hash(fields, result))

    @grpc_errors.mapped_errors
    async def CancelTask(self, request, context):
        check_task_id(request.task_id)
        request_id = self.request_id_of(context)
        kind = await self.broker.cancel(request.task_id, self.actor_of(context), request_id,
                                        cut_utf8(request.reason, MAX_REASON_BYTES))
        requested = kind == "requested"
        return dtq_pb2.CancelTaskResponse(
            status=dtq_pb2.TASK_STATUS_ACTIVE if requested else dtq_pb2.TASK_STATUS_CANCELLED,
            cancel_requested=requested, request_id=request_id)


def check_labels(labels) -> dict[str, str]:
    """LeaseRequest.labels as a dict: at most ``MAX_LABELS`` entries, keys of 1..64 and
    values of at most 256 UTF-8 bytes.

    Raises:
        InvalidArgument: names ``labels``.
    """
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"labels: at most {MAX_LABELS} entries", field="labels")
    for k, v in labels.items():
        if not 1 <= len(k.encode()) <= MAX_LABEL_KEY_BYTES:
            raise InvalidArgument(f"labels: keys must be 1..{MAX_LABEL_KEY_BYTES} bytes",
                                  field="labels")
        if len(v.encode()) > MAX_LABEL_VALUE_BYTES:
            raise InvalidArgument(f"labels: value of {k!r} over {MAX_LABEL_VALUE_BYTES} bytes",
                                  field="labels")
    return dict(labels)
