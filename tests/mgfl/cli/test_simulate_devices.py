"""``mgfl simulate --devices``: a real federated run on Flower's simulation engine in which every
client is a simulated phone; the history reports stragglers and a simulated wall clock that the
clients' predicted times account for exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from client_runtime import federated
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep
from mgfl.cli import app as cli_app
from mgfl.codecs import encode_update, get_codec
from mgfl.cost_model import predict_step
from mgfl.fleet import profile_for, uplink_bits_per_second
from mgfl.run_config import RunConfig
from tests.client_runtime.test_app import setup

DATA = "synthetic:1,8,8:4"  # four natural groups: four clients
SETTINGS = {"dataset": DATA, "model": "mlp", "batch": 16, "local-steps": 3, "seed": 3,
            "uplink-mbps": 0.5}


def predicted_seconds(device) -> dict[str, float]:
    """Each of the four clients' simulated round (training + uplink) by profile name, computed
    here the way the client does: same step, same encoded size, same seeded draws."""
    config, model, layout, initial = setup({**SETTINGS, "devices": "mix"})
    samples = len(federated.client_data(config, 0, 4).y_train)
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr, momentum=config.momentum)
    step = CompiledStep(device, model, min(config.batch, samples), initial,
                        set(layout.trainable), optimizer, profile=False)
    zeros = {n: np.zeros(layout.shapes[n], np.float32) for n in layout.travelling}
    nbytes = encode_update(zeros, get_codec("none")).nbytes
    seconds = {}
    for client in range(4):
        profile = profile_for("mix", client, config.seed)
        train = config.local_steps * predict_step(step, profile).total_s
        uplink = 8 * nbytes / uplink_bits_per_second(client, config.uplink_mbps, config.seed)
        seconds[f"{client}:{profile.name}"] = train + uplink
    return seconds


def test_over_selection_and_a_tight_deadline_leave_stragglers(device, tmp_path):
    totals = sorted(predicted_seconds(device).values())
    assert len(set(totals)) == 4
    deadline = (totals[1] + totals[2]) / 2  # two of the four make it
    # fraction 0.75 of 4 nodes: 3 needed; over-selection 0.5 samples ceil(4.5) -> all 4
    out = tmp_path / "phones"
    args = ["simulate", "--rounds", "2", "--data", DATA, "--model", "mlp", "--batch", "16",
            "--local-steps", "3", "--fraction", "0.75", "--devices", "mix",
            "--over-selection", "0.5", "--round-deadline-s", repr(deadline),
            "--uplink-mbps", "0.5", "-c", "seed=3", "-c", "eval-batch=64",
            "--output-dir", str(out), "--json", str(tmp_path / "run.json")]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    assert "simulated wall clock" in result.output
    history = json.loads((tmp_path / "run.json").read_text())
    assert RunConfig.from_mapping(history["run"]["config"]).devices == "mix"
    first, *trained = history["rounds"]
    assert first["wall_clock_s"] == 0.0
    assert len(trained) == 2
    walls = [first["wall_clock_s"]]
    for record in trained:
        times = record["client_times"]
        assert len(times) == 4  # all four sampled although three are needed
        assert sorted(t["train_s"] + t["uplink_s"] for t in times) == pytest.approx(totals)
        kept = [t for t in times if t["kept"]]
        assert len(kept) == 2 and all(t["train_s"] + t["uplink_s"] <= deadline for t in kept)
        assert record["stragglers"] == 2
        assert sorted(record["straggler_nodes"]) == sorted(t["node"] for t in times
                                                           if not t["kept"])
        assert record["clients"] == 2 and record["failed"] == record["rejected"] == 0
        assert record["round_s"] == pytest.approx(deadline)  # fewer than needed: it waits
        walls.append(record["wall_clock_s"])
    assert walls == pytest.approx([0.0, deadline, 2 * deadline])
    assert history["simulated_wall_clock_s"] == pytest.approx(2 * deadline)
    assert history["final_accuracy"] > history["initial_accuracy"]
    assert (out / "rounds.png").stat().st_size > 0


def test_an_unknown_phone_is_refused_with_the_known_ones(tmp_path):
    result = CliRunner().invoke(cli_app, ["simulate", "--devices", "adreno-999",
                                          "--output-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "adreno-999" in result.output and "mix" in result.output
    assert "mali-g78" in result.output and "adreno-650" in result.output


def test_help_names_the_fleet_options():
    result = CliRunner().invoke(cli_app, ["simulate", "--help"])
    assert result.exit_code == 0
    for option in ("--devices", "--over-selection", "--round-deadline-s", "--uplink-mbps"):
        assert option in result.output
