"""A model compiled for one device, batch size and trainable set: one arena, bound launches.

Compilation orders the launches (``graph``), places every tensor in one arena (``planner``),
allocates that arena once, uploads the initial state, and binds every kernel's arguments. A
training step is then: copy the batch and labels up through a staging buffer (``staging.py``),
enqueue the bound launches. Nothing is read back per step; loss and accuracy accumulate on the
device.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from math import prod

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from client_runtime.graph import (
    CATEGORIES,
    DistillConfig,
    OptimizerConfig,
    StepGraph,
    Views,
    build_graph,
)
from client_runtime.planner import (
    MemoryPlan,
    Placement,
    TensorRequest,
    align_up,
    plan_memory,
)
from client_runtime.profiler import StepProfiler
from client_runtime.staging import StagingRing, resolve_staging_mode, staging_mode_from_env
from kernels import elementwise
from kernels import optimizer as opt_kernels
from kernels.device_errors import naming
from kernels.launch import Launch
from mgfl.models.model import Model

_open_steps: weakref.WeakSet = weakref.WeakSet()
_retained: list = []


def close_all_steps() -> None:
    """Release every live step (called at exit, while the driver is still loaded)."""
    for step in list(_open_steps):
        step.close()


class ArenaTooLargeError(MemoryError):
    """The planned arena exceeds what the device can allocate in one buffer."""


def plan_graph(graph: StepGraph, alignment: int) -> MemoryPlan:
    """Live intervals over the training ops followed by the evaluation ops; persistent tensors
    (parameters, optimizer state, staging targets, accumulators) live throughout. The input and
    the labels are placed as one block (input, then labels at the next aligned offset), so that
    one copy can upload a batch."""
    ops = graph.train_ops + graph.update_ops + graph.eval_ops
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for pos, op in enumerate(ops):
        for name in (*op.reads, *op.writes):
            first.setdefault(name, pos)
            last[name] = pos
    end = max(len(ops) - 1, 0)
    requests = []
    for name, tensor in graph.tensors.items():
        if tensor.persistent:
            lo, hi = 0, end
        elif name in first:
            lo, hi = first[name], last[name]
        else:
            continue  # declared but never used by any op: nothing to place
        requests.append(TensorRequest(name, tensor.nbytes, lo, hi, tensor.category))
    return _plan_with_batch_block(requests, graph.input_name, graph.labels_name, alignment)


_BATCH_BLOCK = "input and labels"


def _plan_with_batch_block(
    requests: list[TensorRequest], input_name: str, labels_name: str, alignment: int
) -> MemoryPlan:
    """Plan with the input and labels requests replaced by one block holding both, then split
    the block's placement back into the two tensors' placements."""
    by_name = {r.name: r for r in requests}
    x, y = by_name.get(input_name), by_name.get(labels_name)
    if x is None or y is None or (x.first, x.last) != (y.first, y.last):
        return plan_memory(requests, alignment)
    labels_at = align_up(max(x.nbytes, 1), alignment)
    block = TensorRequest(_BATCH_BLOCK, labels_at + y.nbytes, x.first, x.last, x.category)
    others = [r for r in requests if r.name not in (input_name, labels_name)]
    plan = plan_memory([*others, block], alignment)
    placed = plan.placements.pop(_BATCH_BLOCK)
    plan.placements[input_name] = Placement(x, placed.offset)
    plan.placements[labels_name] = Placement(y, placed.offset + labels_at)
    return plan


def default_alignment(device_align_bytes: int) -> int:
    return max(256, device_align_bytes)


@dataclass(frozen=True)
class MemoryEstimate:
    """The exact arena of a compiled step, known before allocation, and what is alive in it at
    its busiest moment (by category; the categories and fragmentation add up to the peak)."""

    peak_bytes: int
    by_category: dict[str, int]
    batch: int

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "batch": self.batch, **self.by_category}


def estimate_memory(
    model: Model,
    batch: int,
    trainable: set[str] | None = None,
    optimizer: OptimizerConfig | None = None,
    alignment: int = 256,
    accumulate_gradients: bool = False,
    conv_impl: str = "gemm",
    recompute_segments: int = 0,
    distillation: DistillConfig | None = None,
    fused_update: bool = True,
) -> MemoryEstimate:
    """Peak arena bytes of the step ``compile_step`` would build, without any device."""
    trainable = set(model.parameter_shapes()) if trainable is None else set(trainable)
    graph = build_graph(
        model,
        batch,
        trainable,
        optimizer or OptimizerConfig(),
        accumulate_gradients=accumulate_gradients,
        conv_impl=conv_impl,
        recompute_segments=recompute_segments,
        distillation=distillation,
        fused_update=fused_update,
    )
    plan = plan_graph(graph, alignment)
    by_cat = {c: 0 for c in (*CATEGORIES, "fragmentation")}
    by_cat.update(plan.breakdown_at_peak())
    return MemoryEstimate(plan.peak_bytes, by_cat, batch)


class CompiledStep:
    """Training and evaluation of one model on one device, resident in one arena."""

    def __init__(
        self,
        device: Device,
        model: Model,
        batch: int,
        state: dict[str, np.ndarray],
        trainable: set[str] | None = None,
        optimizer: OptimizerConfig | None = None,
        profile: bool | None = None,
        poison: bool = False,
        poison_freed: bool = False,
        accumulation_steps: int = 1,
        conv_impl: str = "gemm",
        recompute_segments: int = 0,
        distillation: DistillConfig | None = None,
        fused_update: bool = True,
        staging: str | None = None,
    ):
        """``profile``: collect per-kernel and copy times from events (default: whether the
        device's queue records them). ``staging``: the upload path (``map``, ``pinned``,
        ``auto``; default ``MGFL_STAGING``, else ``auto``: see ``client_runtime/staging.py``)."""
        if profile is None:
            profile = device.profiling
        elif profile:
            device.require_profiling("CompiledStep(profile=True)")
        staging = resolve_staging_mode(
            device, staging if staging is not None else staging_mode_from_env()
        )
        if batch % accumulation_steps:
            raise ValueError(
                f"batch {batch} is not a multiple of {accumulation_steps} micro-batches"
            )
        self.device = device
        self.model = model
        self.batch = batch
        self.accumulation_steps = accumulation_steps
        self.micro_batch = batch // accumulation_steps
        self.optimizer = optimizer or OptimizerConfig()
        trainable = set(model.parameter_shapes()) if trainable is None else set(trainable)
        self.graph = build_graph(
            model,
            self.micro_batch,
            trainable,
            self.optimizer,
            accumulate_gradients=accumulation_steps > 1,
            grad_scale=1.0 / batch,
            conv_impl=conv_impl,
            recompute_segments=recompute_segments,
            distillation=distillation,
            fused_update=fused_update,
        )
        self.distillation = distillation
        self.recompute_segments = recompute_segments
        self.plan = plan_graph(self.graph, default_alignment(device.info.mem_base_addr_align_bytes))
        if self.plan.peak_bytes > device.info.max_alloc_bytes:
            raise ArenaTooLargeError(
                f"The step needs a {self.plan.peak_bytes / 2**20:.1f} MiB arena but "
                f"{device.info.name} allocates at most "
                f"{device.info.max_alloc_bytes / 2**20:.0f} MiB"
                " in one buffer; use a smaller batch or freeze layers."
            )
        ctx, queue = device.context, device.queue
        arena_name = (f"the step's arena ({self.plan.peak_bytes / 2**20:.1f} MiB on "
                      f"{device.info.name})")
        with naming(f"allocating {arena_name}"):
            self.arena = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(self.plan.peak_bytes, 1))
            if poison:  # NaN everywhere: a kernel that reads what nobody wrote produces NaN
                cl.enqueue_fill_buffer(
                    queue, self.arena, np.float32(np.nan), 0, self.plan.peak_bytes
                )
        # One sub-buffer per distinct region: tensors that the planner put at the same offset
        # with the same size share it (NVIDIA's driver crashed releasing identical sub-buffers).
        self._regions: dict[tuple[int, int], cl.Buffer] = {}
        self.views = {}
        for name, p in self.plan.placements.items():
            region = (p.offset, max(p.request.nbytes, 1))
            if region not in self._regions:
                with naming(f"buffer {name} ({region[1]} bytes at offset {region[0]} of "
                            f"{arena_name})"):
                    self._regions[region] = self.arena.get_sub_region(*region)
            self.views[name] = self._regions[region]
        # Drivers allocate lazily: the first writes are where a too-large arena fails.
        with naming(f"uploading the initial state into {arena_name}"):
            self._upload_initial_state(state)
        lib = device.kernels
        self._poison_freed = poison_freed
        graph = self.graph
        # Ops over the whole arena (the one-launch update) bind to it and write their tables once.
        views = Views(
            self.views,
            self.arena,
            {name: p.offset for name, p in self.plan.placements.items()},
            self._write,
        )
        self.train_launches = self._bind(graph.train_ops, lib, 0, views)
        self.accumulated_update_launches = self._bind(
            graph.update_ops, lib, len(graph.train_ops), views
        )
        self.eval_launches = self._bind(
            graph.eval_ops, lib, len(graph.train_ops) + len(graph.update_ops), views
        )
        self.update_launches = [
            launch
            for op in graph.train_ops + graph.update_ops
            if op.name.endswith(".update")
            for launch in self._launches_of[op.name]
        ]
        x_shape = (self.micro_batch, *model.input_shape)
        self.staging = StagingRing(
            device,
            x_shape,
            (self.micro_batch,),
            mode=staging,
            labels_at=self._labels_after_input(),
        )
        self._closed = False
        _open_steps.add(self)
        self.profiler = StepProfiler(enabled=profile)
        self.steps_done = 0

    # -- set-up ------------------------------------------------------------------------------
    def _labels_after_input(self) -> int | None:
        """How far the labels start after the input in the arena when nothing but the two lies
        from the input's start to the labels' end (a batch then goes up in one copy); else
        ``None``."""
        x, y = self.plan.placements["input"], self.plan.placements["labels"]
        if y.offset < x.end:
            return None
        for name, other in self.plan.placements.items():
            if name not in ("input", "labels") and other.offset < y.end and x.offset < other.end:
                return None
        return y.offset - x.offset

    def _bind(self, ops, lib, first_position: int, views: Views) -> list[Launch]:
        if not hasattr(self, "_launches_of"):
            self._launches_of: dict[str, list[Launch]] = {}
        freed_at: dict[int, list[str]] = {}
        if self._poison_freed:
            for name, placement in self.plan.placements.items():
                tensor = self.graph.tensors[name]
                if not tensor.persistent and tensor.dtype == np.float32:
                    freed_at.setdefault(placement.request.last, []).append(name)
        launches: list[Launch] = []
        for pos, op in enumerate(ops, start=first_position):
            bound = op.emit(lib, views)
            touched = f"{op.name} (reads {', '.join(op.reads)}; writes {', '.join(op.writes)})"
            for launch in bound:
                launch.tensors = touched
            self._launches_of[op.name] = bound
            launches.extend(bound)
            for name in freed_at.get(pos, []):  # NaN into what no later launch may read
                count = int(np.prod(self.graph.tensors[name].shape))
                launches.append(elementwise.fill(lib, self.views[name], float("nan"), count))
        return launches

    def _write(self, name: str, array: np.ndarray) -> None:
        tensor = self.graph.tensors[name]
        data = np.ascontiguousarray(array, dtype=tensor.dtype).reshape(tensor.shape)
        with naming(f"the copy into buffer {name} ({data.nbytes} bytes)"):
            cl.enqueue_copy(self.device.queue, self.views[name], data, is_blocking=True)

    def _upload_initial_state(self, state: dict[str, np.ndarray]) -> None:
        missing = [n for n in (*self.graph.params, *self.graph.buffers) if n not in state]
        if missing:
            raise ValueError(f"The initial state lacks {missing[:5]}")
        self.set_state(state)
        for name, tensor in self.graph.tensors.items():
            if tensor.category == "optimizer_state" or (
                tensor.category == "gradients" and tensor.persistent
            ):
                self._write(name, np.zeros(tensor.shape, np.float32))
        self._write("train_stats", np.zeros(3, np.float32))
        self._write("eval_stats", np.zeros(3, np.float32))
        self._write("step", np.ones(1, np.int32))

    # -- state -------------------------------------------------------------------------------
    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Upload parameters and buffers (e.g. the global model of a new round)."""
        for name in (*self.graph.params, *self.graph.buffers):
            if name in state:
                expected = self.graph.tensors[name].shape
                if tuple(np.shape(state[name])) != expected:
                    raise ValueError(
                        f"{name} has shape {np.shape(state[name])}, the model expects {expected}"
                    )
                self._write(name, state[name])

    def get_state(self, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Read parameters and buffers back: the only device-to-host copy of weights."""
        names = names or [*self.graph.params, *self.graph.buffers]
        out = {}
        for name in names:
            tensor = self.graph.tensors[name]
            out[name] = np.empty(tensor.shape, tensor.dtype)
            with naming(f"the copy from buffer {name}"):
                cl.enqueue_copy(self.device.queue, out[name], self.views[name], is_blocking=False)
        self.synchronize()
        self.profiler.count_d2h(sum(a.nbytes for a in out.values()))
        return out

    def set_learning_rate(self, lr: float) -> None:
        opt_kernels.set_learning_rate(self.update_launches, lr)

    # -- running -----------------------------------------------------------------------------
    def _upload_batch(self, x: np.ndarray, y: np.ndarray) -> cl.Event:
        if x.shape[0] != self.micro_batch or y.shape[0] != self.micro_batch:
            raise ValueError(f"batch of {x.shape[0]} samples, compiled for {self.micro_batch}")
        event = self.staging.send(
            x, y, self.views["input"], self.views["labels"],
            joint=(self.arena, self.plan.offset("input")),
        )
        self.profiler.count_h2d(self.staging.nbytes, event)
        return event

    def _upload_old_logits(self, old_logits: np.ndarray) -> None:
        """The previous model's logits of this micro-batch, into the persistent tensor the
        distillation reads (counted as host-to-device traffic of the step)."""
        data = np.ascontiguousarray(old_logits, np.float32)
        event = cl.enqueue_copy(
            self.device.queue, self.views[self.graph.old_logits_name], data, is_blocking=False
        )
        self.profiler.count_h2d(data.nbytes, [event])

    def _check_old_logits(self, old_logits: np.ndarray | None) -> None:
        if self.distillation is None:
            if old_logits is not None:
                raise ValueError("old_logits given, but the step was compiled without distillation")
            return
        expected = (self.batch, self.distillation.c_old)
        if old_logits is None or tuple(np.shape(old_logits)) != expected:
            got = None if old_logits is None else tuple(np.shape(old_logits))
            raise ValueError(f"the distilling step needs old_logits of shape {expected}, got {got}")

    def train_step(
        self, x: np.ndarray, y: np.ndarray, old_logits: np.ndarray | None = None
    ) -> None:
        """One step: upload the batch (and, when distilling, the previous model's logits of it),
        enqueue forward, loss, backward and updates. Returns without waiting for the device."""
        if len(y) != self.batch:
            raise ValueError(f"batch of {len(y)} samples, compiled for {self.batch}")
        self._check_old_logits(old_logits)
        queue, m = self.device.queue, self.micro_batch
        for start in range(0, self.batch, m):
            self._upload_batch(x[start : start + m], y[start : start + m])
            if old_logits is not None:
                self._upload_old_logits(old_logits[start : start + m])
            self.profiler.run(queue, self.train_launches, count_step=False)
        if self.accumulation_steps > 1:
            self.profiler.run(queue, self.accumulated_update_launches, count_step=False)
        self.profiler.steps += 1
        self.steps_done += 1

    def synchronize(self) -> None:
        """Wait for everything enqueued; a failure names what was running."""
        with naming(self._running("waiting for the device")):
            self.device.queue.finish()

    def _running(self, what: str) -> str:
        """``what``, and the last launch enqueued before it: kernels fail asynchronously, so an
        error surfaces at the next wait, after the launch that caused it."""
        last = self.profiler.last_enqueued
        return f"{what}, after {last.describe()}" if last is not None else what

    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> None:
        """Evaluation-mode forward; labels of -1 are not counted (padding of a last batch)."""
        self._upload_batch(x, y)
        self.profiler.run(self.device.queue, self.eval_launches, count_step=False)

    def _read_stats(self, name: str, reset: bool) -> dict:
        stats = np.empty(3, np.float32)
        with naming(self._running(f"the read of {name}")):
            cl.enqueue_copy(self.device.queue, stats, self.views[name], is_blocking=True)
        self.profiler.count_d2h(stats.nbytes, per_step=False)
        if reset:
            self._write(name, np.zeros(3, np.float32))
        count = float(stats[2])
        return {
            "loss": float(stats[0]) / count if count else float("nan"),
            "accuracy": float(stats[1]) / count if count else float("nan"),
            "samples": int(round(count)),
        }

    def read_train_stats(self, reset: bool = True) -> dict:
        """Mean loss and accuracy since the last read, accumulated on the device."""
        return self._read_stats("train_stats", reset)

    def read_eval_stats(self, reset: bool = True) -> dict:
        return self._read_stats("eval_stats", reset)

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> dict:
        """Loss and accuracy over a whole set; the last batch is padded with ignored labels."""
        self.read_eval_stats(reset=True)
        n, m = len(y), self.micro_batch
        for start in range(0, n, m):
            xb, yb = x[start : start + m], y[start : start + m]
            if len(yb) < m:
                pad = m - len(yb)
                xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)])
                yb = np.concatenate([yb, np.full(pad, -1, yb.dtype)])
            self.eval_batch(xb, yb)
        return self.read_eval_stats(reset=True)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Evaluation-mode outputs (logits, or features of a model cut before its head) of every
        sample: one read-back of the output tensor per batch, which the evaluation step leaves
        intact because its loss op is the last to read it."""
        m = self.micro_batch
        width = self.graph.tensors[self.graph.eval_output].shape[1:]
        out = np.empty((len(x), *width), np.float32)
        chunk = np.empty((m, *width), np.float32)
        for start in range(0, len(x), m):
            xb = x[start : start + m]
            count = len(xb)
            if count < m:
                xb = np.concatenate([xb, np.zeros((m - count, *xb.shape[1:]), xb.dtype)])
            self.eval_batch(xb, np.full(m, -1, np.int32))
            with naming(self._running(f"the read of {self.graph.eval_output}")):
                cl.enqueue_copy(
                    self.device.queue, chunk, self.views[self.graph.eval_output], is_blocking=True
                )
            self.profiler.count_d2h(chunk.nbytes, per_step=False)
            out[start : start + count] = chunk[:count]
        self.read_eval_stats(reset=True)
        return out

    def close(self) -> None:
        """Release the step's OpenCL objects in a safe order: launches (which hold sub-buffers),
        then the sub-buffers, then the arena and the staging buffers. Left to the garbage
        collector, a parent buffer could go before its sub-buffers, which crashed NVIDIA's
        driver."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self.device.queue.finish()
        except cl.Error:
            pass  # a lost device: release what can be released
        self.profiler.collect()  # its pending events hold launches
        for launches in (self.train_launches, self.eval_launches, self.accumulated_update_launches):
            launches.clear()
        self.update_launches = []
        self._launches_of = {}
        self.views = {}
        if self.device.releases_crash:
            # Kept until the process ends: releasing these crashed NVIDIA's driver (580.159).
            _retained.append((self._regions, self.arena, self.staging))
        else:
            for region in self._regions.values():
                region.release()
            self.arena.release()
            self.staging.close()
        self._regions = {}

    def __del__(self) -> None:
        self.close()

    @property
    def peak_bytes(self) -> int:
        return self.plan.peak_bytes

    @property
    def h2d_bytes_per_step(self) -> int:
        old = self.graph.tensors.get(self.graph.old_logits_name or "")
        return (self.staging.nbytes + (old.nbytes if old else 0)) * self.accumulation_steps

    def launches_per_step(self) -> int:
        return len(self.train_launches)

    def input_elements(self) -> int:
        return prod((self.batch, *self.model.input_shape))


def compile_step(
    device: Device,
    model: Model,
    batch: int,
    state: dict[str, np.ndarray],
    trainable: set[str] | None = None,
    optimizer: OptimizerConfig | None = None,
    **kwargs,
) -> CompiledStep:
    """Compile ``model`` for ``device`` at ``batch`` samples per step."""
    return CompiledStep(device, model, batch, state, trainable, optimizer, **kwargs)
