"""Task commands of ``dtq``: enqueue, get, wait, cancel, recent, tail."""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import click
from click.core import ParameterSource

from dtq_cli import bulk_cmd
from dtq_cli.group import ExitCode, Failure, State, json_option, pass_state
from dtq_cli.render import (
    Duration,
    ago,
    emit_json,
    enum_name,
    extra_fields,
    fields,
    human_duration,
    show_value,
    table,
    to_dict,
    when,
)
from dtq_proto import dtq_pb2
from dtq_pyworker.codec import is_json
from dtq_pyworker.tasks import Task, TaskStatus, TaskWaitTimeout

_OUTCOME_EXIT = {TaskStatus.SUCCEEDED: ExitCode.OK, TaskStatus.DEAD_LETTERED: ExitCode.TASK_FAILED,
                 TaskStatus.CANCELLED: ExitCode.TASK_CANCELLED,
                 TaskStatus.EXPIRED: ExitCode.TASK_EXPIRED}
#: Longest --delay and --ttl (the gateway's limit of delay_ms and ttl_ms), and of a wait.
MAX_DELAY_MS = 365 * 86_400_000
#: Longest --task-timeout (EnqueueRequest.timeout_ms: 1..86400000).
MAX_TASK_TIMEOUT_MS = 86_400_000
#: --task-timeout and --ttl start at 1 ms: the gateway reads a 0 timeout_ms as its
#: default (60 s) and a 0 ttl_ms as none, not as what "0" says.
_STATUS_NAMES = [s.name for s in TaskStatus if s is not TaskStatus.UNSPECIFIED]
_EVENT_NAMES = [v.name.removeprefix("EVENT_TYPE_")
                for v in dtq_pb2.EventType.DESCRIPTOR.values if v.number != 0]


#: Task fields the detail view prints itself (the rest are printed generically).
_TASK_SHOWN = {"task_id", "queue", "task_type", "status", "cancel_requested", "priority",
               "attempt", "max_attempts", "created_at", "due_at", "started_at", "finished_at",
               "expires_at", "worker_id", "idempotency_key", "content_type", "payload",
               "result", "result_truncated", "last_error", "last_error_class", "metadata",
               "attempts", "retry_policy", "updated_at", "timeout_ms", "not_before"}


def task_doc(task: Task) -> dict[str, Any]:
    """A task as a JSON document (see render.to_dict)."""
    return to_dict(task.raw)


def attempt_text(task: Task, sep: str = " of ") -> str:
    """The attempt for people: ``2 of 3``; a task that never ran (cancelled or expired
    while it waited) shows ``none of 3 (never ran)``, one still waiting for its first
    run ``1 of 3 (not started)`` (Task.attempt is the current or *next* attempt)."""
    t = task.raw
    if t.started_at_ms:
        return f"{t.attempt}{sep}{t.max_attempts}"
    if t.finished_at_ms:
        return f"none{sep}{t.max_attempts} (never ran)"
    return f"{t.attempt}{sep}{t.max_attempts} (not started)"


def show_task(state: State, task: Task) -> None:
    """Print a task: JSON document, or its fields and attempts."""
    if state.json:
        emit_json(task_doc(task))
        return
    t = task.raw
    error = f"{t.last_error_class}: {t.last_error}" if t.last_error else ""
    fields([
        ("task", t.task_id), ("queue", t.queue), ("type", t.task_type),
        ("status", task.status.name + (" (cancel requested)" if t.cancel_requested else "")),
        ("priority", t.priority), ("attempt", attempt_text(task)),
        ("time limit", human_duration(t.timeout_ms) if t.timeout_ms else ""),
        ("created", when(t.created_at_ms)), ("due", when(t.due_at_ms) if t.due_at_ms else ""),
        ("started", when(t.started_at_ms) if t.started_at_ms else ""),
        ("finished", when(t.finished_at_ms) if t.finished_at_ms else ""),
        ("expires", when(t.expires_at_ms) if t.expires_at_ms else ""),
        ("worker", t.worker_id), ("key", t.idempotency_key),
        ("content type", t.content_type),
        ("payload", show_value(task.payload) if t.payload else ""),
        ("result", (show_value(task.result) if t.result else "")
         + (" (truncated)" if t.result_truncated else "")),
        ("error", error),
        ("metadata", json.dumps(dict(t.metadata)) if t.metadata else ""),
        *extra_fields(t, _TASK_SHOWN),
    ])
    if t.attempts:
        click.echo()
        table("attempts", ["#", "worker", "started", "took", "outcome", "error"],
              [(a.attempt, a.worker_id, ago(a.started_at_ms),
                _took(a.started_at_ms, a.finished_at_ms), a.outcome,
                f"{a.error_class}: {a.error_message}" if a.error_class else "")
               for a in t.attempts])


def _took(start_ms: int, end_ms: int) -> str:
    return human_duration(end_ms - start_ms) if start_ms and end_ms else ""


def finish_wait(state: State, task_id: str, timeout_ms: int, quiet: bool = False) -> None:
    """Wait for a task, print it (only its id with ``quiet``), and exit with its outcome's
    code."""
    def show(task: Task) -> None:
        if quiet:
            click.echo(task_id)
        else:
            show_task(state, task)

    try:
        task = state.client.wait(task_id, timeout_s=timeout_ms / 1000.0, raise_on_failure=False)
    except TaskWaitTimeout as exc:
        if exc.task is None:  # never read (GetTask answered NOT_FOUND with missing_ok)
            raise Failure(f"task {task_id} not found after {timeout_ms / 1000:g}s",
                          ExitCode.WAIT_TIMEOUT) from exc
        show(exc.task)
        raise Failure(f"task {task_id} still {exc.task.status.name} after "
                      f"{timeout_ms / 1000:g}s", ExitCode.WAIT_TIMEOUT) from exc
    show(task)
    code = _OUTCOME_EXIT[task.status]
    if code != ExitCode.OK:
        detail = f": {task.error_class}: {task.error}" if task.error else ""
        raise Failure(f"task {task_id} {task.status.name}{detail}", code)


def _payload(payload: str | None, content_type: str | None) -> Any:
    """The enqueue payload from the argument ("-" = stdin, "@path" = a file).

    Raises:
        click.BadParameter: naming PAYLOAD: a file that cannot be read or is not UTF-8,
            or (for a JSON content type) text that is not JSON.
    """
    if payload is None:
        return None if content_type is None or is_json(content_type) else b""
    if payload == "-":
        payload = sys.stdin.read()
    elif payload.startswith("@"):
        path = payload[1:]
        try:
            with open(path, encoding="utf-8") as f:
                payload = f.read()
        except OSError as exc:  # missing, a directory, permission denied...
            raise click.BadParameter(f"cannot read {path!r}: {exc.strerror or exc}",
                                     param_hint="PAYLOAD") from None
        except UnicodeDecodeError:
            raise click.BadParameter(f"{path!r} is not UTF-8 text", param_hint="PAYLOAD"
                                     ) from None
    try:
        if content_type is not None and not is_json(content_type):
            return payload.encode("utf-8")
        value = json.loads(payload)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # sent as UTF-8 text
        return value
    except UnicodeEncodeError:
        raise click.BadParameter("not valid Unicode text (a lone surrogate, e.g. the "
                                 "escape \\ud800, or bytes that are not UTF-8)",
                                 param_hint="PAYLOAD") from None
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc}); give --content-type for "
                                 "other media types", param_hint="PAYLOAD") from exc
    except RecursionError:
        raise click.BadParameter("JSON nested too deeply", param_hint="PAYLOAD") from None


