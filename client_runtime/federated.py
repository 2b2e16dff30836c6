"""What a client does with one Flower message: train from the received global arrays and reply
with the encoded change, or evaluate them.

A simulation or a SuperNode may run many messages in one process: the data set, the device and
the compiled step (with its programs and arena) are kept per process and reused, and only the new
weights are uploaded (``set_state``). A compiled step is shared by every client of the same model,
batch, trainable set and optimizer, so memory does not grow with the number of clients. What must
outlive a message but belongs to one client, the error-feedback residual, lives in the client's
Flower ``Context.state``.
"""

from __future__ import annotations

import resource
import sys
import time
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyopencl as cl
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict

from client_runtime.budget import BudgetTooSmallError, largest_fitting_batch, parse_bytes
from client_runtime.device import Device
from client_runtime.device_fallback import open_client_device
from client_runtime.freezing import resolve_trainable
from client_runtime.graph import OPTIMIZER_STATE, OptimizerConfig
from client_runtime.profiler import StepProfiler
from client_runtime.proximal import ProximalPull
from client_runtime.step import CompiledStep, default_alignment, estimate_memory
from client_runtime.trainer import TrainConfig, train
from mgfl.codecs import decode_update, encode_update, get_codec
from mgfl.flower_records import CONFIG_KEY, METRICS_KEY, bundle_of, bundle_record
from mgfl.run_config import RunConfig
from mgfl.update_layout import UpdateLayout

if TYPE_CHECKING:  # a deployed client is no simulated phone: the cost model loads on demand
    from mgfl.simulated_phone import SimulatedPhone

RESIDUAL_KEY = "mgfl-residual"
RESIDUAL_CODEC_KEY = "mgfl-residual-codec"
MAX_CACHED_STEPS = 2
STATISTICS_EPOCHS = 1  # passes over the local samples that measure the sent model's statistics


@dataclass(frozen=True)
class ClientData:
    """One client's share: its training samples and its local held-out samples."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@lru_cache(maxsize=2)
def _dataset(spec: str):
    from mgfl.data.registry import load_dataset

    return load_dataset(spec)


@lru_cache(maxsize=4)
def _device(selection: str) -> Device:
    """The node's device; under ``auto`` a failing GPU falls back to the CPU with a warning."""
    return open_client_device(selection or None)


_steps: OrderedDict[tuple, CompiledStep] = OrderedDict()


def client_data(config: RunConfig, partition_id: int, num_partitions: int) -> ClientData:
    """The partition ``partition_id`` of the run's data set; held-out samples are split the same
    way (the speaker's own test takes under the natural partition)."""
    from mgfl.data.partition import partition

    dataset = _dataset(config.dataset)
    if config.partition == "natural":
        groups = np.unique(dataset.groups_train)
        if num_partitions != len(groups):
            raise ValueError(
                f"the natural partition of {config.dataset} has {len(groups)} clients, but this "
                f"federation has {num_partitions} nodes: run {len(groups)} nodes, or choose the "
                "iid or dirichlet partition"
            )
        if not 0 <= partition_id < len(groups):
            raise ValueError(f"partition-id {partition_id} outside 0..{len(groups) - 1}")
        train_idx = np.flatnonzero(dataset.groups_train == groups[partition_id])
        test_idx = np.flatnonzero(dataset.groups_test == groups[partition_id])
    else:
        clients = config.num_clients or num_partitions
        if not 0 <= partition_id < clients:
            raise ValueError(f"partition-id {partition_id} outside 0..{clients - 1}")
        kwargs = {
            "scheme": config.partition,
            "num_clients": clients,
            "alpha": config.dirichlet_alpha,
            "seed": config.partition_seed,
        }
        train_idx = partition(dataset.y_train, dataset.groups_train, **kwargs)[partition_id]
        test_parts = (
            partition(dataset.y_test, dataset.groups_test, **kwargs)
            if len(dataset.y_test) >= clients
            else None
        )
        test_idx = test_parts[partition_id] if test_parts else np.zeros(0, np.int64)
    return ClientData(
        dataset.x_train[train_idx],
        dataset.y_train[train_idx],
        dataset.x_test[test_idx],
        dataset.y_test[test_idx],
    )


