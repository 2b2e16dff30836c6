"""Byte counts are exact: the bundle is its header plus, per array, a record header and the
codec's payload, nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.codecs import encode_update, get_codec
from mgfl.codecs.wire import varint_size

BUNDLE_HEADER = 3 + 1  # magic, version


def record_header(name: str, shape: tuple[int, ...], payload: int) -> int:
    return (2 + 1 + 1 + varint_size(len(name)) + len(name) + 1 + 1
            + sum(varint_size(d) for d in shape) + varint_size(payload))


def bundle_size(arrays: dict, payloads: dict) -> int:
    total = BUNDLE_HEADER + varint_size(len(payloads))
    for name, payload in payloads.items():
        total += record_header(name, arrays[name].shape, payload) + payload
    return total


ARRAYS = {
    "layers.0.weight": np.linspace(-1, 1, 64 * 40, dtype=np.float32).reshape(64, 1, 10, 4),
    "layers.1.bias": np.linspace(-1, 1, 64, dtype=np.float32),
    "layers.28.weight": np.linspace(-2, 1, 10 * 64, dtype=np.float32).reshape(10, 64),
}


@pytest.mark.parametrize(
    ("spec", "payload_of"),
    [
        ("none", lambda a: 4 * a.size),
        ("fp16", lambda a: 2 * a.size),
        ("int8", lambda a: 1 + 4 + a.size),
        ("int8-channel",
         lambda a: varint_size(a.shape[0] if a.ndim >= 2 else 1)
         + 4 * (a.shape[0] if a.ndim >= 2 else 1) + a.size),
    ],
)
def test_dense_codec_sizes(spec, payload_of):
    encoded = encode_update(ARRAYS, get_codec(spec))
    payloads = {name: payload_of(array) for name, array in ARRAYS.items()}
    assert encoded.nbytes == bundle_size(ARRAYS, payloads)


def test_topk_size_is_header_count_positions_and_half_floats():
    encoded = encode_update(ARRAYS, get_codec("topk:0.01"))
    payloads = {}
    for name in ARRAYS:
        sent = encoded.sent[name].reshape(-1)
        positions = np.flatnonzero(sent)
        if not positions.size:
            continue
        gaps = np.diff(positions, prepend=-1) - 1
        payloads[name] = (1 + varint_size(len(positions)) + sum(varint_size(int(g)) for g in gaps)
                          + 2 * len(positions))
    assert encoded.records == len(payloads)
    assert encoded.nbytes == bundle_size(ARRAYS, payloads)


def test_compression_ratios_against_float32():
    raw = encode_update(ARRAYS, get_codec("none")).nbytes
    assert raw / encode_update(ARRAYS, get_codec("fp16")).nbytes > 1.9
    assert raw / encode_update(ARRAYS, get_codec("int8")).nbytes > 3.5
    assert raw / encode_update(ARRAYS, get_codec("topk:0.01")).nbytes > 25