def _metadata(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--meta")
        out[key] = value
    return out


@click.command()
@click.argument("queue")
@click.argument("task_type", metavar="TYPE")
@click.argument("payload", required=False)
@click.option("-p", "--priority", type=click.IntRange(0, 9), help="Band 0 (low)..9 (high) [5].")
@click.option("--delay", type=Duration(max_ms=MAX_DELAY_MS), help="Run no earlier than this from now (30s, 5m).")
@click.option("--key", "idempotency_key", help="Idempotency key: a live task with it is "
              "returned instead of a new one.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="Attempts in total [3].")
@click.option("--task-timeout", type=Duration(min_ms=1, max_ms=MAX_TASK_TIMEOUT_MS),
              help="Handler time limit (e.g. 2m) [60s].")
@click.option("--ttl", type=Duration(min_ms=1, max_ms=MAX_DELAY_MS), help="Expire if not started within this.")
@click.option("--content-type", help="Media type; non-JSON payloads are sent as UTF-8 text "
              "[application/json].")
@click.option("--meta", multiple=True, metavar="KEY=VALUE", help="Metadata (repeatable).")
@click.option("--debounce-key", help="Debounce key: one task for a burst of enqueues with "
              "it (docs/handlers.md).")
@click.option("--debounce-window", type=Duration(min_ms=1, max_ms=MAX_DELAY_MS), default="1s",
              show_default=True, help="Debounce window.")
@click.option("--debounce-mode", type=click.Choice(["keep-last", "keep-first"]),
              default="keep-last", show_default=True,
              help="keep-last: replace the waiting task's payload and push it back; "
              "keep-first: absorb later enqueues.")
@click.option("--debounce-max-delay", type=Duration(min_ms=1, max_ms=MAX_DELAY_MS),
              help="keep-last: run at most this long after the burst's first enqueue.")
@click.option("--concurrency-key", help="Concurrency key: at most the queue's per-key limit "
              "of tasks with it run at once (docs/fairness.md).")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the outcome; exit code tells it.")
@click.option("--wait-timeout", type=Duration(max_ms=MAX_DELAY_MS), default="30s", show_default=True,
              help="How long --wait waits.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the task id "
              "(for id=$(dtq enqueue -q ...)), also with --wait.")
@json_option
@pass_state
def enqueue(state: State, queue: str, task_type: str, payload: str | None,
            wait_: bool, wait_timeout: int, quiet: bool, **opts: Any) -> None:
    """Enqueue a task of TYPE to QUEUE with a JSON PAYLOAD ('-' reads stdin, '@file' a file).

    \b
    dtq enqueue emails email.send '{"to": "ada@example.com"}' --priority 7
    dtq enqueue reports report.build @params.json --delay 5m --key report-2026-11
    dtq enqueue search reindex '{"doc": 7}' --debounce-key doc-7 --debounce-window 2s
    """
    body = _payload(payload, opts["content_type"])
    options = {"priority": opts["priority"], "delay_ms": opts["delay"],
               "idempotency_key": opts["idempotency_key"],
               "max_attempts": opts["max_attempts"], "timeout_ms": opts["task_timeout"],
               "ttl_ms": opts["ttl"], "content_type": opts["content_type"],
               "metadata": _metadata(opts["meta"]), "debounce": _debounce(opts),
               "concurrency_key": opts["concurrency_key"]}
    res = state.client.enqueue(queue, task_type, body,
                               **{k: v for k, v in options.items() if v is not None})
    if wait_:
        finish_wait(state, res.task_id, wait_timeout, quiet and not state.json)
        return
    if state.json:
        emit_json({"task_id": res.task_id, "deduplicated": res.deduplicated,
                   "debounced": res.debounced, "status": res.status.name})
        return
    if quiet:
        click.echo(res.task_id)
        return
    dedup = " (deduplicated: an earlier task has this key)" if res.deduplicated else ""
    if res.debounced:
        dedup = " (debounced into the burst's task)"
    click.echo(f"{res.task_id} {res.status.name}{dedup}")


def _debounce(opts: dict[str, Any]) -> dict[str, Any] | None:
    """The client's ``debounce=`` option from the --debounce-* flags (None without a key)."""
    if opts["debounce_key"] is None:
        ctx = click.get_current_context()
        for name in ("debounce_window", "debounce_mode", "debounce_max_delay"):
            if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT):
                raise click.BadParameter("needs --debounce-key",
                                         param_hint="--" + name.replace("_", "-"))
        return None
    out = {"key": opts["debounce_key"], "window_ms": opts["debounce_window"],
           "mode": opts["debounce_mode"].replace("-", "_")}
    if opts["debounce_max_delay"] is not None:
        out["max_delay_ms"] = opts["debounce_max_delay"]
    return out


@click.command()
@click.argument("task_id", metavar="ID")
@json_option
@pass_state
def get(state: State, task_id: str) -> None:
    """Show a task: status, payload, result, attempts and errors."""
    show_task(state, state.client.get_task(task_id))


@click.command()
@click.argument("task_id", metavar="ID")
@click.option("--timeout", "timeout_ms", type=Duration(max_ms=MAX_DELAY_MS), default="30s", show_default=True,
              help="Give up after this long (exit 7).")
@json_option
@pass_state
def wait(state: State, task_id: str, timeout_ms: int) -> None:
    """Wait until a task ends; exit 0 succeeded, 4 failed, 5 cancelled, 6 expired."""
    finish_wait(state, task_id, timeout_ms)


@click.command()
@click.argument("task_id", metavar="[ID]", required=False)
@click.option("--reason", default="", help="Reason recorded in the audit stream.")
@click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
              help="Cancel every waiting task matching these instead of one ID. "
              + bulk_cmd.FILTER_HELP)
