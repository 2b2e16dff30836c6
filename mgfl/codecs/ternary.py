"""Sparse ternary compression (STC, Sattler et al. 2019): the k entries of largest magnitude
travel as a position and a sign each; every sent entry of an array takes the array's mean
magnitude over its sent entries. What that leaves behind (the small entries, and each sent entry's
distance to the mean) stays in the sender's error-feedback residual.

Against top-k with float16 values (``topk``: a varint gap and 2 bytes a value, 3-4 bytes an
entry), an entry costs its Rice-coded gap plus one sign bit: about 9 bits at 1% density. One
magnitude (bfloat16: the float32 exponent range, 8 significant bits) per array that has entries.

Section layout (``encode_section``), over the concatenation of one or more arrays::

    varint k | if k > 0: u8 Rice parameter | bit stream: k x (Rice gap, sign bit), zero padding
             | one bfloat16 magnitude per array holding a sent entry, in order

Alone (``stc`` records in an ``MGU`` bundle) a section covers one array; in a compact bundle
(``mgfl.codecs.compact``) it covers every sparse array at once, so that top-k picks the largest
entries of the whole model and no array pays a header of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from mgfl.codecs.base import Codec, require_finite
from mgfl.codecs.bits import (
    MAX_RICE_PARAMETER,
    BitReader,
    best_rice_parameter,
    pack,
    rice_signed_bits,
)
from mgfl.codecs.errors import CodecError
from mgfl.codecs.topk import entries_to_send, parse_fraction
from mgfl.codecs.wire import ByteReader, varint

DEFAULT_STATISTICS_BITS = 2


def to_bfloat16(values: np.ndarray, round_up: bool = False) -> np.ndarray:
    """The upper halves of float32 values, rounded to nearest (or, for non-negative values, up:
    the decoded value is then never below the original)."""
    values = np.asarray(values, np.float32)
    raw = values.view(np.uint32).astype(np.uint64)
    nearest = ((raw + 0x7FFF + ((raw >> 16) & 1)) >> 16).astype(np.uint16)
    if round_up:
        below = from_bfloat16(nearest) < values
        nearest = nearest + below.astype(np.uint16)
    return nearest


def from_bfloat16(halves: np.ndarray) -> np.ndarray:
    return (np.asarray(halves, np.uint32) << 16).view(np.float32)


def read_magnitudes(reader: ByteReader, count: int, what: str) -> np.ndarray:
    """``count`` bfloat16 values that must be finite and not negative."""
    halves = np.frombuffer(reader.take(2 * count), "<u2")
    values = from_bfloat16(halves.astype(np.uint16))
    if not np.all(np.isfinite(values)) or np.any(np.signbit(values)):
        raise CodecError(f"{what} holds a negative or non-finite magnitude")
    return values


@dataclass(frozen=True)
class Selection:
    """Which entries of the concatenated arrays travel, and with which sign."""

    positions: np.ndarray  # increasing, into the concatenation
    negative: np.ndarray  # bool per position


def select_largest(flat: np.ndarray, k: int) -> Selection:
    """The ``k`` entries of largest magnitude (never a zero: fewer if fewer are non-zero)."""
    magnitude = np.abs(flat)
    k = min(k, int(np.count_nonzero(magnitude)))
    if k == 0:
        return Selection(np.zeros(0, np.int64), np.zeros(0, bool))
    chosen = np.argpartition(magnitude, flat.size - k)[flat.size - k:]
    positions = np.sort(chosen).astype(np.int64)
    return Selection(positions, flat[positions] < 0)


def encode_section(flats: list[np.ndarray], k: int) -> tuple[bytes, list[np.ndarray]]:
    """The section sending the ``k`` largest entries of the concatenated ``flats``, and what the
    receiver decodes for each array."""
    sizes = [f.size for f in flats]
    flat = np.concatenate(flats) if flats else np.zeros(0, np.float32)
    selection = select_largest(flat, k)
    count = len(selection.positions)
    decoded = np.zeros(flat.size, np.float32)
    if count == 0:
        return varint(0), _split(decoded, sizes)
    owner = np.searchsorted(np.cumsum(sizes), selection.positions, side="right")
    touched = np.unique(owner)
    magnitude_of = np.zeros(len(sizes), np.float32)
    chosen = np.abs(flat[selection.positions]).astype(np.float64)
    means = np.bincount(owner, chosen, len(sizes))[touched] / np.bincount(owner)[touched]
    halves = to_bfloat16(means.astype(np.float32))
    magnitude_of[touched] = from_bfloat16(halves)
    if not np.all(np.isfinite(magnitude_of)):
        raise CodecError("stc: a mean magnitude overflows float32")
    decoded[selection.positions] = np.where(selection.negative, -1.0, 1.0) * magnitude_of[owner]
    gaps = np.diff(selection.positions, prepend=-1) - 1
    parameter = best_rice_parameter(gaps)
    stream = pack(rice_signed_bits(gaps, selection.negative, parameter))
    payload = b"".join([varint(count), bytes([parameter]), stream,
                        halves.astype("<u2").tobytes()])
    return payload, _split(decoded, sizes)


def decode_section(data: bytes, sizes: list[int], what: str) -> tuple[list[np.ndarray | None], int]:
    """The arrays a section at the start of ``data`` sends (None where it sends nothing) and the
    bytes it took."""
    reader = ByteReader(data, what)
    total = sum(sizes)
    count = reader.varint()
    if count > total:
        raise reader.fail(f"sends {count} entries of {total}")
    if count == 0:
        return [None] * len(sizes), len(data) - reader.remaining
    parameter = reader.u8()
    if parameter > MAX_RICE_PARAMETER:
        raise reader.fail(f"Rice parameter {parameter} above {MAX_RICE_PARAMETER}")
    if count * (parameter + 2) > 8 * reader.remaining:
        raise reader.fail(f"declares {count} entries but holds {reader.remaining} bytes for them")
    start = len(data) - reader.remaining
    bits = BitReader(data[start:], what)
    positions = np.empty(count, np.int64)
    negative = np.empty(count, bool)
    position = -1
    for i in range(count):
        quotient = bits.unary(total >> parameter)
        position += (quotient << parameter) + bits.unsigned(parameter) + 1
        if position >= total:
            raise bits.fail(f"position {position} outside {total} entries")
        positions[i] = position
        negative[i] = bits.bit()
    reader.take(bits.byte_aligned_end())
    owner = np.searchsorted(np.cumsum(sizes), positions, side="right")
    touched = np.unique(owner)
    magnitudes = read_magnitudes(reader, len(touched), what)
    magnitude_of = np.zeros(len(sizes), np.float32)
    magnitude_of[touched] = magnitudes
    out: list[np.ndarray | None] = [None] * len(sizes)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for index in touched:
        mine = owner == index
        array = np.zeros(sizes[index], np.float32)
        array[positions[mine] - bounds[index]] = np.where(negative[mine], -1.0, 1.0) * \
            magnitude_of[index]
        out[index] = array
    return out, len(data) - reader.remaining


def _split(flat: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(sizes)[:-1]) if sizes else []


def parse_stc(argument: str) -> tuple[float, int]:
    """``"0.01"`` -> (0.01, default bits); ``"0.01:3"`` -> (0.01, 3 bits for statistics)."""
    fraction_text, _, bits_text = argument.partition(":")
    fraction = parse_fraction(fraction_text)
    if not bits_text:
        return fraction, DEFAULT_STATISTICS_BITS
    if not bits_text.strip().isdigit() or not 1 <= int(bits_text) <= 8:
        raise ValueError(f"stc statistics bits must be 1..8, got {bits_text!r}")
    return fraction, int(bits_text)


class SparseTernary(Codec):
    """STC with error feedback. In an update (``encode_update``) it writes one compact bundle:
    top-k over all trained arrays together, and the BatchNorm running statistics as
    ``statistics_bits``-bit dithered deltas against the received global statistics (see
    ``mgfl.codecs.compact``). Alone, per array, it writes an ``stc`` record."""

    name = "stc"
    codec_id = 5
    error_feedback = True
    sparse = True
    whole_update = True

    def __init__(self, fraction: float = 0.01, statistics_bits: int = DEFAULT_STATISTICS_BITS):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"stc fraction must lie in (0, 1], got {fraction}")
        if not 1 <= statistics_bits <= 8:
            raise ValueError(f"stc statistics bits must be 1..8, got {statistics_bits}")
        self.fraction = float(fraction)
        self.statistics_bits = int(statistics_bits)

    @property
    def spec(self) -> str:
        suffix = "" if self.statistics_bits == DEFAULT_STATISTICS_BITS else \
            f":{self.statistics_bits}"
        return f"{self.name}:{self.fraction:g}{suffix}"

    def encode(self, array: np.ndarray, rng: np.random.Generator | None = None) -> bytes | None:
        flat = np.asarray(array, np.float32).reshape(-1)
        require_finite(flat, self.name)
        payload, decoded = encode_section([flat], entries_to_send(flat.size, self.fraction, rng))
        return payload if np.any(decoded[0]) else None

    def decode(self, payload: bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        arrays, used = decode_section(payload, [prod(shape)], "stc payload")
        if used != len(payload):
            raise CodecError(f"stc payload: {len(payload) - used} unexpected trailing bytes")
        if arrays[0] is None:
            return np.zeros(shape, dtype)
        return arrays[0].astype(dtype).reshape(shape)
