"""The pure parts of ``bench.cluster_scale``: queue spread from a CLUSTER SLOTS reply,
per-primary figures and the report's formatting (no Redis, no processes)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from bench import cluster_scale as cs
from dtq_gateway.store import keys

#: a raw CLUSTER SLOTS reply as redis-py returns it from a plain client (bytes hosts,
#: ranges out of order, one range with a replica entry)
SLOTS = [
    [10923, 16383, [b"127.0.0.1", 7003, b"c" * 40], [b"127.0.0.1", 7013, b"d" * 40]],
    [0, 5460, [b"127.0.0.1", 7001, b"a" * 40]],
    [5461, 10922, [b"127.0.0.1", 7002, b"b" * 40]],
]
A, B, C = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"


def test_slot_owners_sorted_primaries_only() -> None:
    assert cs.slot_owners(SLOTS) == [(0, 5460, A), (5461, 10922, B), (10923, 16383, C)]


@pytest.mark.parametrize(("slot", "node"), [(0, A), (5460, A), (5461, B), (16383, C)])
def test_node_of_slot_edges(slot: int, node: str) -> None:
    assert cs.node_of_slot(cs.slot_owners(SLOTS), slot) == node


def test_node_of_slot_uncovered() -> None:
    with pytest.raises(ValueError, match="slot 100"):
        cs.node_of_slot([(200, 16383, A)], 100)


def test_queue_spread_counts_queues_and_tasks_per_primary() -> None:
    slots = {"q0": 17, "q1": 6000, "q2": 12000, "q3": 5000, "q4": 5461}
    tasks = cs.tasks_per_queue(1003, list(slots))
    assert sum(tasks.values()) == 1003 and tasks["q0"] == 201 and tasks["q4"] == 200
    spread = cs.queue_spread(slots, SLOTS, tasks)
    assert spread == {A: {"queues": ["q0", "q3"], "tasks": 401},
                      B: {"queues": ["q1", "q4"], "tasks": 401},
                      C: {"queues": ["q2"], "tasks": 201}}


def test_queue_spread_lists_a_primary_without_queues() -> None:
    spread = cs.queue_spread({"only": 3}, SLOTS, {"only": 10})
    assert spread[B] == {"queues": [], "tasks": 0} and spread[A]["tasks"] == 10


def test_max_over_mean() -> None:
    assert cs.max_over_mean([1.0, 1.0, 1.0]) == 1.0
    assert cs.max_over_mean([3, 0, 0]) == 3.0
    assert cs.max_over_mean([0, 0]) is None
    assert cs.max_over_mean([]) is None


def _phase(cpu: dict[str, float], calls: dict[str, int], tasks: int) -> dict[str, Any]:
    total = sum(cpu.values())
    return {"tasks_per_s": 1000.0, "redis_cpu_us_per_task": total / tasks * 1e6,
            "redis_calls_per_task_no_scripts": 8.0, "redis_script_calls_per_task": 1.0,
            "gateway_cpu_us_per_task": 400.0, "worker_cpu_us_per_task": 250.0,
            "raw": {"redis_cpu_s_per_node": cpu, "redis_calls_per_node": calls}}


def _cluster_row(tasks: int) -> tuple[dict[str, Any], dict[str, Any]]:
    spread = {A: {"queues": ["q0", "q3"], "tasks": 600}, B: {"queues": ["q1"], "tasks": 400},
              C: {"queues": [], "tasks": 0}}
    enq = _phase({A: 0.06, B: 0.04, C: 0.02}, {A: 3000, B: 2000, C: 100}, tasks)
    drain = _phase({A: 0.12, B: 0.08, C: 0.04}, {A: 6000, B: 4000, C: 500}, tasks)
    every = _phase({A: 0.18, B: 0.12, C: 0.06}, {A: 9000, B: 6000, C: 600}, tasks)
    return {"enqueue": enq, "drain": drain, "all": every}, spread


def test_cluster_summary_per_primary_and_ceiling() -> None:
    row, spread = _cluster_row(1000)
    s = cs.cluster_summary(row, spread, 1000)
    a = s["all"]["per_node"][A]
    assert a["redis_cpu_us_per_task"] == 180.0 and a["redis_cpu_us_per_own_task"] == 300.0
    assert a["redis_calls_per_task"] == 9.0 and a["cpu_share"] == 0.5
    assert s["all"]["per_node"][C]["redis_cpu_us_per_own_task"] is None
    assert s["all"]["cpu_max_over_mean"] == 1.5  # 0.18 / mean(0.18, 0.12, 0.06)
    assert s["ceiling_per_s"] == round(1000 / 0.18)
    assert s["queues_max_over_mean"] == 2.0 and s["tasks_max_over_mean"] == 1.8


def test_render_table() -> None:
    row, spread = _cluster_row(1000)
    cluster = {**row, "spread": spread, "per_primary": cs.cluster_summary(row, spread, 1000),
               "shared_keys": {"dtq:workers:{workers}": {"slot": 1, "node": A}},
               "idle_redis_cpu_ms_per_s": {A: 1.0, B: 1.5, C: 2.25}}
    std = _phase({"": 0.25}, {"": 9000}, 1000)
    results = {"options": {"primaries": 3, "tasks": 1000, "payload_bytes": 100, "queues": 3,
                           "gateways": 1, "workers": 2, "concurrency": 32},
               "host": {"redis_server": "7.0.15", "cpus": 2, "commit": "abc1234"},
               "standalone": {"enqueue": std, "drain": std, "all": std,
                              "idle_redis_cpu_ms_per_s": 0.5},
               "cluster": cluster}
    text = cs.render(results)
    lines = text.splitlines()
    assert lines[0].startswith("dtq on one Redis and on a 3-primary Redis Cluster: 1,000 tasks")
    assert lines[2].split() == ["standalone", "1,000", "1,000", "1,000", "250.0/250.0/250.0",
                                "8.00", "1.00", "400", "250", "4,000"]
    assert lines[3].split()[:2] == ["cluster", "×3"] and lines[3].split()[-1] == "5,556"
    assert lines[1].index("ceiling/s") + len("ceiling/s") == len(lines[2])  # aligned
    node_a = next(ln for ln in lines if ln.startswith(A)).split()
    assert node_a == [A, "2", "600", "0.06/0.12", "60.0/120.0/180.0", "300.0", "9.00", "0.50"]
    assert next(ln for ln in lines if ln.startswith(C)).split()[5] == "–"
    assert "Redis CPU e/d/all 1.50/1.50/1.50, queues 2.00, tasks 1.80" in text
    assert "cluster 5,556/s (1.39× one Redis)" in text
    assert "dtq:workers:{workers} → 127.0.0.1:7001" in text
    assert "idle Redis CPU, no client (ms/s): one Redis 0.5, cluster 1.0 + 1.5 + 2.2" in text


def test_render_failed_cluster_run() -> None:
    std = _phase({"": 0.25}, {"": 9000}, 1000)
    results = {"options": {"primaries": 3, "tasks": 1000, "payload_bytes": 100, "queues": 3,
                           "gateways": 1, "workers": 2, "concurrency": 32},
               "host": {"redis_server": "7.0.15", "cpus": 2, "commit": "abc1234"},
               "standalone": {"enqueue": std, "drain": std, "all": std},
               "cluster": {"na": "gateway-0 exited with 1: boom"}}
    assert "cluster ×3   n/a (gateway-0 exited with 1: boom)" in cs.render(results)


def test_create_slot_ranges_as_redis_cli() -> None:
    assert cs.create_slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]
    ranges = cs.create_slot_ranges(7)
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383
    assert all(b[0] == a[1] + 1 for a, b in pairwise(ranges))


@pytest.mark.parametrize(("k", "primaries", "counts"), [(24, 3, [8, 8, 8]),
                                                         (32, 3, [11, 11, 10]),
                                                         (5, 4, [2, 1, 1, 1])])
def test_balanced_queue_names(k: int, primaries: int, counts: list[int]) -> None:
    names = cs.balanced_queue_names(k, primaries)
    assert len(set(names)) == k and all(keys.QUEUE_RE.match(n) for n in names)
    slots = {n: keys.key_slot(f"{{{n}}}") for n in names}
    reply = [[lo, hi, [b"127.0.0.1", 7000 + i, b"x"]]
             for i, (lo, hi) in enumerate(cs.create_slot_ranges(primaries))]
    spread = cs.queue_spread(slots, reply, dict.fromkeys(names, 1))
    assert [len(v["queues"]) for v in spread.values()] == counts
