"""Fuzzing of every decoder with hypothesis: arbitrary bytes and mutated valid bundles either
decode to arrays of the expected names and shapes or raise CodecError, and never make the
receiver allocate much more than the bundle and the expected model hold.

``MGFL_FUZZ_EXAMPLES`` raises the number of cases per test (docs/reliability.md quotes a run with
it); the counts of every run are printed at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import os
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgfl.codecs import CodecError, decode_update, encode_record, encode_update, get_codec
from mgfl.codecs.registry import decoders
from mgfl.codecs.topk import TopK
from mgfl.codecs.wire import varint

EXAMPLES = int(os.environ.get("MGFL_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
CODECS = ["none", "fp16", "int8", "int8-channel", "topk:0.3", "topk:1", "stc:0.3", "stc:1"]
EXPECTED = {"conv.weight": (4, 3, 3, 3), "conv.bias": (4,), "fc.weight": (5, 36), "bn.mean": (4,)}
EXPECTED_BYTES = 8 * sum(int(np.prod(s)) for s in EXPECTED.values())
CASES: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    total = sum(CASES.values())
    print(f"\nfuzz cases: {dict(CASES)}; total {total}, "
          f"rejected with CodecError {CASES['rejected']}")


STATISTIC = "bn.mean"
REFERENCE = {STATISTIC: np.linspace(0.5, 2.0, 4, dtype=np.float32)}


def decode_within_bounds(blob: bytes, expected=EXPECTED, reference=None) -> dict | None:
    """Decodes ``blob``: the result or None for CodecError; any other exception fails the test.
    The peak allocation must stay within a small multiple of the input and the expected model."""
    tracemalloc.start()
    try:
        out = decode_update(blob, expected, reference=reference)
    except CodecError:
        out = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak <= 16 * len(blob) + 4 * EXPECTED_BYTES + (1 << 16), peak
    CASES["decoded" if out is not None else "rejected"] += 1
    return out


def valid_bundle(seed: int, codec: str) -> bytes:
    rng = np.random.default_rng(seed)
    arrays = {name: rng.normal(size=shape).astype(np.float32) for name, shape in EXPECTED.items()}
    return encode_update(arrays, get_codec(codec), rng=rng).blob


def valid_compact_bundle(seed: int, spec: str) -> bytes:
    """An stc bundle whose BatchNorm statistic travels as a log ratio to ``REFERENCE``."""
    rng = np.random.default_rng(seed)
    arrays = {name: rng.normal(size=shape).astype(np.float32) for name, shape in EXPECTED.items()}
    arrays[STATISTIC] = (REFERENCE[STATISTIC] * rng.uniform(-0.5, 1.0, 4)).astype(np.float32)
    codec = get_codec(spec)
    return encode_update(arrays, codec, rng=rng, codec_of={STATISTIC: codec},
                         reference=REFERENCE).blob


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("varint"), st.integers(0, 1 << 16), st.integers(0x80, 0xFF)),
)


def mutate(blob: bytes, steps) -> bytes:
    data = bytearray(blob)
    for kind, where, value in steps:
        at = where % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= value
        elif kind == "set" and at < len(data):
            data[at] = value
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = bytes([value])
        elif kind == "delete" and at < len(data):
            del data[at]
        elif kind == "varint":  # a run of continuation bytes: huge declared sizes
            data[at:at] = bytes([value] * 8) + b"\x01"
    return bytes(data)


def check_result(out: dict | None) -> None:
    if out is None:
        return
    for name, array in out.items():
        assert tuple(array.shape) == EXPECTED[name]


@FUZZ
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_are_rejected_cleanly(blob):
    check_result(decode_within_bounds(blob))


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_after_a_valid_header(blob):
    check_result(decode_within_bounds(b"MGU\x01" + blob))
    check_result(decode_within_bounds(b"MGU\x01\x01MG\x01" + blob))


@FUZZ
@given(st.integers(0, 1 << 20), st.sampled_from(CODECS), st.lists(mutation, min_size=1,
                                                                   max_size=4))
def test_mutated_valid_bundles_decode_or_raise_codec_error(seed, codec, steps):
    check_result(decode_within_bounds(mutate(valid_bundle(seed, codec), steps)))


@FUZZ
@given(st.integers(0, 1 << 20), st.sampled_from(["stc:0.1", "stc:0.5:3", "stc:1:8"]),
       st.lists(mutation, min_size=1, max_size=4))
def test_mutated_compact_bundles_with_statistics(seed, spec, steps):
    """Compact bundles decoded against the global statistics they refer to."""
    check_result(decode_within_bounds(mutate(valid_compact_bundle(seed, spec), steps),
                                      reference=REFERENCE))


@FUZZ
@given(st.binary(max_size=1024))
def test_arbitrary_bytes_after_a_compact_header(blob):
    from mgfl.codecs.compact import layout_digest

    header = b"MGC\x01" + layout_digest(EXPECTED).to_bytes(4, "little")
    check_result(decode_within_bounds(header + blob, reference=REFERENCE))


@FUZZ
@given(st.sampled_from(sorted(decoders())), st.binary(max_size=1024),
       st.lists(st.integers(0, 40), min_size=0, max_size=4),
       st.sampled_from([np.float32, np.float16, np.float64]))
def test_every_payload_decoder_alone(codec_id, payload, shape, dtype):
    """Each codec's own payload decoder, given any bytes for any small shape."""
    shape = tuple(shape)
    try:
        out = decoders()[codec_id].decode(payload, shape, np.dtype(dtype))
    except CodecError:
        CASES["rejected"] += 1
        return
    CASES["decoded"] += 1
    assert out.shape == shape and out.dtype == np.dtype(dtype)
    assert np.all(np.isfinite(out))


@FUZZ
@given(st.integers(0, 1 << 20), st.sampled_from(CODECS), st.lists(mutation, min_size=1,
                                                                   max_size=3))
def test_mutations_without_an_expected_model_stay_typed(seed, codec, steps):
    """Without a model to compare with, the element cap still bounds what a record may claim."""
    try:
        decode_update(mutate(valid_bundle(seed, codec), steps), None, max_elements=1 << 12)
        CASES["decoded"] += 1
    except CodecError:
        CASES["rejected"] += 1


def test_declared_sizes_beyond_the_payload_are_refused_before_allocating():
    """A top-k record claiming every entry of a 16M-entry array in a dozen bytes is refused
    before its position table (128 MiB) is allocated."""
    shape = (4096, 4096)
    payload = b"\x00" + varint(shape[0] * shape[1]) + b"\x00" * 8
    record = encode_record("w", np.broadcast_to(np.float32(0), shape), TopK.codec_id, payload)
    blob = b"MGU\x01\x01" + record
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match="declares"):
            decode_update(blob, {"w": shape})
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 1 << 20
