"""Top-k sparsification: only the k entries of largest magnitude travel, as positions and values.

Deep Gradient Compression sends about 0.1% of a gradient's entries this way; what is left behind
must be kept by the sender and added to its next update (error feedback), or the small entries
would never arrive. ``k`` follows the fraction in expectation: ``k = floor(fraction * size + u)``
with ``u`` uniform in [0, 1) from the caller's generator, so that an array of 64 entries at 0.1%
travels in one round out of about sixteen (with its accumulated residual) instead of either every
round or never. Without a generator, ``k`` is the fraction rounded half up.

Payload: ``u8 value format (0 = float16, 1 = float32) | varint k | k x varint position gap |
k x value``. Positions are increasing; the first gap is the first position, each later one is
``position - previous - 1``, so dense selections cost one byte a position. Values are float16
unless one exceeds its range.
"""

from __future__ import annotations

import math
from math import prod

import numpy as np

from mgfl.codecs.base import Codec, payload_reader, require_finite
from mgfl.codecs.dense import FLOAT16_MAX
from mgfl.codecs.errors import CodecError
from mgfl.codecs.wire import varint

VALUE_FORMATS = {0: np.dtype("<f2"), 1: np.dtype("<f4")}


def parse_fraction(text: str) -> float:
    """``"0.01"`` or ``"1%"`` -> 0.01; must lie in (0, 1]."""
    text = text.strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError as err:
        raise ValueError(f"top-k fraction {text!r} is not a number (write 0.01 or 1%)") from err
    if not 0.0 < value <= 1.0:
        raise ValueError(f"top-k fraction must lie in (0, 1], got {text!r}")
    return value


def entries_to_send(size: int, fraction: float, rng: np.random.Generator | None) -> int:
    offset = rng.random() if rng is not None else 0.5
    return min(size, math.floor(fraction * size + offset))


def encode_positions(positions: np.ndarray) -> bytes:
    gaps = np.diff(positions, prepend=-1) - 1
    return b"".join(varint(int(g)) for g in gaps)


class TopK(Codec):
    """Keeps ``fraction`` of the entries (by magnitude); meant for updates with error feedback."""

    name = "topk"
    codec_id = 4
    error_feedback = True
    sparse = True

    def __init__(self, fraction: float = 0.01):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"top-k fraction must lie in (0, 1], got {fraction}")
        self.fraction = float(fraction)

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.fraction:g}"

    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes | None:
        flat = np.asarray(array).reshape(-1)
        require_finite(flat, self.name)
        k = entries_to_send(flat.size, self.fraction, rng)
        if k == 0:
            return None
        magnitude = np.abs(flat)
        chosen = np.argpartition(magnitude, flat.size - k)[flat.size - k:]
        positions = np.sort(chosen)
        values = flat[positions]
        wide = bool(values.size) and float(np.max(np.abs(values))) > FLOAT16_MAX
        fmt = 1 if wide else 0
        return b"".join([
            bytes([fmt]), varint(k), encode_positions(positions),
            values.astype(VALUE_FORMATS[fmt]).tobytes(),
        ])  # fmt: skip

    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        reader = payload_reader(payload, self.name)
        fmt = reader.u8()
        if fmt not in VALUE_FORMATS:
            raise CodecError(f"topk payload has unknown value format {fmt}")
        size = prod(shape)
        k = reader.varint()
        if k > size:
            raise CodecError(f"topk payload sends {k} entries of an array of {size}")
        smallest = k * (1 + VALUE_FORMATS[fmt].itemsize)  # a position takes at least one byte
        if smallest > reader.remaining:
            raise CodecError(f"topk payload declares {k} entries but holds {reader.remaining} "
                             "bytes for them")
        positions = np.empty(k, np.int64)
        position = -1
        for i in range(k):
            position += reader.varint() + 1
            if position >= size:
                raise CodecError(f"topk position {position} outside an array of {size}")
            positions[i] = position
        values = np.frombuffer(reader.take(k * VALUE_FORMATS[fmt].itemsize), VALUE_FORMATS[fmt])
        reader.expect_end()
        if not np.all(np.isfinite(values)):
            raise CodecError("topk payload holds NaN or infinite values")
        out = np.zeros(size, dtype)
        out[positions] = values
        return out.reshape(shape)
