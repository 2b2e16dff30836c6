"""Class-incremental metrics from the accuracy matrix ``R[i][j]``: the accuracy on task ``j``'s
test classes after training task ``i`` (entries with ``j > i`` are not used).

Definitions (docs FACTS.md, section 1.4): final average accuracy (Lopez-Paz & Ranzato 2017),
average incremental accuracy (Rebuffi et al. 2017, iCaRL), forgetting (Chaudhry et al. 2018) and
backward transfer. Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _matrix(accuracy: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    r = np.asarray(accuracy, np.float64)
    if r.ndim != 2 or r.shape[0] != r.shape[1] or r.shape[0] < 1:
        raise ValueError(f"the accuracy matrix must be square T x T with T >= 1, got {r.shape}")
    lower = np.tril(np.ones_like(r, dtype=bool))
    if not np.all(np.isfinite(r[lower])):
        raise ValueError("the accuracy matrix has non-finite entries on or below its diagonal")
    return r


def accuracy_after_each_task(
    accuracy: Sequence[Sequence[float]] | np.ndarray,
    task_sizes: Sequence[int] | None = None,
) -> list[float]:
    """``A_i``: accuracy over every task seen after task ``i``, the mean of ``R[i][:i+1]``
    (weighted by the test samples of each task when ``task_sizes`` is given)."""
    r = _matrix(accuracy)
    sizes = np.ones(len(r)) if task_sizes is None else np.asarray(task_sizes, np.float64)
    if sizes.shape != (len(r),) or np.any(sizes <= 0):
        raise ValueError(f"task_sizes must hold {len(r)} positive counts, got {task_sizes}")
    return [float(np.average(r[i, : i + 1], weights=sizes[: i + 1])) for i in range(len(r))]


def final_accuracy(accuracy, task_sizes: Sequence[int] | None = None) -> float:
    """``A_T = (1/T) sum_j R[T-1][j]``: the accuracy over all tasks after the last one."""
    return accuracy_after_each_task(accuracy, task_sizes)[-1]


def average_incremental_accuracy(accuracy, task_sizes: Sequence[int] | None = None) -> float:
    """``(1/T) sum_i A_i``: the accuracy on the classes seen so far, averaged over the steps."""
    return float(np.mean(accuracy_after_each_task(accuracy, task_sizes)))


def forgetting(accuracy) -> float:
    """Mean over ``j < T-1`` of ``max_{l in [j, T-2]} R[l][j] - R[T-1][j]``; 0 for one task."""
    r = _matrix(accuracy)
    t = len(r)
    if t < 2:
        return 0.0
    return float(np.mean([r[j : t - 1, j].max() - r[t - 1, j] for j in range(t - 1)]))


def backward_transfer(accuracy) -> float:
    """``(1/(T-1)) sum_{j<T-1} (R[T-1][j] - R[j][j])``; negative means forgetting."""
    r = _matrix(accuracy)
    t = len(r)
    if t < 2:
        return 0.0
    return float(np.mean([r[t - 1, j] - r[j, j] for j in range(t - 1)]))


def summarize(accuracy, task_sizes: Sequence[int] | None = None) -> dict:
    """Every metric and the matrix (upper triangle as ``None``), ready for JSON."""
    r = _matrix(accuracy)
    matrix = [[float(r[i, j]) if j <= i else None for j in range(len(r))] for i in range(len(r))]
    return {
        "accuracy_matrix": matrix,
        "accuracy_after_each_task": accuracy_after_each_task(r, task_sizes),
        "final_accuracy": final_accuracy(r, task_sizes),
        "average_incremental_accuracy": average_incremental_accuracy(r, task_sizes),
        "forgetting": forgetting(r),
        "backward_transfer": backward_transfer(r),
    }
