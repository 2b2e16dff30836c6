"""Lowers a model description into the ordered operations of one training step and one evaluation
step: which tensors each operation reads and writes, and how to bind its kernels once buffers exist.

Nothing is allocated here. The operation list is what the memory planner reads (live intervals) and
what the compiled step binds (launches), so the peak memory of a step is known before allocation.

Conventions:
- A layer's forward output is a new tensor, except Flatten (same memory, new shape) and Dropout in
  evaluation (identity). ReLU/ReLU6 right after Linear or a convolution is fused into its forward.
- A ReLU/ReLU6 whose output no backward but its own reads (the next weight is frozen) keeps a bit
  mask for that backward instead of its float output.
- A BatchNorm with frozen statistics (``mgfl.models.frozen_statistics``: under ``bias``) trains as
  the affine map of evaluation; its backward reads its input only for gamma's gradient, and
  without it the BatchNorm runs in place over the output of the weight layer before it.
- Backward walks the layers in reverse and stops at the earliest trainable layer: no input gradient
  is computed for a layer that has nothing trainable before it.
- By default (``fused_update``) one launch updates every trainable parameter after the last
  backward op: launches, not the update's arithmetic, are what it costs on a phone. That op reads
  every gradient, so gradients live until the end of backward. Without it, a parameter's update is
  emitted right after the backward of its layer (after the input gradient, which still reads the
  old weight), so its gradient lives only for that moment. With gradient accumulation
  (micro-batches) gradients persist and the updates run once per effective batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod

import numpy as np

from client_runtime import conv_lowering
from kernels import (
    batchnorm,
    conv2d,
    depthwise,
    distill,
    dropout,
    elementwise,
    gemm,
    optimizer,
    pool,
    reduce,
    softmax_xent,
)
from kernels.conv_shape import ConvShape
from kernels.launch import Launch
from mgfl.models import layers as L
from mgfl.models.frozen_statistics import frozen_statistics_layers
from mgfl.models.model import Model, ResolvedLayer

UPDATE_TABLE = "update_table"  # where the one-launch update finds each tensor in the arena


class Views(dict):
    """Tensor name -> cl.Buffer (a sub-buffer of the arena), and what an op over the whole arena
    needs at bind time: the arena, each tensor's byte offset in it, and a one-off writer of a
    tensor's contents (``write(name, array)``)."""

    def __init__(self, views: dict, arena=None, offsets=None, write=None):
        super().__init__(views)
        self.arena = arena
        self.offsets: dict[str, int] = dict(offsets or {})
        self.write = write


PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
WORKSPACE = "workspace"
CONV_IMPLS = ("gemm", "direct")  # dense convolutions: im2col + GEMM, or the direct kernels
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, WORKSPACE)


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    category: str
    persistent: bool = False
    dtype: type = np.float32

    @property
    def nbytes(self) -> int:
        return int(prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclass
class Op:
    """One step of the schedule: the kernels of one layer's forward, backward or update."""

    name: str
    phase: str  # "forward", "loss", "backward", "update", "eval"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    emit: Callable[[object, Views], list[Launch]] = field(repr=False)


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyper-parameters bound into the update kernels (the learning rate can change later)."""

    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in ("sgd", "adam"):
            raise ValueError(f"Unknown optimizer {self.name!r}; expected 'sgd' or 'adam'")
        if self.lr <= 0:
            raise ValueError(f"The learning rate must be positive, got {self.lr}")


@dataclass(frozen=True)
class DistillConfig:
    """A distillation term from a previous model's logits (iCaRL / LwF), bound at compile time:
    the previous model knew the first ``c_old`` classes; its logits come up with every batch."""

    c_old: int
    temperature: float = 2.0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.c_old < 1:
            raise ValueError(f"distillation needs at least one old class, got c_old={self.c_old}")
        if self.temperature <= 0:
            raise ValueError(f"distillation temperature must be positive, got {self.temperature}")
        if self.weight < 0:
            raise ValueError(f"distillation weight must not be negative, got {self.weight}")


@dataclass
class StepGraph:
    """Everything the planner and the binder need: tensors, and the op lists of both steps."""

    batch: int
    tensors: dict[str, Tensor]
    train_ops: list[Op]
    eval_ops: list[Op]
    update_ops: list[Op] = field(default_factory=list)  # with gradient accumulation only
    input_name: str = "input"
    labels_name: str = "labels"
    train_stats: str = "train_stats"
    eval_stats: str = "eval_stats"
    step_counter: str = "step"
    params: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)
    trainable: list[str] = field(default_factory=list)
    optimizer_launch_ops: list[str] = field(default_factory=list)
    old_logits_name: str | None = None  # set when the step distils from a previous model
    eval_output: str = ""  # the logits tensor of the evaluation step (readable after it)


_ACT = {L.ReLU: "relu", L.ReLU6: "relu6"}
_WEIGHT_LAYERS = (L.Linear, L.Conv2d, L.DepthwiseConv2d)


def _fusable(layer: L.Layer) -> bool:
    return isinstance(layer, (L.Linear, L.Conv2d, L.DepthwiseConv2d))


def _follows_batchnorm(records: list[dict]) -> bool:
    return (
        bool(records)
        and records[-1]["kind"] == "layer"
        and isinstance(records[-1]["rl"].layer, L.BatchNorm)
    )


class _Builder:
    """Walks the resolved layers once for the training step and once for evaluation."""

    def __init__(
        self,
        model: Model,
        batch: int,
        trainable: set[str],
        opt: OptimizerConfig,
        accumulate_gradients: bool,
        conv_impl: str = "gemm",
        distillation: DistillConfig | None = None,
        fused_update: bool = True,
    ):
        if conv_impl not in CONV_IMPLS:
            raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
        self.conv_impl = conv_impl
        self.model = model
        self.n = batch
        self.trainable = trainable
        self.opt = opt
        self.accumulate = accumulate_gradients
        self.fused_update = fused_update
        self.distillation = distillation
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.resolved = model.resolve()
        self.frozen_statistics = frozen_statistics_layers(model, trainable)
        # trainable_before[i]: does any layer before resolved layer i train (backward reaches i)?
        self.trainable_before: list[bool] = []
        seen = False
        for rl in self.resolved:
            self.trainable_before.append(seen)
            seen = seen or any(p in trainable for p in rl.params)

    # -- tensors ---------------------------------------------------------------------------
    def tensor(
        self, name: str, shape, category: str = ACTIVATIONS, *, persistent=False, dtype=np.float32
    ) -> str:
        if name not in self.tensors:
            self.tensors[name] = Tensor(
                name, tuple(int(s) for s in shape), category, persistent, dtype
            )
        return name

    def op(self, name, phase, reads, writes, emit) -> None:
        self.ops.append(
            Op(name, phase, tuple(r for r in reads if r), tuple(w for w in writes if w), emit)
        )

    # -- schedule ----------------------------------------------------------------------------
    def persistent(self) -> None:
        n = self.n
        self.tensor("input", (n, *self.model.input_shape), WORKSPACE, persistent=True)
        self.tensor("labels", (n,), WORKSPACE, persistent=True, dtype=np.int32)
        self.tensor("train_stats", (3,), WORKSPACE, persistent=True)
        self.tensor("eval_stats", (3,), WORKSPACE, persistent=True)
        self.tensor("step", (1,), WORKSPACE, persistent=True, dtype=np.int32)
        if self.distillation is not None:
            c_old = self.distillation.c_old
            self.tensor("old_logits", (n, c_old), WORKSPACE, persistent=True)
        for name, shape in self.model.parameter_shapes().items():
            self.tensor(name, shape, PARAMETERS, persistent=True)
            if name in self.trainable:
                if self.opt.name == "sgd" and self.opt.momentum:
                    self.tensor(f"{name}:velocity", shape, OPTIMIZER_STATE, persistent=True)
                if self.opt.name == "adam":
                    self.tensor(f"{name}:m", shape, OPTIMIZER_STATE, persistent=True)
                    self.tensor(f"{name}:v", shape, OPTIMIZER_STATE, persistent=True)
                if self.accumulate:
                    self.tensor(f"{name}:grad", shape, GRADIENTS, persistent=True)
        for name, shape in self.model.buffer_shapes().items():
            self.tensor(name, shape, PARAMETERS, persistent=True)
        if self.fused_update and self.trainable_names():
            length = optimizer.update_table_length(len(self.trainable_names()))
            self.tensor(UPDATE_TABLE, (length,), WORKSPACE, persistent=True, dtype=np.int32)

    def trainable_names(self) -> list[str]:
        """Trainable parameters in the model's order (the order of the one-launch update)."""
        return [p for p in self.model.parameter_shapes() if p in self.trainable]

    def forward(self, training: bool, prefix: str) -> str:
        """Emits forward ops; returns the logits tensor. Records what backward needs in
        ``self.records`` (training only)."""
        self.records, current = self._walk(
            0, len(self.resolved), "input", self.model.input_shape, training, prefix
        )
        return current

    def _walk(
        self,
        start: int,
        stop: int,
        current: str,
        cur_shape,
        training: bool,
        prefix: str,
        recompute: bool = False,
    ) -> tuple[list[dict], str]:
        """Forward ops of resolved layers ``[start, stop)`` from tensor ``current``. With
        ``recompute`` the ops re-create a segment's activations during backward (gradient
        checkpointing) and leave BatchNorm running statistics alone."""
        records: list[dict] = []
        skips: list[tuple[str, tuple]] = []
        layers = self.resolved
        i = start
        while i < stop:
            rl = layers[i]
            layer = rl.layer
            nxt = layers[i + 1].layer if i + 1 < stop else None
            act = _ACT.get(type(nxt)) if _fusable(layer) else None
            out_shape = rl.output_shape if not act else layers[i + 1].output_shape
            rec = {
                "rl": rl,
                "x": current,
                "x_shape": cur_shape,
                "act": act,
                "i": i,
                "depth": len(skips),
                "prefix": prefix,
            }
            if isinstance(layer, L.Residual):
                skips.append((current, cur_shape))
                rec["kind"] = "res_start"
                records.append(rec)
                i += 1
                continue
            if isinstance(layer, L.ResidualEnd):
                skip, _ = skips.pop()
                rec["depth"] = len(skips)
                out = self.tensor(f"{prefix}{rl.path}:out", (self.n, *rl.output_shape))
                self._emit_add(prefix, rl, current, skip, out)
                rec.update(kind="res_end", y=out, skip=skip)
                records.append(rec)
                current, cur_shape = out, rl.output_shape
                i += 1
                continue
            if isinstance(layer, L.Flatten) or (isinstance(layer, L.Dropout) and not training):
                rec.update(kind="alias", y=current)
                records.append(rec)
                cur_shape = rl.output_shape
                i += 1
                continue
            in_place = (type(layer) in _ACT and _follows_batchnorm(records)) or (
                training and self._affine_in_place(rl, records)
            )
            if in_place:  # the backward before it does not read this input
                y = current
            else:
                y = self.tensor(f"{prefix}{rl.path}:y", (self.n, *out_shape))
            act_index = i + 1 if act else i
            mask = None
            if (act or type(layer) in _ACT) and training and self._mask_suffices(act_index):
                bits = elementwise.mask_bytes(self.n * prod(out_shape))
                name = f"{prefix}{layers[act_index].path}:mask"
                mask = self.tensor(name, (bits,), dtype=np.uint8)
            if mask and act:  # the layer without its activation, then the masked one in place
                self._emit_forward(prefix, rl, current, y, None, training, recompute)
                self._emit_masked_activation(f"{prefix}{rl.path}", act, y, y, mask, recompute)
            elif mask:
                self._emit_masked_activation(
                    f"{prefix}{rl.path}", _ACT[type(layer)], current, y, mask, recompute
                )
            else:
                self._emit_forward(prefix, rl, current, y, act, training, recompute)
            rec.update(kind="layer", y=y, y_shape=out_shape, mask=mask)
            records.append(rec)
            current, cur_shape = y, out_shape
            i += 2 if act else 1
        return records, current

    def _mask_suffices(self, index: int) -> bool:
        """Can the activation at resolved ``index`` keep a byte mask instead of its output: its
        backward runs, and the backward of what consumes its output does not read it?"""
        if not self.trainable_before[index]:
            return False  # backward stops before it: neither output nor mask is kept
        k, passed = index + 1, (L.Residual, L.Flatten)
        while k < len(self.resolved) and isinstance(self.resolved[k].layer, passed):
            k += 1  # a residual's skip is read by the forward add only
        if k == len(self.resolved):
            return True
        consumer = self.resolved[k]
        layer = consumer.layer
        if isinstance(layer, _WEIGHT_LAYERS):
            return f"{consumer.path}.weight" not in self.trainable
        if isinstance(layer, L.BatchNorm):
            return (
                consumer.path in self.frozen_statistics
                and f"{consumer.path}.weight" not in self.trainable
            )
        return isinstance(
            layer, (L.AvgPool2d, L.GlobalAvgPool, L.Dropout, L.ResidualEnd, L.ReLU, L.ReLU6)
        )

    def _affine_in_place(self, rl: ResolvedLayer, records: list[dict]) -> bool:
        """A BatchNorm with frozen statistics and a frozen scale reads nothing in its backward;
        it can overwrite its input when that is the output of a weight layer, which no backward
        reads."""
        if not isinstance(rl.layer, L.BatchNorm) or rl.path not in self.frozen_statistics:
            return False
        if f"{rl.path}.weight" in self.trainable or not records:
            return False
        prev = records[-1]
        return (
            prev["kind"] == "layer"
            and isinstance(prev["rl"].layer, _WEIGHT_LAYERS)
            and not prev["act"]
        )

    def _emit_masked_activation(self, name, kind, x, y, mask, recompute) -> None:
        count = int(np.prod(self.tensors[y].shape))
        self.op(
            f"{name}.{kind}_mask",
            "recompute" if recompute else "forward",
            (x,),
            (y, mask),
            lambda lib, v: [
                elementwise.activation_forward_mask(lib, kind, v[x], v[y], v[mask], count)
            ],
        )

    def segments(self, count: int) -> list[tuple[int, int]]:
        """Record ranges ``[lo, hi)`` of about equal length that start and end outside residual
        blocks: the units of gradient checkpointing."""
        cuts = [
            j + 1
            for j, rec in enumerate(self.records)
            if rec["depth"] == 0 and rec["kind"] in ("layer", "res_end", "alias")
        ]
        cuts = [c for c in cuts if c < len(self.records)]
        count = max(1, min(count, len(cuts) + 1))
        chosen = (
            sorted({cuts[round(k * len(cuts) / count) - 1] for k in range(1, count)})
            if count > 1
            else []
        )
        bounds = [0, *chosen, len(self.records)]
        return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]

    # -- forward kernels -----------------------------------------------------------------------
    def _emit_add(self, prefix, rl, a, b, out):
        count = self.n * prod(rl.output_shape)
        self.op(
            f"{prefix}{rl.path}.add",
            "forward",
            (a, b),
            (out,),
            lambda lib, v: [elementwise.add(lib, v[a], v[b], v[out], count)],
        )

    def _emit_forward(
        self,
        prefix,
        rl: ResolvedLayer,
        x: str,
        y: str,
        act,
        training: bool,
        recompute: bool = False,
    ):
        layer, n, path = rl.layer, self.n, rl.path
        phase = "recompute" if recompute else "forward" if training else "eval"
        name = f"{prefix}{path}"
        w, b = f"{path}.weight", f"{path}.bias"
        has_b = b in rl.params
        if isinstance(layer, L.Linear):
            fin, fout = rl.input_shape[0], rl.output_shape[0]

            def emit(lib, v):
                return [
                    gemm.gemm(
                        lib,
                        v[x],
                        v[w],
                        v[y],
                        m=n,
                        n=fout,
                        k=fin,
                        trans_b=True,
                        bias=v[b] if has_b else None,
                        activation=act,
                    )
                ]

            self.op(name, phase, (x, w, b if has_b else None), (y,), emit)
        elif isinstance(layer, L.Conv2d) and self.conv_impl == "gemm":
            conv_lowering.emit_forward(
                self, name, phase, self.conv_shape(rl), x, w, b if has_b else None, y, act
            )
        elif isinstance(layer, (L.Conv2d, L.DepthwiseConv2d)):
            shape = self.conv_shape(rl)
            fn = (
                conv2d.conv2d_forward
                if isinstance(layer, L.Conv2d)
                else depthwise.depthwise_forward
            )
            self.op(
                name,
                phase,
                (x, w, b if has_b else None),
                (y,),
                lambda lib, v: fn(
                    lib, v[x], v[w], v[b] if has_b else None, v[y], shape=shape, activation=act
                ),
            )
        elif isinstance(layer, L.BatchNorm):
            c, hw = rl.input_shape[0], prod(rl.input_shape[1:])
            rm, rv = f"{path}.running_mean", f"{path}.running_var"
            if training and path not in self.frozen_statistics:
                mean = self.tensor(f"{name}:mean", (c,), WORKSPACE)
                invstd = self.tensor(f"{name}:invstd", (c,), WORKSPACE)
                self.op(
                    name,
                    phase,
                    (x, w, b, rm, rv),
                    (y, mean, invstd, rm, rv),
                    lambda lib, v: batchnorm.batchnorm_forward_train(
                        lib,
                        v[x],
                        v[w],
                        v[b],
                        v[y],
                        v[mean],
                        v[invstd],
                        v[rm],
                        v[rv],
                        n=n,
                        c=c,
                        hw=hw,
                        momentum=0.0 if recompute else layer.momentum,
                        eps=layer.eps,
                    ),
                )
            else:
                self.op(
                    name,
                    phase,
                    (x, w, b, rm, rv),
                    (y,),
                    lambda lib, v: batchnorm.batchnorm_forward_eval(
                        lib, v[x], v[w], v[b], v[y], v[rm], v[rv], n=n, c=c, hw=hw, eps=layer.eps
                    ),
                )
        elif type(layer) in _ACT:
            kind, count = _ACT[type(layer)], n * prod(rl.input_shape)
            self.op(
                name,
                phase,
                (x,),
                (y,),
                lambda lib, v: [elementwise.activation_forward(lib, kind, v[x], v[y], count)],
            )
        elif isinstance(layer, (L.MaxPool2d, L.AvgPool2d)):
            shape = self.conv_shape(rl)
            fn = pool.maxpool_forward if isinstance(layer, L.MaxPool2d) else pool.avgpool_forward
            self.op(name, phase, (x,), (y,), lambda lib, v: fn(lib, v[x], v[y], shape=shape))
        elif isinstance(layer, L.GlobalAvgPool):
            c, hw = rl.input_shape[0], prod(rl.input_shape[1:])
            self.op(
                name,
                phase,
                (x,),
                (y,),
                lambda lib, v: pool.global_avgpool_forward(lib, v[x], v[y], n=n, c=c, hw=hw),
            )
        elif isinstance(layer, L.Dropout):
            count, seed = n * prod(rl.input_shape), L.dropout_seed(path)
            self.op(
                name,
                phase,
                (x, "step"),
                (y,),
                lambda lib, v: dropout.dropout_forward(
                    lib, v[x], v[y], v["step"], n=count, p=layer.p, seed=seed
                ),
            )
        else:
            raise ValueError(f"The engine cannot run layer {path} ({type(layer).__name__})")

    def conv_shape(self, rl: ResolvedLayer) -> ConvShape:
        layer = rl.layer
        c, h, w = rl.input_shape
        k = rl.output_shape[0]
        r, s = layer.kernel_size
        stride = layer.stride if layer.stride is not None else layer.kernel_size
        return ConvShape(
            n=self.n,
            c=c,
            h=h,
            w=w,
            k=k,
            r=r,
            s=s,
            stride_h=stride[0],
            stride_w=stride[1],
            pad_h=layer.padding[0],
            pad_w=layer.padding[1],
        )

    # -- loss ----------------------------------------------------------------------------------
    def loss(self, logits: str, grad_scale: float) -> str:
        classes = self.model.num_classes
        dlogits = self.tensor(f"{logits}:grad", (self.n, classes))
        n = self.n
        self.op(
            "loss",
            "loss",
            (logits, "labels", "train_stats"),
            (dlogits, "train_stats"),
            lambda lib, v: softmax_xent.softmax_xent(
                lib,
                v[logits],
                v["labels"],
                v[dlogits],
                v["train_stats"],
                n=n,
                c=classes,
                grad_scale=grad_scale,
            ),
        )
        if self.distillation is not None:
            self._distill(logits, dlogits, grad_scale)
        return dlogits

    def _distill(self, logits: str, dlogits: str, grad_scale: float) -> None:
        """Adds the distillation gradient to the cross-entropy's, and its loss to the stats."""
        cfg, classes, n = self.distillation, self.model.num_classes, self.n
        if cfg.c_old > classes:
            raise ValueError(
                f"distillation from {cfg.c_old} old classes needs a head of at least as many; "
                f"the model has {classes}"
            )
        self.op(
            "distill",
            "loss",
            (logits, "old_logits", dlogits, "train_stats"),
            (dlogits, "train_stats"),
            lambda lib, v: distill.distill_xent(
                lib,
                v[logits],
                v["old_logits"],
                v[dlogits],
                v["train_stats"],
                n=n,
                c_old=cfg.c_old,
                c=classes,
                temperature=cfg.temperature,
                weight=cfg.weight,
                grad_scale=grad_scale,
            ),
        )

    def eval_loss(self, logits: str) -> None:
        classes, n = self.model.num_classes, self.n
        self.op(
            "eval_loss",
            "eval",
            (logits, "labels", "eval_stats"),
            ("eval_stats",),
            lambda lib, v: softmax_xent.softmax_xent_eval(
                lib, v[logits], v["labels"], v["eval_stats"], n=n, c=classes
            ),
        )

    # -- backward ------------------------------------------------------------------------------
    def needs_input_grad(self) -> list[bool]:
        """For each record: is any parameter before it (in execution order) trainable?"""
        flags, seen = [], False
        for rec in self.records:
            flags.append(seen)
            if any(p in self.trainable for p in rec["rl"].params):
                seen = True
        return flags

    def backward(self, dlogits: str, recompute_segments: int = 0) -> None:
        needs = self.needs_input_grad()
        grad_of = {self.records[-1]["y"]: dlogits}
        skip_grads: list[str] = []
        # every checkpoint segment but the last is recomputed when its backward begins
        ends = {hi - 1: (lo, hi) for lo, hi in self.segments(recompute_segments)[:-1]}
        for idx in range(len(self.records) - 1, -1, -1):
            if idx in ends:
                self._recompute(*ends[idx], grad_of)
            rec = self.records[idx]
            kind, rl = rec["kind"], rec["rl"]
            trainable_here = any(p in self.trainable for p in rl.params)
            if not needs[idx] and not trainable_here and kind != "res_end":
                break
            if kind == "alias":
                continue  # Flatten: same buffer, same gradient
            if kind == "res_end":
                dy = grad_of[rec["y"]]
                grad_of[rec["x"]] = dy  # gradient of the body's output
                skip_grads.append(dy)
                continue
            if kind == "res_start":
                dskip = skip_grads.pop()
                if not needs[idx]:
                    continue
                dx_body = grad_of.get(rec["x"])
                if dx_body is None or dx_body == dskip:
                    grad_of[rec["x"]] = dskip
                else:
                    count = self.n * prod(rec["x_shape"])
                    self.op(
                        f"{rl.path}.add_grad",
                        "backward",
                        (dx_body, dskip),
                        (dx_body,),
                        lambda lib, v, a=dx_body, g=dskip, c=count: [
                            elementwise.accumulate(lib, v[a], v[g], c)
                        ],
                    )
                continue
            dy = grad_of[rec["y"]]
            dx = self._emit_backward(rec, dy, needs[idx])
            if dx is not None:
                grad_of[rec["x"]] = dx
            self._emit_updates(rl)
        if self.fused_update and not self.accumulate and self.trainable_names():
            self._emit_fused_update(zero_grads=False)

    def _recompute(self, lo: int, hi: int, grad_of: dict[str, str]) -> None:
        """Re-create the activations of records ``[lo, hi)`` from the segment's input, which was
        kept; backward then reads the new copies and the originals die after the forward."""
        first, last = self.records[lo], self.records[hi - 1]
        stop = self.records[hi]["i"]
        fresh, _ = self._walk(
            first["i"], stop, first["x"], first["x_shape"], True, f"re{lo}:", recompute=True
        )
        if len(fresh) != hi - lo:
            raise AssertionError("a recomputed segment must mirror the original records")
        self.records[lo:hi] = fresh
        if last["y"] in grad_of:
            grad_of[fresh[-1]["y"]] = grad_of[last["y"]]

    def _grad_target(self, pname: str) -> str:
        if self.accumulate:
            return f"{pname}:grad"
        return self.tensor(f"{pname}:grad", self.tensors[pname].shape, GRADIENTS)

    def _emit_backward(self, rec, dy: str, input_grad: bool) -> str | None:
        rl, layer, n, path = rec["rl"], rec["rl"].layer, self.n, rec["rl"].path
        x, y, act = rec["x"], rec["y"], rec["act"]
        acc = self.accumulate
        w, b = f"{path}.weight", f"{path}.bias"
        train_w = w in self.trainable
        train_b = b in self.trainable
        dx = self.tensor(f"{x}:grad", (n, *rec["x_shape"])) if input_grad else None
        mask = rec.get("mask")
        if act:  # fused activation: undo it on the output before the layer's own backward
            dpre = self.tensor(f"{y}:pregrad", (n, *rec["y_shape"]))
            count = n * prod(rec["y_shape"])
            if mask:
                self.op(
                    f"{path}.{act}_backward",
                    "backward",
                    (mask, dy),
                    (dpre,),
                    lambda lib, v, g=dy: [
                        elementwise.masked_backward(lib, v[mask], v[g], v[dpre], count)
                    ],
                )
            else:
                self.op(
                    f"{path}.{act}_backward",
                    "backward",
                    (y, dy),
                    (dpre,),
                    lambda lib, v, a=act, g=dy: [
                        elementwise.activation_backward(lib, a, v[y], v[g], v[dpre], count)
                    ],
                )
            dy = dpre
        gw = self._grad_target(w) if train_w else None
        gb = self._grad_target(b) if train_b else None
        if isinstance(layer, L.Linear):
            fin, fout = rl.input_shape[0], rl.output_shape[0]
            if gw:
                self.op(
                    f"{path}.dW",
                    "backward",
                    (dy, x),
                    (gw,),
                    lambda lib, v: [
                        gemm.gemm(
                            lib,
                            v[dy],
                            v[x],
                            v[gw],
                            m=fout,
                            n=fin,
                            k=n,
                            trans_a=True,
                            beta=1.0 if acc else 0.0,
                        )
                    ],
                )
            if gb:
                self.op(
                    f"{path}.db",
                    "backward",
                    (dy,),
                    (gb,),
                    lambda lib, v: [
                        reduce.sum_rows(lib, v[dy], v[gb], rows=n, cols=fout, accumulate=acc)
                    ],
                )
            if dx:
                self.op(
                    f"{path}.dx",
                    "backward",
                    (dy, w),
                    (dx,),
                    lambda lib, v: [gemm.gemm(lib, v[dy], v[w], v[dx], m=n, n=fin, k=fout)],
                )
        elif isinstance(layer, L.Conv2d) and self.conv_impl == "gemm":
            conv_lowering.emit_backward(self, path, self.conv_shape(rl), x, dy, w, gw, gb, dx, acc)
        elif isinstance(layer, (L.Conv2d, L.DepthwiseConv2d)):
            shape = self.conv_shape(rl)
            mod_w = (
                conv2d.conv2d_backward_weight
                if isinstance(layer, L.Conv2d)
                else depthwise.depthwise_backward_weight
            )
            mod_x = (
                conv2d.conv2d_backward_data
                if isinstance(layer, L.Conv2d)
                else depthwise.depthwise_backward_data
            )
            if gw or gb:
                if gw is None:  # bias only: a per-channel sum of dy
                    hw = shape.out_h * shape.out_w
                    self.op(
                        f"{path}.db",
                        "backward",
                        (dy,),
                        (gb,),
                        lambda lib, v: [
                            reduce.sum_channels(
                                lib, v[dy], v[gb], n=n, c=shape.k, hw=hw, accumulate=acc
                            )
                        ],
                    )
                else:
                    self.op(
                        f"{path}.dW",
                        "backward",
                        (x, dy),
                        (gw, gb),
                        lambda lib, v: mod_w(
                            lib,
                            v[x],
                            v[dy],
                            v[gw],
                            v[gb] if gb else None,
                            shape=shape,
                            accumulate=acc,
                        ),
                    )
            if dx:
                self.op(
                    f"{path}.dx",
                    "backward",
                    (dy, w),
                    (dx,),
                    lambda lib, v: mod_x(lib, v[dy], v[w], v[dx], shape=shape),
                )
        elif isinstance(layer, L.BatchNorm) and path in self.frozen_statistics:
            c, hw = rl.input_shape[0], prod(rl.input_shape[1:])
            rm, rv = f"{path}.running_mean", f"{path}.running_var"
            if gw or gb or dx:
                self.op(
                    f"{path}.backward",
                    "backward",
                    (x if gw else None, dy, w, rm, rv),
                    tuple(t for t in (dx, gw, gb) if t),
                    lambda lib, v: batchnorm.batchnorm_backward_frozen(
                        lib,
                        v[x] if gw else None,
                        v[dy],
                        v[w],
                        v[rm],
                        v[rv],
                        v[dx] if dx else None,
                        v[gw] if gw else None,
                        v[gb] if gb else None,
                        n=n,
                        c=c,
                        hw=hw,
                        eps=layer.eps,
                        accumulate=acc,
                    ),
                )
        elif isinstance(layer, L.BatchNorm):
            c, hw = rl.input_shape[0], prod(rl.input_shape[1:])
            mean, invstd = f"{rec['prefix']}{path}:mean", f"{rec['prefix']}{path}:invstd"
            if gw or gb or dx:
                self.op(
                    f"{path}.backward",
                    "backward",
                    (x, dy, w, mean, invstd),
                    tuple(t for t in (dx, gw, gb) if t),
                    lambda lib, v: batchnorm.batchnorm_backward(
                        lib,
                        v[x],
                        v[dy],
                        v[w],
                        v[mean],
                        v[invstd],
                        v[dx] if dx else None,
                        v[gw] if gw else None,
                        v[gb] if gb else None,
                        n=n,
                        c=c,
                        hw=hw,
                        accumulate=acc,
                        input_grad=dx is not None,
                    ),
                )
        elif type(layer) in _ACT and dx and mask:
            count = n * prod(rl.input_shape)
            self.op(
                f"{path}.backward",
                "backward",
                (mask, dy),
                (dx,),
                lambda lib, v: [elementwise.masked_backward(lib, v[mask], v[dy], v[dx], count)],
            )
        elif type(layer) in _ACT and dx:
            kind, count = _ACT[type(layer)], n * prod(rl.input_shape)
            self.op(
                f"{path}.backward",
                "backward",
                (y, dy),
                (dx,),
                lambda lib, v: [
                    elementwise.activation_backward(lib, kind, v[y], v[dy], v[dx], count)
                ],
            )
        elif isinstance(layer, L.MaxPool2d) and dx:
            shape = self.conv_shape(rl)
            self.op(
                f"{path}.backward",
                "backward",
                (x, dy),
                (dx,),
                lambda lib, v: pool.maxpool_backward(lib, v[x], v[dy], v[dx], shape=shape),
            )
        elif isinstance(layer, L.AvgPool2d) and dx:
            shape = self.conv_shape(rl)
            self.op(
                f"{path}.backward",
                "backward",
                (dy,),
                (dx,),
                lambda lib, v: pool.avgpool_backward(lib, v[dy], v[dx], shape=shape),
            )
        elif isinstance(layer, L.GlobalAvgPool) and dx:
            c, hw = rl.input_shape[0], prod(rl.input_shape[1:])
            self.op(
                f"{path}.backward",
                "backward",
                (dy,),
                (dx,),
                lambda lib, v: pool.global_avgpool_backward(lib, v[dy], v[dx], n=n, c=c, hw=hw),
            )
        elif isinstance(layer, L.Dropout) and dx:
            count, seed = n * prod(rl.input_shape), L.dropout_seed(path)
            self.op(
                f"{path}.backward",
                "backward",
                (dy, "step"),
                (dx,),
                lambda lib, v: dropout.dropout_backward(
                    lib, v[dy], v[dx], v["step"], n=count, p=layer.p, seed=seed
                ),
            )
        return dx

    def _emit_updates(self, rl: ResolvedLayer) -> None:
        if self.accumulate or self.fused_update:
            return
        for pname in rl.params:
            if pname in self.trainable:
                self._emit_update(pname)

    def _emit_update(self, pname: str) -> None:
        opt, g = self.opt, f"{pname}:grad"
        count = prod(self.tensors[pname].shape)
        if opt.name == "sgd":
            vel = f"{pname}:velocity" if opt.momentum else None
            self.op(
                f"{pname}.update",
                "update",
                (pname, g, vel),
                (pname, vel) if vel else (pname,),
                lambda lib, v: optimizer.sgd_update(
                    lib,
                    v[pname],
                    v[g],
                    v[vel] if vel else None,
                    n=count,
                    lr=opt.lr,
                    momentum=opt.momentum,
                    weight_decay=opt.weight_decay,
                    nesterov=opt.nesterov,
                ),
            )
        else:
            m, s = f"{pname}:m", f"{pname}:v"
            self.op(
                f"{pname}.update",
                "update",
                (pname, g, m, s, "step"),
                (pname, m, s),
                lambda lib, v: optimizer.adam_update(
                    lib,
                    v[pname],
                    v[g],
                    v[m],
                    v[s],
                    v["step"],
                    n=count,
                    lr=opt.lr,
                    beta1=opt.beta1,
                    beta2=opt.beta2,
                    eps=opt.eps,
                    weight_decay=opt.weight_decay,
                ),
            )

    def _states(self, pname: str) -> tuple[str, ...]:
        if self.opt.name == "adam":
            return (f"{pname}:m", f"{pname}:v")
        return (f"{pname}:velocity",) if self.opt.momentum else ()

    def _emit_fused_update(self, zero_grads: bool) -> None:
        """One launch updates every trainable parameter (and, with ``zero_grads``, zeroes its
        gradient). Its table of element offsets is written into the arena when the op is bound,
        the only time offsets are known."""
        opt, names = self.opt, self.trainable_names()
        grads = tuple(f"{p}:grad" for p in names)
        states = tuple(s for p in names for s in self._states(p))
        counts = {p: prod(self.tensors[p].shape) for p in names}

        def emit(lib, v: Views) -> list:
            at = {name: optimizer.element_offset(offset) for name, offset in v.offsets.items()}
            tensors = [
                optimizer.ArenaTensor(
                    counts[p], at[p], at[f"{p}:grad"], tuple(at[s] for s in self._states(p))
                )
                for p in names
            ]
            v.write(UPDATE_TABLE, optimizer.update_table(tensors))
            common = dict(table_offset=at[UPDATE_TABLE], lr=opt.lr,
                          weight_decay=opt.weight_decay, zero_grads=zero_grads)
            if opt.name == "sgd":
                return optimizer.sgd_update_multi(
                    lib, v.arena, tensors, momentum=opt.momentum, nesterov=opt.nesterov, **common
                )
            return optimizer.adam_update_multi(
                lib, v.arena, tensors, step_offset=at["step"], beta1=opt.beta1,
                beta2=opt.beta2, eps=opt.eps, **common,
            )

        reads = (*names, *grads, *states, UPDATE_TABLE, "step" if opt.name == "adam" else None)
        writes = (*names, *states, *(grads if zero_grads else ()))
        self.op("optimizer.update", "update", reads, writes, emit)

    def accumulated_updates(self) -> None:
        """Micro-batching: one update of every trainable parameter from its accumulated
        gradient, then the gradients are zeroed for the next effective batch."""
        names = self.trainable_names()
        if self.fused_update:
            if names:
                self._emit_fused_update(zero_grads=True)
            self.finish_step()
            return
        for pname in names:
            self._emit_update(pname)
        for pname in names:
            g, count = f"{pname}:grad", prod(self.tensors[pname].shape)
            self.op(
                f"{pname}.zero_grad",
                "update",
                (),
                (g,),
                lambda lib, v, g=g, c=count: [elementwise.fill(lib, v[g], 0.0, c)],
            )
        self.finish_step()

    def finish_step(self) -> None:
        self.op(
            "step+1",
            "update",
            ("step",),
            ("step",),
            lambda lib, v: optimizer.increment_step(lib, v["step"]),
        )


