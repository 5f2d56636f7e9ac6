"""``dtq schedules ...`` and ``dtq limits ...``: periodic schedules and rate limits
(docs/schedules.md, docs/rate-limits.md) through the Admin RPCs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from dtq_cli.group import State, json_option, pass_state
from dtq_cli.render import Duration, emit_json, human_duration, table, to_dict, when
from dtq_cli.tasks_cmd import _payload
from dtq_proto import dtq_pb2
from dtq_pyworker._requests import enqueue_request

#: Schedule.interval_ms: 1000..31622400000 (366 days).
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 1000, 366 * 86_400_000
#: RateLimit ranges (proto/dtq.proto, docs/rate-limits.md): limit and burst
#: 1..1000000 (burst 0 = limit), period_ms 1..86400000 (the gateway reads 0 as 1000, so
#: --per 0 is refused rather than sent).
MAX_RATE_LIMIT = 1_000_000
MAX_RATE_PERIOD_MS = 86_400_000
_CATCH_UP = {"skip": dtq_pb2.SCHEDULE_CATCH_UP_SKIP,
             "latest": dtq_pb2.SCHEDULE_CATCH_UP_LATEST, "all": dtq_pb2.SCHEDULE_CATCH_UP_ALL}


@click.group()
def schedules() -> None:
    """Periodic schedules: a task enqueued on a cron expression or every interval."""


@schedules.command("ls")
@json_option
@pass_state
def schedules_ls(state: State) -> None:
    """List every schedule with its timetable, next fire and last task."""
    found = state.client.schedules()
    if state.json:
        emit_json([to_dict(s) for s in found])
        return
    table(None, ["name", "when", "queue", "type", "next fire", "last task", "fires", "paused"],
          [(i.schedule.name,
            (f"{i.schedule.cron} ({i.schedule.timezone or 'UTC'})" if i.schedule.cron
             else f"every {human_duration(i.schedule.interval_ms)}"),
            i.schedule.task.queue, i.schedule.task.task_type,
            when(i.next_fire_ms) if i.next_fire_ms and not i.schedule.paused else "",
            i.last_task_id, i.fires_total, "paused" if i.schedule.paused else "")
           for i in found], empty="no schedules")


@schedules.command("create")
@click.argument("name")
@click.argument("queue")
@click.argument("task_type", metavar="TYPE")
@click.argument("payload", required=False)
@click.option("--cron", default="", help="Cron expression, e.g. '*/5 * * * *' or @daily.")
@click.option("--tz", "timezone", default="", help="IANA time zone of --cron [UTC].")
@click.option("--every", "interval_ms",
              type=Duration(min_ms=MIN_INTERVAL_MS, max_ms=MAX_INTERVAL_MS), help="Fixed interval (e.g. 30s, 1h).")
@click.option("--catch-up", type=click.Choice(sorted(_CATCH_UP)), default="skip",
              show_default=True, help="Fires missed while no gateway ran.")
@click.option("--priority", type=click.IntRange(0, 9), help="Priority of each fire's task.")
@click.option("--paused", is_flag=True, help="Create it paused.")
@click.option("--replace", is_flag=True, help="Replace a schedule of the same name.")
@json_option
@pass_state
def schedules_create(state: State, name: str, queue: str, task_type: str, payload: str | None,
                     cron: str, timezone: str, interval_ms: int | None, catch_up: str,
                     priority: int | None, paused: bool, replace: bool) -> None:
    """Create schedule NAME enqueuing TYPE to QUEUE with a JSON PAYLOAD at each fire.

    \b
    dtq schedules create nightly reports report.build '{}' --cron '0 2 * * *' --tz Europe/Paris
    dtq schedules create ping health health.check --every 30s
    """
    task = enqueue_request(queue, task_type, _payload(payload, None), priority=priority)
    schedule = dtq_pb2.Schedule(name=name, cron=cron, timezone=timezone,
                                interval_ms=interval_ms or 0, task=task,
                                catch_up=_CATCH_UP[catch_up], paused=paused)
    res = state.client.create_schedule(schedule, replace)
    if state.json:
        emit_json(to_dict(res))
        return
    info = res.schedule
    nxt = f", next fire {when(info.next_fire_ms)}" if info.next_fire_ms and not paused else ""
    click.echo(f"schedule {name} {'created' if res.created else 'replaced'}{nxt}")


def _one(state: State, name: str, action: str) -> None:
    call: Callable[[str], Any] = {
        "pause": state.client.pause_schedule, "resume": state.client.resume_schedule,
        "trigger": state.client.trigger_schedule,
        "delete": state.client.delete_schedule}[action]
    res = call(name)
    if state.json:
        emit_json(to_dict(res))
    elif action == "trigger":
        click.echo(res.task_id)
    elif action == "delete":
        click.echo(f"schedule {name} {'deleted' if res.deleted else 'did not exist'}")
    else:
        click.echo(f"schedule {name} {action}d")


for _action, _help in (("pause", "Stop firing NAME (fires due while paused are skipped)."),
                       ("resume", "Fire NAME again, from now."),
                       ("trigger", "Enqueue one fire of NAME now; prints the task id."),
                       ("delete", "Delete NAME.")):
    def _make(action: str, text: str):
        @schedules.command(action, help=text)
        @click.argument("name")
        @json_option
        @pass_state
        def command(state: State, name: str) -> None:
            _one(state, name, action)
        return command
    _make(_action, _help)


@click.group()
def limits() -> None:
    """Rate limits per queue and per (queue, task type), shared by every gateway."""


@limits.command("ls")
@click.option("--queue", default="", help="Only this queue's limits.")
@json_option
@pass_state
def limits_ls(state: State, queue: str) -> None:
    """List rate limits with the tokens their buckets hold now."""
    found = state.client.rate_limits(queue)
    if state.json:
        emit_json([to_dict(r) for r in found])
        return
    table(None, ["queue", "task type", "limit", "per", "burst", "tokens"],
          [(r.queue, r.task_type or "(whole queue)", r.limit, human_duration(r.period_ms),
            r.burst or "", f"{r.tokens:.1f}") for r in found], empty="no rate limits")


@limits.command("set")
@click.argument("queue")
@click.argument("limit", type=click.IntRange(1, MAX_RATE_LIMIT))
@click.option("--per", "period_ms", type=Duration(min_ms=1, max_ms=MAX_RATE_PERIOD_MS), default="1s", show_default=True,
              help="Period the limit counts over.")
@click.option("--type", "task_type", default="", help="Only tasks of this type.")
@click.option("--burst", type=click.IntRange(0, MAX_RATE_LIMIT), default=0,
              help="Bucket size (tasks leased at once after a quiet spell) [limit].")
@json_option
@pass_state
def limits_set(state: State, queue: str, limit: int, period_ms: int, task_type: str,
               burst: int) -> None:
    """Lease at most LIMIT tasks of QUEUE per period, across every gateway."""
    res = state.client.set_rate_limit(queue, limit, period_ms, task_type, burst)
    if state.json:
        emit_json(to_dict(res))
        return
    scope = f"{queue}/{task_type}" if task_type else queue
    click.echo(f"rate limit {scope}: {limit} per {human_duration(period_ms)} "
               f"({'set' if res.created else 'changed'})")


@limits.command("rm")
@click.argument("queue")
@click.option("--type", "task_type", default="", help="The limit of this task type.")
@json_option
@pass_state
def limits_rm(state: State, queue: str, task_type: str) -> None:
    """Remove a rate limit."""
    res = state.client.delete_rate_limit(queue, task_type)
    if state.json:
        emit_json(to_dict(res))
        return
    click.echo("removed" if res.deleted else "there was no such limit")


#: The commands of this module, added to the ``dtq`` group by dtq_cli.main.
COMMANDS = (schedules, limits)