@click.option("--dry-run", is_flag=True, help="With --filter: only count and list matches.")
@click.option("--limit", type=click.IntRange(1, 1_000_000),
              help="With --filter: stop after this many [100000].")
@click.option("-y", "--yes", is_flag=True, help="With --filter: do not ask for confirmation.")
@json_option
@pass_state
def cancel(state: State, task_id: str | None, reason: str, filters: tuple[str, ...],
           dry_run: bool, limit: int | None, yes: bool) -> None:
    """Cancel a queued, scheduled or running task, or with --filter every waiting
    (queued or scheduled) task of a queue that matches (a started task goes on)."""
    if bool(task_id) == bool(filters):
        raise bulk_cmd.no_target()
    if filters:
        bulk_cmd.cancel_by_filter(state, filters, dry_run, limit, reason, yes)
        return
    assert task_id is not None  # one of ID and --filter, checked above
    res = state.client.cancel(task_id, reason=reason)
    if state.json:
        emit_json({"task_id": task_id, "status": res.status.name,
                   "cancel_requested": res.cancel_requested, "request_id": res.request_id})
    elif res.cancel_requested:
        click.echo(f"{task_id} is running: cancellation requested (its worker stops it)")
    else:
        click.echo(f"{task_id} {res.status.name}")


@click.command()
@click.option("--queue", default="", help="Only this queue.")
@click.option("--status", type=click.Choice(_STATUS_NAMES, case_sensitive=False),
              help="Only tasks in this status.")
@click.option("-n", "--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@json_option
@pass_state
def recent(state: State, queue: str, status: str | None, limit: int) -> None:
    """List the most recently created tasks, newest first."""
    st = TaskStatus[status.upper()] if status else TaskStatus.UNSPECIFIED
    tasks = state.client.recent_tasks(limit=limit, queue=queue, status=st)
    if state.json:
        emit_json([task_doc(t) for t in tasks])
        return
    table(None, ["task", "queue", "type", "status", "prio", "attempt", "created", "error"],
          [(t.task_id, t.queue, t.task_type, t.status.name, t.priority,
            attempt_text(t, "/"), ago(t.raw.created_at_ms),
            f"{t.error_class}: {t.error}"[:60] if t.error_class else "") for t in tasks],
          empty="no tasks")


@click.command()
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeatable).")
@click.option("--type", "types", multiple=True,
              type=click.Choice(_EVENT_NAMES, case_sensitive=False),
              help="Only this event type (repeatable).")
@click.option("-n", "--count", type=click.IntRange(min=1), help="Stop after this many events.")
@json_option
@pass_state
def tail(state: State, queues: tuple[str, ...], types: tuple[str, ...],
         count: int | None) -> None:
    """Follow live events (task and worker lifecycle) until Ctrl-C (exit 0)."""
    stream = state.client.events(queues, [dtq_pb2.EventType.Value(f"EVENT_TYPE_{t.upper()}")
                                          for t in types])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread (e.g. under a test runner thread)
        previous = None
    seen = 0
    try:
        # inside the try: a Ctrl-C while subscribing or right after the banner still
        # exits 0; the banner means subscribed (events from then on are printed)
        stream.wait_subscribed()
        # on stderr with --json too: a script reading the JSON lines on stdout may wait for it
        click.echo(f"tailing events from {state.client.target} (Ctrl-C to stop)", err=True)
        for event in stream:
            _print_event(state, event)
            seen += 1
            if count is not None and seen >= count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stream.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _print_event(state: State, ev: dtq_pb2.SubscribeResponse) -> None:
    """One event per line, flushed at once (tail is read through pipes)."""
    if state.json:
        emit_json(to_dict(ev))
        sys.stdout.flush()
        return
    kind = enum_name(ev.DESCRIPTOR.fields_by_name["type"], ev.type)
    parts = [ev.ts, f"{kind:<22}"]
    for label, value in (("queue", ev.queue), ("task", ev.task_id), ("type", ev.task_type),
                         ("attempt", ev.attempt or ""), ("worker", ev.worker_id)):
        if value:
            parts.append(f"{label}={value}")
    parts.extend(f"{k}={v}" for k, v in sorted(ev.metadata.items()))
    if ev.dropped:
        parts.append(f"(dropped {ev.dropped} before)")
    click.echo(" ".join(parts))
    sys.stdout.flush()


#: The commands of this module, added to the ``dtq`` group by dtq_cli.main.
COMMANDS = (enqueue, get, wait, cancel, recent, tail)
