"""``dtq concurrency ...``: per-key concurrency limits of queues (docs/fairness.md)
through the Admin RPCs."""

from __future__ import annotations

import click

from dtq_cli.group import State, json_option, pass_state
from dtq_cli.render import emit_json, table, to_dict

#: SetConcurrencyLimitRequest.max_active_per_key: 1..1000000.
MAX_PER_KEY = 1_000_000


@click.group()
def concurrency() -> None:
    """Per-key concurrency: at most N active tasks per concurrency key of a queue."""


@concurrency.command("ls")
@json_option
@pass_state
def concurrency_ls(state: State) -> None:
    """List every queue's per-key limit."""
    found = state.client.concurrency_limits()
    if state.json:
        emit_json([to_dict(x) for x in found])
        return
    table(None, ["queue", "max active per key"],
          [(x.queue, x.max_active_per_key) for x in found], empty="no concurrency limits")


@concurrency.command("set")
@click.argument("queue")
@click.argument("max_active_per_key", type=click.IntRange(1, MAX_PER_KEY))
@json_option
@pass_state
def concurrency_set(state: State, queue: str, max_active_per_key: int) -> None:
    """Run at most MAX_ACTIVE_PER_KEY tasks with the same concurrency key of QUEUE at once."""
    res = state.client.set_concurrency_limit(queue, max_active_per_key)
    if state.json:
        emit_json(to_dict(res))
        return
    click.echo(f"concurrency limit {queue}: {max_active_per_key} per key "
               f"({'set' if res.created else 'changed'})")


@concurrency.command("rm")
@click.argument("queue")
@json_option
@pass_state
def concurrency_rm(state: State, queue: str) -> None:
    """Remove QUEUE's per-key limit (its waiting tasks go back to their bands)."""
    res = state.client.delete_concurrency_limit(queue)
    if state.json:
        emit_json(to_dict(res))
        return
    click.echo("removed" if res.deleted else "there was no such limit")


@concurrency.command("keys")
@click.argument("queue")
@click.option("--top", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Most keys shown (the busiest first).")
@json_option
@pass_state
def concurrency_keys(state: State, queue: str, top: int) -> None:
    """QUEUE's limit and its busiest concurrency keys: active and waiting tasks."""
    res = state.client.concurrency(queue, top)
    if state.json:
        emit_json(to_dict(res))
        return
    limit = res.max_active_per_key or "none"
    click.echo(f"{queue}: max active per key {limit}; {res.key_count} keys in use, "
               f"{res.active} active, {res.waiting} waiting")
    table(None, ["key", "active", "waiting"], [(k.key, k.active, k.waiting) for k in res.keys],
          empty="no keys in use")


#: The commands this module adds to ``dtq`` (dtq_cli/main.py).
COMMANDS = (concurrency,)
