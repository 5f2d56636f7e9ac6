"""Worker-side operations: Ack, Fail (failure / release / cancelled) and Heartbeat.

All three are fenced by the lease (stream entry, consumer, attempt) inside their
Lua script: a lease that is not the task's current one changes nothing. Many items
go out as one pipeline (``store.completion``), so a batch of acks costs one Redis
round trip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from dtq_gateway import metrics
from dtq_gateway.domain.validation import MAX_HOSTNAME_BYTES, cut_utf8
from dtq_gateway.errors import DtqError, PermissionDenied, StaleLease
from dtq_gateway.leasing import leaseid
from dtq_gateway.leasing.leaseid import Keyring, Lease, default_keyring, owner_tag
from dtq_gateway.leasing.progress_limit import ProgressLimiter
from dtq_gateway.settings import Settings
from dtq_gateway.store import completion as store
from dtq_gateway.store.client import Client
from dtq_gateway.store.completion import ACK_CHUNK, WorkerBeat, WorkerRegistration
from dtq_gateway.store.durability import ReplicaWait
from dtq_gateway.store.errors import ReplicasNotAcked
from dtq_proto import dtq_pb2

__all__ = ["ACK_CHUNK", "Completion", "ItemOutcome", "WorkerRegistration"]

_MODES = {dtq_pb2.FAIL_MODE_UNSPECIFIED: "failure", dtq_pb2.FAIL_MODE_FAILURE: "failure",
          dtq_pb2.FAIL_MODE_RELEASE: "release", dtq_pb2.FAIL_MODE_CANCELLED: "cancelled"}
_KIND_STATUS = {"retry": "scheduled", "dead": "dead_lettered", "released": "queued",
                "cancelled": "cancelled", "ok": "succeeded"}


@dataclass(slots=True)
class ItemOutcome:
    """Outcome of one Ack/Fail item. ``kind``: ok, retry, dead, released, cancelled, dup."""

    lease_id: str
    kind: str = ""
    status: str = ""
    duplicate: bool = False
    error: DtqError | None = None
    lease: Lease | None = None
    started_at_ms: int = 0
    finished_at_ms: int = 0
    #: Follow-up work the script reported: 'c' a chain step is owed, 'g' a group member
    #: ended (terminal outcomes only), 'cg' both, '' none.
    follow: str = ""


#: Longest progress message stored, in bytes of UTF-8.
MAX_PROGRESS_MESSAGE_BYTES = 256


def _progress(report: dtq_pb2.TaskProgress | None) -> tuple[str, str]:
    """heartbeat.lua's (percent, message) ARGV for a progress report: percent clamped
    to 0..100 with two decimals, ('', '') without a usable report (none, or NaN)."""
    if report is None or math.isnan(report.percent):
        return "", ""
    percent = min(100.0, max(0.0, report.percent))
    return format(round(percent, 2), "g"), cut_utf8(report.message, MAX_PROGRESS_MESSAGE_BYTES)


class Completion:
    """Ack / Fail / Heartbeat. ``on_done(worker_id, queue, outcome)`` runs per finished lease."""

    def __init__(self, redis: Client, settings: Settings,
                 on_done: Callable[[str, str, ItemOutcome], None] = lambda w, q, o: None,
                 keyring: Keyring | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.on_done = on_done
        #: verifies lease ids (see leaseid.py)
        self.keyring = keyring or default_keyring()
        #: DTQ_REDIS_MIN_REPLICAS_ACK: acks and failures wait for replicas (None = off)
        self.wait = ReplicaWait.of(settings.redis_min_replicas_ack,
                                   settings.redis_replica_ack_timeout_ms)
        #: Called with each finished outcome whose ``follow`` is set (chain step owed,
        #: group member ended); the gateway wires followups.FollowUps.after_outcome.
        self.on_follow: Callable[[ItemOutcome], None] = lambda o: None
        #: the per-lease bound on applied progress reports (progress_limit.py)
        self.progress_limiter = ProgressLimiter()

    async def _decode(self, lease_ids: Sequence[str], caller: str | None) -> list[ItemOutcome]:
        await self.keyring.ensure()
        out = []
        for i, lid in enumerate(lease_ids):
            item = ItemOutcome(lease_id=lid)
            try:
                item.lease = leaseid.decode(lid, self.keyring, field=f"items[{i}].lease_id",
                                            caller=caller)
            except DtqError as exc:
                item.error = exc
            out.append(item)
        return out

    async def ack(self, items: Sequence[dtq_pb2.AckItem],
                  caller: str | None = None) -> list[ItemOutcome]:
        """Complete leases successfully; one outcome per item, in order.

        ``caller`` is the calling identity (auth.caller_identity): an item whose lease
        was issued to another identity gets PERMISSION_DENIED (LEASE_NOT_OWNED); None
        = the gateway itself (no owner check). Every lease id must verify (leaseid.py).

        Well-formed items go out as ack.lua calls of at most ``ACK_CHUNK`` leases each
        (one EVALSHA for up to that many, pipelined beyond): one round trip per Ack.
        """
        s = self.settings
        outcomes = await self._decode([it.lease_id for it in items], caller)
        # one ack.lua call touches one queue (one hash slot): group, then chunk
        by_queue: dict[str, tuple[list, list[ItemOutcome]]] = {}
        for it, oc in zip(items, outcomes):
            if oc.lease is not None:
                acks, done = by_queue.setdefault(oc.lease.queue, ([], []))
                acks.append((oc.lease, it.result))
                done.append(oc)
        if not by_queue:
            return outcomes
        parts, todo = [], []
        for acks, done in by_queue.values():
            parts += [acks[i:i + ACK_CHUNK] for i in range(0, len(acks), ACK_CHUNK)]
            todo += done
        replies = await store.ack(self.redis, parts, s.result_max_bytes,
                                  s.result_retention_s, s.task_retention_s, self.wait,
                                  keep_finished=s.keep_finished_for)
        self._record(todo, replies)
        return outcomes

    async def fail(self, items: Sequence[dtq_pb2.FailItem],
                   caller: str | None = None) -> list[ItemOutcome]:
        """Report failed / released / cancelled leases; one outcome per item, in order
        (``caller`` as in :meth:`ack`). Well-formed items go out as one pipeline."""
        s = self.settings
        outcomes = await self._decode([it.lease_id for it in items], caller)
        calls, queued = [], []
        for it, oc in zip(items, outcomes):
            if oc.lease is not None:
                calls.append((oc.lease, _MODES.get(it.mode, "failure"),
                              it.retryable if it.HasField("retryable") else True,
                              min(it.retry_after_ms, 86_400_000),
                              cut_utf8(it.error_message, 4096), cut_utf8(it.error_class, 128)))
                queued.append(oc)
        if queued:
            self._record(queued, await store.fail(self.redis, calls, s.dlq_maxlen,
                                                  s.task_retention_s, self.wait))
        return outcomes

    def _record(self, queued: list[ItemOutcome],
                replies: list[store.LeaseOutcome | Exception]) -> None:
        """Fill each outcome from its script's; ``on_done`` for finished leases."""
        unconfirmed: ReplicasNotAcked | None = None
        for oc, reply in zip(queued, replies):
            if isinstance(reply, ReplicasNotAcked):
                # applied on the primary but not confirmed by enough replicas: keep the
                # local state in step with the primary, then answer the error
                unconfirmed = unconfirmed or reply
                reply = cast(store.LeaseOutcome, reply.reply)
            if isinstance(reply, Exception):
                raise reply
            assert oc.lease is not None  # queued items always carry their decoded lease
            oc.kind = reply.kind
            if reply.kind == "dup":  # a repeat of the call that finished the lease
                oc.duplicate = True
                oc.status = reply.status
                continue
            if reply.kind == "stale":
                oc.status = reply.status
                oc.error = StaleLease(f"lease is no longer current (task {oc.lease.task_id} "
                                      f"is {oc.status})")
                continue
            oc.status = _KIND_STATUS[reply.kind]
            oc.started_at_ms, oc.finished_at_ms = reply.started_at_ms, reply.finished_at_ms
            oc.follow = reply.follow
            self.on_done(oc.lease.worker_id, oc.lease.queue, oc)
            if oc.follow:
                self.on_follow(oc)
        if unconfirmed is not None:
            raise unconfirmed

    async def heartbeat(self, req: dtq_pb2.HeartbeatRequest,
                        caller: str = "") -> tuple[list[str], list[str]]:
        """Extend the worker's leases; returns (lost lease ids, cancelled lease ids).

        Malformed, unverifiable and other identities' lease ids, and leases of another
        worker, are reported lost. Only the latest progress report per listed lease is
        applied, and at most 2 per lease per second (:mod:`.progress_limit`); the others
        are dropped and counted in ``dtq_progress_reports_dropped_total``.

        Raises:
            PermissionDenied: ``req.worker_id`` is bound to another identity than
                ``caller`` (nothing was changed).
        """
        await self.keyring.ensure()
        progress = {p.lease_id: p for p in req.progress}  # the latest report per lease
        beat = self._beat(req.worker_id, req.hostname, "draining" if req.draining else "",
                          req.active_tasks, req.concurrency,
                          req.counters if req.HasField("counters") else None, caller=caller)
        lost, checked, leases = [], [], []
        considered = 0
        for lid in req.lease_ids:
            try:
                le = leaseid.decode(lid, self.keyring, caller=caller)
            except DtqError:
                lost.append(lid)
                continue
            if le.worker_id != req.worker_id:
                lost.append(lid)
                continue
            report = progress.pop(lid, None)
            if report is not None:
                considered += 1
                if not self.progress_limiter.allow(lid):
                    metrics.PROGRESS_DROPPED.labels(reason="rate").inc()
                    report = None
            leases.append((le, *_progress(report)))
            checked.append(lid)
        if len(req.progress) > considered:
            metrics.PROGRESS_DROPPED.labels(reason="unlisted").inc(len(req.progress) - considered)
        reply = await store.heartbeat(self.redis, beat, leases, self.settings.lease_grace_ms)
        if reply.denied:
            # bound to another identity: the lease scripts behind it in the pipeline
            # were not queued for it (their lease ids name another owner and were
            # reported lost above), so nothing changed
            raise _denied(req.worker_id)
        cancelled = []
        for lid, state in zip(checked, reply.states):
            if state in ("lost", "overdue"):
                lost.append(lid)
            elif state == "cancelled":
                cancelled.append(lid)
        return lost, cancelled

    def _beat(self, worker_id: str, hostname: str, event: str,
              active: int | str = "", concurrency: int | str = "",
              counters: dtq_pb2.WorkerCounters | None = None,
              gateway_id: str | None = None, caller: str = "",
              registration: WorkerRegistration | None = None) -> WorkerBeat:
        """A refresh of dtq:worker:<id> (PEXPIRE 3x heartbeat); ``gateway_id`` with a
        "started"/"stopped" event counts the worker's open Lease streams on that gateway
        (ListWorkers' ``leasing``). The record is bound to the owner tag of ``caller``
        by the first beat; a beat from another identity changes nothing and replies
        ``denied`` (worker_beat.lua); ``registration`` (with "started") stores the
        session's labels, queues and task type filter."""
        return WorkerBeat(
            worker_id, cut_utf8(hostname, MAX_HOSTNAME_BYTES), self.settings.worker_ttl_ms,
            event, active, concurrency,
            (counters.tasks_processed, counters.tasks_failed, counters.tasks_retried)
            if counters is not None else None,
            gateway_id, owner_tag(caller), registration)

    async def worker_event(self, worker_id: str, hostname: str, event: str,
                           concurrency: int = 0, caller: str = "",
                           registration: WorkerRegistration | None = None) -> None:
        """Record a session start ("started", with the session's ``registration``) or
        end ("stopped") with its event.

        Raises:
            PermissionDenied: the worker id is bound to another identity.
        """
        beat = self._beat(worker_id, hostname, event, "", concurrency or "",
                          gateway_id=self.settings.gateway_id, caller=caller,
                          registration=registration)
        if not await store.worker_beat(self.redis, beat):
            raise _denied(worker_id)


def _denied(worker_id: str) -> PermissionDenied:
    return PermissionDenied(f"worker_id: {worker_id!r} is bound to another identity (the one "
                            "that registered it); use your own worker id",
                            field="worker_id", reason="WORKER_ID_NOT_OWNED")
