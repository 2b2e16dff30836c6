"""Flower's own strategies, chosen by name from the run configuration. mgfl re-implements none of
them: it only wraps them (``server.compressed``) to decode updates and merge partial models."""

from __future__ import annotations

from flwr.serverapp.strategy import (
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    Krum,
)

from mgfl.run_config import RunConfig


def build_flower_strategy(config: RunConfig, num_nodes: int | None = None) -> FedAvg:
    """The strategy ``config.strategy`` names, with the run's sampling and its own parameters.
    ``num_nodes`` (when known) lets the minimum counts follow the sampling fraction."""
    min_train = config.min_train_nodes
    if num_nodes is not None:
        min_train = min(min_train, num_nodes)
    common = {
        "fraction_train": config.fraction_train,
        "fraction_evaluate": config.fraction_evaluate,
        "min_train_nodes": min_train,
        "min_evaluate_nodes": min_train if config.fraction_evaluate > 0 else 0,
        "min_available_nodes": min_train,
    }
    name = config.strategy
    if name == "fedavg":
        return FedAvg(**common)
    if name == "fedprox":
        return FedProx(**common, proximal_mu=config.proximal_mu)
    if name == "fedadam":
        return FedAdam(**common, eta=config.adam_eta, eta_l=config.lr, tau=config.adam_tau)
    if name == "fedavgm":
        return FedAvgM(**common, server_learning_rate=config.server_lr,
                       server_momentum=config.server_momentum)
    if name == "fedmedian":
        return FedMedian(**common)
    if name == "fedtrimmedavg":
        return FedTrimmedAvg(**common, beta=config.trim_beta)
    if name == "krum":
        return Krum(**common, num_malicious_nodes=config.krum_malicious)
    raise ValueError(f"unknown strategy {name!r}")
