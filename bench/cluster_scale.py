"""``python -m bench.cluster_scale``: one Redis and a 3-primary Redis Cluster, side by side.

The same workload runs twice: on one private standalone redis-server, then on a private
Redis Cluster of ``--primaries`` primaries (no replicas, AOF off, no RDB saves) that
the bench creates on free loopback ports with ``redis-cli --cluster create``. Each run
is one cell of :mod:`bench.scale` (its processes, gate, phases and meter): G
``dtq-gateway`` processes (``DTQ_REDIS_MODE=cluster`` on the cluster), W gated
``dtq-pyworker`` processes leasing all ``--queues``, ``--tasks`` tasks spread evenly
over the queues, an enqueue phase, then a drain phase.

Per run: tasks/s of both phases, Redis CPU per task (``INFO cpu``; on the cluster read
on every primary and summed), Redis calls per task (``INFO commandstats`` summed over
the nodes). For the cluster also how the queues spread: each queue's slot (``CLUSTER
KEYSLOT`` of its hash tag) mapped to its primary by ``CLUSTER SLOTS``, queues and
tasks per primary, Redis CPU per primary and its max/mean ratio, and the cluster
ceiling: tasks ÷ the busiest primary's CPU seconds. Prints a table and writes
``bench/results/cluster-scale-<UTC time>.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench.common import RECOMMENDED_REDIS_CONFIG, REPO, private_redis
from bench.dtq_scale import PAYLOAD_100
from bench.scale import (
    BATCH,
    enqueue_plan,
    host_info,
    queue_names,
    raise_interrupt,
    redis_cpu_s,
    run_cell,
    run_dtq_cell,
)
from dtq_gateway.store import keys

logger = logging.getLogger("bench.cluster_scale")
#: keys without a queue's hash tag that the hot path touches: where they live tells
#: which primary carries the shared work (worker heartbeats, the recent-tasks index)
SLOTS = 16384  # hash slots of a Redis Cluster
SHARED_KEYS = (keys.WORKERS, keys.RECENT_TASKS, keys.BUSY_QUEUES, keys.QUEUES)
IDLE_S = 2.0  # how long the idle Redis CPU of a setup is measured, before its run (s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options of ``python -m bench.cluster_scale``."""
    p = argparse.ArgumentParser(prog="python -m bench.cluster_scale",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tasks", type=int, default=20000, help="tasks per run")
    p.add_argument("--queues", type=int, default=24,
                   help="K queues: tasks spread evenly, every worker leases all K")
    p.add_argument("--gateways", type=int, default=1, help="G dtq-gateway processes")
    p.add_argument("--workers", type=int, default=2, help="W dtq-pyworker processes")
    p.add_argument("--primaries", type=int, default=3, help="primaries of the cluster (>= 3)")
    p.add_argument("--balanced", action="store_true",
                   help="pick queue names (scale-<i>, skipping some) whose hash slots give "
                        "every primary the same number of queues, instead of scale-0..K-1")
    p.add_argument("--concurrency", type=int, default=32,
                   help="handler slots per worker process")
    p.add_argument("--phase-timeout", type=float, default=300.0,
                   help="longest wait for one phase (enqueue or drain) of one run (s)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"),
                   help="directory for the JSON result")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the processes' logs (kept anyway when something failed)")
    args = p.parse_args(argv)
    if min(args.tasks, args.queues, args.gateways, args.workers, args.concurrency) < 1:
        p.error("--tasks, --queues, --gateways, --workers and --concurrency must be >= 1")
    from dtq_gateway.rpc.broker_servicer import MAX_QUEUES

    if args.queues > MAX_QUEUES:
        p.error(f"--queues must be <= {MAX_QUEUES}: every worker leases all of them in one "
                "Lease session, which takes at most that many queues")
    if args.primaries < 3:
        p.error("--primaries must be >= 3 (redis-cli --cluster create needs three)")
    args.queue_list = (balanced_queue_names(args.queues, args.primaries) if args.balanced
                       else queue_names(args.queues))
    return args


# -- pure helpers: spread of the queues over the primaries ------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def slot_owners(slots_reply: Sequence[Any]) -> list[tuple[int, int, str]]:
    """``(first slot, last slot, "host:port" of the primary)`` per range of a raw
    ``CLUSTER SLOTS`` reply (``[[start, end, [host, port, id, ...], replicas...], ...]``),
    sorted by first slot."""
    owners = [(int(r[0]), int(r[1]), f"{_text(r[2][0])}:{int(r[2][1])}") for r in slots_reply]
    return sorted(owners)