def _model(config: RunConfig):
    """The zoo model, or the model of an .onnx file (its weights are its initial state)."""
    from mgfl.onnx_import import build_or_import_model

    dataset = _dataset(config.dataset)
    return build_or_import_model(
        config.model, input_shape=dataset.input_shape, num_classes=dataset.num_classes
    )


def _node_partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    if "partition-id" not in node or "num-partitions" not in node:
        raise ValueError(
            "this node has no partition: start it with --node-config "
            '"partition-id=I num-partitions=N" (the simulation sets both itself)'
        )
    return int(node["partition-id"]), int(node["num-partitions"])


def _received_state(
    content: RecordDict, config: RunConfig, model, layout: UpdateLayout, digest: str | None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """Frozen arrays rebuilt from the model seed, and the travelling arrays as received."""
    blob = bundle_of(content)
    received = decode_update(blob, layout.travelling_shapes())
    missing = [n for n in layout.travelling if n not in received]
    if missing:
        raise ValueError(f"the global model arrived without {missing[:5]}")
    initial = model.init_state(config.model_seed)
    if digest is not None and layout.frozen_digest(initial) != digest:
        raise ValueError(
            "the frozen arrays rebuilt from model-seed differ from the server's: both sides must "
            "use the same model, model-seed and freezing policy"
        )
    state = {**{n: initial[n] for n in layout.frozen}, **received}
    return state, received, len(blob)


def _batch_for(
    model,
    requested: int,
    samples: int,
    trainable: set[str],
    optimizer: OptimizerConfig,
    device: Device,
    budget: str,
) -> int:
    batch = max(1, min(requested, samples))
    if not budget:
        return batch
    limit = parse_bytes(budget)
    align = default_alignment(device.info.mem_base_addr_align_bytes)

    def peak_of(b: int) -> int:
        return estimate_memory(model, b, trainable, optimizer, alignment=align).peak_bytes

    fits = largest_fitting_batch(peak_of, limit, batch)
    if fits == 0:
        raise BudgetTooSmallError(
            f"the model needs {peak_of(1)} bytes at batch 1, more than memory-budget {budget}; "
            "raise the budget or freeze layers (freeze = head, bias, last:K)"
        )
    return fits


def _compiled_step(
    device: Device, model, batch: int, state: dict, trainable: set[str], optimizer: OptimizerConfig
) -> CompiledStep:
    key = (model, batch, frozenset(trainable), optimizer, device.info.cache_key)
    step = _steps.get(key)
    if step is None:
        step = CompiledStep(device, model, batch, state, trainable, optimizer)
        _steps[key] = step
        while len(_steps) > MAX_CACHED_STEPS:
            _steps.popitem(last=False)
    else:
        _steps.move_to_end(key)
        step.set_state(state)
        _reset_optimizer(step)
    step.profiler = StepProfiler(enabled=True)
    return step


def _reset_optimizer(step: CompiledStep) -> None:
    """Momentum and Adam moments start from zero every round, as on a freshly built step."""
    queue = step.device.queue
    for name, tensor in step.graph.tensors.items():
        if tensor.category == OPTIMIZER_STATE:
            cl.enqueue_copy(queue, step.views[name], np.zeros(tensor.shape, tensor.dtype))
    cl.enqueue_copy(queue, step.views[step.graph.step_counter], np.ones(1, np.int32))
    queue.finish()


def _load_residuals(context: Context, codec_spec: str) -> dict[str, np.ndarray] | None:
    state = context.state
    if RESIDUAL_KEY not in state.array_records:
        return None
    if state.config_records.get(RESIDUAL_CODEC_KEY, {}).get("codec") != codec_spec:
        return None  # the codec changed: the old residual belongs to another compressor
    return {name: array.numpy() for name, array in state.array_records[RESIDUAL_KEY].items()}


def _store_residuals(context: Context, codec_spec: str, residuals: dict[str, np.ndarray]) -> None:
    context.state[RESIDUAL_KEY] = ArrayRecord({n: Array(r) for n, r in residuals.items()})
    context.state[RESIDUAL_CODEC_KEY] = ConfigRecord({"codec": codec_spec})


def peak_rss_bytes() -> int:
    """The peak resident memory of this process so far (a Ray actor serves many clients: this
    staying flat round after round is what bounded memory means)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def simulated_phone(config: RunConfig, partition_id: int) -> SimulatedPhone | None:
    """The phone this client stands for when the run simulates a fleet (``devices``)."""
    if not config.devices.strip():
        return None
    from mgfl.simulated_phone import SimulatedPhone

    return SimulatedPhone.of(config.devices, partition_id, config.uplink_mbps, config.seed)


def memory_budget_of(config: RunConfig, phone: SimulatedPhone | None) -> str:
    """The budget for memory-aware batching: the run's own if it names one, else the simulated
    phone's app budget, else none."""
    if config.memory_budget or phone is None:
        return config.memory_budget
    return str(phone.profile.memory_budget_bytes)


def measure_statistics(step: CompiledStep, state: dict[str, np.ndarray],
                       buffers: tuple[str, ...], data: ClientData, batch: int, seed: int,
                       lr: float, epochs: int = STATISTICS_EPOCHS) -> dict[str, np.ndarray]:
    """The BatchNorm running statistics of ``state``'s weights on the local training samples:
    training steps at learning rate 0 (the weights stay), starting from ``state``'s statistics
    (the received global ones, so the result leans on them by 0.9 ** steps)."""
    step.set_state(state)
    step.set_learning_rate(0.0)
    try:
        order_rng = np.random.default_rng(seed + 1)
        x = np.ascontiguousarray(data.x_train, np.float32)
        y = np.ascontiguousarray(data.y_train, np.int32)
        for _ in range(epochs):
            order = order_rng.permutation(len(y))
            for start in range(0, len(y) - batch + 1, batch):
                step.train_step(x[order[start:start + batch]], y[order[start:start + batch]])
        step.synchronize()
        step.read_train_stats(reset=True)
        return step.get_state(list(buffers))
    finally:
        step.set_learning_rate(lr)


def _round_seed(config: RunConfig, server_round: int, partition_id: int) -> int:
    sequence = np.random.SeedSequence([config.seed, server_round, partition_id])
    return int(sequence.generate_state(1)[0])


def train_round(content: RecordDict, context: Context) -> RecordDict:
    """Local training from the received global arrays; the reply carries the encoded change of
    the travelling arrays and the round's metrics."""
    settings = dict(content[CONFIG_KEY]) if CONFIG_KEY in content.config_records else {}
    config = RunConfig.from_mapping(settings)
    server_round = int(settings.get("server-round", 0))
    partition_id, num_partitions = _node_partition(context)
    data = client_data(config, partition_id, num_partitions)
    model = _model(config)
    trainable = resolve_trainable(model, config.freeze)
    layout = UpdateLayout.of(model, trainable)
    state, received, downlink_bytes = _received_state(
        content, config, model, layout, settings.get("frozen-digest")
    )
    device = _device(config.device)
    programs_before = dict(device.kernels.stats)
    optimizer = OptimizerConfig(
        name=config.optimizer,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
    phone = simulated_phone(config, partition_id)
    batch = _batch_for(
        model,
        config.batch,
        len(data.y_train),
        trainable,
        optimizer,
        device,
        memory_budget_of(config, phone),
    )
    step = _compiled_step(device, model, batch, state, trainable, optimizer)
    seed = _round_seed(config, server_round, partition_id)
    train_config = TrainConfig(
        batch=batch, epochs=config.epochs, steps=config.local_steps or None, seed=seed
    )
    has_test = len(data.y_test) > 0
    x_eval, y_eval = (data.x_test, data.y_test) if has_test else (data.x_train, data.y_train)
    mu = float(settings.get("proximal-mu", 0.0)) if config.strategy == "fedprox" else 0.0
    started = time.perf_counter()
    pull = (ProximalPull(step, {n: received[n] for n in layout.trainable}, mu, config.lr)
            if mu > 0 else nullcontext())
    with pull:
        result, step = train(
            device,
            model,
            state,
            data.x_train,
            data.y_train,
            train_config,
            optimizer,
            trainable,
            x_eval,
            y_eval,
            step=step,
        )
    train_seconds = time.perf_counter() - started
    trained = step.get_state(list(layout.travelling))
    changes = {name: trained[name] - received[name] for name in layout.travelling}
    codec = get_codec(config.codec)
    buffer_codec = get_codec(config.uplink_buffer_codec())
    codecs_spec = f"{codec.spec}|{buffer_codec.spec}"
    feedback = codec.error_feedback or buffer_codec.error_feedback
    residuals = _load_residuals(context, codecs_spec) if feedback else None
    # the running statistics stay home in the rounds that do not send them (statistics-every)
    omit = () if config.sends_statistics(server_round) else layout.buffers
    encoded = encode_update(changes, codec, residuals, np.random.default_rng(seed),
                            codec_of={name: buffer_codec for name in layout.buffers},
                            reference=received, omit=omit)
    if codec.sparse and layout.buffers and not omit:
        # a sparse update moves the server's weights a little, the local statistics follow the
        # locally trained weights: send those of the model the server will hold instead
        sent_model = {**state, **{n: received[n] + encoded.sent[n] for n in layout.trainable}}
        measured = measure_statistics(step, sent_model, layout.buffers, data, batch, seed,
                                      config.lr)
        changes.update({n: measured[n] - received[n] for n in layout.buffers})
        encoded = encode_update(changes, codec, residuals, np.random.default_rng(seed),
                                codec_of={name: buffer_codec for name in layout.buffers},
                                reference=received)
    if feedback:
        _store_residuals(context, codecs_spec, encoded.residuals)
    programs = device.kernels.stats
    metrics = MetricRecord(
        {
            "num-examples": int(len(data.y_train)),
            "train-loss": float(result.final_loss),
            "train-accuracy": float(result.train_accuracy),
            "loss": float(result.test_loss),
            "accuracy": float(result.accuracy),
            "train-time-s": float(train_seconds),
            "step-time-s": float(result.step_time_s),
            "data-movement-share": float(result.data_movement_share),
            "peak-device-bytes": int(result.peak_device_bytes),
            "uplink-bytes": int(encoded.nbytes),
            "downlink-bytes": int(downlink_bytes),
            "batch": int(batch),
            "steps": int(result.steps),
            # what this message cost in OpenCL program builds: a process that finds the disk cache
            # warm loads binaries instead of compiling
            "programs-compiled": programs["compiled"] - programs_before["compiled"],
            "programs-from-disk": programs["loaded_from_disk"]
            - programs_before["loaded_from_disk"],
            "process-peak-rss-bytes": peak_rss_bytes(),
        }
    )
    if phone is not None:
        for key, value in phone.metrics(step, int(result.steps), encoded.nbytes).items():
            metrics[key] = value
    return RecordDict({"arrays": bundle_record(encoded.blob), METRICS_KEY: metrics})


def evaluate_round(content: RecordDict, context: Context) -> RecordDict:
    """Loss and accuracy of the received global model on this client's held-out samples (its
    training samples when it holds none)."""
    settings = dict(content[CONFIG_KEY]) if CONFIG_KEY in content.config_records else {}
    config = RunConfig.from_mapping(settings)
    partition_id, num_partitions = _node_partition(context)
    data = client_data(config, partition_id, num_partitions)
    model = _model(config)
    trainable = resolve_trainable(model, config.freeze)
    layout = UpdateLayout.of(model, trainable)
    state, _, _ = _received_state(content, config, model, layout, settings.get("frozen-digest"))
    device = _device(config.device)
    x_eval, y_eval = (
        (data.x_test, data.y_test) if len(data.y_test) else (data.x_train, data.y_train)
    )
    batch = max(1, min(config.eval_batch, len(y_eval)))
    step = _compiled_step(device, model, batch, state, set(), OptimizerConfig())
    result = step.evaluate(
        np.ascontiguousarray(x_eval, np.float32), np.ascontiguousarray(y_eval, np.int32)
    )
    return RecordDict(
        {
            METRICS_KEY: MetricRecord(
                {
                    "num-examples": int(len(y_eval)),
                    "loss": float(result["loss"]),
                    "accuracy": float(result["accuracy"]),
                }
            )
        }
    )
