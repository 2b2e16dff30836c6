"""Memory budgets: parse them, and pick the largest batch whose compiled step fits one.

The arena peak of a step is exact before allocation (``step.estimate_memory``), so fitting a budget
is a search over batch sizes, not a trial of allocations. Peak memory grows monotonically with the
batch (every activation is proportional to it), so a binary search is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "gib": 2**30,
}
DEFAULT_BUDGET_FRACTION = 0.25


class BudgetTooSmallError(MemoryError):
    """Even one sample does not fit; the message names the smallest budget that would."""


def parse_bytes(text: str | int) -> int:
    """``"256MB"``, ``"1.5GiB"``, ``"65536"`` -> bytes (binary units: a phone's MB is MiB)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"Cannot read {text!r} as a memory size; write e.g. 256MB, 1.5GB, 65536")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class BatchChoice:
    """How a requested batch runs under a budget: ``micro_batch`` samples per launch,
    ``accumulation_steps`` launches per optimizer step."""

    requested: int
    micro_batch: int
    accumulation_steps: int
    peak_bytes: int
    budget_bytes: int
    recompute_segments: int = 0

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation_steps


def largest_fitting_batch(peak_of: Callable[[int], int], budget: int, limit: int) -> int:
    """The largest batch in [1, limit] with ``peak_of(batch) <= budget``; 0 if none."""
    if peak_of(1) > budget:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak_of(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def choose_batch(peak_of: Callable[[int], int], requested: int, budget: int) -> BatchChoice:
    """The requested batch if it fits; otherwise a split into equal
    micro-batches (``requested`` must be a multiple of the micro-batch so the effective batch is
    unchanged) that fits."""
    one = peak_of(1)
    if one > budget:
        raise BudgetTooSmallError(
            f"The model does not fit a {format_bytes(budget)} budget even at batch 1: it needs "
            f"{format_bytes(one)} ({one} bytes). Raise the budget to at least that, or freeze "
            "layers (--freeze head, bias, last:K)."
        )
    if peak_of(requested) <= budget:
        return BatchChoice(requested, requested, 1, peak_of(requested), budget)
    fits = largest_fitting_batch(peak_of, budget, requested)
    micro = max(d for d in range(1, fits + 1) if requested % d == 0)
    return BatchChoice(requested, micro, requested // micro, peak_of(micro), budget)


def staging_bytes(model, micro_batch: int, slots: int = 2) -> int:
    """Host-visible staging buffers of a step (inputs and labels, double-buffered)."""
    from math import prod

    return slots * micro_batch * (prod(model.input_shape) + 1) * 4


def default_segments(model) -> int:
    """About the square root of the layer count: the classic checkpointing trade-off (memory of
    O(sqrt(n)) activations for one extra forward)."""
    return max(2, round(len(model.resolve()) ** 0.5))


def fit_to_budget(
    model,
    batch: int,
    trainable: set[str],
    optimizer,
    budget: int,
    alignment: int = 256,
    conv_impl: str = "gemm",
) -> BatchChoice:
    """How ``batch`` runs within ``budget`` bytes of device memory (arena plus staging): whole,
    as micro-batches, or, when not even one sample fits, with recomputation by segments."""
    from client_runtime.step import estimate_memory

    def peak_with(segments: int):
        def peak_of(micro: int) -> int:
            arena = estimate_memory(
                model,
                micro,
                trainable,
                optimizer,
                alignment,
                accumulate_gradients=micro != batch,
                conv_impl=conv_impl,
                recompute_segments=segments,
            )
            return arena.peak_bytes + staging_bytes(model, micro)

        return peak_of

    try:
        return choose_batch(peak_with(0), batch, budget)
    except BudgetTooSmallError:
        segments = default_segments(model)
        choice = choose_batch(peak_with(segments), batch, budget)
        return replace(choice, recompute_segments=segments)
