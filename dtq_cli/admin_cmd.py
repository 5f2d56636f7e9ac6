"""Operator commands of ``dtq``: queues, stats, pause, resume, delete-queue, workers, audit,
dlq."""

from __future__ import annotations

import click

from dtq_cli.group import ExitCode, Failure, State, json_option, pass_state
from dtq_cli.render import (
    Duration,
    ago,
    emit_json,
    extra_fields,
    fields,
    human_duration,
    table,
    to_dict,
)
from dtq_pyworker.errors import DtqRpcError

#: Oldest --older-than / --newer-than (the dashboard's bound of the same filter).
MAX_DEAD_LETTER_AGE_MS = 365 * 86_400_000
#: Most --rate and --limit of a redrive (RedriveDeadLettersRequest: the gateway refuses
#: more requeues per second, or more matches, than these).
MAX_REDRIVE_RATE = 10_000
MAX_REDRIVE_LIMIT = 100_000


@click.command()
@json_option
@pass_state
def queues(state: State) -> None:
    """List every queue with its depth, leased entries and paused flag (``--json`` keeps
    the API's field names: ``pending`` is the leased count)."""
    found = state.client.list_queues()
    if state.json:
        emit_json([to_dict(q) for q in found])
        return
    table(None, ["queue", "depth", "leased", "paused"],
          [(q.name, q.depth, q.pending, "paused" if q.paused else "") for q in found],
          empty="no queues")


#: Queue stats fields the view prints itself (the rest are printed generically).
_STATS_SHOWN = {"queue", "paused", "depth", "pending", "scheduled", "oldest_task_age_ms",
                "dead_letter_depth", "bands", "consumers", "succeeded", "failed", "retried",
                "dead_lettered", "cancelled", "succeeded_per_s", "failed_per_s",
                "throughput_window_ms", "waiting_types", "waiting_complete",
                "stuck_task_types"}


def _throughput(s) -> str:
    """``1.5 succeeded/s, 0.2 failed/s (last 31.8 s)``, or "" before a window exists."""
    if not s.throughput_window_ms:
        return ""
    return (f"{s.succeeded_per_s:.3g} succeeded/s, {s.failed_per_s:.3g} failed/s "
            f"(last {human_duration(s.throughput_window_ms)})")


def _waiting(s) -> str:
    """``send 3, build 2``, with ``(first 2000 waiting entries counted)`` when partial."""
    text = ", ".join(f"{w.task_type} {w.waiting}" for w in s.waiting_types)
    if text and not s.waiting_complete:
        text += " (only the first 2000 waiting entries counted)"
    return text


@click.command()
@click.argument("queue")
@json_option
@pass_state
def stats(state: State, queue: str) -> None:
    """Show a queue's depth per priority band, schedule, dead letters and consumers."""
    s = state.client.queue_stats(queue)
    if state.json:
        emit_json(to_dict(s))
        return
    fields([("queue", s.queue), ("paused", "yes" if s.paused else "no"), ("depth", s.depth),
            ("leased", s.pending), ("scheduled", s.scheduled),
            ("oldest waiting", human_duration(s.oldest_task_age_ms)
             if s.oldest_task_age_ms else ""),
            ("dead letters", s.dead_letter_depth),
            ("outcomes", (f"{s.succeeded} succeeded, {s.failed} failed ({s.retried} retried, "
                          f"{s.dead_lettered} dead-lettered), {s.cancelled} cancelled")),
            ("throughput", _throughput(s)), ("waiting by type", _waiting(s)),
            ("no worker takes", ", ".join(s.stuck_task_types)),
            *extra_fields(s, _STATS_SHOWN)])
    click.echo()
    table("bands", ["band", "depth", "leased"],
          [(b.band, b.depth, b.pending) for b in s.bands if b.depth or b.pending],
          empty="bands: all empty")
    if s.consumers:
        click.echo()
        table("consumers", ["worker", "leased", "idle"],
              [(c.name, c.pending, human_duration(c.idle_ms)) for c in s.consumers])


def _toggle(state: State, queue: str, reason: str, pause: bool, create: bool = False) -> None:
    client = state.client
    try:
        res = (client.pause_queue(queue, reason, create) if pause
               else client.resume_queue(queue, reason))
    except DtqRpcError as exc:
        if pause and exc.reason == "QUEUE_NOT_FOUND":  # the gateway names the API field
            raise Failure(f"NOT_FOUND QUEUE_NOT_FOUND: no queue named {queue!r}; pass "
                          "--create to pause it before its first task",
                          ExitCode.NOT_FOUND) from exc
        raise
    verb = "paused" if pause else "resumed"
    if state.json:
        emit_json({"queue": queue, "changed": res.changed, "request_id": res.request_id})
    elif res.changed:
        click.echo(f"{queue} {verb}")
    else:
        click.echo(f"{queue} was already {'paused' if pause else 'not paused'}")


