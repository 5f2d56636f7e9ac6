"""TaskFilter (proto/dtq.proto) validation, shared by the Admin RPCs CancelTasks and
SearchTasks and the dashboard's bulk-cancel and search endpoints: bad input is an
InvalidArgument naming ``filter.<field>``, raised before anything changes."""

from __future__ import annotations

from typing import Any

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.store import admin, bulk, keys, search
from dtq_gateway.store.task_record import NAME_BY_STATUS
from dtq_proto import dtq_pb2 as pb

#: Most tasks one CancelTasks may match (CancelTasksRequest.limit).
MAX_CANCEL_LIMIT = 1_000_000
#: Most metadata pairs of a filter.
MAX_FILTER_METADATA = 16
#: Statuses CancelTasks may select (ACTIVE only when named: such a task is flagged
#: cancel_requested, as CancelTask does).
_CANCELLABLE = {pb.TASK_STATUS_QUEUED: "queued", pb.TASK_STATUS_SCHEDULED: "scheduled",
                pb.TASK_STATUS_ACTIVE: "active"}


def filter_fields(f: pb.TaskFilter, cancel: bool) -> tuple[frozenset[str], dict[str, str]]:
    """Validate the fields of a TaskFilter (INVALID_ARGUMENT naming ``filter.<field>``);
    returns its statuses (hash status strings) and metadata."""
    if f.queue:
        admin.validate_queue(f.queue, "filter.queue")
    elif cancel:
        raise InvalidArgument("filter.queue: required", field="filter.queue")
    if f.task_type and not keys.TASK_TYPE_RE.match(f.task_type):
        raise InvalidArgument("filter.task_type: must match [A-Za-z0-9_.:/-]{1,128}",
                              field="filter.task_type")
    statuses = set()
    for st in f.statuses:
        name = (_CANCELLABLE if cancel else NAME_BY_STATUS).get(st)
        if not name:
            allowed = "QUEUED, SCHEDULED or ACTIVE" if cancel else "a known task status"
            raise InvalidArgument(f"filter.statuses: {st} is not {allowed}",
                                  field="filter.statuses")
        statuses.add(name)
    if len(f.metadata) > MAX_FILTER_METADATA:
        raise InvalidArgument(f"filter.metadata: at most {MAX_FILTER_METADATA} pairs",
                              field="filter.metadata")
    for k, v in f.metadata.items():
        if not k or len(k.encode()) > 128 or len(v.encode()) > 1024:
            raise InvalidArgument("filter.metadata: keys 1..128 bytes, values at most 1024",
                                  field="filter.metadata")
    for name in ("min_age_ms", "max_age_ms", "created_after_ms", "created_before_ms"):
        if getattr(f, name) < 0:
            raise InvalidArgument(f"filter.{name}: must be >= 0", field=f"filter.{name}")
    if f.max_age_ms and f.min_age_ms > f.max_age_ms:
        raise InvalidArgument("filter.max_age_ms: must be >= min_age_ms",
                              field="filter.max_age_ms")
    if f.created_before_ms and f.created_after_ms >= f.created_before_ms:
        raise InvalidArgument("filter.created_before_ms: must be > created_after_ms",
                              field="filter.created_before_ms")
    return frozenset(statuses), dict(f.metadata)


def cancel_filter(f: pb.TaskFilter) -> bulk.TaskFilter:
    """The bulk-cancel filter of a CancelTasks TaskFilter (queue required; statuses
    QUEUED, SCHEDULED and ACTIVE only). Raises InvalidArgument naming ``filter.<field>``."""
    statuses, metadata = filter_fields(f, cancel=True)
    return bulk.TaskFilter(queue=f.queue, task_type=f.task_type, statuses=statuses,
                           metadata=metadata, min_age_ms=f.min_age_ms,
                           max_age_ms=f.max_age_ms, created_after_ms=f.created_after_ms,
                           created_before_ms=f.created_before_ms)



async def search_filter(client: Any, f: pb.TaskFilter) -> search.SearchFilter:
    """The SearchTasks filter of a TaskFilter, ages turned into a creation-time window
    by the Redis clock. Raises InvalidArgument naming ``filter.<field>``."""
    statuses, metadata = filter_fields(f, cancel=False)
    after, before = f.created_after_ms, f.created_before_ms
    if f.min_age_ms or f.max_age_ms:
        now = await admin.redis_now_ms(client)
        if f.max_age_ms:
            after = max(after, now - f.max_age_ms)
        if f.min_age_ms:
            bound = now - f.min_age_ms + 1
            before = min(before, bound) if before else bound
    return search.SearchFilter(queue=f.queue, task_type=f.task_type, statuses=statuses,
                               metadata=metadata, after_ms=after, before_ms=before)
