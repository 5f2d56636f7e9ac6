"""Turn bench results into printed tables and the target check of issue 6."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

COLUMNS = [("enqueue_one_per_s", "enq 1/s"), ("enqueue_16_per_s", "enq 16/s"),
           ("enqueue_batch_per_s", "batch/s"), ("drain_per_s", "drain/s"),
           ("e2e_p50_ms", "p50 ms"), ("e2e_p99_ms", "p99 ms")]
FLOOR_ROWS = [
    ("redis_xadd_1_per_s", "Redis XADD one by one (/s)"),
    ("redis_xadd_pipelined_per_s", "Redis XADD pipelined x500 (/s)"),
    ("redis_drain_per_s", "Redis XREADGROUP 100 + XACK + XDEL drain (/s)"),
    ("redis_e2e_p50_ms", "Redis XADD -> blocked XREADGROUP p50 (ms)"),
    ("redis_e2e_p99_ms", "Redis XADD -> blocked XREADGROUP p99 (ms)"),
    ("grpc_unary_1_per_s", "gRPC empty unary, one at a time (/s)"),
    ("grpc_unary_cpu_us", "gRPC empty unary, server CPU per call (us)"),
    ("grpc_unary_16_per_s", "gRPC empty unary, 16 in flight (/s)"),
    ("grpc_stream_msgs_per_s", "gRPC server-streamed 100 B messages (/s)"),
    ("grpc_stream_cpu_us", "gRPC server CPU per streamed message (us)"),
]


def fmt(value: Any) -> str:
    """A figure for a table cell: thousands separators for rates, 2-3 digits for ms."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def floors_table(floors: dict[str, Any]) -> str:
    """Floors as two columns: what, figure."""
    if "na" in floors:
        return f"floors: n/a ({floors['na']})"
    return _table(["floor", "value"], [[label, fmt(floors.get(key))]
                                       for key, label in FLOOR_ROWS if key in floors])


def systems_table(systems: list[dict[str, Any]]) -> str:
    """dtq and the peers: one row each, absolute numbers."""
    rows = []
    for s in systems:
        if "na" in s:
            rows.append([s["peer"], f"n/a ({s['na'][:90]})"] + [""] * (len(COLUMNS) - 1))
        else:
            rows.append([s["peer"]] + [fmt(s.get(k)) for k, _ in COLUMNS])
    return _table(["system"] + [label for _, label in COLUMNS], rows)


def ratios_table(dtq: dict[str, Any], peers: list[dict[str, Any]]) -> str:
    """dtq / peer for each throughput column (higher is better for dtq) and peer / dtq for
    latency (also higher is better for dtq)."""
    ok = [p for p in peers if "na" not in p]
    if "na" in dtq or not ok:
        return "dtq/peer ratios: n/a (" + (dtq.get("na") or "no peer ran") + ")"
    rows = []
    for key, label in COLUMNS:
        latency = key.endswith("_ms")
        cells = []
        for p in ok:
            a, b = dtq.get(key), p.get(key)
            if not a or not b:
                cells.append("-")
            else:
                cells.append(f"{(b / a if latency else a / b):.2f}x")
        rows.append([label + (" (peer/dtq)" if latency else " (dtq/peer)")] + cells)
    return _table(["figure"] + [p["peer"] for p in ok], rows)


def _get(results: dict[str, Any], where: str, key: str) -> float | None:
    if where in ("dtq", "floors"):
        src = results.get(where) or {}
    else:
        src = next((p for p in results.get("peers", []) if p.get("peer") == where), {})
    value = src.get(key)
    return value if isinstance(value, (int, float)) else None


def _ratio(results: dict[str, Any], key: str, where: str, other: str | None = None,
           other_key: str | None = None) -> float | None:
    a = _get(results, "dtq", key)
    b = _get(results, other or where, other_key or key)
    return a / b if a is not None and b else None


#: (what, how it is measured, goal, whether a value meets it); goal "report" and test
#: None: a figure printed for comparison, with no agreed goal (met "-").
Target = tuple[str, Callable[[dict[str, Any]], float | None], str,
               Callable[[float], bool] | None]