@click.command()
@click.argument("queue")
@click.option("--reason", default="", help="Reason recorded in the audit stream.")
@click.option("--create", is_flag=True,
              help="Pause a queue that has no task yet (else: not found, exit 3).")
@json_option
@pass_state
def pause(state: State, queue: str, reason: str, create: bool) -> None:
    """Stop workers from leasing QUEUE (enqueues are still accepted)."""
    _toggle(state, queue, reason, True, create)


@click.command()
@click.argument("queue")
@click.option("--reason", default="", help="Reason recorded in the audit stream.")
@json_option
@pass_state
def resume(state: State, queue: str, reason: str) -> None:
    """Let workers lease from QUEUE again."""
    _toggle(state, queue, reason, False)


@click.command("delete-queue")
@click.argument("queue")
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--discard-dead-letters", is_flag=True,
              help="Delete the queue's dead letters with it (else they stop the delete).")
@click.option("--reason", default="", help="Reason recorded in the audit stream.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@pass_state
def delete_queue(state: State, queue: str, dry_run: bool, discard_dead_letters: bool,
                 reason: str, yes: bool) -> None:
    """Delete a drained QUEUE and its keys (asks first unless --yes or --dry-run).

    Refused (exit 1) while the queue holds queued, leased or scheduled tasks, or dead
    letters unless --discard-dead-letters; an unknown queue exits 3.
    """
    if not (yes or dry_run):  # "no" (or no answer on stdin) aborts with exit 1
        what = " and its dead letters" if discard_dead_letters else ""
        click.confirm(f"Delete queue {queue}{what}?", abort=True, err=True)
    res = state.client.delete_queue(queue, dry_run=dry_run,
                                    discard_dead_letters=discard_dead_letters, reason=reason)
    if state.json:
        emit_json({"queue": queue, "deleted": res.deleted, "dry_run": dry_run,
                   "keys": list(res.keys), "dead_letters_discarded": res.dead_letters_discarded,
                   "request_id": res.request_id})
        return
    dead = (f", {res.dead_letters_discarded} dead letters"
            if res.dead_letters_discarded else "")
    if dry_run:
        click.echo(f"dry run: would delete {queue} ({len(res.keys)} keys{dead}); "
                   "nothing changed")
        for key in res.keys:
            click.echo(f"  {key}")
    else:
        click.echo(f"{queue} deleted ({len(res.keys)} keys{dead})")


@click.command()
@json_option
@pass_state
def workers(state: State) -> None:
    """List known workers: state, load, counters and last heartbeat."""
    found = state.client.workers()
    if state.json:
        emit_json([to_dict(w) for w in found])
        return
    # labels: shown when the gateway reports them (a map field of newer gateways)
    labels = [dict(getattr(w, "labels", {}) or {}) for w in found]
    extra = ["labels"] if any(labels) else []
    table(None, ["worker", "host", "status", "leasing", "active", "processed", "failed",
                 "heartbeat", "started", *extra],
          [(w.worker_id, w.hostname, w.status, "yes" if w.leasing else "no",
            f"{w.active_tasks}/{w.concurrency}" if w.concurrency else w.active_tasks,
            w.tasks_processed, w.tasks_failed, f"{human_duration(w.heartbeat_age_ms)} ago",
            ago(w.started_at_ms),
            *([",".join(f"{k}={v}" for k, v in sorted(lab.items()))] if extra else []))
           for w, lab in zip(found, labels, strict=True)],
          empty="no workers")


@click.command()
@click.option("-n", "--limit", type=click.IntRange(1, 10000), default=20, show_default=True)
@json_option
@pass_state
def audit(state: State, limit: int) -> None:
    """List audited operator actions (cancel, pause, requeue, purge...), newest first."""
    entries = state.client.audit(limit)
    if state.json:
        emit_json([to_dict(e) for e in entries])
        return
    table(None, ["when", "actor", "action", "target", "detail", "request"],
          [(ago(e.ts_ms), e.actor, e.action, e.task_id, e.detail, e.request_id)
           for e in entries], empty="no audit entries")


# -- dead letters ---------------------------------------------------------------------------
@click.group()
def dlq() -> None:
    """Dead-letter queue: ls, requeue, discard, redrive, purge."""


@dlq.command("ls")
@click.option("--queue", default="", help="Only entries of this queue.")
@click.option("-n", "--limit", type=click.IntRange(1, 100000), default=20, show_default=True)
@json_option
@pass_state
def dlq_ls(state: State, queue: str, limit: int) -> None:
    """List dead-lettered tasks, newest first."""
    entries = state.client.dead_letters(queue=queue, limit=limit)
    if state.json:
        emit_json([to_dict(e) for e in entries])
        return
    table(None, ["task", "queue", "type", "attempts", "error", "failed"],
          [(e.task_id, e.queue, e.task_type, e.attempts_made,
            f"{e.last_error_class}: {e.last_error}"[:70], ago(e.failed_at_ms))
           for e in entries], empty="no dead letters")


_PAST = {"requeue": "requeued", "discard": "discarded"}


def _each(state: State, task_ids: tuple[str, ...], action: str) -> None:
    """Requeue or discard each id; report per id; exit 3 if any was not found."""
    client = state.client
    call = client.requeue_dead_letter if action == "requeue" else client.discard_dead_letter
    done, missing = [], []
    for task_id in task_ids:
        try:
            res = call(task_id)
        except DtqRpcError as exc:
            if exc.reason != "NOT_FOUND" and exc.code.name != "NOT_FOUND":
                raise
            missing.append(task_id)
            continue
        done.append({"task_id": task_id, "request_id": res.request_id})
    if state.json:
        emit_json({_PAST[action]: done, "not_found": missing})
    else:
        for d in done:
            click.echo(f"{d['task_id']} {_PAST[action]}")
    if missing:
        raise Failure(f"no dead-letter entry for {', '.join(missing)}", ExitCode.NOT_FOUND)


@dlq.command("requeue")
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True)
@json_option
@pass_state
def dlq_requeue(state: State, task_ids: tuple[str, ...]) -> None:
    """Put dead-lettered tasks back in their queues with a fresh attempt budget."""
    _each(state, task_ids, "requeue")


