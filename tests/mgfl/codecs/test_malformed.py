"""Every malformed input is refused with CodecError, before anything large is allocated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgfl.codecs import CodecError, decode_update, encode_update, get_codec
from mgfl.codecs.base import encode_record
from mgfl.codecs.wire import ByteReader, varint

SPECS = ["none", "fp16", "int8", "int8-channel", "topk:0.3"]
ARRAYS = {
    "layers.0.weight": np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6),
    "layers.0.bias": np.linspace(-1, 1, 4, dtype=np.float32),
}
EXPECTED = {name: array.shape for name, array in ARRAYS.items()}


def bundle(*records: bytes) -> bytes:
    return b"MGU" + bytes([1]) + varint(len(records)) + b"".join(records)


@pytest.mark.parametrize("spec", SPECS)
def test_every_truncation_is_refused(spec):
    blob = encode_update(ARRAYS, get_codec(spec)).blob
    for cut in range(len(blob)):
        with pytest.raises(CodecError):
            decode_update(blob[:cut])


@pytest.mark.parametrize("spec", SPECS)
def test_trailing_bytes_are_refused(spec):
    blob = encode_update(ARRAYS, get_codec(spec)).blob
    with pytest.raises(CodecError, match="trailing"):
        decode_update(blob + b"\0")


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"XYZ\x01\x00", "magic"),
        (b"MGU\x02\x00", "version 2"),
        (b"MGU\x01\x01XX", "magic"),
        (bundle(b"MG\x02\x00"), "version 2"),
        (bundle(b"MG\x01\x09\x01a"), "unknown codec id 9"),
        (bundle(b"MG\x01\x00\x00"), "name length 0"),
        (bundle(b"MG\x01\x00\x02\xff\xfe"), "UTF-8"),
        (bundle(b"MG\x01\x00\x01a\x07"), "dtype code 7"),
        (bundle(b"MG\x01\x00\x01a\x01\x09"), "dimensions"),
        (bundle(b"MG\x01\x00\x01a\x01\x02" + varint(1 << 20) + varint(1 << 20)), "exceeds"),
        (bundle(b"MG\x01\x00\x01a\x01\x01\x04\x03abc"), "must take 16 bytes"),
        (bundle(b"MG\x01\x00\x01a\x01\x01\x80\x00"), "minimally"),
        (b"MGU\x01" + b"\xff" * 12, "longer than"),
    ],
)
def test_structural_errors_name_the_problem(blob, match):
    with pytest.raises(CodecError, match=match):
        decode_update(blob)


def test_record_names_and_shapes_are_checked_against_the_model():
    good = encode_record("layers.0.bias", ARRAYS["layers.0.bias"], 0,
                         ARRAYS["layers.0.bias"].tobytes())
    stranger = encode_record("layers.9.bias", ARRAYS["layers.0.bias"], 0,
                             ARRAYS["layers.0.bias"].tobytes())
    reshaped = encode_record("layers.0.weight", ARRAYS["layers.0.bias"], 0,
                             ARRAYS["layers.0.bias"].tobytes())
    assert set(decode_update(bundle(good), EXPECTED)) == {"layers.0.bias"}
    with pytest.raises(CodecError, match="appears twice"):
        decode_update(bundle(good, good), EXPECTED)
    with pytest.raises(CodecError, match="unexpected array"):
        decode_update(bundle(stranger), EXPECTED)
    with pytest.raises(CodecError, match="expected"):
        decode_update(bundle(reshaped), EXPECTED)
    with pytest.raises(CodecError, match="only 2 arrays"):
        decode_update(bundle(good, good, good), EXPECTED)


def payload_record(codec_id: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    return encode_record("a", np.zeros(shape, np.float32), codec_id, payload)


@pytest.mark.parametrize(
    ("codec_id", "shape", "payload", "match"),
    [
        (1, (2,), np.array([np.inf, 1], "<f2").tobytes(), "infinite"),
        (2, (2,), varint(2) + bytes(8) + bytes(2), "needs 1 scales"),
        (2, (2,), varint(1) + np.float32(-1).tobytes() + bytes(2), "negative"),
        (2, (2,), varint(1) + np.float32(np.nan).tobytes() + bytes(2), "non-finite"),
        (2, (2,), varint(1) + np.float32(1).tobytes() + b"\x80\x00", "-128"),
        (3, (2, 3), varint(1) + bytes(4) + bytes(6), "needs 2 scales"),
        (4, (4,), b"\x02\x01\x00" + bytes(2), "value format"),
        (4, (4,), b"\x00\x05" + bytes(5) + bytes(10), "5 entries"),
        (4, (4,), b"\x00\x02\x01\x02" + bytes(4), "outside an array of 4"),
        (4, (4,), b"\x00\x01\x00" + np.array([np.nan], "<f2").tobytes(), "NaN"),
        (4, (4,), b"\x00\x01\x00" + bytes(3), "trailing"),
    ],
)
def test_payload_errors(codec_id, shape, payload, match):
    with pytest.raises(CodecError, match=match):
        decode_update(bundle(payload_record(codec_id, shape, payload)))


def test_reader_refuses_negative_and_oversized_takes():
    reader = ByteReader(b"abc", "test")
    with pytest.raises(CodecError):
        reader.take(4)
    with pytest.raises(CodecError):
        reader.take(-1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.sampled_from(SPECS), position=st.integers(0, 10_000), value=st.integers(0, 255))
def test_a_changed_byte_decodes_or_raises_codec_error(spec, position, value):
    blob = bytearray(encode_update(ARRAYS, get_codec(spec)).blob)
    blob[position % len(blob)] = value
    try:
        decoded = decode_update(bytes(blob), EXPECTED)
    except CodecError:
        return
    for name, array in decoded.items():
        assert array.shape == EXPECTED[name]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_decode_or_raise_codec_error(data):
    for blob in (data, b"MGU\x01" + data, bundle(b"MG\x01" + data)):
        try:
            decode_update(blob)
        except CodecError:
            pass
