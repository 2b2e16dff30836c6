"""examples/simulation/in_process.py and sweep.py: a federation with its clients called in the
server's process goes through the same apps, codecs and client state as a real run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIMULATION = REPO / "examples" / "simulation"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SIMULATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


in_process = load("in_process")


def test_pairs_are_typed_and_malformed_ones_refused():
    assert in_process.parse_pairs(["num-rounds=3", "codec=stc:0.1", "lr=0.004"]) == {
        "num-rounds": 3, "codec": "stc:0.1", "lr": 0.004}
    with pytest.raises(SystemExit, match="key=value"):
        in_process.parse_pairs(["num-rounds"])


def test_two_rounds_with_error_feedback_kept_per_client(tmp_path):
    """Six FSDD speakers, top-k with error feedback: every client replies every round, the
    uplink is counted from the real encoded replies, and each node keeps its own residual in its
    persistent context between rounds."""
    from client_runtime.federated import RESIDUAL_KEY

    history, grid = in_process.run_in_process({"num-rounds": 2, "local-steps": 2,
                                               "codec": "topk:0.01",
                                               "output-dir": str(tmp_path / "run")})
    assert [r["round"] for r in history["rounds"]] == [0, 1, 2] and history["wall_s"] > 0
    trained = [r for r in history["rounds"] if r["round"] > 0]
    assert [r["clients"] for r in trained] == [6, 6]
    dense_bytes = 4 * 24_000 * 6
    assert all(0 < r["uplink_bytes"] < dense_bytes / 10 for r in trained)
    residuals = [context.state.array_records[RESIDUAL_KEY] for context in grid.contexts.values()]
    first = [a.numpy() for a in residuals[0].values()]
    second = [a.numpy() for a in residuals[1].values()]
    assert any(a.any() for a in first)
    assert any((a != b).any() for a, b in zip(first, second, strict=True))


def test_sweep_runs_configs_side_by_side_and_summarises(tmp_path):
    out = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(SIMULATION / "sweep.py"), str(out), "--workers", "2",
         "num-rounds=1 local-steps=1", "num-rounds=1 local-steps=1 codec=fp16"],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((out / "sweep.json").read_text())
    assert [r["config"].split()[-1] for r in rows] == ["local-steps=1", "codec=fp16"]
    assert all(r["returncode"] == 0 and r["rounds"] == 1 for r in rows)
    ratio = rows[0]["uplink_per_client_round"] / rows[1]["uplink_per_client_round"]
    assert 1.9 < ratio < 2.1  # fp16 halves the float32 update


def test_statistics_travel_every_k_rounds_and_in_the_last(tmp_path):
    """statistics-every=2 over three rounds of stc: replies carry the BatchNorm statistics in
    rounds 2 and 3 (the last) only, the server counts them, and round 1 costs fewer bytes."""
    history, _ = in_process.run_in_process({"num-rounds": 3, "local-steps": 2,
                                            "codec": "stc:0.05", "statistics-every": 2,
                                            "output-dir": str(tmp_path / "run")})
    trained = [r for r in history["rounds"] if r["round"] > 0]
    assert [r["statistics_replies"] for r in trained] == [0, 6, 6]
    assert trained[0]["uplink_bytes"] < min(r["uplink_bytes"] for r in trained[1:])
    from mgfl.cli.simulate import plot_history

    assert plot_history(history, tmp_path / "rounds.png").stat().st_size > 0
