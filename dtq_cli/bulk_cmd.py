"""``dtq cancel --filter``, ``dtq purge`` and ``dtq search``: bulk cancels of waiting
tasks (CancelTasks, PurgeQueue) and the task search (SearchTasks)."""

from __future__ import annotations

from typing import Any

import click

from dtq_cli.group import ExitCode, Failure, State, json_option, pass_state
from dtq_cli.render import Duration, ago, emit_json, parse_duration_ms, table, to_dict
from dtq_proto import dtq_pb2
from dtq_pyworker.tasks import Task, TaskStatus

#: Longest age a filter takes (365 days, in ms).
MAX_AGE_MS = 365 * 86_400_000
_WAITING = {"queued": dtq_pb2.TASK_STATUS_QUEUED, "scheduled": dtq_pb2.TASK_STATUS_SCHEDULED,
            "active": dtq_pb2.TASK_STATUS_ACTIVE}
FILTER_HELP = ("KEY=VALUE, repeatable: queue=Q (required), type=T, "
               "status=queued|scheduled|active (repeatable; default queued and scheduled; "
               "an active task is only flagged, as `dtq cancel ID` does), meta.K=V "
               "(repeatable), older-than=1h, newer-than=1d.")


def parse_filters(items: tuple[str, ...]) -> dict[str, Any]:
    """TaskFilter fields of ``--filter KEY=VALUE`` items; a malformed item is a usage
    error (exit 2) naming it."""
    out: dict[str, Any] = {"metadata": {}, "statuses": []}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--filter")
        if key == "queue":
            out["queue"] = value
        elif key == "type":
            out["task_type"] = value
        elif key == "status":
            if value.lower() not in _WAITING:
                raise click.BadParameter(f"status {value!r}: queued, scheduled or active",
                                         param_hint="--filter")
            out["statuses"].append(_WAITING[value.lower()])
        elif key.startswith("meta.") and len(key) > 5:
            out["metadata"][key[5:]] = value
        elif key in ("older-than", "newer-than"):
            try:
                ms = parse_duration_ms(value)
            except ValueError as exc:
                raise click.BadParameter(f"{key}: {exc}", param_hint="--filter") from None
            if not 0 < ms <= MAX_AGE_MS:
                raise click.BadParameter(f"{key}: 1ms..365d", param_hint="--filter")
            out["min_age_ms" if key == "older-than" else "max_age_ms"] = ms
        else:
            raise click.BadParameter(f"unknown filter {key!r} ({FILTER_HELP})",
                                     param_hint="--filter")
    if "queue" not in out:
        raise click.BadParameter("queue=Q is required", param_hint="--filter")
    return out


def cancel_by_filter(state: State, filters: tuple[str, ...], dry_run: bool, limit: int | None,
                     reason: str, yes: bool) -> None:
    """``dtq cancel --filter ...``: CancelTasks (asks first unless --yes or --dry-run)."""
    flt = parse_filters(filters)
    if not (yes or dry_run):  # "no" (or no answer on stdin) aborts with exit 1
        running = dtq_pb2.TASK_STATUS_ACTIVE in flt["statuses"]
        what = "task" if running else "waiting task"
        flagged = " (running ones are asked to stop)" if running else ""
        click.confirm(f"Cancel every {what} of {flt['queue']} matching "
                      f"{' '.join(filters)}{flagged}?", abort=True, err=True)
    res = state.client.cancel_tasks(dry_run=dry_run, limit=limit or 0, reason=reason, **flt)
    if state.json:
        emit_json({**to_dict(res), "dry_run": dry_run})
    elif dry_run:
        click.echo(f"dry run: {res.matched} tasks match; nothing changed")
        for task_id in res.task_ids:
            click.echo(f"  {task_id}")
    else:
        flagged = (f"; {res.cancel_requested} running, cancellation requested"
                   if res.cancel_requested else "")
        click.echo(f"cancelled {res.cancelled} of {res.matched} matching tasks{flagged}")


