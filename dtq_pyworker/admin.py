"""AdminClient: a blocking :class:`~dtq_pyworker.client.Client` that also drives
the ``dtq.v1.Admin`` and ``dtq.v1.Events`` services (what the ``dtq`` command line
is built on).

Listings page through the gateway for the caller and answer lists of the
protobuf messages (``QueueSummary``, ``DeadLetter``, ``WorkerInfo``,
``AuditEntry``), except recent tasks, which are typed :class:`Task` values. When
the gateway has tokens on, every Admin and Events call needs an ``admin`` token.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, cast

import grpc

from dtq_proto import dtq_pb2
from dtq_pyworker._requests import new_message
from dtq_pyworker.client import Client
from dtq_pyworker.connect import ConnectConfig
from dtq_pyworker.errors import DtqRpcError
from dtq_pyworker.tasks import Task, TaskStatus

R = TypeVar("R")

#: Largest page the gateway serves for each listing.
QUEUES_PAGE = 1000
DEAD_LETTERS_PAGE = 500
AUDIT_PAGE = 500


class AdminClient(Client):
    """Blocking client of Broker, Admin and Events on one channel.

    Takes the arguments of :class:`Client`. Every method raises
    :class:`DtqRpcError` when the gateway refuses the call (PERMISSION_DENIED
    without an admin token, NOT_FOUND for an unknown queue or task, ...), and
    ValueError (TypeError) naming the field for an integer argument its protobuf field
    cannot hold (not an integer), before sending anything.

    Read-only Admin calls (the listings, GetQueueStats, GetSchedule) are sent again
    on UNAVAILABLE like :class:`Client`'s GetTask; calls that change state are sent
    once (each appends to the audit stream).
    """

    def __init__(self, target: str | ConnectConfig | None = None, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._admin = self.connection.stub(self._channel, "Admin")
        self._events = self.connection.stub(self._channel, "Events")

    def _admin_call(self, method: str, reply: type[R], request: Any) -> R:
        """The ``reply`` of Admin ``method`` for ``request`` (DtqRpcError when refused)."""
        try:
            answer: R = getattr(self._admin, method)(request, timeout=self.timeout_s)
            return answer
        except grpc.RpcError as exc:
            raise DtqRpcError.from_rpc_error(exc) from exc

    # -- periodic schedules and rate limits (docs/schedules.md, docs/rate-limits.md) --
    def schedules(self) -> list[dtq_pb2.ScheduleInfo]:
        """Every schedule, by name (pages through ListSchedules)."""
        out: list[dtq_pb2.ScheduleInfo] = []
        token = ""
        while True:
            resp = self._admin_call("ListSchedules", dtq_pb2.ListSchedulesResponse,
                                    dtq_pb2.ListSchedulesRequest(
                page_size=200, page_token=token))
            out.extend(resp.schedules)
            token = resp.next_page_token
            if not token:
                return out

    def create_schedule(self, schedule: dtq_pb2.Schedule, replace: bool = False
                        ) -> dtq_pb2.CreateScheduleResponse:
        """Create a schedule (ALREADY_EXISTS unless ``replace``)."""
        return self._admin_call("CreateSchedule", dtq_pb2.CreateScheduleResponse,
                                dtq_pb2.CreateScheduleRequest(
            schedule=schedule, replace=replace))

    def pause_schedule(self, name: str) -> dtq_pb2.PauseScheduleResponse:
        """Pause a schedule (NOT_FOUND if unknown)."""
        return self._admin_call("PauseSchedule", dtq_pb2.PauseScheduleResponse,
                                dtq_pb2.PauseScheduleRequest(name=name))

    def resume_schedule(self, name: str) -> dtq_pb2.ResumeScheduleResponse:
        """Resume a schedule from now (fires due while paused are skipped)."""
        return self._admin_call("ResumeSchedule", dtq_pb2.ResumeScheduleResponse,
                                dtq_pb2.ResumeScheduleRequest(name=name))

    def trigger_schedule(self, name: str) -> dtq_pb2.TriggerScheduleResponse:
        """Enqueue one fire now, by hand; returns the task id."""
        return self._admin_call("TriggerSchedule", dtq_pb2.TriggerScheduleResponse,
                                dtq_pb2.TriggerScheduleRequest(name=name))

    def delete_schedule(self, name: str) -> dtq_pb2.DeleteScheduleResponse:
        """Delete a schedule; ``deleted`` is False when there was none."""
        return self._admin_call("DeleteSchedule", dtq_pb2.DeleteScheduleResponse,
                                dtq_pb2.DeleteScheduleRequest(name=name))

    def rate_limits(self, queue: str = "") -> list[dtq_pb2.RateLimit]:
        """Rate limits of one queue, or of every queue (pages through ListRateLimits)."""
        out: list[dtq_pb2.RateLimit] = []
        token = ""
        while True:
            resp = self._admin_call("ListRateLimits", dtq_pb2.ListRateLimitsResponse,
                                    dtq_pb2.ListRateLimitsRequest(
                queue=queue, page_size=1000, page_token=token))
            out.extend(resp.rate_limits)
            token = resp.next_page_token
            if not token:
                return out

    def set_rate_limit(self, queue: str, limit: int, period_ms: int, task_type: str = "",
                       burst: int = 0) -> dtq_pb2.SetRateLimitResponse:
        """Set or change a rate limit: ``limit`` tasks per ``period_ms`` (ms).

        Raises:
            ValueError: ``rate_limit.limit`` or ``burst`` outside 0..2**32-1,
                ``rate_limit.period_ms`` outside 0..2**64-1 (the gateway refuses what
                is outside the documented 1..1000000 and 1..86400000 ms).
        """
        return self._admin_call("SetRateLimit", dtq_pb2.SetRateLimitResponse,
                                dtq_pb2.SetRateLimitRequest(
            rate_limit=new_message(dtq_pb2.RateLimit, "rate_limit.", queue=queue,
                                   task_type=task_type, limit=limit, period_ms=period_ms,
                                   burst=burst)))

    def delete_rate_limit(self, queue: str, task_type: str = "") -> dtq_pb2.DeleteRateLimitResponse:
        """Remove a rate limit; ``deleted`` is False when there was none."""
        return self._admin_call("DeleteRateLimit", dtq_pb2.DeleteRateLimitResponse,
                                dtq_pb2.DeleteRateLimitRequest(
            queue=queue, task_type=task_type))

    # -- per-key concurrency (docs/fairness.md) ------------------------------------
    def concurrency_limits(self) -> list[dtq_pb2.ConcurrencyLimit]:
        """Every queue's per-key concurrency limit, sorted by queue."""
        return list(self._admin_call("ListConcurrencyLimits",
                                     dtq_pb2.ListConcurrencyLimitsResponse,
                                     dtq_pb2.ListConcurrencyLimitsRequest()).limits)

    def set_concurrency_limit(self, queue: str, max_active_per_key: int
                              ) -> dtq_pb2.SetConcurrencyLimitResponse:
        """At most ``max_active_per_key`` (1..1000000) active tasks per concurrency key
        of ``queue``; ``created`` is False when a limit was changed."""
        return self._admin_call("SetConcurrencyLimit", dtq_pb2.SetConcurrencyLimitResponse,
                                new_message(
            dtq_pb2.SetConcurrencyLimitRequest, "", queue=queue,
            max_active_per_key=max_active_per_key))

    def concurrency(self, queue: str, max_keys: int = 0) -> dtq_pb2.GetConcurrencyResponse:
        """``queue``'s per-key limit and its busiest keys (``max_keys`` 0 = 100)."""
        return self._admin_call("GetConcurrency", dtq_pb2.GetConcurrencyResponse, new_message(
            dtq_pb2.GetConcurrencyRequest, "", queue=queue, max_keys=max_keys))

    def delete_concurrency_limit(self, queue: str) -> dtq_pb2.DeleteConcurrencyLimitResponse:
        """Remove ``queue``'s per-key limit; ``deleted`` is False when there was none."""
        return self._admin_call("DeleteConcurrencyLimit",
                                dtq_pb2.DeleteConcurrencyLimitResponse,
                                dtq_pb2.DeleteConcurrencyLimitRequest(queue=queue))

    # -- queues -------------------------------------------------------------------
    def list_queues(self) -> list[dtq_pb2.QueueSummary]:
        """Every queue, sorted by name (all pages)."""
        out: list[dtq_pb2.QueueSummary] = []
        token = ""
        while True:
            resp = self._admin_call("ListQueues", dtq_pb2.ListQueuesResponse,
                                    dtq_pb2.ListQueuesRequest(
                page_size=QUEUES_PAGE, page_token=token))
            out.extend(resp.queues)
            token = resp.next_page_token
            if not token:
                return out

    def queue_stats(self, queue: str) -> dtq_pb2.GetQueueStatsResponse:
        """Depth and pending per band, schedule, dead letters, consumers.

        Raises:
            DtqRpcError: NOT_FOUND for a queue with no streams.
        """
        return self._admin_call("GetQueueStats", dtq_pb2.GetQueueStatsResponse,
                                dtq_pb2.GetQueueStatsRequest(queue=queue))

    def pause_queue(self, queue: str, reason: str = "",
                    create: bool = False) -> dtq_pb2.PauseQueueResponse:
        """Stop leasing from ``queue`` (``changed`` False when it already was); a queue
        that does not exist is NOT_FOUND unless ``create`` (pause it before its first task)."""
        return self._admin_call("PauseQueue", dtq_pb2.PauseQueueResponse,
                                dtq_pb2.PauseQueueRequest(
            queue=queue, reason=reason, create=create))

    def resume_queue(self, queue: str, reason: str = "") -> dtq_pb2.ResumeQueueResponse:
        """Resume leasing from ``queue`` (``changed`` False when it was not paused)."""
        return self._admin_call("ResumeQueue", dtq_pb2.ResumeQueueResponse,
                                dtq_pb2.ResumeQueueRequest(queue=queue,
                                                                           reason=reason))

    def delete_queue(self, queue: str, dry_run: bool = False, discard_dead_letters: bool = False,
                     reason: str = "") -> dtq_pb2.DeleteQueueResponse:
        """Delete a drained queue and its keys, or with ``dry_run`` list what would go.

        Raises:
            DtqRpcError: NOT_FOUND for an unknown queue; FAILED_PRECONDITION with
                reason QUEUE_NOT_EMPTY (tasks queued, leased or scheduled) or
                HAS_DEAD_LETTERS (unless ``discard_dead_letters``).
        """
        return self._admin_call("DeleteQueue", dtq_pb2.DeleteQueueResponse,
                                dtq_pb2.DeleteQueueRequest(
            queue=queue, dry_run=dry_run, discard_dead_letters=discard_dead_letters,
            reason=reason))

    # -- dead letters -------------------------------------------------------------
    def dead_letters(self, queue: str = "", limit: int = 50) -> list[dtq_pb2.DeadLetter]:
        """Up to ``limit`` dead-letter entries, newest first (``queue`` "" = all)."""
        out: list[dtq_pb2.DeadLetter] = []
        token = ""
        while len(out) < limit:
            resp = self._admin_call("ListDeadLetters", dtq_pb2.ListDeadLettersResponse,
                                    dtq_pb2.ListDeadLettersRequest(
                page_size=min(DEAD_LETTERS_PAGE, limit - len(out)), page_token=token,
                queue=queue))
            out.extend(resp.entries)
            token = resp.next_page_token
            if not token:
                break
        return out[:limit]

    def requeue_dead_letter(self, task_id: str) -> dtq_pb2.RequeueDeadLetterResponse:
        """Put a dead-lettered task back with a fresh attempt budget (NOT_FOUND
        when it has no dead-letter entry)."""
        return self._admin_call("RequeueDeadLetter", dtq_pb2.RequeueDeadLetterResponse,
                                dtq_pb2.RequeueDeadLetterRequest(task_id=task_id))

    def discard_dead_letter(self, task_id: str) -> dtq_pb2.DiscardDeadLetterResponse:
        """Remove a task's dead-letter entry (NOT_FOUND when it has none)."""
        return self._admin_call("DiscardDeadLetter", dtq_pb2.DiscardDeadLetterResponse,
                                dtq_pb2.DiscardDeadLetterRequest(task_id=task_id))

    def purge_dead_letters(self) -> dtq_pb2.PurgeDeadLettersResponse:
        """Remove every dead-letter entry."""
        return self._admin_call("PurgeDeadLetters", dtq_pb2.PurgeDeadLettersResponse,
                                dtq_pb2.PurgeDeadLettersRequest())

    def redrive_dead_letters(self, **filters: Any) -> dtq_pb2.RedriveDeadLettersResponse:
        """Requeue the dead letters matching ``filters`` (fields of
        ``RedriveDeadLettersRequest``: queue, task_type, error_class, min_age_ms,
        max_age_ms, dry_run, max_per_second, limit)."""
        return self._admin_call("RedriveDeadLetters", dtq_pb2.RedriveDeadLettersResponse,
                                new_message(dtq_pb2.RedriveDeadLettersRequest, **filters))

    # -- bulk cancels and search --------------------------------------------------------
    def cancel_tasks(self, *, dry_run: bool = False, limit: int = 0, reason: str = "",
                     **filters: Any) -> dtq_pb2.CancelTasksResponse:
        """Cancel (or with ``dry_run`` count) the waiting tasks matching ``filters``
        (fields of ``TaskFilter``: queue (required), task_type, statuses, metadata,
        min_age_ms, max_age_ms, created_after_ms, created_before_ms). A started task is
        never cancelled; ``limit`` 0 = 100000."""
        return self._admin_call("CancelTasks", dtq_pb2.CancelTasksResponse,
                                dtq_pb2.CancelTasksRequest(
            filter=new_message(dtq_pb2.TaskFilter, **filters), dry_run=dry_run,
            limit=limit, reason=reason))

    def purge_queue(self, queue: str, *, dry_run: bool = False,
                    reason: str = "") -> dtq_pb2.PurgeQueueResponse:
        """Cancel (or with ``dry_run`` count) every waiting task of ``queue``."""
        return self._admin_call("PurgeQueue", dtq_pb2.PurgeQueueResponse,
                                dtq_pb2.PurgeQueueRequest(
            queue=queue, dry_run=dry_run, reason=reason))

    def search_tasks(self, *, page_size: int = 50, page_token: str = "",
                     **filters: Any) -> dtq_pb2.SearchTasksResponse:
        """One page of SearchTasks (``filters``: fields of ``TaskFilter``); the reply's
        ``next_page_token`` continues it, "" at the end."""
        return self._admin_call("SearchTasks", dtq_pb2.SearchTasksResponse,
                                dtq_pb2.SearchTasksRequest(
            filter=new_message(dtq_pb2.TaskFilter, **filters), page_size=page_size,
            page_token=page_token))

    # -- workers, recent tasks, audit ------------------------------------------------
    def workers(self) -> list[dtq_pb2.WorkerInfo]:
        """Known workers, sorted by id."""
        return list(self._admin_call("ListWorkers", dtq_pb2.ListWorkersResponse,
                                     dtq_pb2.ListWorkersRequest()).workers)

    def recent_tasks(self, limit: int = 50, queue: str = "",
                     status: TaskStatus | int = TaskStatus.UNSPECIFIED) -> list[Task]:
        """Most recently created tasks, newest first (payloads omitted), 1..1000."""
        resp = self._admin_call("ListRecentTasks", dtq_pb2.ListRecentTasksResponse, new_message(
            dtq_pb2.ListRecentTasksRequest, limit=limit, queue=queue, status=int(status)))
        return [Task.from_proto(t) for t in resp.tasks]

    def audit(self, limit: int = 50) -> list[dtq_pb2.AuditEntry]:
        """Up to ``limit`` audit entries, newest first."""
        out: list[dtq_pb2.AuditEntry] = []
        token = ""
        while len(out) < limit:
            resp = self._admin_call("ListAudit", dtq_pb2.ListAuditResponse,
                                    dtq_pb2.ListAuditRequest(
                page_size=min(AUDIT_PAGE, limit - len(out)), page_token=token))
            out.extend(resp.entries)
            token = resp.next_page_token
            if not token:
                break
        return out[:limit]

    # -- events ---------------------------------------------------------------------
    def events(self, queues: Iterable[str] = (), types: Iterable[int] = ()
               ) -> EventStream:
        """Subscribe to live events (no history); iterate the answer, close it to stop.

        Args:
            queues: Only events of these queues (empty = all, worker events too).
            types: Only these ``dtq_pb2.EventType`` values (empty = all).
        """
        call = self._events.Subscribe(dtq_pb2.SubscribeRequest(queues=list(queues),
                                                               types=_event_types(types)))
        return EventStream(call)



def _event_types(types: Iterable[int]) -> list[dtq_pb2.EventType]:
    """``types`` for SubscribeRequest.types (EventType values are ints at run time)."""
    return cast("list[dtq_pb2.EventType]", list(types))


class EventStream:
    """Iterator of ``dtq_pb2.SubscribeResponse`` over an open Subscribe call."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def wait_subscribed(self) -> None:
        """Block until the gateway has registered the subscription (it sends the
        response headers then).

        Events published after this returns are delivered; a gateway that never
        answers is found by the channel's keepalive (about 15 s).

        Raises:
            DtqRpcError: the call ended before it was subscribed (gateway unreachable,
                a bad filter: INVALID_ARGUMENT naming the field, the subscriber limit).
        """
        self._call.initial_metadata()
        if self._call.done() and self._call.code() != grpc.StatusCode.OK:
            raise DtqRpcError.from_rpc_error(self._call)

    def __iter__(self) -> Iterator[dtq_pb2.SubscribeResponse]:
        try:
            yield from self._call
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise DtqRpcError.from_rpc_error(exc) from exc

    def close(self) -> None:
        """End the subscription."""
        self._call.cancel()
