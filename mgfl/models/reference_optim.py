"""Float64 SGD and Adam with PyTorch's exact update rules, for the reference trainer."""

from __future__ import annotations

from math import sqrt

import numpy as np


class ReferenceSGD:
    """``g = grad + wd*p; v = momentum*v + g; d = g + momentum*v if nesterov else v; p -= lr*d``.

    ``v`` starts at zero, so the first ``v`` is ``g``, as PyTorch's first step clones it."""

    def __init__(self, lr: float, momentum: float, weight_decay: float, nesterov: bool) -> None:
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        self.lr, self.momentum, self.weight_decay, self.nesterov = (
            lr, momentum, weight_decay, nesterov,
        )  # fmt: skip
        self.velocity: dict[str, np.ndarray] = {}

    def update(self, param: np.ndarray, grad: np.ndarray, name: str, step: int) -> None:
        """Apply one step to ``param`` in place."""
        g = grad + self.weight_decay * param if self.weight_decay else grad
        v = self.momentum * self.velocity.get(name, 0.0) + g
        self.velocity[name] = v
        direction = g + self.momentum * v if self.nesterov else v
        param -= self.lr * direction


class ReferenceAdam:
    """PyTorch's Adam: L2 weight decay folded into ``g``, bias corrections with step ``t``::

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """

    def __init__(
        self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
    ) -> None:
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.first_moment: dict[str, np.ndarray] = {}
        self.second_moment: dict[str, np.ndarray] = {}

    def update(self, param: np.ndarray, grad: np.ndarray, name: str, step: int) -> None:
        """Apply step ``step`` (counted from 1) to ``param`` in place."""
        beta1, beta2 = self.betas
        g = grad + self.weight_decay * param if self.weight_decay else grad
        m = beta1 * self.first_moment.get(name, 0.0) + (1 - beta1) * g
        v = beta2 * self.second_moment.get(name, 0.0) + (1 - beta2) * g * g
        self.first_moment[name], self.second_moment[name] = m, v
        step_size = self.lr / (1 - beta1**step)
        denom = np.sqrt(v) / sqrt(1 - beta2**step) + self.eps
        param -= step_size * m / denom


def make_optimizer(
    name: str,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    betas: tuple[float, float],
    eps: float,
) -> ReferenceSGD | ReferenceAdam:
    """``"sgd"`` or ``"adam"`` with the hyper-parameters that apply to it."""
    if name == "sgd":
        return ReferenceSGD(lr, momentum, weight_decay, nesterov)
    if name == "adam":
        return ReferenceAdam(lr, betas, eps, weight_decay)
    raise ValueError(f"Unknown optimizer {name!r}; expected 'sgd' or 'adam'")