TARGETS: list[Target] = [
    ("drain / taskiq", lambda r: _ratio(r, "drain_per_s", "taskiq"), ">= 2.0x",
     lambda v: v >= 2.0),
    ("drain / bullmq", lambda r: _ratio(r, "drain_per_s", "bullmq"), ">= 0.6x",
     lambda v: v >= 0.6),
    ("EnqueueBatch / bullmq addBulk", lambda r: _ratio(r, "enqueue_batch_per_s", "bullmq"),
     ">= 1.0x", lambda v: v >= 1.0),
    ("unary 16 in flight / taskiq per-task enqueue",
     lambda r: _ratio(r, "enqueue_16_per_s", "taskiq", other_key="enqueue_one_per_s"),
     ">= 1.0x", lambda v: v >= 1.0),
    ("unary one caller / empty gRPC unary",
     lambda r: _ratio(r, "enqueue_one_per_s", "floors", other_key="grpc_unary_1_per_s"),
     ">= 0.5x", lambda v: v >= 0.5),
    ("gateway CPU per task, batch path (us)",
     lambda r: _get(r, "dtq", "gateway_cpu_us_per_task_batch"), "<= 150", lambda v: v <= 150),
    ("gateway CPU per task, unary at 200/s (us)",
     lambda r: _get(r, "dtq", "gateway_cpu_us_per_task_unary"), "<= 150", lambda v: v <= 150),
    ("e2e p50 at 200/s (ms)", lambda r: _get(r, "dtq", "e2e_p50_ms"), "<= 1", lambda v: v <= 1),
    ("e2e p99 at 200/s (ms)", lambda r: _get(r, "dtq", "e2e_p99_ms"), "<= 2", lambda v: v <= 2),
    ("Redis clients with 1,000 idle Lease streams",
     lambda r: _get(r, "dtq", "scale_redis_clients_idle"), "<= 20", lambda v: v <= 20),
    ("gateway RSS with 1,000 idle Lease streams (MB)",
     lambda r: _get(r, "dtq", "scale_gateway_rss_mb_idle"), "<= 300", lambda v: v <= 300),
    ("enqueue->lease p50 idle / before",
     lambda r: _ratio(r, "scale_lease_p50_ms_idle", "dtq", other_key="scale_lease_p50_ms_before"),
     "<= 1.2x", lambda v: v <= 1.2),
    ("Redis memory per queued 100 B task (bytes)",
     lambda r: _get(r, "dtq", "mem_bytes_per_queued_task"), "<= 1024", lambda v: v <= 1024),
    ("task stream entries at rest", lambda r: _get(r, "dtq", "rest_stream_entries"), "~0",
     lambda v: v <= 10),
    # issue 21: cost per task by process, and the ratios the lead compares across rounds
    ("all-process CPU per task, batch path (us): gateway + worker + Redis",
     lambda r: _get(r, "dtq", "all_cpu_us_per_task_batch"), "<= 200", lambda v: v <= 200),
    ("all-process CPU per task, batch path: dtq / taskiq (worker + Redis)",
     lambda r: _ratio(r, "all_cpu_us_per_task_batch", "taskiq"), "report", None),
    ("Redis CPU per task, batch path: dtq / taskiq",
     lambda r: _ratio(r, "redis_cpu_us_per_task_batch", "taskiq"), "<= 1.0x",
     lambda v: v <= 1.0),
    ("Redis commands per task, batch path", lambda r: _get(
        r, "dtq", "gateway_redis_cmds_per_task_batch"), "<= 8", lambda v: v <= 8),
    ("Redis commands per task at 200/s", lambda r: _get(
        r, "dtq", "gateway_redis_cmds_per_task_unary_200"), "<= 10", lambda v: v <= 10),
    ("Redis commands per task at 200/s: dtq / taskiq",
     lambda r: _ratio(r, "gateway_redis_cmds_per_task_unary_200", "taskiq",
                      other_key="redis_cmds_per_task_unary_200"), "report", None),
    ("unary Enqueue one caller: dtq / taskiq",
     lambda r: _ratio(r, "enqueue_one_per_s", "taskiq"), ">= 1.0x", lambda v: v >= 1.0),
]


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 6 with its measured value and whether it is met (None = n/a)."""
    out = []
    for name, measure, goal, test in TARGETS:
        value = measure(results)
        out.append({"target": name, "goal": goal,
                    "value": None if value is None else round(value, 3),
                    "met": None if value is None or test is None else bool(test(value))})
    return out


def targets_table(targets: list[dict[str, Any]]) -> str:
    """The target check as a table."""
    rows = [[t["target"], fmt(t["value"]) if t["value"] is not None else "n/a", t["goal"],
             "-" if t["goal"] == "report" else {True: "yes", False: "NO", None: "n/a"}[t["met"]]]
            for t in targets]
    return _table(["target (issues 6, 21)", "measured", "goal", "met"], rows)


def render(results: dict[str, Any]) -> str:
    """The whole printed report."""
    dtq = results.get("dtq") or {"peer": "dtq", "na": "not run"}
    peers = results.get("peers", [])
    head = (f"dtq bench {results['started_at']}  mode={results['mode']}  "
            f"repeat={results['sizes']['repeat']}  backlog={results['sizes']['backlog_n']}")
    parts = [head]
    if results.get("floors"):
        parts += ["", "== Floors", floors_table(results["floors"])]
    once = [p["peer"] for p in peers if p.get("repeat") == 1 and results["sizes"]["repeat"] > 1]
    title = "== Throughput and latency (medians)"
    if once:
        title += f"; one run each: {', '.join(once)}"
    parts += ["", title, systems_table([dtq, *peers])]
    if peers:
        parts += ["", "== dtq vs peers", ratios_table(dtq, peers)]
    scale = {k: v for k, v in dtq.items() if k.startswith(("scale_", "mem_", "rest_", "gateway_"))}
    cmds = dtq.get("redis_commands_per_task") or {}
    if cmds:
        names = sorted({c for phase in cmds.values() for c in phase},
                       key=lambda c: -max(p.get(c, 0) for p in cmds.values()))[:12]
        parts += ["", "== dtq: Redis commands per task (incl. inside Lua)",
                  _table(["command", *cmds], [[c, *(fmt(p.get(c)) for p in cmds.values())]
                                              for c in names])]
    for phase, frames in (dtq.get("profile_top") or {}).items():
        parts += ["", f"== gateway profile, {phase}: top self-time frames (% of samples)",
                  _table(["frame", "%"], [[f[:110], fmt(pct)] for f, pct in frames])]
    if scale:
        parts += ["", "== dtq scale and cost", _table(["figure", "value"],
                                                       [[k, fmt(v)] for k, v in scale.items()])]
    parts += ["", "== Targets", targets_table(results["targets"])]
    return "\n".join(parts)