@dlq.command("discard")
@click.argument("task_ids", metavar="ID...", nargs=-1, required=True)
@json_option
@pass_state
def dlq_discard(state: State, task_ids: tuple[str, ...]) -> None:
    """Remove dead-letter entries (the task records stay, marked discarded)."""
    _each(state, task_ids, "discard")


@dlq.command("redrive")
@click.option("--queue", default="", help="Only this queue.")
@click.option("--type", "task_type", default="", help="Only this task type.")
@click.option("--error-class", default="", help="Only this error class (e.g. Timeout).")
@click.option("--older-than", "min_age", type=Duration(max_ms=MAX_DEAD_LETTER_AGE_MS), help="Dead-lettered at least "
              "this long ago.")
@click.option("--newer-than", "max_age", type=Duration(max_ms=MAX_DEAD_LETTER_AGE_MS), help="Dead-lettered at most "
              "this long ago.")
@click.option("--rate", type=click.IntRange(1, MAX_REDRIVE_RATE),
              help="Requeues per second [100].")
@click.option("--limit", type=click.IntRange(1, MAX_REDRIVE_LIMIT), help="Stop after this many [1000].")
@click.option("--dry-run", is_flag=True, help="Only count and list the matches.")
@json_option
@pass_state
def dlq_redrive(state: State, queue: str, task_type: str, error_class: str,
                min_age: int | None, max_age: int | None, rate: int | None,
                limit: int | None, dry_run: bool) -> None:
    """Requeue every dead letter matching the filters (all when none is given)."""
    res = state.client.redrive_dead_letters(
        queue=queue, task_type=task_type, error_class=error_class, min_age_ms=min_age or 0,
        max_age_ms=max_age or 0, max_per_second=rate or 0, limit=limit or 0, dry_run=dry_run)
    if state.json:
        emit_json({**to_dict(res), "dry_run": dry_run})
        return
    if dry_run:
        click.echo(f"dry run: {res.matched} dead letters match; nothing changed")
        for task_id in res.task_ids:
            click.echo(f"  {task_id}")
    else:
        click.echo(f"requeued {res.requeued} of {res.matched} matching dead letters")


@dlq.command("purge")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@pass_state
def dlq_purge(state: State, yes: bool) -> None:
    """Remove EVERY dead-letter entry (asks first unless --yes)."""
    if not yes:  # "no" (or no answer on stdin) aborts with exit 1, changing nothing
        click.confirm("Remove every dead-letter entry?", abort=True, err=True)
    res = state.client.purge_dead_letters()
    if state.json:
        emit_json({"purged": res.purged, "request_id": res.request_id})
    else:
        click.echo(f"purged {res.purged} dead letters")


#: The commands of this module, added to the ``dtq`` group by dtq_cli.main.
COMMANDS = (queues, stats, pause, resume, delete_queue, workers, audit, dlq)
