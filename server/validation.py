"""The checks every client reply passes before it may touch the global model.

A federation is fed by devices nobody controls, so a reply is untrusted input: it is measured
before it is parsed, parsed by decoders that check every field, and compared with the global
model (names, shapes, dtypes), and its values and weight must be finite (and, if the run asks, its
change within an L2 norm bound). A reply that fails raises :class:`ReplyRejected` with the reason;
nothing of it is used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mgfl.codecs import CodecError, decode_update
from mgfl.update_layout import UpdateLayout

RECORD_OVERHEAD_BYTES = 512  # generous bound on one record's header and a codec's side data
BUNDLE_OVERHEAD_BYTES = 16


class ReplyRejected(ValueError):
    """A reply that cannot be used; the message says why."""


@dataclass(frozen=True)
class ReplyLimits:
    """What a run accepts: the largest bundle in bytes, and an optional bound on the L2 norm of
    the whole change (0 = none)."""

    max_bytes: int
    norm_bound: float = 0.0

    @classmethod
    def for_layout(cls, layout: UpdateLayout, max_bytes: int = 0, norm_bound: float = 0.0
                   ) -> ReplyLimits:
        """``max_bytes`` 0 means: the uncompressed float32 size of every travelling array plus
        headers, which every codec stays below."""
        if max_bytes <= 0:
            values = sum(math.prod(layout.shapes[n]) for n in layout.travelling)
            max_bytes = (4 * values + RECORD_OVERHEAD_BYTES * len(layout.travelling)
                         + BUNDLE_OVERHEAD_BYTES)
        return cls(max_bytes=int(max_bytes), norm_bound=float(norm_bound))


def validate_update(blob: bytes, layout: UpdateLayout, global_state: Mapping[str, np.ndarray],
                    limits: ReplyLimits) -> dict[str, np.ndarray]:
    """The decoded changes of a reply's bundle, or :class:`ReplyRejected`."""
    if len(blob) > limits.max_bytes:
        raise ReplyRejected(f"bundle of {len(blob)} bytes exceeds the bound of "
                            f"{limits.max_bytes} bytes")
    try:
        changes = decode_update(blob, layout.travelling_shapes(), reference=global_state)
    except CodecError as err:
        raise ReplyRejected(f"malformed bundle: {err}") from err
    squared = 0.0
    for name, change in changes.items():
        expected = np.asarray(global_state[name]).dtype
        if change.dtype != expected:
            raise ReplyRejected(f"{name} arrived as {change.dtype}, the global model holds "
                                f"{expected}")
        if not np.all(np.isfinite(change)):
            raise ReplyRejected(f"the change of {name} holds NaN or infinite values")
        squared += float(np.sum(np.square(change, dtype=np.float64)))
    norm = math.sqrt(squared)
    if not math.isfinite(norm):
        raise ReplyRejected("the change's norm overflows")
    if limits.norm_bound > 0 and norm > limits.norm_bound:
        raise ReplyRejected(f"the change's L2 norm {norm:.4g} exceeds the bound "
                            f"{limits.norm_bound:g}")
    return changes


def validate_weight(value: object, key: str) -> float:
    """The reply's sample count: a finite positive number, or :class:`ReplyRejected`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReplyRejected(f"{key} = {value!r} is not a number")
    weight = float(value)
    if not (math.isfinite(weight) and weight > 0):
        raise ReplyRejected(f"{key} = {weight} is not a finite positive number")
    return weight


def non_finite_arrays(merged: Mapping[str, np.ndarray], previous: Mapping[str, np.ndarray]
                   ) -> list[str]:
    """Names of arrays of ``merged`` that are not finite everywhere (the aggregate must then be
    dropped and ``previous`` kept)."""
    return [name for name, value in merged.items()
            if name in previous and not np.all(np.isfinite(value))]
