"""``python -m bench.plot_cpu``: CPU per task by process from tiny synthetic bench.scale JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import plot_cpu


def scale_json(path: Path, cells: dict[str, tuple[float, float, float]]) -> str:
    """A minimal bench.scale result with ``{"GxW": (gateway, worker, Redis µs)}``."""
    dtq = []
    for name, (gw, wrk, rds) in cells.items():
        g, w = name.split("x")
        dtq.append({"gateways": int(g), "workers": int(w), "queues": 1,
                    "all": {"gateway_cpu_us_per_task": gw, "worker_cpu_us_per_task": wrk,
                            "redis_cpu_us_per_task": rds}})
    dtq.append({"na": "a failed cell is skipped"})
    path.write_text(json.dumps({"dtq": dtq, "taskiq": []}))
    return str(path)


@pytest.fixture
def runs(tmp_path: Path) -> list[str]:
    return [scale_json(tmp_path / "before.json", {"1x1": (260.0, 170.0, 65.0),
                                                  "2x2": (300.0, 180.0, 70.0)}),
            scale_json(tmp_path / "after.json", {"2x2": (150.0, 90.0, 40.0),
                                                 "1x1": (140.0, 80.0, 35.0)}) + "=round 4"]


def test_figures_take_the_first_common_cell_in_input_order(runs: list[str]) -> None:
    cell, by_run = plot_cpu.figures(runs)
    assert cell == "1x1"
    assert list(by_run) == ["before", "round 4"]
    assert by_run["before"] == {"gateway": 260.0, "worker": 170.0, "Redis": 65.0}
    assert by_run["round 4"] == {"gateway": 140.0, "worker": 80.0, "Redis": 35.0}
    assert plot_cpu.figures(runs, "2x2")[1]["round 4"]["Redis"] == 40.0


def test_table_holds_each_process_and_the_sum(runs: list[str]) -> None:
    text = plot_cpu.table(*plot_cpu.figures(runs))
    assert "| cell 1x1, µs per task | before | round 4 |" in text
    assert "| gateway | 260.0 | 140.0 |" in text and "| all three | 495.0 | 255.0 |" in text


def test_a_missing_cell_or_a_foreign_file_is_refused(runs: list[str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no measured cell 4x8"):
        plot_cpu.figures(runs, "4x8")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"dtq": {"peer": "dtq"}}))
    assert plot_cpu.main([str(other), runs[0], "--out", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()


def test_plot_writes_a_png(runs: list[str], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the bench extra (pip install '.[bench]')")
    out = tmp_path / "img" / "cpu.png"
    assert plot_cpu.main([*runs, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| Redis | 65.0 | 35.0 |" in capsys.readouterr().out
