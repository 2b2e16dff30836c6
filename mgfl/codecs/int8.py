"""Symmetric linear 8-bit quantisation: ``q = round(x / scale)`` in [-127, 127], one float32 scale
per tensor, or per output channel (axis 0) so that one large channel does not flatten the others.

Payload: ``varint scale count | count x float32 scale | size x int8``. Per channel, the count is
the length of axis 0 for arrays of two or more dimensions and 1 otherwise (a bias vector's
entries are not channels of their own).
"""

from __future__ import annotations

from math import prod

import numpy as np

from mgfl.codecs.base import Codec, payload_reader, require_finite
from mgfl.codecs.errors import CodecError
from mgfl.codecs.wire import varint

LEVELS = 127


def scale_count(shape: tuple[int, ...], per_channel: bool) -> int:
    return shape[0] if per_channel and len(shape) >= 2 else 1


class Int8(Codec):
    """4x fewer bytes than float32, plus 4 bytes a scale."""

    name = "int8"
    codec_id = 2

    per_channel = False

    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes:
        array = np.asarray(array)
        require_finite(array, self.name)
        groups = scale_count(array.shape, self.per_channel)
        rows = array.astype(np.float64).reshape(groups, -1) if array.size else None
        if rows is None:
            scales = np.zeros(groups, np.float32)
            codes = np.zeros(0, np.int8)
        else:
            scales = (np.max(np.abs(rows), axis=1) / LEVELS).astype(np.float32)
            safe = np.where(scales > 0, scales, 1.0).astype(np.float64)[:, None]
            codes = np.clip(np.rint(rows / safe), -LEVELS, LEVELS).astype(np.int8)
        return b"".join([varint(groups), scales.astype("<f4").tobytes(), codes.tobytes()])

    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        reader = payload_reader(payload, self.name)
        groups = reader.varint()
        expected = scale_count(shape, self.per_channel)
        if groups != expected:
            raise CodecError(f"{self.name} payload of shape {shape} needs {expected} scales, "
                             f"has {groups}")
        scales = np.frombuffer(reader.take(4 * groups), dtype="<f4")
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise CodecError(f"{self.name} payload holds a negative or non-finite scale")
        codes = np.frombuffer(reader.take(prod(shape)), dtype=np.int8)
        reader.expect_end()
        if np.any(codes == -128):
            raise CodecError(f"{self.name} payload holds -128, outside the symmetric range")
        if not codes.size:
            return np.zeros(shape, dtype)
        values = codes.reshape(groups, -1).astype(np.float32) * scales[:, None]
        return values.astype(dtype).reshape(shape)


class Int8PerChannel(Int8):
    """One scale per output channel (axis 0): kernels whose channels differ in magnitude keep
    their small channels."""

    name = "int8-channel"
    codec_id = 3
    per_channel = True
