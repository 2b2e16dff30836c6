"""One federated run on the server side: the global model, Flower's strategy wrapped for encoded
partial updates, evaluation, checkpoints and history each round."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from logging import INFO
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from mgfl.codecs import get_codec
from mgfl.run_config import RunConfig
from mgfl.update_layout import UpdateLayout
from server.checkpoint import save_checkpoint
from server.compressed import CompressedUpdateStrategy, RoundTraffic, record_of, state_of
from server.evaluation import ServerEvaluator
from server.faults import FaultPlan, FaultyGrid
from server.history import RoundRecord, RunHistory
from server.resume import (
    ServerState,
    check_same_run,
    load_state,
    restore_strategy_arrays,
    save_state,
    strategy_arrays_of,
)
from server.round_offset import ContinuedStrategy
from server.stragglers import FleetRounds
from server.strategies import build_flower_strategy
from server.validation import ReplyLimits


class RoundReporter:
    """Flower's ``evaluate_fn``: called with the global model before round 1 and after every
    round. Evaluates it, checkpoints it, and records the round."""

    def __init__(self, evaluator, strategy: CompressedUpdateStrategy, history: RunHistory,
                 checkpoint_dir: Path | None, faults: dict[int, dict[str, int]] | None = None,
                 on_round_end: Callable[[int, dict[str, np.ndarray]], None] | None = None):
        self.evaluator = evaluator
        self.strategy = strategy
        self.history = history
        self.checkpoint_dir = checkpoint_dir
        self.faults = faults if faults is not None else {}
        self.on_round_end = on_round_end
        self.started = time.perf_counter()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        state = state_of(arrays)
        result = self.evaluator(state)
        path = save_checkpoint(self.checkpoint_dir, server_round, state) \
            if self.checkpoint_dir else None
        traffic = self.strategy.traffic.get(server_round, RoundTraffic())
        fleet = self.strategy.fleet
        timing = fleet.records.get(server_round, {}) if fleet is not None else {}
        self.history.add(RoundRecord(
            round=server_round,
            accuracy=float(result["accuracy"]),
            loss=float(result["loss"]),
            uplink_bytes=traffic.uplink_bytes,
            downlink_bytes=traffic.downlink_bytes + traffic.evaluate_downlink_bytes,
            clients=traffic.replies,
            rejected=traffic.rejected,
            failed=traffic.failed,
            seconds=time.perf_counter() - self.started,
            checkpoint=str(path) if path else "",
            client_metrics=self.strategy.client_metrics.get(server_round, {}),
            rejections=list(traffic.rejections),
            faults=dict(self.faults.get(server_round, {})),
            aggregated=traffic.aggregated,
            note=traffic.note,
            statistics_replies=traffic.statistics_replies,
            stragglers=len(traffic.stragglers),
            straggler_nodes=list(traffic.stragglers),
            round_s=timing.get("round_s", 0.0) if fleet is not None else None,
            wall_clock_s=fleet.clock.seconds if fleet is not None else None,
            client_times=list(timing.get("clients", [])),
        ))
        if self.on_round_end is not None:
            self.on_round_end(server_round, state)
        return MetricRecord({"accuracy": float(result["accuracy"]),
                             "loss": float(result["loss"])})


def prepare(config: RunConfig):
    """The data set, model, layout and initial state a run with ``config`` uses."""
    from client_runtime.freezing import resolve_trainable
    from mgfl.data.registry import load_dataset
    from mgfl.onnx_import import build_or_import_model

    dataset = load_dataset(config.dataset)
    model = build_or_import_model(config.model, input_shape=dataset.input_shape,
                                  num_classes=dataset.num_classes)
    layout = UpdateLayout.of(model, resolve_trainable(model, config.freeze))
    initial = {name: np.asarray(value, np.float32)
               for name, value in model.init_state(config.model_seed).items()}
    return dataset, model, layout, initial


def fleet_of(config: RunConfig) -> FleetRounds | None:
    """Over-selection and deadline of a run that simulates phones (``devices`` set)."""
    if not config.devices.strip():
        return None
    return FleetRounds(config.fraction_train, config.min_train_nodes, config.over_selection,
                       config.round_deadline_s)


def run_server(grid: Grid, config: RunConfig, evaluator=None) -> RunHistory:
    """Runs ``config.num_rounds`` rounds on ``grid``; returns the history (also written to
    ``<output-dir>/history.json`` with a checkpoint per round)."""
    dataset, model, layout, initial = prepare(config)
    if evaluator is None:
        evaluator = ServerEvaluator(model, dataset.x_test, dataset.y_test, config.eval_batch,
                                    config.device)
    strategy = CompressedUpdateStrategy(
        build_flower_strategy(config), layout, get_codec(config.downlink_codec),
        extra_config={"frozen-digest": layout.frozen_digest(initial)},
        limits=ReplyLimits.for_layout(layout, config.max_update_bytes, config.update_norm_bound),
        min_replies=config.min_replies,
        fleet=fleet_of(config),
    )
    output = Path(config.output_dir) if config.output_dir else None
    plan = FaultPlan(config.fault_crash, config.fault_timeout, config.fault_late,
                     config.fault_seed)
    if plan.active:
        grid = FaultyGrid(grid, plan)
    history = RunHistory(output / "history.json" if output else None, {
        "config": config.to_mapping(),
        "model_parameters": model.parameter_count(),
        "travelling_values": int(sum(np.prod(layout.shapes[n]) for n in layout.travelling)),
        "test_samples": int(len(dataset.y_test)),
    })
    saved = load_state(output) if output and config.resume else None
    done = 0
    if saved is not None:
        check_same_run(saved.config, config.to_mapping())
        done = saved.round
        initial = saved.global_state
        restore_strategy_arrays(strategy.inner, saved.strategy_arrays)
        history.rounds = [RoundRecord(**record) for record in saved.history]
        if strategy.fleet is not None and history.rounds:
            strategy.fleet.clock.seconds = history.rounds[-1].wall_clock_s or 0.0
        log(INFO, "resuming after round %d from %s", done, output)

    def save_round(server_round: int, state: dict[str, np.ndarray]) -> None:
        save_state(output, ServerState(
            server_round, state, strategy_arrays_of(strategy.inner), config.to_mapping(),
            {"uplink": config.codec, "downlink": config.downlink_codec},
            [asdict(record) for record in history.rounds]))

    reporter = RoundReporter(evaluator, strategy, history, output,
                             faults=getattr(grid, "injected", None),
                             on_round_end=save_round if output else None)
    if done >= config.num_rounds:
        history.write()
        return history
    continued = ContinuedStrategy(strategy, done)
    settings = ConfigRecord(config.to_mapping())
    continued.start(grid=grid, initial_arrays=record_of(initial),
                    num_rounds=config.num_rounds - done, train_config=settings,
                    evaluate_config=ConfigRecord(config.to_mapping()),
                    evaluate_fn=continued.evaluate_fn(reporter))
    return history
