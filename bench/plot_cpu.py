"""CPU per task by process, before vs after: grouped bars from ``bench.scale`` JSON files.

```
python -m bench.scale --matrix 1x1 --tasks 5000 --skip-taskiq --no-plot --json before.json
... (change the code) ...
python -m bench.scale --matrix 1x1 --tasks 5000 --skip-taskiq --no-plot --json after.json
python -m bench.plot_cpu before.json after.json            # docs/img/cpu-per-task-round4.png
python -m bench.plot_cpu a.json=before b.json c.json=after --cell 2x2 --out x.png
```

Each input is one ``bench.scale`` result (``--json PATH``, or a
``bench/results/scale-*.json``); ``PATH=LABEL`` names its bars (default: the file's
stem). From each, the cell ``--cell GxW`` (default: the first dtq cell every input
has) gives three figures, both phases (enqueue + drain): gateway, worker and Redis CPU
per task (µs; ``all.gateway_cpu_us_per_task``, ``all.worker_cpu_us_per_task``,
``all.redis_cpu_us_per_task``). The plot has one group of bars per process and one bar
per input, in the order given, with the value on each bar; the table it prints holds the
same numbers. Needs matplotlib (``pip install '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "img" / "cpu-per-task-round4.png"
#: (label, key under the cell's "all" phase), in plot order
PROCESSES = [("gateway", "gateway_cpu_us_per_task"), ("worker", "worker_cpu_us_per_task"),
             ("Redis", "redis_cpu_us_per_task")]


def cell_name(cell: dict[str, Any]) -> str:
    """``GxW`` of a bench.scale dtq cell."""
    return f"{cell['gateways']}x{cell['workers']}"


def load_run(spec: str) -> tuple[str, dict[str, Any]]:
    """``PATH`` or ``PATH=LABEL`` -> (label, parsed JSON).

    Raises:
        ValueError: the file is not a bench.scale result (no ``dtq`` cells).
    """
    path, sep, label = spec.partition("=")
    data = json.loads(Path(path).read_text())
    is_scale = isinstance(data, dict) and isinstance(data.get("dtq"), list)
    if not is_scale:
        raise ValueError(f"{path}: not a bench.scale result (no dtq cells)")
    return (label if sep else Path(path).stem), data


def pick_cell(runs: list[tuple[str, dict[str, Any]]], cell: str | None) -> str:
    """The cell to compare: ``cell`` when given, else the first that every run measured.

    Raises:
        ValueError: no such cell in some run (or no cell common to all runs).
    """
    measured = [[cell_name(c) for c in data["dtq"] if "na" not in c] for _, data in runs]
    if cell is not None:
        for (label, _), names in zip(runs, measured):
            if cell not in names:
                raise ValueError(f"{label}: no measured cell {cell} (has {', '.join(names)})")
        return cell
    common = [n for n in measured[0] if all(n in names for names in measured[1:])]
    if not common:
        raise ValueError("no cell was measured in every run")
    return common[0]


def cpu_per_task(data: dict[str, Any], cell: str) -> dict[str, float]:
    """``{"gateway": µs, "worker": µs, "Redis": µs}`` of ``cell`` in one run."""
    row = next(c for c in data["dtq"] if "na" not in c and cell_name(c) == cell)
    return {label: float(row["all"][key]) for label, key in PROCESSES}


def figures(specs: list[str], cell: str | None = None) -> tuple[str, dict[str, dict[str, float]]]:
    """The compared cell and ``{run label: cpu_per_task}`` in input order."""
    runs = [load_run(s) for s in specs]
    chosen = pick_cell(runs, cell)
    return chosen, {label: cpu_per_task(data, chosen) for label, data in runs}


def table(cell: str, by_run: dict[str, dict[str, float]]) -> str:
    """The plotted numbers as a markdown table (µs per task)."""
    labels = list(by_run)
    lines = [f"| cell {cell}, µs per task | " + " | ".join(labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for process, _ in PROCESSES:
        lines.append(f"| {process} | " + " | ".join(f"{by_run[r][process]:.1f}"
                                                    for r in labels) + " |")
    lines.append("| all three | " + " | ".join(f"{sum(by_run[r].values()):.1f}"
                                              for r in labels) + " |")
    return "\n".join(lines)


def plot(cell: str, by_run: dict[str, dict[str, float]], out: Path, title: str) -> None:
    """Draw the grouped bars into ``out`` (PNG; its directory is created)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(by_run)
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, label in enumerate(labels):
        xs = [p + (i - (len(labels) - 1) / 2) * width for p in range(len(PROCESSES))]
        values = [by_run[label][process] for process, _ in PROCESSES]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
    ax.set_xticks(range(len(PROCESSES)), [p for p, _ in PROCESSES])
    ax.set_ylabel("CPU per task (µs), enqueue + drain")
    ax.set_title(title or f"dtq CPU per task by process, bench.scale cell {cell}")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the table, write the PNG; 2 on bad input or no matplotlib."""
    p = argparse.ArgumentParser(prog="python -m bench.plot_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="JSON[=LABEL]",
                   help="bench.scale results, in bar order (two or more)")
    p.add_argument("--cell", default=None, help="GxW cell to compare (default: first common)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"PNG to write ({DEFAULT_OUT.name})")
    p.add_argument("--title", default="", help="plot title")
    args = p.parse_args(argv)
    if len(args.runs) < 2:
        p.error("give two or more bench.scale JSON files (before, after)")
    try:
        cell, by_run = figures(args.runs, args.cell)
    except (OSError, ValueError, KeyError) as exc:
        print(f"plot_cpu: {exc}", file=sys.stderr)
        return 2
    print(table(cell, by_run))
    try:
        plot(cell, by_run, Path(args.out), args.title)
    except ImportError:
        print("plot_cpu: matplotlib missing: pip install '.[bench]'", file=sys.stderr)
        return 2
    print(f"plot written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
