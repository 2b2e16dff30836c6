"""Each strategy name gives Flower's own class with the run's settings."""

from __future__ import annotations

import pytest
from flwr.serverapp.strategy import (
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    Krum,
)

from mgfl.run_config import STRATEGIES, RunConfig
from server.strategies import build_flower_strategy

EXPECTED = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam, "fedavgm": FedAvgM,
            "fedmedian": FedMedian, "fedtrimmedavg": FedTrimmedAvg, "krum": Krum}


@pytest.mark.parametrize("name", STRATEGIES)
def test_names_build_flower_classes(name):
    config = RunConfig(strategy=name, fraction_train=0.1, min_train_nodes=3)
    strategy = build_flower_strategy(config)
    assert type(strategy) is EXPECTED[name]
    assert strategy.fraction_train == 0.1
    assert strategy.min_train_nodes == 3


def test_strategy_parameters_reach_flower():
    config = RunConfig(proximal_mu=0.5, server_lr=0.7, server_momentum=0.3, adam_eta=0.02,
                       adam_tau=0.004, trim_beta=0.1, krum_malicious=1)
    assert build_flower_strategy(RunConfig(**{**config.__dict__, "strategy": "fedprox"})
                                 ).proximal_mu == 0.5
    avgm = build_flower_strategy(RunConfig(**{**config.__dict__, "strategy": "fedavgm"}))
    assert (avgm.server_learning_rate, avgm.server_momentum) == (0.7, 0.3)
    adam = build_flower_strategy(RunConfig(**{**config.__dict__, "strategy": "fedadam"}))
    assert (adam.eta, adam.tau) == (0.02, 0.004)
    assert build_flower_strategy(RunConfig(**{**config.__dict__, "strategy": "fedtrimmedavg"})
                                 ).beta == 0.1
    assert build_flower_strategy(RunConfig(**{**config.__dict__, "strategy": "krum"})
                                 ).num_malicious_nodes == 1