def node_of_slot(owners: list[tuple[int, int, str]], slot: int) -> str:
    """The primary serving ``slot``.

    Raises:
        ValueError: no range covers the slot (the cluster is not fully covered).
    """
    for first, last, node in owners:
        if first <= slot <= last:
            return node
    raise ValueError(f"slot {slot} is served by no primary")


def queue_spread(queue_slots: dict[str, int], slots_reply: Sequence[Any],
                 tasks_per_queue: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Queues and tasks per primary.

    Args:
        queue_slots: queue → hash slot of its tag (``CLUSTER KEYSLOT {queue}``).
        slots_reply: the raw ``CLUSTER SLOTS`` reply.
        tasks_per_queue: queue → tasks enqueued on it.

    Returns:
        ``{"host:port": {"queues": [names], "tasks": n}}`` for every primary in the
        reply (a primary that got no queue has an empty list), sorted by node.
    """
    owners = slot_owners(slots_reply)
    spread: dict[str, dict[str, Any]] = {n: {"queues": [], "tasks": 0}
                                         for n in sorted({o[2] for o in owners})}
    for queue, slot in sorted(queue_slots.items()):
        node = spread[node_of_slot(owners, slot)]
        node["queues"].append(queue)
        node["tasks"] += tasks_per_queue.get(queue, 0)
    return spread


def create_slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """The slot ranges ``redis-cli --cluster create`` gives ``primaries`` new primaries
    (its allocation: equal shares, each end rounded to the nearest slot)."""
    per, first, cursor, out = SLOTS / primaries, 0, 0.0, []
    for i in range(primaries):
        last = SLOTS - 1 if i == primaries - 1 else math.floor(cursor + per - 1 + 0.5)
        out.append((first, max(last, first)))
        first, cursor = max(last, first) + 1, cursor + per
    return out


def balanced_queue_names(k: int, primaries: int) -> list[str]:
    """``k`` queue names ``scale-<i>`` (i from 0, some skipped) that fall evenly, ±1,
    on the slot ranges of :func:`create_slot_ranges`, ranges taking the extra ones first."""
    ranges = create_slot_ranges(primaries)
    want = [k // primaries + (1 if r < k % primaries else 0) for r in range(primaries)]
    names: list[str] = []
    i = 0
    while len(names) < k:
        name, i = f"scale-{i}", i + 1
        slot = keys.key_slot(f"{{{name}}}")
        r = next(n for n, (lo, hi) in enumerate(ranges) if lo <= slot <= hi)
        if want[r]:
            want[r] -= 1
            names.append(name)
    return names


def tasks_per_queue(tasks: int, queues: list[str]) -> dict[str, int]:
    """Tasks each queue gets from :func:`bench.scale.enqueue_plan`."""
    out = dict.fromkeys(queues, 0)
    for queue, n in enqueue_plan(tasks, queues):
        out[queue] += n
    return out


def max_over_mean(values: Sequence[float]) -> float | None:
    """max ÷ mean of ``values`` (1.0 = perfectly even); None when the mean is 0."""
    mean = statistics.fmean(values) if values else 0.0
    return round(max(values) / mean, 3) if mean > 0 else None


def per_node_figures(phase: dict[str, Any], spread: dict[str, dict[str, Any]],
                     tasks: int) -> dict[str, dict[str, Any]]:
    """Per-primary figures of one phase (as :func:`bench.scale.derive` returns it).

    Returns:
        ``{"host:port": {redis_cpu_s, redis_cpu_us_per_task (node CPU ÷ all tasks:
        the nodes' figures add up to the total), redis_cpu_us_per_own_task (node CPU
        ÷ the tasks of its queues; None without any), redis_calls_per_task,
        cpu_share}}``.
    """
    cpu = phase["raw"]["redis_cpu_s_per_node"]
    calls = phase["raw"]["redis_calls_per_node"]
    total = sum(cpu.values()) or 1e-12
    out = {}
    for node, s in sorted(cpu.items()):
        own = spread.get(node, {}).get("tasks", 0)
        out[node] = {"redis_cpu_s": round(s, 4),
                     "redis_cpu_us_per_task": round(s / tasks * 1e6, 2),
                     "redis_cpu_us_per_own_task": round(s / own * 1e6, 2) if own else None,
                     "redis_calls_per_task": round(calls[node] / tasks, 3),
                     "cpu_share": round(s / total, 3)}
    return out


def cluster_summary(row: dict[str, Any], spread: dict[str, dict[str, Any]],
                    tasks: int) -> dict[str, Any]:
    """Per-primary figures of each phase, the max/mean ratios, and the ceilings.

    ``ceiling_per_s`` is tasks ÷ the busiest primary's Redis CPU seconds (both
    phases): the rate at which that primary would be one fully busy core, the others
    following in the same proportions.
    """
    out: dict[str, Any] = {}
    for phase in ("enqueue", "drain", "all"):
        nodes = per_node_figures(row[phase], spread, tasks)
        out[phase] = {"per_node": nodes, "cpu_max_over_mean": max_over_mean(
            [n["redis_cpu_s"] for n in nodes.values()])}
    busiest = max(row["all"]["raw"]["redis_cpu_s_per_node"].values())
    out["ceiling_per_s"] = round(tasks / busiest) if busiest > 0 else None
    out["queues_max_over_mean"] = max_over_mean([len(n["queues"]) for n in spread.values()])
    out["tasks_max_over_mean"] = max_over_mean([n["tasks"] for n in spread.values()])
    return out


# -- the two runs --------------------------------------------------------------------------
def _configure(client: redis.Redis) -> None:
    """The settings docs/operations.md recommends, as on bench.common's private Redis."""
    for name, value in RECOMMENDED_REDIS_CONFIG.items():
        client.config_set(name, value)


