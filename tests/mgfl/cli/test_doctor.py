"""``mgfl doctor``: a ready machine passes every check; each kind of trouble fails with exit 1 and
says which check failed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mgfl.cli import app
from mgfl.cli import doctor as doctor_module

runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(device):
    """The session device fixture points MGFL_CACHE_DIR at a private program cache."""


def _report(args: list[str]) -> tuple[int, dict]:
    result = runner.invoke(app, ["doctor", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_ready_machine_passes_every_check():
    code, report = _report(["--model", "mlp", "--memory-budget", "64MB"])
    assert code == 0 and report["ok"]
    names = [c["name"] for c in report["checks"]]
    assert names == ["OpenCL platform", "OpenCL device", "kernels build",
                     "training step matches NumPy", "memory budget"]
    memory = report["memory"]
    assert memory["budget_bytes"] == 64 * 2**20
    assert 1 <= memory["largest_batch"] <= doctor_module.MAX_BATCH
    assert memory["batch1_bytes"] <= memory["budget_bytes"]


def test_device_selection_that_matches_nothing_fails():
    code, report = _report(["--device", "no-such-device-anywhere"])
    assert code == 1 and not report["ok"]
    assert report["checks"][-1]["name"] == "OpenCL device"
    assert "no-such-device-anywhere" in report["checks"][-1]["detail"]


def test_budget_below_one_sample_fails_with_what_is_needed():
    code, report = _report(["--model", "mlp", "--memory-budget", "64KB"])
    assert code == 1
    last = report["checks"][-1]
    assert last["name"] == "memory budget" and not last["ok"]
    assert report["memory"]["largest_batch"] == 0
    assert "batch 1 needs" in last["detail"]


def test_a_step_that_differs_from_numpy_fails(monkeypatch):
    monkeypatch.setattr(doctor_module, "STEP_RTOL", 0.0)
    monkeypatch.setattr(doctor_module, "STEP_ATOL", 1e-30)  # float32 never equals float64 here
    code, report = _report(["--model", "mlp"])
    assert code == 1
    assert report["checks"][-1]["name"] == "training step matches NumPy"
    assert not report["checks"][-1]["ok"]


def test_unknown_model_fails_and_the_table_says_not_ready():
    result = runner.invoke(app, ["doctor", "--model", "resnet9000"])
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "not ready" in result.stdout