@click.command()
@click.argument("queue")
@click.option("--dry-run", is_flag=True, help="Only count the waiting tasks.")
@click.option("--reason", default="", help="Reason recorded in the audit stream.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@pass_state
def purge(state: State, queue: str, dry_run: bool, reason: str, yes: bool) -> None:
    """Cancel every waiting (queued or scheduled) task of QUEUE; running tasks go on
    (asks first unless --yes or --dry-run). An unknown queue exits 3."""
    if not (yes or dry_run):
        click.confirm(f"Cancel every waiting task of {queue}?", abort=True, err=True)
    res = state.client.purge_queue(queue, dry_run=dry_run, reason=reason)
    if state.json:
        emit_json({"queue": queue, **to_dict(res), "dry_run": dry_run})
    elif dry_run:
        click.echo(f"dry run: {res.matched} waiting tasks in {queue}; nothing changed")
    else:
        click.echo(f"purged {queue}: cancelled {res.cancelled} waiting tasks")


_STATUS_NAMES = [s.name for s in TaskStatus if s is not TaskStatus.UNSPECIFIED]


@click.command()
@click.option("--queue", default="", help="Only this queue.")
@click.option("--type", "task_type", default="", help="Only this task type.")
@click.option("--status", "statuses", multiple=True,
              type=click.Choice(_STATUS_NAMES, case_sensitive=False),
              help="Only tasks in this status (repeatable).")
@click.option("--meta", "meta", multiple=True, metavar="K=V",
              help="Only tasks whose metadata has K=V (repeatable).")
@click.option("--newer-than", "max_age", type=Duration(min_ms=1, max_ms=MAX_AGE_MS),
              help="Created at most this long ago.")
@click.option("--older-than", "min_age", type=Duration(min_ms=1, max_ms=MAX_AGE_MS),
              help="Created at least this long ago.")
@click.option("-n", "--limit", type=click.IntRange(1, 500), default=20, show_default=True,
              help="Most tasks on the page.")
@click.option("--page", "page_token", default="", help="next_page_token of an earlier search.")
@json_option
@pass_state
def search(state: State, queue: str, task_type: str, statuses: tuple[str, ...],
           meta: tuple[str, ...], max_age: int | None, min_age: int | None, limit: int,
           page_token: str) -> None:
    """Find recent tasks by queue, type, status, metadata and age, newest first; one
    page (each page reads at most 1000 entries of the recent-tasks index: `--page`
    with the printed token goes on)."""
    metadata = {}
    for item in meta:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--meta")
        metadata[k] = v
    res = state.client.search_tasks(
        page_size=limit, page_token=page_token, queue=queue, task_type=task_type,
        statuses=[int(TaskStatus[s.upper()]) for s in statuses], metadata=metadata,
        min_age_ms=min_age or 0, max_age_ms=max_age or 0)
    tasks = [Task.from_proto(t) for t in res.tasks]
    if state.json:
        emit_json({"tasks": [to_dict(t.raw) for t in tasks],
                   "next_page_token": res.next_page_token, "examined": res.examined})
        return
    table(None, ["task", "queue", "type", "status", "created", "metadata"],
          [(t.task_id, t.queue, t.task_type, t.status.name, ago(t.raw.created_at_ms),
            ",".join(f"{k}={v}" for k, v in sorted(t.metadata.items())))
           for t in tasks], empty="no matching tasks")
    if res.next_page_token:
        click.echo(f"more: dtq search ... --page {res.next_page_token}", err=True)


def no_target() -> Failure:
    """The error of a ``dtq cancel`` with neither ID nor --filter."""
    return Failure("give a task ID or --filter queue=Q ..., not both or neither",
                   ExitCode.USAGE)


#: The commands of this module, added to the ``dtq`` group by dtq_cli.main.
COMMANDS = (purge, search)
