"""Float64 reference of the fused softmax cross-entropy and its statistics."""

from __future__ import annotations

import numpy as np

IGNORE_LABEL = -1


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def softmax_xent(logits, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row ``(loss, correct, counted)``; rows labelled -1 have zero in all three."""
    labels = np.asarray(labels, np.int64)
    counted = labels != IGNORE_LABEL
    rows = np.arange(labels.size)
    logp = log_softmax(logits)
    loss = np.where(counted, -logp[rows, np.where(counted, labels, 0)], 0.0)
    correct = counted & (np.argmax(logits, axis=1) == labels)
    return loss, correct.astype(np.float64), counted.astype(np.float64)


def softmax_xent_stats(logits, labels) -> np.ndarray:
    """``[sum of losses, correct predictions, counted rows]`` as the kernel adds them."""
    return np.array([part.sum() for part in softmax_xent(logits, labels)])


def softmax_xent_grad(logits, labels, grad_scale: float) -> np.ndarray:
    """``(softmax - onehot) * grad_scale`` on counted rows, zero on ignored rows."""
    labels = np.asarray(labels, np.int64)
    counted = labels != IGNORE_LABEL
    grad = np.exp(log_softmax(logits))
    grad[np.flatnonzero(counted), labels[counted]] -= 1.0
    grad[~counted] = 0.0
    return grad * grad_scale
