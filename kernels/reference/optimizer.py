"""Float64 references of the optimizer updates (PyTorch semantics)."""

from __future__ import annotations

import numpy as np


def sgd_update(param, grad, velocity=None, *, lr, momentum=0.0, weight_decay=0.0,
               nesterov=False) -> tuple[np.ndarray, np.ndarray | None]:
    """One step; returns ``(param, velocity)`` (velocity None without momentum)."""
    param = np.asarray(param, np.float64)
    g = np.asarray(grad, np.float64) + weight_decay * param
    if momentum == 0:
        return param - lr * g, None
    v = momentum * np.asarray(velocity, np.float64) + g
    d = g + momentum * v if nesterov else v
    return param - lr * d, v


def adam_update(param, grad, m, v, t: int, *, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step t (>= 1); returns ``(param, m, v)``."""
    param = np.asarray(param, np.float64)
    g = np.asarray(grad, np.float64) + weight_decay * param
    m = beta1 * np.asarray(m, np.float64) + (1 - beta1) * g
    v = beta2 * np.asarray(v, np.float64) + (1 - beta2) * g * g
    step_size = lr / (1 - beta1**t)
    denom = np.sqrt(v) / np.sqrt(1 - beta2**t) + eps
    return param - step_size * m / denom, m, v