def build_graph(
    model: Model,
    batch: int,
    trainable: set[str],
    opt: OptimizerConfig,
    *,
    accumulate_gradients: bool = False,
    grad_scale: float | None = None,
    conv_impl: str = "gemm",
    recompute_segments: int = 0,
    distillation: DistillConfig | None = None,
    fused_update: bool = True,
) -> StepGraph:
    """The training and evaluation schedules of ``model`` at ``batch`` samples per launch.

    With ``accumulate_gradients`` the training ops only add into persistent gradients; the caller
    runs :func:`update_ops` once per effective batch (micro-batching). With ``distillation`` the
    loss also distils from the logits uploaded into the ``old_logits`` tensor with each batch.
    With ``fused_update`` one launch updates every trainable parameter (binding it needs
    :class:`Views` with the arena); without it each parameter has its own update launch."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    unknown = set(trainable) - set(model.parameter_shapes())
    if unknown:
        raise ValueError(f"Unknown parameter names in the trainable set: {sorted(unknown)}")
    builder = _Builder(
        model, batch, set(trainable), opt, accumulate_gradients, conv_impl, distillation,
        fused_update,
    )
    builder.persistent()
    logits = builder.forward(training=True, prefix="")
    dlogits = builder.loss(logits, grad_scale if grad_scale is not None else 1.0 / batch)
    builder.backward(dlogits, recompute_segments)
    if not accumulate_gradients:
        builder.finish_step()
    train_ops = builder.ops
    builder.ops = []
    if accumulate_gradients:
        builder.accumulated_updates()
    update_ops = builder.ops
    builder.ops = []
    eval_logits = builder.forward(training=False, prefix="eval:")
    builder.eval_loss(eval_logits)
    eval_ops = builder.ops
    return StepGraph(
        batch=batch,
        tensors=builder.tensors,
        train_ops=train_ops,
        eval_ops=eval_ops,
        update_ops=update_ops,
        params=list(model.parameter_shapes()),
        buffers=list(model.buffer_shapes()),
        trainable=[p for p in model.parameter_shapes() if p in trainable],
        old_logits_name="old_logits" if distillation is not None else None,
        eval_output=eval_logits,
    )
