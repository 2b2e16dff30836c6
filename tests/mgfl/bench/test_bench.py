"""``mgfl bench`` on tiny cases: rows with the required keys and positive timings; the torch
parts only where torch is installed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mgfl.bench.report import BenchRow, median_wall_seconds
from mgfl.cli import app

REQUIRED = {"suite", "case", "ours_s", "reference", "reference_s", "ratio"}


def test_ratio_is_reference_over_ours():
    assert BenchRow("gemm", "x", 2.0, "numpy", 1.0).ratio == 0.5
    assert BenchRow("paper", "y", 1.0, "paper", None).ratio is None


def test_median_excludes_warm_up():
    calls = []
    median_wall_seconds(lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7


def test_gemm_suite_writes_rows(tmp_path, device):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app, ["bench", "--suite", "gemm", "--quick", "--repeats", "2", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    rows = payload["rows"]
    assert {r["case"] for r in rows} >= {"square 64", "mlp fc1 forward"}
    for row in rows:
        assert REQUIRED <= set(row) and row["suite"] == "gemm"
        assert row["ours_s"] > 0 and row["reference_s"] > 0 and row["ratio"] > 0
        assert row["max_rel_error"] < 1e-4
    assert payload["device"]["name"]


def test_step_suite_against_torch(tmp_path, device):
    pytest.importorskip("torch")
    from mgfl.bench import step

    rows, _ = step.run(device, repeats=2, quick=True, with_tinygrad=False)
    assert len(rows) == 1 and rows[0].reference.startswith("torch")
    assert rows[0].ours_s > 0 and rows[0].reference_s > 0


def test_torch_model_matches_reference_forward():
    torch = pytest.importorskip("torch")
    import numpy as np

    from mgfl.bench.torch_reference import build_torch_model
    from mgfl.models import build_model

    model = build_model("lenet5")
    state = model.init_state(3)
    net = build_torch_model(torch, model, state).eval()
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    w1, b1 = state["layers.0.weight"], state["layers.0.bias"]
    first = net[0](torch.from_numpy(x)).detach().numpy()
    direct = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w1),
                                        torch.from_numpy(b1), padding=2).numpy()
    assert np.allclose(first, direct, atol=1e-5)
    assert net(torch.from_numpy(x)).shape == (2, 10)


def test_step_suite_times_mgfl_on_a_plain_queue(device, monkeypatch):
    """The step suite's wall-clock timing runs on the same OpenCL device opened without
    profiling events (they cost host time per enqueue on some drivers)."""
    from mgfl.bench import step

    seen = []

    def fake_ours(dev, model, batch, state, x, y, repeats):
        seen.append(dev)
        return 1.0, 2.0

    monkeypatch.setattr(step, "ours_step_seconds", fake_ours)
    monkeypatch.setattr(step, "torch_or_none", lambda: None)
    rows, _ = step.run(device, repeats=1, quick=True, with_tinygrad=False)
    assert [r.ours_s for r in rows] == [1.0]
    (used,) = seen
    assert not used.profiling and used.info == device.info
    assert device.profiling  # the other suites keep their events
    assert step.timing_device(used) is used
