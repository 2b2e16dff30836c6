"""examples/simulation/plot_mirror.py: mirror rows grouped by run and seed, the table and plot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "simulation" / "plot_mirror.py"
spec = importlib.util.spec_from_file_location("plot_mirror", SCRIPT)
plot_mirror = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_mirror)


def rows(tmp_path: Path) -> Path:
    path = tmp_path / "mirror.jsonl"
    lines = [{"run": "codec=stc:0.023 threads=1", "final_accuracy": 0.9,
              "uplink_bytes_per_client_round": 928.0},
             {"run": "codec=stc:0.023 seed=1 threads=1", "final_accuracy": 0.8,
              "uplink_bytes_per_client_round": 930.0},
             {"run": "codec=stc:0.023 threads=2", "final_accuracy": 0.1,  # seed 0 again
              "uplink_bytes_per_client_round": 1.0},
             {"run": "codec=none seed=1", "final_accuracy": 0.95,
              "uplink_bytes_per_client_round": 98129.0}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_runs_are_named_without_seed_and_threads_and_the_first_row_wins(tmp_path):
    runs = plot_mirror.seeds_of([rows(tmp_path)])
    assert runs == {"codec=stc:0.023": {0: (0.9, 928.0), 1: (0.8, 930.0)},
                    "codec=none": {1: (0.95, 98129.0)}}
    table = plot_mirror.table(runs, ["codec=stc:0.023"])
    assert "| codec=stc:0.023 | 2 | 90.0, 80.0 | 85.0% | 929 |" in table


def test_the_plot_is_written_and_unknown_runs_are_named(tmp_path, monkeypatch, capsys):
    source = rows(tmp_path)
    png = tmp_path / "seeds.png"
    monkeypatch.setattr(sys, "argv", ["plot_mirror.py", str(png), str(source),
                                      "--runs", "codec=stc:0.023", "codec=none"])
    plot_mirror.main()
    assert png.stat().st_size > 1000 and "plot:" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["plot_mirror.py", str(png), str(source),
                                      "--runs", "codec=fp16"])
    with pytest.raises(SystemExit, match="no rows for"):
        plot_mirror.main()
