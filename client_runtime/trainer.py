"""Local training on the device: the loop around a compiled step.

Batches are shuffled on the host (a seeded permutation per epoch) and streamed up; the device keeps
everything else. The host waits for the device only at reports (every ``window`` steps), where it
reads the accumulated loss and accuracy (12 bytes) and the profiling events.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from client_runtime.budget import fit_to_budget
from client_runtime.device import Device
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep, default_alignment
from mgfl.models.model import Model


@dataclass(frozen=True)
class TrainConfig:
    batch: int = 32
    epochs: int = 1
    steps: int | None = None  # overrides epochs when given
    seed: int = 0
    window: int = 10  # steps between timing windows (and device synchronisations)
    memory_budget: int | None = None  # bytes; the batch is split into micro-batches to fit


@dataclass
class TrainResult:
    final_loss: float
    train_accuracy: float
    accuracy: float | None  # on the test set, when one is given
    test_loss: float | None
    step_time_s: float
    samples_per_s: float
    data_movement_share: float
    h2d_bytes_per_step: float
    d2h_bytes_per_step: float
    peak_device_bytes: int
    steps: int
    epochs_run: float
    micro_batch: int = 0
    accumulation_steps: int = 1
    recompute_segments: int = 0
    history: list[dict] = field(default_factory=list)
    kernels: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


ProgressFn = Callable[[int, int, dict | None], None]


def compile_within_budget(
    device: Device,
    model: Model,
    config: TrainConfig,
    state: dict[str, np.ndarray],
    trainable: set[str] | None,
    optimizer: OptimizerConfig | None,
) -> CompiledStep:
    """The step for ``config.batch``, split into micro-batches when a memory budget asks for it
    (the effective batch, and so the result, stays the same)."""
    optimizer = optimizer or OptimizerConfig()
    trainable = set(model.parameter_shapes()) if trainable is None else set(trainable)
    steps, segments = 1, 0
    if config.memory_budget is not None:
        alignment = default_alignment(device.info.mem_base_addr_align_bytes)
        choice = fit_to_budget(
            model, config.batch, trainable, optimizer, config.memory_budget, alignment
        )
        steps, segments = choice.accumulation_steps, choice.recompute_segments
    return CompiledStep(
        device,
        model,
        config.batch,
        state,
        trainable,
        optimizer,
        accumulation_steps=steps,
        recompute_segments=segments,
    )


def batches_per_epoch(n: int, batch: int) -> int:
    if n < batch:
        raise ValueError(f"The training set has {n} samples, fewer than one batch of {batch}")
    return n // batch  # the last partial batch is dropped: every step has the same shape


def train(
    device: Device,
    model: Model,
    state: dict[str, np.ndarray],
    x_train: np.ndarray,
    y_train: np.ndarray,
    config: TrainConfig,
    optimizer: OptimizerConfig | None = None,
    trainable: set[str] | None = None,
    x_test: np.ndarray | None = None,
    y_test: np.ndarray | None = None,
    progress: ProgressFn | None = None,
    step: CompiledStep | None = None,
) -> tuple[TrainResult, CompiledStep]:
    """Train ``model`` from ``state``; returns the result and the compiled step (whose
    ``get_state()`` gives the trained weights)."""
    if step is None:
        step = compile_within_budget(device, model, config, state, trainable, optimizer)
    per_epoch = batches_per_epoch(len(y_train), config.batch)
    total = config.steps if config.steps is not None else per_epoch * config.epochs
    if total < 1:
        raise ValueError("Nothing to train: give at least one step or epoch")
    rng = np.random.default_rng(config.seed)
    x_train = np.ascontiguousarray(x_train, np.float32)
    y_train = np.ascontiguousarray(y_train, np.int32)
    window_times: list[float] = []
    history: list[dict] = []
    done = 0
    order = rng.permutation(len(y_train))
    pos = 0
    t_window, in_window = time.perf_counter(), 0
    while done < total:
        if pos + config.batch > len(order):
            order, pos = rng.permutation(len(y_train)), 0
            history.append({"step": done, **step.read_train_stats()})
        idx = order[pos : pos + config.batch]
        pos += config.batch
        step.train_step(x_train[idx], y_train[idx])
        done += 1
        in_window += 1
        if in_window == config.window or done == total:
            step.synchronize()
            now = time.perf_counter()
            window_times.append((now - t_window) / in_window)
            t_window, in_window = now, 0
            if progress:
                progress(done, total, None)
    stats = step.read_train_stats()
    history.append({"step": done, **stats})
    profile = step.profiler.summary()
    timed = window_times[1:] if len(window_times) > 1 else window_times
    step_time = statistics.median(timed)
    test = step.evaluate(x_test, y_test) if x_test is not None and y_test is not None else None
    result = TrainResult(
        final_loss=stats["loss"],
        train_accuracy=stats["accuracy"],
        accuracy=test["accuracy"] if test else None,
        test_loss=test["loss"] if test else None,
        step_time_s=step_time,
        samples_per_s=config.batch / step_time if step_time else 0.0,
        data_movement_share=profile["data_movement_share"],
        h2d_bytes_per_step=profile["h2d_bytes_per_step"],
        d2h_bytes_per_step=profile["d2h_bytes_per_step"],
        peak_device_bytes=step.peak_bytes,
        steps=done,
        epochs_run=done / per_epoch,
        micro_batch=step.micro_batch,
        accumulation_steps=step.accumulation_steps,
        recompute_segments=step.recompute_segments,
        history=history,
        kernels=profile["kernels"],
    )
    return result, step
