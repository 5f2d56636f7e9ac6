"""The demo's closing summary, computed from the final task records (GetTask).

Everything is derived from what the gateway stored: statuses, the attempts
history (retries and the queue wait, i.e. first ``started_at_ms`` minus
``created_at_ms``, both read from the Redis clock), ``finished_at_ms`` for the
throughput, and each result's JSON for the word counts and worker language.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from dtq_proto import dtq_pb2

#: Words shown in the summary.
TOP_WORDS = 10
_OPEN_LABEL = "left queued or active"


@dataclass
class Summary:
    """Aggregated outcome of a demo run (also written as JSON with ``--json``).

    Attributes:
        tasks: Tasks enqueued.
        by_type: Tasks per task_type.
        succeeded: Tasks in status SUCCEEDED.
        dead_lettered: Tasks in status DEAD_LETTERED.
        other_terminal: Tasks CANCELLED or EXPIRED, by status name.
        left_open: Tasks not terminal (queued, scheduled, active or missing).
        open_by_status: The non-terminal tasks by status name ("MISSING" = no record).
        retried_tasks: Tasks that needed more than one attempt.
        retries: Attempts beyond the first, summed over tasks.
        elapsed_s: First created_at to last finished_at (s).
        throughput_per_s: Terminal tasks per second over elapsed_s.
        queue_wait_p50_ms: Median of first start minus creation (ms).
        queue_wait_p99_ms: 99th percentile of the same (ms).
        per_lang: Succeeded tasks per worker language (result ``worker_lang``, else
            the language of the worker id that ran the task).
        files: Files counted (successful file.stats tasks).
        lines: Lines over those files.
        words: Words over those files.
        top_words: Most common words, summed from each result's top words.
    """

    tasks: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    succeeded: int = 0
    dead_lettered: int = 0
    other_terminal: dict[str, int] = field(default_factory=dict)
    left_open: int = 0
    open_by_status: dict[str, int] = field(default_factory=dict)
    retried_tasks: int = 0
    retries: int = 0
    elapsed_s: float = 0.0
    throughput_per_s: float = 0.0
    queue_wait_p50_ms: float = 0.0
    queue_wait_p99_ms: float = 0.0
    per_lang: dict[str, int] = field(default_factory=dict)
    files: int = 0
    lines: int = 0
    words: int = 0
    top_words: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self) -> str:
        """The summary as a JSON document."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values).

    Args:
        values: Samples in any order.
        pct: Percentile in (0, 100].
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def _queue_wait_ms(task: dtq_pb2.Task) -> int | None:
    started = task.attempts[0].started_at_ms if task.attempts else task.started_at_ms
    return started - task.created_at_ms if started else None


def _result(task: dtq_pb2.Task) -> dict | None:
    if task.status != dtq_pb2.TASK_STATUS_SUCCEEDED or not task.result:
        return None
    try:
        value = json.loads(task.result)
    except ValueError:  # truncated or not JSON
        return None
    return value if isinstance(value, dict) else None


def _count_status(s: Summary, task: dtq_pb2.Task, other: Counter[str],
                  open_: Counter[str]) -> None:
    if task.status == dtq_pb2.TASK_STATUS_SUCCEEDED:
        s.succeeded += 1
    elif task.status == dtq_pb2.TASK_STATUS_DEAD_LETTERED:
        s.dead_lettered += 1
    elif task.status in (dtq_pb2.TASK_STATUS_CANCELLED, dtq_pb2.TASK_STATUS_EXPIRED):
        other[_status_name(task.status)] += 1
    else:
        s.left_open += 1
        open_[_status_name(task.status)] += 1
    if len(task.attempts) > 1:
        s.retried_tasks += 1
        s.retries += len(task.attempts) - 1


def _status_name(status: int) -> str:
    return dtq_pb2.TaskStatus.Name(status).removeprefix("TASK_STATUS_")


def _count_result(s: Summary, result: dict, task_type: str, lang: str, langs: Counter[str],
                  words: Counter[str]) -> None:
    langs[str(result.get("worker_lang") or lang)] += 1
    if task_type == "file.stats":
        s.files += 1
        s.lines += int(result.get("lines", 0))
        s.words += int(result.get("words", 0))
        words.update({w: int(c) for w, c in result.get("top_words", [])})


def build(tasks: Mapping[str, dtq_pb2.Task], types: Mapping[str, str],
          worker_langs: Mapping[str, str] | None = None) -> Summary:
    """Aggregate the final task records.

    Args:
        tasks: task_id -> Task as fetched with GetTask (missing ids count as open).
        types: task_id -> task_type of every task the demo enqueued.
        worker_langs: worker_id -> language of the workers the demo started; used
            for results that do not say ``worker_lang`` themselves.

    Returns:
        The summary.
    """
    s = Summary(tasks=len(types), by_type=dict(Counter(types.values())))
    other, open_, langs, words = Counter[str](), Counter[str](), Counter[str](), Counter[str]()
    waits: list[int] = []
    first_ms, last_ms = math.inf, 0
    for task_id, task_type in types.items():
        task = tasks.get(task_id)
        if task is None:
            s.left_open += 1
            open_["MISSING"] += 1
            continue
        _count_status(s, task, other, open_)
        wait = _queue_wait_ms(task)
        if wait is not None:
            waits.append(wait)
        first_ms = min(first_ms, task.created_at_ms)
        last_ms = max(last_ms, task.finished_at_ms)
        result = _result(task)
        if result is not None:
            lang = (worker_langs or {}).get(task.worker_id, "unknown")
            _count_result(s, result, task_type, lang, langs, words)
    s.other_terminal, s.open_by_status, s.per_lang = dict(other), dict(open_), dict(langs)
    s.top_words = words.most_common(TOP_WORDS)
    if last_ms > first_ms:
        s.elapsed_s = (last_ms - first_ms) / 1000.0
        s.throughput_per_s = (s.tasks - s.left_open) / s.elapsed_s
    s.queue_wait_p50_ms = percentile(waits, 50)
    s.queue_wait_p99_ms = percentile(waits, 99)
    return s


def _fmt_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def render(s: Summary) -> str:
    """The human-readable summary block."""
    rows = [
        ("tasks", f"{s.tasks:,} ({_fmt_counts(s.by_type)})"),
        ("succeeded", f"{s.succeeded:,}"),
        ("retried", f"{s.retried_tasks:,} tasks ({s.retries:,} retries)"),
        ("dead-lettered", f"{s.dead_lettered:,}"),
    ]
    if s.other_terminal:
        rows.append(("other terminal", _fmt_counts(s.other_terminal)))
    rows += [
        ("throughput", (f"{s.throughput_per_s:,.1f} tasks/s "
                        f"({s.tasks - s.left_open:,} tasks in {s.elapsed_s:.2f} s)")),
        ("queue wait", f"p50 {s.queue_wait_p50_ms:,.0f} ms, p99 {s.queue_wait_p99_ms:,.0f} ms"),
        ("by worker language", _fmt_counts(s.per_lang) or "-"),
        ("stdlib", f"{s.files:,} files, {s.lines:,} lines, {s.words:,} words"),
        ("top 10 words", ", ".join(f"{w} {c:,}" for w, c in s.top_words) or "-"),
        (_OPEN_LABEL, f"{s.left_open:,}"
                      + (f" ({_fmt_counts(s.open_by_status)})" if s.open_by_status else "")),
    ]
    width = max(len(label) for label, _ in rows)
    lines = ["", "dtq demo summary", "-" * 16]
    lines += [f"{label + ':':<{width + 1}} {value}" for label, value in rows]
    return "\n".join(lines)
