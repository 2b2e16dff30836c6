"""Rice-coded gaps and fixed-width codes: exact round trips, costs near the entropy of the
positions, and refusal of streams that are cut short or padded with anything but zeros."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.codecs import CodecError
from mgfl.codecs.bits import (
    BitReader,
    best_rice_parameter,
    fixed_width_bits,
    pack,
    rice_cost,
    rice_signed_bits,
)


def read_rice(data: bytes, count: int, parameter: int) -> tuple[list[int], list[int]]:
    reader = BitReader(data, "test")
    gaps, signs = [], []
    for _ in range(count):
        quotient = reader.unary(1 << 40)
        gaps.append((quotient << parameter) + reader.unsigned(parameter))
        signs.append(reader.bit())
    assert reader.byte_aligned_end() == len(data)
    return gaps, signs


@pytest.mark.parametrize("parameter", [0, 1, 3, 7])
def test_rice_round_trip(rng, parameter):
    gaps = rng.geometric(0.05, size=200) - 1
    negative = rng.random(200) < 0.5
    bits = rice_signed_bits(gaps, negative, parameter)
    assert len(bits) == rice_cost(gaps, parameter) + len(gaps)
    decoded_gaps, signs = read_rice(pack(bits), len(gaps), parameter)
    assert decoded_gaps == gaps.tolist()
    assert signs == negative.astype(int).tolist()


@pytest.mark.parametrize(("density", "bits_per_position"), [(0.01, 8.4), (0.02, 7.4), (0.1, 4.9)])
def test_best_parameter_codes_positions_near_their_entropy(rng, density, bits_per_position):
    positions = np.flatnonzero(rng.random(200_000) < density)
    gaps = np.diff(positions, prepend=-1) - 1
    parameter = best_rice_parameter(gaps)
    cost = rice_cost(gaps, parameter) / len(gaps)
    entropy = -(density * np.log2(density) + (1 - density) * np.log2(1 - density)) / density
    assert cost <= bits_per_position
    assert cost <= entropy * 1.05
    varint_cost = np.mean([8 * max(1, -(-int(g).bit_length() // 7)) for g in gaps])
    assert cost < varint_cost * 0.85  # varint gaps: 10.3 bits at 1%, 8.6 at 2%


def test_fixed_width_round_trip(rng):
    for width in range(1, 9):
        codes = rng.integers(0, 1 << width, size=37)
        reader = BitReader(pack(fixed_width_bits(codes, width)), "test")
        np.testing.assert_array_equal(reader.fixed_width(37, width), codes)
        reader.byte_aligned_end()


def test_readers_refuse_short_streams_and_dirty_padding():
    with pytest.raises(CodecError, match="end of the stream"):
        BitReader(b"\xff", "test").unary(100)
    with pytest.raises(CodecError, match="exceeds"):
        BitReader(b"\xff\x00", "test").unary(3)
    with pytest.raises(CodecError, match="needs"):
        BitReader(b"\x00", "test").fixed_width(3, 3)
    reader = BitReader(b"\x81", "test")
    reader.bit()
    with pytest.raises(CodecError, match="padding"):
        reader.byte_aligned_end()
