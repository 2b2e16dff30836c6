"""``mgfl incremental`` end to end through the command line, on a small synthetic run."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mgfl.cli import app

runner = CliRunner()
KEYS = ("accuracy_matrix", "final_accuracy", "average_incremental_accuracy", "forgetting",
        "exemplar_bytes")  # fmt: skip


def test_incremental_writes_json_with_baselines_and_a_plot(tmp_path, device):
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    result = runner.invoke(
        app,
        ["incremental", "--data", "synthetic:1,6,6:6", "--tasks", "3", "--classes-per-task", "2",
         "--memory", "12", "--exemplar-dtype", "int8", "--selection", "nme", "--epochs", "2",
         "--batch", "16", "--json", str(out), "--plot", str(png)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    for run in (payload, payload["baselines"]["finetune"], payload["baselines"]["joint"]):
        for key in KEYS:
            assert key in run
        assert len(run["accuracy_matrix"]) == 3 and len(run["increments"]) == 3
    assert payload["exemplar_bytes"] == 12 * (36 + 4)
    assert payload["baselines"]["finetune"]["exemplar_bytes"] == 0
    assert png.stat().st_size > 0
    assert "accuracy matrix" in result.output and "task 2" in result.output


def test_more_classes_than_the_data_set_has_is_an_error(device):
    result = runner.invoke(
        app,
        ["incremental", "--data", "synthetic:1,6,6:4", "--tasks", "3", "--classes-per-task", "2"],
    )
    assert result.exit_code == 2
    assert "classes" in result.output


def test_federated_run_through_the_command_line(tmp_path, device):
    out = tmp_path / "fcl.json"
    result = runner.invoke(
        app,
        ["incremental", "--data", "synthetic:1,6,6:4", "--tasks", "2", "--clients", "2",
         "--rounds-per-task", "2", "--stagger", "1", "--memory", "8", "--local-epochs", "1",
         "--batch", "16", "--no-flower", "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert [h["global_classes"] for h in payload["history"]] == [2, 2, 4, 4, 4]
    for key in KEYS:
        assert key in payload
    assert payload["exemplar_bytes"] == 2 * 8 * 36 * 4  # float32, as --exemplar-dtype says
    assert "round   3: client tasks 1 0" in result.output