def idle_cpu_ms_per_s(nodes: dict[str, redis.Redis], seconds: float) -> dict[str, float]:
    """Redis CPU of each server while nothing but this reading talks to it (ms per s):
    the fixed cost of a setup (server cron, on a cluster the cluster bus), which the
    per-task figures of a phase include in proportion to its wall time."""
    before = {k: redis_cpu_s(n) for k, n in nodes.items()}
    t0 = time.monotonic()
    time.sleep(seconds)  # the measuring interval itself, not a wait for an event
    wall = time.monotonic() - t0
    return {k: round((redis_cpu_s(n) - before[k]) / wall * 1e3, 2) for k, n in nodes.items()}


def run_standalone(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The workload on one private redis-server; the server is removed afterwards."""
    server = private_redis()
    r = redis.Redis.from_url(server.url)
    try:
        host = host_info(r)
        idle = idle_cpu_ms_per_s({"": r}, IDLE_S)[""]
        row = run_cell("standalone", server.url, r, args, work, run_dtq_cell,
                       args.gateways, args.workers)
        return {"host": host, "idle_redis_cpu_ms_per_s": idle, **row}
    finally:
        r.flushall()
        r.close()
        server.cleanup()


def cluster_layout(node: redis.Redis, queues: list[str]) -> tuple[list[Any], dict[str, int],
                                                                   dict[str, int]]:
    """The raw ``CLUSTER SLOTS`` reply, each queue's slot and each shared key's slot
    (``CLUSTER KEYSLOT``: a queue's keys hash by ``{queue}``)."""
    slots = node.execute_command("CLUSTER", "SLOTS")
    queue_slots = {q: int(node.execute_command("CLUSTER", "KEYSLOT", f"{{{q}}}"))
                   for q in queues}
    shared = {k: int(node.execute_command("CLUSTER", "KEYSLOT", k)) for k in SHARED_KEYS}
    return slots, queue_slots, shared


def run_cluster(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The workload on a private cluster of ``--primaries`` primaries (one gateway
    client per primary measures it); the nodes and their directory are removed."""
    from tests.support.redis_cluster import RedisClusterSetup

    setup = RedisClusterSetup(directory=str(work / "cluster-nodes"), primaries=args.primaries,
                              replicas=0, appendonly=False)
    nodes: dict[str, redis.Redis] = {}
    try:
        setup.start()
        first = redis.Redis(port=setup.nodes[0].port)
        nodes[""] = first
        queues = args.queue_list
        slots, queue_slots, shared = cluster_layout(first, queues)
        owners = slot_owners(slots)
        nodes.pop("")
        for _, _, addr in owners:
            if addr not in nodes:
                host, port = addr.rsplit(":", 1)
                nodes[addr] = redis.Redis(host=host, port=int(port))
                _configure(nodes[addr])
        first.close()
        spread = queue_spread(queue_slots, slots, tasks_per_queue(args.tasks, queues))
        idle = idle_cpu_ms_per_s(nodes, IDLE_S)
        row = run_cell("cluster", setup.url, next(iter(nodes.values())), args, work,
                       run_dtq_cell, args.gateways, args.workers,
                       gateway_env={"DTQ_REDIS_MODE": "cluster"}, nodes=nodes)
        out = {"primaries": len(nodes), "idle_redis_cpu_ms_per_s": idle,
               "queue_slots": queue_slots,
               "shared_keys": {k: {"slot": s, "node": node_of_slot(owners, s)}
                               for k, s in shared.items()},
               "spread": spread, **row}
        if "na" not in row:
            out["per_primary"] = cluster_summary(row, spread, args.tasks)
        return out
    finally:
        for client in nodes.values():
            client.close()
        setup.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both runs, one after the other (never two Redis setups at once).

    Returns:
        The results written as JSON: options, host, standalone, cluster, elapsed_s.
    """
    started = datetime.now(UTC)
    work = Path(tempfile.mkdtemp(prefix="dtq-cluster-scale-"))
    results: dict[str, Any] = {
        "started_at": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "options": {"tasks": args.tasks, "queues": args.queues, "balanced": args.balanced,
                    "queue_names": args.queue_list, "gateways": args.gateways,
                    "workers": args.workers, "primaries": args.primaries,
                    "concurrency": args.concurrency, "payload_bytes": len(PAYLOAD_100),
                    "batch": BATCH}}
    t0 = time.monotonic()
    try:
        standalone = run_standalone(args, work)
        results["host"] = standalone.pop("host")
        results["standalone"] = standalone
        results["cluster"] = run_cluster(args, work)
    finally:
        if args.keep_logs:
            logger.warning("process logs kept in %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["elapsed_s"] = round(time.monotonic() - t0, 1)
    return results


# -- report --------------------------------------------------------------------------------
COLUMNS = [("Redis", 12), ("enq/s", 7), ("drain/s", 7), ("all/s", 7),
           ("Redis µs/task e/d/all", 21), ("calls/task", 10), ("+scripts", 8),
           ("gw µs", 6), ("wrk µs", 6), ("ceiling/s", 9)]
NODE_COLUMNS = [("primary", 16), ("queues", 6), ("tasks", 6), ("CPU s e/d", 11),
                ("µs/task e/d/all", 17), ("µs/own task", 11), ("calls/task", 10),
                ("share", 5)]


def _line(cells: Sequence[str], columns: Sequence[tuple[str, int]]) -> str:
    return " ".join(f"{c:>{w}}" if i else f"{c:<{w}}"
                    for i, (c, (_, w)) in enumerate(zip(cells, columns)))


def format_row(label: str, row: dict[str, Any], ceiling: float | None) -> str:
    """One line of the main table (``n/a (reason)`` for a failed run)."""
    if "na" in row:
        return f"{label:<12} n/a ({row['na'][:150]})"
    e, d, a = row["enqueue"], row["drain"], row["all"]
    return _line([label, f"{e['tasks_per_s']:,.0f}", f"{d['tasks_per_s']:,.0f}",
                  f"{a['tasks_per_s']:,.0f}",
                  (f"{e['redis_cpu_us_per_task']:.1f}/{d['redis_cpu_us_per_task']:.1f}/"
                  f"{a['redis_cpu_us_per_task']:.1f}"),
                  f"{a['redis_calls_per_task_no_scripts']:.2f}",
                  f"{a['redis_script_calls_per_task']:.2f}",
                  f"{a['gateway_cpu_us_per_task']:.0f}", f"{a['worker_cpu_us_per_task']:.0f}",
                  f"{ceiling:,.0f}" if ceiling else "–"], COLUMNS)


def format_nodes(cluster: dict[str, Any]) -> list[str]:
    """The per-primary table of a cluster run, and its max/mean line."""
    pp, spread = cluster["per_primary"], cluster["spread"]
    lines = [_line([n for n, _ in NODE_COLUMNS], NODE_COLUMNS)]
    for node, a in pp["all"]["per_node"].items():
        e, d = pp["enqueue"]["per_node"][node], pp["drain"]["per_node"][node]
        own = a["redis_cpu_us_per_own_task"]
        lines.append(_line([
            node, str(len(spread[node]["queues"])), str(spread[node]["tasks"]),
            f"{e['redis_cpu_s']:.2f}/{d['redis_cpu_s']:.2f}",
            (f"{e['redis_cpu_us_per_task']:.1f}/{d['redis_cpu_us_per_task']:.1f}/"
            f"{a['redis_cpu_us_per_task']:.1f}"),
            f"{own:.1f}" if own is not None else "–", f"{a['redis_calls_per_task']:.2f}",
            f"{a['cpu_share']:.2f}"], NODE_COLUMNS))
    ratios = "/".join(f"{pp[p]['cpu_max_over_mean']:.2f}" if pp[p]["cpu_max_over_mean"]
                      else "–" for p in ("enqueue", "drain", "all"))
    spread_ratios = [f"{pp[k]:.2f}" if pp[k] else "–"
                     for k in ("queues_max_over_mean", "tasks_max_over_mean")]
    lines.append(f"max/mean per primary: Redis CPU e/d/all {ratios}, queues "
                 f"{spread_ratios[0]}, tasks {spread_ratios[1]}")
    return lines


def render(results: dict[str, Any]) -> str:
    """The printed report: one line per setup, the cluster's primaries, the ceilings."""
    o, host = results["options"], results["host"]
    std, clu = results["standalone"], results["cluster"]
    lines = [(f"dtq on one Redis and on a {o['primaries']}-primary Redis Cluster: "
             f"{o['tasks']:,} tasks of {o['payload_bytes']} B over {o['queues']} queues"
             f"{' (names balanced over the primaries)' if o.get('balanced') else ''}, "
             f"{o['gateways']} gateway(s), {o['workers']} worker(s) × {o['concurrency']}, "
             f"redis-server {host['redis_server']}, {host['cpus']} CPUs, "
             f"commit {host['commit']}"),
             _line([n for n, _ in COLUMNS], COLUMNS)]
    std_us = std.get("all", {}).get("redis_cpu_us_per_task")
    std_ceiling = 1e6 / std_us if std_us else None
    clu_ceiling = clu.get("per_primary", {}).get("ceiling_per_s")
    lines.append(format_row("standalone", std, std_ceiling))
    lines.append(format_row(f"cluster ×{o['primaries']}", clu, clu_ceiling))
    if "per_primary" in clu:
        lines += ["", *format_nodes(clu)]
        idle = clu.get("idle_redis_cpu_ms_per_s", {})
        lines.append(f"idle Redis CPU, no client (ms/s): one Redis "
                     f"{std.get('idle_redis_cpu_ms_per_s', float('nan')):.1f}, cluster "
                     + " + ".join(f"{v:.1f}" for v in idle.values()))
        lines.append("shared keys: " + ", ".join(
            f"{k} → {v['node']}" for k, v in clu["shared_keys"].items()))
        if std_ceiling and clu_ceiling:
            lines.append(f"ceiling: one Redis {std_ceiling:,.0f}/s, cluster "
                         f"{clu_ceiling:,.0f}/s ({clu_ceiling / std_ceiling:.2f}× one Redis)")
    lines.append("e/d/all: enqueue / drain / both phases; Redis µs/task: INFO cpu summed "
                 "over the primaries ÷ tasks; calls/task: commandstats summed over the "
                 "nodes, without EVAL/EVALSHA (+scripts); ceiling: one Redis 1 s ÷ µs/task, "
                 "cluster tasks ÷ the busiest primary's CPU s; µs/own task: a primary's "
                 "CPU ÷ the tasks of its queues")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point: both runs, the report, the JSON."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupt)  # clean up as on Ctrl-C
    try:
        results = run(args)
    except KeyboardInterrupt:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        print("interrupted; every process the bench started was stopped", file=sys.stderr)
        return 130
    print(render(results))
    os.makedirs(args.out, exist_ok=True)
    path = Path(args.out) / f"cluster-scale-{results['started_at'].replace(':', '')}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nelapsed {results['elapsed_s']} s; JSON written to {path}")
    return 0 if "na" not in results["standalone"] and "na" not in results["cluster"] else 1


if __name__ == "__main__":
    sys.exit(main())
