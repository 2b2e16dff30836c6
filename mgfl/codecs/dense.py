"""Dense codecs: every entry travels. ``none`` sends the array's own bytes; ``fp16`` halves them."""

from __future__ import annotations

from math import prod

import numpy as np

from mgfl.codecs.base import Codec, check_payload_size, require_finite
from mgfl.codecs.errors import CodecError

FLOAT16_MAX = float(np.finfo(np.float16).max)


class NoCompression(Codec):
    """The array's little-endian bytes, unchanged: the float32 baseline every ratio refers to."""

    name = "none"
    codec_id = 0
    lossless = True

    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes:
        array = np.asarray(array)
        return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()

    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        little = np.dtype(dtype).newbyteorder("<")
        check_payload_size(payload, prod(shape) * little.itemsize, self.name, shape)
        return np.frombuffer(payload, dtype=little).astype(dtype).reshape(shape)


class Float16(Codec):
    """IEEE half precision: 2 bytes an entry, about 3 significant digits. Values beyond the
    float16 range are refused rather than sent as infinity."""

    name = "fp16"
    codec_id = 1

    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes:
        array = np.asarray(array)
        require_finite(array, self.name)
        if array.size and float(np.max(np.abs(array))) > FLOAT16_MAX:
            raise CodecError(
                f"fp16: values up to {float(np.max(np.abs(array))):.3g} exceed the float16 range "
                f"({FLOAT16_MAX:g}); use none or int8 for this array"
            )
        return np.ascontiguousarray(array, dtype="<f2").tobytes()

    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        check_payload_size(payload, prod(shape) * 2, self.name, shape)
        values = np.frombuffer(payload, dtype="<f2")
        if not np.all(np.isfinite(values)):
            raise CodecError("fp16 payload holds NaN or infinite values")
        return values.astype(dtype).reshape(shape)
