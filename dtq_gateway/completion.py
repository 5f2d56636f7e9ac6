"""Worker-side operations: Ack, Fail (failure / release / cancelled) and Heartbeat.

All three are fenced by the lease (stream entry, consumer, attempt) inside their
Lua script: a lease that is not the task's current one changes nothing. Many items
go out as one pipeline, so a batch of acks costs one Redis round trip.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from dtq_gateway import keys, leaseid
from dtq_gateway.errors import DtqError, StaleLease
from dtq_gateway.leaseid import Lease
from dtq_gateway.replies import text as _s
from dtq_gateway.scripts import Script, call_chunks, execute
from dtq_gateway.settings import Settings
from dtq_gateway.validation import cut_utf8
from dtq_proto import dtq_pb2

ACK = Script("ack")
FAIL = Script("fail")
HEARTBEAT = Script("heartbeat")
WORKER_BEAT = Script("worker_beat")
#: Most leases per ack.lua call: bounds how long one script holds Redis.
ACK_CHUNK = 100

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


def _idem_key(lease: Lease) -> str:
    return keys.idempotency(lease.queue, lease.idem_digest) if lease.idem_digest else \
        keys.task(lease.task_id)


class Completion:
    """Ack / Fail / Heartbeat. ``on_done(worker_id, queue, outcome)`` runs per finished lease."""

    def __init__(self, redis: Redis, settings: Settings,
                 on_done: Callable[[str, str, ItemOutcome], None] = lambda w, q, o: None) -> None:
        self.redis = redis
        self.settings = settings
        self.on_done = on_done

    def _decode(self, lease_ids: Sequence[str]) -> list[ItemOutcome]:
        out = []
        for i, lid in enumerate(lease_ids):
            item = ItemOutcome(lease_id=lid)
            try:
                item.lease = leaseid.decode(lid, field=f"items[{i}].lease_id")
            except DtqError as exc:
                item.error = exc
            out.append(item)
        return out

    async def ack(self, items: Sequence[dtq_pb2.AckItem]) -> list[ItemOutcome]:
        """Complete leases successfully; one outcome per item, in order.

        Well-formed items go out as ack.lua calls of at most ``ACK_CHUNK`` leases each
        (one EVALSHA for up to that many, pipelined beyond): one round trip per Ack.
        """
        s = self.settings
        outcomes = self._decode([it.lease_id for it in items])
        todo = [(it, oc) for it, oc in zip(items, outcomes) if oc.lease is not None]
        if not todo:
            return outcomes
        # one ack.lua call touches one queue (one hash slot): group, then chunk
        by_queue: dict[str, list] = {}
        for it, oc in todo:
            by_queue.setdefault(oc.lease.queue, []).append((it, oc))
        parts = [group[i:i + ACK_CHUNK] for group in by_queue.values()
                 for i in range(0, len(group), ACK_CHUNK)]
        todo = [pair for part in parts for pair in part]
        calls = []
        for part in parts:
            keys_: list[str] = []
            args = Script.argv_notified(keys.GROUP, len(part),
                                        s.result_retention_s, s.task_retention_s)
            for it, oc in part:
                le = oc.lease
                result = it.result[: s.result_max_bytes]
                keys_ += (le.stream, keys.task(le.task_id), keys.result(le.task_id),
                          _idem_key(le))
                args += (le.entry_id, le.attempt, le.worker_id, le.task_id, result,
                         "1" if len(it.result) > len(result) else "0", le.tag)
            calls.append((keys_, args))
        replies = await call_chunks(self.redis, ACK, calls)
        self._record([oc for _, oc in todo], replies)
        return outcomes

    async def fail(self, items: Sequence[dtq_pb2.FailItem]) -> list[ItemOutcome]:
        """Report failed / released / cancelled leases; one outcome per item, in order."""
        s = self.settings

        def call(it: dtq_pb2.FailItem, le: Lease) -> tuple[list[str], list]:
            retryable = it.retryable if it.HasField("retryable") else True
            return ([le.stream, keys.task(le.task_id), keys.dead_letter(le.queue),
                     keys.schedule(le.queue), _idem_key(le)],
                    Script.argv_notified(
                        keys.GROUP, le.entry_id, le.attempt, le.worker_id, le.task_id,
                        _MODES.get(it.mode, "failure"), "1" if retryable else "0",
                        min(it.retry_after_ms, 86_400_000), random.random(),
                        cut_utf8(it.error_message, 4096), cut_utf8(it.error_class, 128),
                        s.dlq_maxlen, s.task_retention_s, "1" if le.idem_digest else "0",
                        le.tag))

        return await self._apply(items, FAIL, call, index_dead_letters=True)

    async def _apply(self, items: Sequence, script: Script,
                     call: Callable[[object, Lease], tuple[list[str], list]],
                     index_dead_letters: bool = False) -> list[ItemOutcome]:
        """Run ``script`` once per well-formed item, all in one pipeline (one round trip).

        ``index_dead_letters``: the calls may dead-letter, so the pipeline first adds
        their queues to the dead-letter index (it spans queues: a single-key SADD ahead
        of the per-queue scripts; a member without entries is harmless)."""
        outcomes = self._decode([it.lease_id for it in items])
        pipe = self.redis.pipeline(transaction=False)
        queued = []
        pairs = [(it, oc) for it, oc in zip(items, outcomes) if oc.lease is not None]
        if pairs and index_dead_letters:
            pipe.sadd(keys.DEAD_LETTER_QUEUES, *{oc.lease.queue for _, oc in pairs})
        for it, oc in pairs:
            script.queue(pipe, *call(it, oc.lease))
            queued.append(oc)
        if queued:
            replies = await execute(self.redis, pipe)
            self._record(queued, replies[1:] if index_dead_letters else replies)
        return outcomes

    def _record(self, queued: list[ItemOutcome], replies: list) -> None:
        """Fill each outcome from its script reply; ``on_done`` for finished leases."""
        for oc, reply in zip(queued, replies):
            if isinstance(reply, Exception):
                raise reply
            kind = _s(reply[0])
            oc.kind = kind
            if kind == "dup":  # a repeat of the call that finished the lease: its status now
                oc.duplicate = True
                oc.status = _s(reply[1])
                continue
            if kind == "stale":
                oc.status = _s(reply[1])
                oc.error = StaleLease(f"lease is no longer current (task {oc.lease.task_id} "
                                      f"is {oc.status})")
                continue
            oc.status = _KIND_STATUS[kind]
            oc.started_at_ms = int(reply[2] if kind != "ok" else reply[1])
            oc.finished_at_ms = int(reply[3]) if kind == "ok" else 0
            self.on_done(oc.lease.worker_id, oc.lease.queue, oc)

    async def heartbeat(self, req: dtq_pb2.HeartbeatRequest) -> tuple[list[str], list[str]]:
        """Extend the worker's leases; returns (lost lease ids, cancelled lease ids).

        Malformed lease ids and leases of another worker are reported lost.
        """
        s = self.settings
        pipe = self.redis.pipeline(transaction=False)
        self.queue_worker_beat(pipe, req.worker_id, req.hostname,
                               "draining" if req.draining else "", req.active_tasks,
                               req.concurrency, req.counters if req.HasField("counters") else None)
        lost, checked = [], []
        for lid in req.lease_ids:
            try:
                le = leaseid.decode(lid)
            except DtqError:
                lost.append(lid)
                continue
            if le.worker_id != req.worker_id:
                lost.append(lid)
                continue
            HEARTBEAT.queue(pipe, [le.stream, keys.task(le.task_id)],
                            Script.argv(keys.GROUP, le.entry_id, le.attempt, le.worker_id,
                                        s.lease_grace_ms, le.tag))
            checked.append(lid)
        replies = await execute(self.redis, pipe)
        if isinstance(replies[0], Exception):  # the worker record was not refreshed
            raise replies[0]
        cancelled = []
        for lid, reply in zip(checked, replies[1:]):
            if isinstance(reply, Exception):
                raise reply
            state = _s(reply)
            if state in ("lost", "overdue"):
                lost.append(lid)
            elif state == "cancelled":
                cancelled.append(lid)
        return lost, cancelled

    def queue_worker_beat(self, pipe, worker_id: str, hostname: str, event: str,
                          active: int | str = "", concurrency: int | str = "",
                          counters: dtq_pb2.WorkerCounters | None = None,
                          gateway_tag: str = "") -> None:
        """Queue a refresh of dtq:worker:<id> (PEXPIRE 3x heartbeat) on a pipeline;
        ``gateway_tag`` with a "started"/"stopped" event counts the worker's open Lease
        streams on this gateway (ListWorkers' ``leasing``)."""
        c = counters or dtq_pb2.WorkerCounters()
        WORKER_BEAT.queue(pipe, [keys.worker(worker_id), keys.WORKERS], Script.argv(
            worker_id, hostname, self.settings.worker_ttl_ms, event, active, concurrency,
            c.tasks_processed, c.tasks_failed, c.tasks_retried, "1" if counters else "0",
            gateway_tag))

    async def worker_event(self, worker_id: str, hostname: str, event: str,
                           concurrency: int = 0) -> None:
        """Record a session start ("started") or end ("stopped") with its event."""
        pipe = self.redis.pipeline(transaction=False)
        self.queue_worker_beat(pipe, worker_id, hostname, event, "", concurrency or "",
                               gateway_tag=keys.gateway_tag(self.settings.gateway_id))
        (reply,) = await execute(self.redis, pipe)
        if isinstance(reply, Exception):
            raise reply
