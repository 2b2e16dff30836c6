"""``mgfl train`` end to end through the command line, on small runs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mgfl.cli import app

runner = CliRunner()


def test_train_synthetic_writes_the_json_fields(tmp_path, device):
    out = tmp_path / "run.json"
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            "lenet5",
            "--data",
            "synthetic",
            "--batch",
            "16",
            "--steps",
            "12",
            "--json",
            str(out),
            "--save",
            str(tmp_path / "w.npz"),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    for key in (
        "final_loss",
        "accuracy",
        "step_time_s",
        "samples_per_s",
        "data_movement_share",
        "h2d_bytes_per_step",
        "d2h_bytes_per_step",
        "peak_device_bytes",
    ):
        assert key in payload
    assert payload["steps"] == 12
    assert payload["h2d_bytes_per_step"] == 16 * 28 * 28 * 4 + 16 * 4
    assert payload["d2h_bytes_per_step"] == 0
    assert payload["peak_device_bytes"] > 0
    assert (tmp_path / "w.npz").exists()


def test_train_on_embedded_fsdd_learns(tmp_path, device):
    out = tmp_path / "run.json"
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            "mlp",
            "--data",
            "fsdd",
            "--batch",
            "32",
            "--epochs",
            "3",
            "--optimizer",
            "adam",
            "--lr",
            "0.001",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert payload["accuracy"] > 0.5  # ten digits: chance is 0.1


def test_bad_model_is_a_clear_error():
    result = runner.invoke(app, ["train", "--model", "resnet1000", "--data", "synthetic"])
    assert result.exit_code == 2
    assert "Unknown model" in result.output
