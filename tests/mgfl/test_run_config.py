"""The run configuration: defaults equal the pyproject's Flower app config, and mistakes are
refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Flower depends on tomli, the same parser before Python 3.11
    import tomli as tomllib

from mgfl.run_config import RunConfig

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pyproject_defaults_are_the_run_config_defaults():
    flwr_config = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert flwr_config == RunConfig().to_mapping()


def test_round_trip_through_a_flower_mapping():
    config = RunConfig(codec="topk:0.01", strategy="krum", num_rounds=3, lr=0.1)
    assert RunConfig.from_mapping(config.to_mapping()) == config


def test_integers_are_accepted_for_floats_and_server_keys_ignored():
    config = RunConfig.from_mapping({"lr": 1, "num-rounds": 4.0, "server-round": 2,
                                     "frozen-digest": "ab"})
    assert config.lr == 1.0 and config.num_rounds == 4


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"num-round": 3}, "unknown run-config key"),
        ({"num-rounds": "3"}, "expected int"),
        ({"lr": True}, "expected float"),
        ({"strategy": "fedsgd"}, "choose one of"),
        ({"codec": "zip"}, "unknown codec"),
        ({"downlink-codec": "topk:0.1"}, "downlink-codec"),
        ({"fraction-train": 0.0}, "fraction-train"),
        ({"num-rounds": 0}, "num-rounds"),
        ({"statistics-every": 0}, "statistics-every"),
    ],
)
def test_mistakes_are_refused(values, match):
    with pytest.raises(ValueError, match=match):
        RunConfig.from_mapping(values)


@pytest.mark.parametrize(
    ("codec", "buffer_codec", "expected"),
    [("none", "auto", "none"), ("int8-channel", "auto", "int8-channel"),
     ("topk:0.01", "auto", "int8"), ("topk:0.01", "fp16", "fp16"),
     ("stc:0.02", "auto", "stc:0.02")],
)
def test_batchnorm_statistics_are_never_sparse_unless_asked(codec, buffer_codec, expected):
    config = RunConfig(codec=codec, buffer_codec=buffer_codec)
    assert config.uplink_buffer_codec() == expected


def test_statistics_travel_every_k_rounds_and_in_the_last():
    every_round = RunConfig(num_rounds=7)
    assert all(every_round.sends_statistics(r) for r in range(1, 8))
    config = RunConfig(num_rounds=7, statistics_every=3)
    assert [r for r in range(1, 8) if config.sends_statistics(r)] == [3, 6, 7]
    assert config.sends_statistics(0)  # a message without a round number
