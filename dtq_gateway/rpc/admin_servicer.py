"""``dtq.v1.Admin``: the operator service (grpcurl-friendly).

Thin: validate the request → call :mod:`dtq_gateway.store.admin` /
:mod:`dtq_gateway.store.admin_dlq` → convert to protobuf. Errors go through
:func:`dtq_gateway.rpc.grpc_errors.abort` (status + ErrorInfo). Destructive calls
take the actor from :func:`dtq_gateway.rpc.auth.actor_of` and the request id from
:func:`dtq_gateway.store.audit.request_id_of` (echoed in the ``x-request-id`` trailer).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from dtq_gateway import metrics, task_filters
from dtq_gateway.domain.validation import MAX_REASON_BYTES, cut_utf8
from dtq_gateway.errors import InvalidArgument, NotFound, Unavailable
from dtq_gateway.queue_rates import RATES
from dtq_gateway.rpc.auth import actor_of
from dtq_gateway.rpc.grpc_errors import mapped_errors
from dtq_gateway.settings import Settings
from dtq_gateway.store import (
    admin,
    admin_dlq,
    admin_lists,
    bulk,
    keys,
    queue_delete,
    ratelimits,
    schedules,
    search,
)
from dtq_gateway.store.admin_common import CallInfo, as_int, page_size
from dtq_gateway.store.audit import append_audit, request_id_of
from dtq_gateway.store.client import Client
from dtq_gateway.store.replies import text
from dtq_gateway.store.task_record import NAME_BY_STATUS, task_from_hash
from dtq_proto import dtq_pb2 as pb
from dtq_proto import dtq_pb2_grpc

log = logging.getLogger(__name__)

MAX_REDRIVE_LIMIT = 100_000
MAX_REDRIVE_RATE = 10_000
LIST_QUEUES_PAGE_DEFAULT = 100
LIST_QUEUES_PAGE_MAX = 1000
MAX_CANCEL_LIMIT = task_filters.MAX_CANCEL_LIMIT


_rpc = mapped_errors


def _call(context: grpc.aio.ServicerContext) -> CallInfo:
    return CallInfo(actor=actor_of(context), request_id=request_id_of(context))


def _dead_letter(e: admin_dlq.DeadLetterEntry) -> pb.DeadLetter:
    f = e.fields
    return pb.DeadLetter(
        entry_id=e.entry_id, task_id=text(f.get("task_id")),
        queue=text(f.get("original_queue") or f.get("queue")),
        task_type=text(f.get("task_type")), payload=f.get("payload", b""),
        attempts_made=as_int(f.get("attempts_made")), last_error=text(f.get("last_error")),
        last_error_class=text(f.get("last_error_class")),
        failed_at_ms=as_int(f.get("failed_at_ms")), worker_id=text(f.get("worker_id")),
        priority=as_int(f.get("priority")))


def _queue_stats(s: admin.QueueStats) -> pb.GetQueueStatsResponse:
    c = s.counters
    rate = RATES.observe(s.queue, s.now_ms, c.get("succeeded", 0), s.failed)
    return pb.GetQueueStatsResponse(
        queue=s.queue, depth=s.depth, pending=s.pending, scheduled=s.scheduled,
        oldest_task_age_ms=s.oldest_task_age_ms, paused=s.paused,
        dead_letter_depth=s.dead_letter_depth,
        bands=[pb.BandStats(band=b.band, depth=b.depth, pending=b.pending) for b in s.bands],
        consumers=[pb.ConsumerStats(name=c.name, pending=c.pending, idle_ms=c.idle_ms)
                   for c in s.consumers],
        succeeded=c.get("succeeded", 0), failed=s.failed, retried=c.get("retried", 0),
        dead_lettered=c.get("dead_lettered", 0), cancelled=c.get("cancelled", 0),
        succeeded_per_s=rate.succeeded_per_s, failed_per_s=rate.failed_per_s,
        throughput_window_ms=rate.window_ms,
        waiting_types=[pb.TaskTypeWaiting(task_type=t.task_type, waiting=t.waiting,
                                          oldest_age_ms=t.oldest_age_ms, taken=t.taken)
                       for t in s.waiting_types],
        waiting_complete=s.waiting_complete, stuck_task_types=s.stuck_task_types)


def _worker(w: admin_lists.WorkerRecord) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        worker_id=w.worker_id, hostname=w.hostname, started_at_ms=w.started_at_ms,
        last_heartbeat_at_ms=w.last_heartbeat_at_ms, heartbeat_age_ms=w.heartbeat_age_ms,
        active_tasks=w.active_tasks, concurrency=w.concurrency,
        tasks_processed=w.tasks_processed, tasks_failed=w.tasks_failed,
        tasks_retried=w.tasks_retried, status=w.status, alive=w.alive, leasing=w.leasing,
        labels=w.labels, queues=w.queues, task_types=w.task_types)


def _redrive_filter(req: pb.RedriveDeadLettersRequest) -> admin_dlq.RedriveFilter:
    if req.queue:
        admin.validate_queue(req.queue)
    if req.task_type and not keys.TASK_TYPE_RE.match(req.task_type):
        raise InvalidArgument("task_type: must match [A-Za-z0-9_.:/-]{1,128}", field="task_type")
    if len(req.error_class.encode()) > 128:
        raise InvalidArgument("error_class: at most 128 bytes", field="error_class")
    for name in ("min_age_ms", "max_age_ms"):
        if getattr(req, name) < 0:
            raise InvalidArgument(f"{name}: must be >= 0", field=name)
    if req.max_age_ms and req.min_age_ms > req.max_age_ms:
        raise InvalidArgument("max_age_ms: must be >= min_age_ms", field="max_age_ms")
    return admin_dlq.RedriveFilter(queue=req.queue, task_type=req.task_type,
                                   error_class=req.error_class, min_age_ms=req.min_age_ms,
                                   max_age_ms=req.max_age_ms)


class AdminServicer(dtq_pb2_grpc.AdminServicer):
    """Implements dtq.v1.Admin.

    Args:
        redis: the gateway's client.
        settings: gateway settings (audit MAXLEN, task retention, heartbeat interval).
        broker: the gateway's :class:`~dtq_gateway.store.broker.Broker` (TriggerSchedule).
    """

    def __init__(self, redis: Client, settings: Settings, broker: Any = None) -> None:
        self.redis = redis
        self.settings = settings
        self.broker = broker
        self.dlq = admin_dlq.DlqSettings(audit_maxlen=settings.audit_maxlen,
                                         task_retention_s=settings.task_retention_s,
                                         idem_ttl_s=settings.idem_ttl_s)

    @_rpc
    async def ListQueues(self, request: pb.ListQueuesRequest, context: Any
                         ) -> pb.ListQueuesResponse:
        """One page of the queue registry, sorted by name."""
        size = page_size(request.page_size, "page_size", LIST_QUEUES_PAGE_DEFAULT,
                         LIST_QUEUES_PAGE_MAX)
        queues, token = await admin.list_queues(self.redis, size, request.page_token)
        return pb.ListQueuesResponse(next_page_token=token, queues=[pb.QueueSummary(
            name=q.name, depth=q.depth, pending=q.pending, paused=q.paused) for q in queues])

    @_rpc
    async def GetQueueStats(self, request: pb.GetQueueStatsRequest, context: Any
                            ) -> pb.GetQueueStatsResponse:
        """Per-band depth/pending and the autoscaling signals of one queue."""
        return _queue_stats(await admin.queue_stats(self.redis, request.queue,
                                                    self.settings.heartbeat_interval_ms))

    @_rpc
    async def PauseQueue(self, request: pb.PauseQueueRequest, context: Any
                         ) -> pb.PauseQueueResponse:
        """Stop leasing from a queue (audited)."""
        changed, request_id = await self._set_paused(request, context, True)
        return pb.PauseQueueResponse(changed=changed, request_id=request_id)

    @_rpc
    async def ResumeQueue(self, request: pb.ResumeQueueRequest, context: Any
                          ) -> pb.ResumeQueueResponse:
        """Resume leasing from a queue (audited)."""
        changed, request_id = await self._set_paused(request, context, False)
        return pb.ResumeQueueResponse(changed=changed, request_id=request_id)

    async def _set_paused(self, request: Any, context: Any, paused: bool) -> tuple[bool, str]:
        admin.validate_queue(request.queue)
        call = _call(context)
        reason = cut_utf8(request.reason, MAX_REASON_BYTES)
        changed = await admin.set_paused(self.redis, request.queue, paused, call, reason,
                                         audit_maxlen=self.settings.audit_maxlen,
                                         create=paused and request.create)
        return changed, call.request_id

    @_rpc
    async def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any
                          ) -> pb.DeleteQueueResponse:
        """Delete a drained queue and its keys, or report them with dry_run (audited).

        After a delete, this replica forgets the queue's consumer groups (the next
        enqueue or lease creates them again) and its metric series; other replicas
        recover from NOGROUP and drop the series within a gauge refresh.
        """
        call = _call(context)
        done = await queue_delete.delete_queue(
            self.redis, request.queue, call, dry_run=request.dry_run,
            discard_dead_letters=request.discard_dead_letters,
            reason=cut_utf8(request.reason, MAX_REASON_BYTES),
            audit_maxlen=self.settings.audit_maxlen)
        if done.deleted:
            if self.broker is not None:
                self.broker.groups.discard([request.queue])
            metrics.forget_queue(request.queue)
        return pb.DeleteQueueResponse(deleted=done.deleted, dry_run=request.dry_run,
                                      keys=done.keys,
                                      dead_letters_discarded=done.dead_letters,
                                      request_id=call.request_id)

    @_rpc
    async def ListDeadLetters(self, request: pb.ListDeadLettersRequest, context: Any
                              ) -> pb.ListDeadLettersResponse:
        """One page of the dead-letter stream, newest first."""
        size = page_size(request.page_size, "page_size", 50, 500)
        entries, token = await admin_dlq.list_dead_letters(self.redis, size, request.page_token,
                                                           request.queue)
        return pb.ListDeadLettersResponse(entries=[_dead_letter(e) for e in entries],
                                          next_page_token=token)

    @_rpc
    async def RequeueDeadLetter(self, request: pb.RequeueDeadLetterRequest, context: Any
                                ) -> pb.RequeueDeadLetterResponse:
        """A dead-lettered task back in its queue with a fresh attempt budget."""
        call = _call(context)
        await admin_dlq.requeue(self.redis, request.task_id, call, self.dlq)
        return pb.RequeueDeadLetterResponse(task_id=request.task_id,
                                            request_id=call.request_id)

    @_rpc
    async def DiscardDeadLetter(self, request: pb.DiscardDeadLetterRequest, context: Any
                                ) -> pb.DiscardDeadLetterResponse:
        """Remove a dead-letter entry; the task stays dead_lettered, discarded=true."""
        call = _call(context)
        await admin_dlq.discard(self.redis, request.task_id, call, self.dlq)
        return pb.DiscardDeadLetterResponse(request_id=call.request_id)

    @_rpc
    async def PurgeDeadLetters(self, request: pb.PurgeDeadLettersRequest, context: Any
                               ) -> pb.PurgeDeadLettersResponse:
        """Remove every dead-letter entry (exact trim to 0)."""
        call = _call(context)
        purged = await admin_dlq.purge(self.redis, call, self.dlq)
        return pb.PurgeDeadLettersResponse(purged=purged, request_id=call.request_id)

    @_rpc
    async def RedriveDeadLetters(self, request: pb.RedriveDeadLettersRequest, context: Any
                                 ) -> pb.RedriveDeadLettersResponse:
        """Requeue (or count, with dry_run) the dead letters matching a filter."""
        flt = _redrive_filter(request)
        limit = page_size(request.limit, "limit", 1000, MAX_REDRIVE_LIMIT)
        rate = page_size(request.max_per_second, "max_per_second", 100, MAX_REDRIVE_RATE)
        call = _call(context)
        result = await admin_dlq.redrive(self.redis, flt, call, self.dlq,
                                         dry_run=request.dry_run, max_per_second=rate,
                                         limit=limit)
        return pb.RedriveDeadLettersResponse(matched=result.matched, requeued=result.requeued,
                                             task_ids=result.task_ids,
                                             request_id=call.request_id)

    async def _bulk_cancel(self, flt: bulk.TaskFilter, context: Any, action: str,
                           dry_run: bool, limit: int, reason: str) -> tuple[bulk.BulkResult, str]:
        if not await admin.queue_known(self.redis, flt.queue):
            raise NotFound(f"queue: no queue named {flt.queue!r}", reason="QUEUE_NOT_FOUND")
        call = _call(context)
        result = await bulk.bulk_cancel(
            self.redis, flt, call, action=action, dry_run=dry_run, limit=limit,
            reason=cut_utf8(reason, MAX_REASON_BYTES),
            task_retention_s=self.settings.task_retention_s,
            keep_finished=self.settings.keep_finished_for(flt.queue),
            audit_maxlen=self.settings.audit_maxlen)
        return result, call.request_id

    @_rpc
    async def CancelTasks(self, request: pb.CancelTasksRequest, context: Any
                          ) -> pb.CancelTasksResponse:
        """Cancel (or count, with dry_run) the waiting tasks of one queue matching the
        filter; audited as cancel_tasks. NOT_FOUND for an unknown queue."""
        flt = task_filters.cancel_filter(request.filter)
        limit = page_size(request.limit, "limit", 100_000, MAX_CANCEL_LIMIT)
        result, request_id = await self._bulk_cancel(flt, context, "cancel_tasks",
                                                     request.dry_run, limit, request.reason)
        return pb.CancelTasksResponse(matched=result.matched, cancelled=result.cancelled,
                                      cancel_requested=result.requested,
                                      task_ids=result.task_ids, request_id=request_id)

    @_rpc
    async def PurgeQueue(self, request: pb.PurgeQueueRequest, context: Any
                         ) -> pb.PurgeQueueResponse:
        """Cancel (or count, with dry_run) every waiting task of a queue; audited as
        purge_queue. NOT_FOUND for an unknown queue."""
        admin.validate_queue(request.queue)
        result, request_id = await self._bulk_cancel(
            bulk.TaskFilter(queue=request.queue), context, "purge_queue", request.dry_run,
            MAX_CANCEL_LIMIT, request.reason)
        return pb.PurgeQueueResponse(matched=result.matched, cancelled=result.cancelled,
                                     request_id=request_id)

    @_rpc
    async def SearchTasks(self, request: pb.SearchTasksRequest, context: Any
                          ) -> pb.SearchTasksResponse:
        """One page of the tasks of the recent-tasks index matching the filter, newest
        first (payload omitted); at most 1000 index entries read per page."""
        size = page_size(request.page_size, "page_size", 50, 500)
        flt = await task_filters.search_filter(self.redis, request.filter)
        rows, token, examined = await search.search(self.redis, flt, size,
                                                    request.page_token)
        return pb.SearchTasksResponse(
            tasks=[task_from_hash(r, None, include_payload=False) for r in rows],
            next_page_token=token, examined=examined)

    @_rpc
    async def ListWorkers(self, request: pb.ListWorkersRequest, context: Any
                          ) -> pb.ListWorkersResponse:
        """Known workers with heartbeat age and liveness."""
        workers = await admin_lists.list_workers(self.redis, self.settings.heartbeat_interval_ms)
        return pb.ListWorkersResponse(workers=[_worker(w) for w in workers])

    @_rpc
    async def ListRecentTasks(self, request: pb.ListRecentTasksRequest, context: Any
                              ) -> pb.ListRecentTasksResponse:
        """Most recently created tasks, newest first, payload omitted."""
        limit = page_size(request.limit, "limit", 50, 1000)
        if request.queue:
            admin.validate_queue(request.queue)
        status = ""
        if request.status != pb.TASK_STATUS_UNSPECIFIED:
            status = NAME_BY_STATUS.get(request.status, "")
            if not status:
                raise InvalidArgument("status: unknown task status", field="status")
        rows = await admin_lists.list_recent_tasks(self.redis, limit, request.queue, status)
        return pb.ListRecentTasksResponse(
            tasks=[task_from_hash(f, None, include_payload=False) for f in rows])

    @_rpc
    async def ListAudit(self, request: pb.ListAuditRequest, context: Any) -> pb.ListAuditResponse:
        """One page of the audit stream, newest first."""
        size = page_size(request.page_size, "page_size", 50, 500)
        items, token = await admin_lists.list_audit(self.redis, size, request.page_token)
        return pb.ListAuditResponse(next_page_token=token, entries=[pb.AuditEntry(
            entry_id=a.entry_id, actor=a.actor, action=a.action, task_id=a.task_id,
            ts_ms=a.ts_ms, request_id=a.request_id, detail=a.detail) for a in items])

    # -- periodic schedules (schedules.py) ----------------------------------------------
    async def _audit(self, context: Any, action: str, target: str, detail: str = "") -> str:
        call = _call(context)
        await append_audit(self.redis, call.actor, action, target, call.request_id, detail,
                           maxlen=self.settings.audit_maxlen)
        return call.request_id

    @_rpc
    async def CreateSchedule(self, request: pb.CreateScheduleRequest, context: Any
                             ) -> pb.CreateScheduleResponse:
        """Store a schedule (audited as create_schedule)."""
        info, created = await schedules.create(self.redis, self.settings, request.schedule,
                                               request.replace)
        await self._audit(context, "create_schedule", request.schedule.name,
                          "" if created else "replaced")
        return pb.CreateScheduleResponse(schedule=info, created=created)

    @_rpc
    async def GetSchedule(self, request: pb.GetScheduleRequest, context: Any
                          ) -> pb.GetScheduleResponse:
        """One schedule with its state."""
        return pb.GetScheduleResponse(schedule=await schedules.get(self.redis, request.name))

    @_rpc
    async def ListSchedules(self, request: pb.ListSchedulesRequest, context: Any
                            ) -> pb.ListSchedulesResponse:
        """One page of schedules sorted by name."""
        size = page_size(request.page_size, "page_size", LIST_QUEUES_PAGE_DEFAULT,
                         LIST_QUEUES_PAGE_MAX)
        infos, token = await schedules.list_page(self.redis, size, request.page_token)
        return pb.ListSchedulesResponse(schedules=infos, next_page_token=token)

    @_rpc
    async def PauseSchedule(self, request: pb.PauseScheduleRequest, context: Any
                            ) -> pb.PauseScheduleResponse:
        """Stop a schedule's fires (audited)."""
        info = await schedules.set_paused(self.redis, request.name, True)
        await self._audit(context, "pause_schedule", request.name)
        return pb.PauseScheduleResponse(schedule=info)

    @_rpc
    async def ResumeSchedule(self, request: pb.ResumeScheduleRequest, context: Any
                             ) -> pb.ResumeScheduleResponse:
        """Resume a schedule from now on (audited)."""
        info = await schedules.set_paused(self.redis, request.name, False)
        await self._audit(context, "resume_schedule", request.name)
        return pb.ResumeScheduleResponse(schedule=info)

    @_rpc
    async def TriggerSchedule(self, request: pb.TriggerScheduleRequest, context: Any
                              ) -> pb.TriggerScheduleResponse:
        """Enqueue a schedule's task now (audited)."""
        if self.broker is None:
            raise Unavailable("this gateway cannot enqueue")
        task_id = await schedules.trigger(self.redis, self.settings, self.broker, request.name)
        await self._audit(context, "trigger_schedule", request.name, task_id)
        return pb.TriggerScheduleResponse(task_id=task_id)

    @_rpc
    async def DeleteSchedule(self, request: pb.DeleteScheduleRequest, context: Any
                             ) -> pb.DeleteScheduleResponse:
        """Remove a schedule (audited)."""
        deleted = await schedules.delete(self.redis, request.name)
        await self._audit(context, "delete_schedule", request.name,
                          "" if deleted else "absent")
        return pb.DeleteScheduleResponse(deleted=deleted)

    # -- rate limits (ratelimits.py) ----------------------------------------------------
    @_rpc
    async def SetRateLimit(self, request: pb.SetRateLimitRequest, context: Any
                           ) -> pb.SetRateLimitResponse:
        """Set or change a rate limit (audited as set_rate_limit)."""
        r = request.rate_limit
        rl = ratelimits.validate(r.queue, r.task_type, r.limit, r.period_ms, r.burst)
        created = await ratelimits.set_limit(self.redis, rl, actor_of(context),
                                             max_limits=self.settings.max_rate_limits)
        await self._audit(context, "set_rate_limit", rl.queue,
                          f"task_type={rl.task_type or '*'} limit={rl.limit} "
                          f"period_ms={rl.period_ms} burst={rl.burst}")
        return pb.SetRateLimitResponse(created=created)

    @_rpc
    async def DeleteRateLimit(self, request: pb.DeleteRateLimitRequest, context: Any
                              ) -> pb.DeleteRateLimitResponse:
        """Remove a rate limit (audited as delete_rate_limit)."""
        deleted = await ratelimits.delete_limit(self.redis, request.queue, request.task_type,
                                                actor_of(context))
        await self._audit(context, "delete_rate_limit", request.queue,
                          f"task_type={request.task_type or '*'}")
        return pb.DeleteRateLimitResponse(deleted=deleted)

    @_rpc
    async def ListRateLimits(self, request: pb.ListRateLimitsRequest, context: Any
                             ) -> pb.ListRateLimitsResponse:
        """One page of the limits of one queue, or of every queue."""
        size = page_size(request.page_size, "page_size", LIST_QUEUES_PAGE_MAX,
                         LIST_QUEUES_PAGE_MAX)
        limits, token = await ratelimits.list_page(self.redis, size, request.page_token,
                                                   request.queue)
        return pb.ListRateLimitsResponse(rate_limits=[pb.RateLimit(
            queue=r.queue, task_type=r.task_type, limit=r.limit, period_ms=r.period_ms,
            burst=r.burst, tokens=r.tokens) for r in limits], next_page_token=token)
