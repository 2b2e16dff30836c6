"""Exemplars stored at reduced precision (FastICARL's quantised exemplars): float32, float16, or
int8 with one float32 scale per exemplar. The bytes they take are exact, so a budget in bytes
holds more int8 exemplars than float32 ones."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

STORAGE_DTYPES = ("float32", "float16", "int8")
_SCALE_BYTES = 4  # one float32 scale per int8 exemplar


def bytes_per_sample(sample_shape: tuple[int, ...], dtype: str) -> int:
    """Bytes one stored exemplar of ``sample_shape`` takes at ``dtype``."""
    _check_dtype(dtype)
    values = prod(sample_shape)
    if dtype == "int8":
        return values + _SCALE_BYTES
    return values * np.dtype(dtype).itemsize


def _check_dtype(dtype: str) -> None:
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"exemplar storage {dtype!r} unknown; use one of {STORAGE_DTYPES}")


@dataclass(frozen=True)
class StoredSamples:
    """Samples in their storage form; ``decode()`` gives float32 back for training."""

    dtype: str
    data: np.ndarray
    scales: np.ndarray | None = None  # int8 only: x ~= data * scale, per sample

    @classmethod
    def encode(cls, x: np.ndarray, dtype: str) -> StoredSamples:
        _check_dtype(dtype)
        x = np.asarray(x, np.float32)
        if dtype != "int8":
            return cls(dtype, x.astype(dtype))
        flat = x.reshape(len(x), -1)
        peak = np.abs(flat).max(axis=1) if flat.size else np.zeros(len(x), np.float32)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        shape = (len(x),) + (1,) * (x.ndim - 1)
        q = np.clip(np.rint(x / scales.reshape(shape)), -127, 127).astype(np.int8)
        return cls(dtype, q, scales)

    def decode(self) -> np.ndarray:
        if self.scales is None:
            return self.data.astype(np.float32)
        shape = (len(self.data),) + (1,) * (self.data.ndim - 1)
        return self.data.astype(np.float32) * self.scales.reshape(shape)

    def head(self, count: int) -> StoredSamples:
        """The first ``count`` samples (exemplars are kept in order of selection)."""
        scales = None if self.scales is None else self.scales[:count].copy()
        return StoredSamples(self.dtype, self.data[:count].copy(), scales)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + (0 if self.scales is None else self.scales.nbytes))
