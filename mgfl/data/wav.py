"""Reads PCM WAV files with the standard library, so loading recordings needs no audio package."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

_PCM_TYPES = {1: np.uint8, 2: np.int16, 4: np.int32}


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The signal as float64 in [-1, 1) (channels averaged to mono) and its sampling rate."""
    with wave.open(str(path), "rb") as f:
        width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
        raw = f.readframes(f.getnframes())
    if width not in _PCM_TYPES:
        raise ValueError(f"{path}: {8 * width}-bit samples; only 8, 16 and 32-bit PCM WAV is read")
    samples = np.frombuffer(raw, dtype=_PCM_TYPES[width]).astype(np.float64)
    if width == 1:
        samples -= 128.0
    samples /= float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate
