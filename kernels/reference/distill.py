"""Float64 reference of the distillation loss and its gradient."""

from __future__ import annotations

import numpy as np

from kernels.reference.softmax_xent import log_softmax


def distill_loss(logits, old_logits, *, c_old: int, temperature: float, weight: float):
    """Per-row ``weight * T^2 * KL(softmax(old/T) || softmax(logits[:, :c_old]/T))``."""
    log_q = log_softmax(np.asarray(logits, np.float64)[:, :c_old] / temperature)
    log_p = log_softmax(np.asarray(old_logits, np.float64)[:, :c_old] / temperature)
    kl = np.sum(np.exp(log_p) * (log_p - log_q), axis=1)
    return weight * temperature**2 * kl


def distill_grad(logits, old_logits, *, c_old: int, temperature: float, weight: float,
                 grad_scale: float) -> np.ndarray:
    """``grad_scale`` times the gradient of the summed loss with respect to all ``c`` logits."""
    logits = np.asarray(logits, np.float64)
    q = np.exp(log_softmax(logits[:, :c_old] / temperature))
    p = np.exp(log_softmax(np.asarray(old_logits, np.float64)[:, :c_old] / temperature))
    grad = np.zeros_like(logits)
    grad[:, :c_old] = grad_scale * weight * temperature * (q - p)
    return grad
