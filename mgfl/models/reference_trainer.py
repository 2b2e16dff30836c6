"""The float64 NumPy trainer that defines what one training step of a model computes.

The OpenCL engine is tested against it, so every rule here is exact and written down:

- loss: mean softmax cross-entropy over the batch;
- BatchNorm in training: batch mean and biased variance over N*H*W per channel (N for flat
  inputs); then ``running = (1-m)*running + m*stat``, with the variance made unbiased by
  ``count/(count-1)``; evaluation uses the running statistics;
- Dropout in training: the keep mask of ``kernels.reference.dropout.dropout_mask`` over the
  flattened batch, seeded by ``dropout_seed(path)`` and the step ``t``; kept values scaled 1/(1-p);
- MaxPool: the gradient goes to the first maximum of each window, row-major;
- optimizers: PyTorch's SGD (momentum, dampening 0, optional Nesterov, L2 weight decay) and Adam;
  only trainable parameters move, but BatchNorm running statistics update in every training step;
- except BatchNorms with frozen statistics (``frozen_statistics.frozen_statistics_layers``: a
  frozen weight before them, a parameter of their own training, as under ``bias``): in training
  they too normalise with the running statistics, which stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from mgfl.models import reference_layers
from mgfl.models.frozen_statistics import frozen_statistics_layers
from mgfl.models.layers import Residual, ResidualEnd
from mgfl.models.model import Model
from mgfl.models.reference_ops import softmax_cross_entropy
from mgfl.models.reference_optim import make_optimizer

EVAL_CHUNK = 256
Result = TypeVar("Result")


def _single_threaded_blas(method: Callable[..., Result]) -> Callable[..., Result]:
    """Run ``method`` with a one-thread BLAS. The reference's matrices are small: a threaded
    BLAS gains little on them and, on a machine whose cores are busy, loses tens of times over
    to threads waiting for one another."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with _threadpools().limit(limits=1, user_api="blas"):
            return method(*args, **kwargs)

    return wrapper


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The thread pools of the loaded native libraries, found once (finding them is slow)."""
    return ThreadpoolController()


class ReferenceTrainer:
    """Trains ``model`` from ``state`` in float64, one batch at a time.

    ``step`` is the step counter ``t`` that the next ``train_step`` uses (1 before the first);
    Adam's bias corrections and the dropout masks read it. ``forward`` and ``loss_and_grads``
    use the current ``step`` too and change nothing, so they see what ``train_step`` would."""

    def __init__(
        self,
        model: Model,
        state: dict[str, np.ndarray],
        *,
        optimizer: str = "sgd",
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        trainable: set[str] | None = None,
    ) -> None:
        self.model = model
        self.layers = model.resolve()
        self.num_classes = model.num_classes
        self.state = _checked_state(model, state)
        params = model.parameter_shapes()
        self.trainable = set(params) if trainable is None else set(trainable)
        unknown = sorted(self.trainable - set(params))
        if unknown:
            raise ValueError(f"trainable names unknown parameters: {', '.join(unknown)}")
        self.frozen_statistics = frozen_statistics_layers(model, self.trainable)
        self.optimizer = make_optimizer(
            optimizer,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,
            betas=betas,
            eps=eps,
        )
        self.step = 1

    @_single_threaded_blas
    def forward(self, x: np.ndarray, *, training: bool) -> np.ndarray:
        """Logits ``(N, classes)``; in training mode with batch statistics and dropout."""
        logits, _ = self._forward(self._inputs(x), training)
        return logits

    @_single_threaded_blas
    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """Training-mode loss and the gradient of every parameter; nothing is updated."""
        x, labels = self._inputs(x), self._labels(y, len(x))
        logits, tapes = self._forward(x, training=True)
        loss, dlogits = softmax_cross_entropy(logits, labels)
        return loss, self._backward(tapes, dlogits)

    @_single_threaded_blas
    def train_step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One step: the loss before the update, then BatchNorm statistics and parameters move."""
        x, labels = self._inputs(x), self._labels(y, len(x))
        logits, tapes = self._forward(x, training=True)
        loss, dlogits = softmax_cross_entropy(logits, labels)
        grads = self._backward(tapes, dlogits)
        self._update_running_stats(tapes)
        for name in self.model.parameter_shapes():
            if name in self.trainable:
                self.optimizer.update(self.state[name], grads[name], name, self.step)
        self.step += 1
        return loss

    @_single_threaded_blas
    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean loss and accuracy in evaluation mode (running statistics, no dropout)."""
        x, labels = self._inputs(x), self._labels(y, len(x))
        total_loss, correct = 0.0, 0
        for start in range(0, len(x), EVAL_CHUNK):
            chunk = slice(start, start + EVAL_CHUNK)
            logits, _ = self._forward(x[chunk], training=False)
            loss, _ = softmax_cross_entropy(logits, labels[chunk])
            total_loss += loss * len(logits)
            correct += int(np.sum(logits.argmax(axis=1) == labels[chunk]))
        return total_loss / len(x), correct / len(x)

    def _forward(
        self, x: np.ndarray, training: bool
    ) -> tuple[np.ndarray, list[reference_layers.Tape | None]]:
        tapes: list[reference_layers.Tape | None] = []
        skips: list[np.ndarray] = []
        for entry in self.layers:
            if isinstance(entry.layer, Residual):
                skips.append(x)
                tapes.append(None)
            elif isinstance(entry.layer, ResidualEnd):
                x = x + skips.pop()
                tapes.append(None)
            else:
                x, tape = reference_layers.forward(
                    entry,
                    x,
                    self.state,
                    training,
                    self.step,
                    frozen_statistics=entry.path in self.frozen_statistics,
                )
                tapes.append(tape)
        return x, tapes

    def _backward(
        self, tapes: list[reference_layers.Tape | None], dlogits: np.ndarray
    ) -> dict[str, np.ndarray]:
        grads: dict[str, np.ndarray] = {}
        skip_grads: list[np.ndarray] = []
        d = dlogits
        for entry, tape in zip(reversed(self.layers), reversed(tapes), strict=True):
            if isinstance(entry.layer, ResidualEnd):
                skip_grads.append(d)  # the join's gradient flows into the body and the skip
            elif isinstance(entry.layer, Residual):
                d = d + skip_grads.pop()
            else:
                d, layer_grads = reference_layers.backward(entry, tape, d, self.state)
                grads.update(layer_grads)
        return grads

    def _update_running_stats(self, tapes: Iterable[reference_layers.Tape | None]) -> None:
        for entry, tape in zip(self.layers, tapes, strict=True):
            if tape is None or tape.batch_stats is None:
                continue
            mean, var, count = tape.batch_stats
            m = entry.layer.momentum
            running_mean = self.state[f"{entry.path}.running_mean"]
            running_var = self.state[f"{entry.path}.running_var"]
            running_mean[...] = (1 - m) * running_mean + m * mean
            running_var[...] = (1 - m) * running_var + m * var * (count / (count - 1))

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1 + len(self.model.input_shape) or x.shape[1:] != self.model.input_shape:
            expected = ", ".join(map(str, self.model.input_shape))
            raise ValueError(
                f"Inputs of {self.model.name!r} must be (N, {expected}), got {x.shape}"
            )
        if len(x) == 0:
            raise ValueError("A batch needs at least one sample")
        return x

    def _labels(self, y: np.ndarray, count: int) -> np.ndarray:
        labels = np.asarray(y)
        if labels.shape != (count,) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"Labels must be {count} integers, got {labels.dtype} {labels.shape}")
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(
                f"Labels must lie in [0, {self.num_classes}), got {labels.min()}..{labels.max()}"
            )
        return labels.astype(np.int64)


def _checked_state(model: Model, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A float64 copy of ``state`` holding exactly the model's parameters and buffers."""
    expected = {**model.parameter_shapes(), **model.buffer_shapes()}
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise ValueError(
            f"State does not fit {model.name!r}: missing {missing or 'nothing'}, "
            f"unexpected {extra or 'nothing'}"
        )
    copied = {}
    for name, shape in expected.items():
        array = np.array(state[name], dtype=np.float64)
        if array.shape != shape:
            raise ValueError(f"State {name!r} has shape {array.shape}, the model needs {shape}")
        copied[name] = array
    return copied
