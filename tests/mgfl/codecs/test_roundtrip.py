"""Each codec returns what it was given, within the error its format allows."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.codecs import decode_update, encode_update, get_codec
from mgfl.codecs.topk import TopK

SHAPES = [(1,), (7,), (64,), (3, 5), (16, 1, 10, 4), (13, 1, 3, 3), ()]


def random_arrays(rng, shapes=SHAPES, dtype=np.float32):
    return {f"layers.{i}.weight": (rng.normal(size=s) * rng.uniform(0.01, 3)).astype(dtype)
            for i, s in enumerate(shapes)}


def round_trip(arrays, spec, rng=None):
    encoded = encode_update(arrays, get_codec(spec), rng=rng)
    decoded = decode_update(encoded.blob, {n: a.shape for n, a in arrays.items()})
    return encoded, decoded


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_none_is_exact_for_every_float_dtype(rng, dtype):
    arrays = random_arrays(rng, dtype=dtype)
    _, decoded = round_trip(arrays, "none")
    for name, array in arrays.items():
        assert decoded[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded[name], array)


def test_fp16_is_within_half_an_ulp(rng):
    arrays = random_arrays(rng)
    _, decoded = round_trip(arrays, "fp16")
    for name, array in arrays.items():
        assert decoded[name].dtype == np.float32
        np.testing.assert_allclose(decoded[name], array, rtol=2.0**-11, atol=2.0**-25)


def test_fp16_is_exact_on_representable_values(rng):
    arrays = {k: v.astype(np.float16).astype(np.float32) for k, v in random_arrays(rng).items()}
    _, decoded = round_trip(arrays, "fp16")
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)


@pytest.mark.parametrize("spec", ["int8", "int8-channel"])
def test_int8_error_is_at_most_half_a_step(rng, spec):
    arrays = random_arrays(rng)
    _, decoded = round_trip(arrays, spec)
    per_channel = spec == "int8-channel"
    for name, array in arrays.items():
        rows = array.reshape(array.shape[0] if per_channel and array.ndim >= 2 else 1, -1)
        step = np.abs(rows).max(axis=1, keepdims=True) / 127
        error = np.abs(decoded[name].reshape(rows.shape) - rows)
        assert np.all(error <= step / 2 * (1 + 1e-5) + 1e-12), name


def test_per_channel_keeps_small_channels_that_per_tensor_flattens(rng):
    weight = rng.normal(size=(8, 16)).astype(np.float32)
    weight[0] *= 1000.0  # one loud channel
    arrays = {"w": weight}
    _, tensor = round_trip(arrays, "int8")
    _, channel = round_trip(arrays, "int8-channel")
    quiet = slice(1, None)
    err_tensor = np.abs(tensor["w"][quiet] - weight[quiet]).max()
    err_channel = np.abs(channel["w"][quiet] - weight[quiet]).max()
    assert err_channel * 50 < err_tensor


def test_int8_of_zeros_is_zeros():
    arrays = {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}
    for spec in ("int8", "int8-channel"):
        _, decoded = round_trip(arrays, spec)
        for name in arrays:
            np.testing.assert_array_equal(decoded[name], arrays[name])


def test_topk_sends_exactly_the_largest_entries(rng):
    flat = rng.permutation(np.arange(1, 1001, dtype=np.float32)) * rng.choice([-1, 1], 1000)
    array = flat.reshape(10, 100) / 1000
    _, decoded = round_trip({"w": array}, "topk:0.05")  # 50 entries, no generator: exact count
    kept = decoded["w"] != 0
    assert kept.sum() == 50
    assert np.abs(array[kept]).min() > np.abs(array[~kept]).max()
    np.testing.assert_allclose(decoded["w"][kept], array[kept], rtol=2.0**-11)


def test_topk_of_full_fraction_is_fp16_exact(rng):
    arrays = {k: v.astype(np.float16).astype(np.float32) for k, v in random_arrays(rng).items()}
    _, decoded = round_trip(arrays, "topk:1")
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)


def test_topk_switches_to_float32_values_beyond_the_float16_range():
    array = np.array([1e6, -3e5, 0.5, 0.0], np.float32)
    _, decoded = round_trip({"w": array}, "topk:0.5")
    np.testing.assert_array_equal(decoded["w"], [1e6, -3e5, 0.0, 0.0])


def test_topk_count_follows_the_fraction_in_expectation():
    rng = np.random.default_rng(1)
    codec = TopK(0.001)
    counts = []
    for _ in range(2000):
        payload = codec.encode(np.arange(1, 641, dtype=np.float32), rng)  # 0.64 entries expected
        counts.append(0 if payload is None else payload[1])  # varint k < 128 is one byte
    assert set(counts) <= {0, 1}
    assert abs(np.mean(counts) - 0.64) < 0.04


def test_omitted_arrays_decode_as_absent_and_are_sent_as_zero():
    codec = TopK(0.001)
    arrays = {"tiny": np.ones(8, np.float32)}
    encoded = encode_update(arrays, codec)  # 0.008 entries rounds to 0
    assert encoded.records == 0
    assert decode_update(encoded.blob, {"tiny": (8,)}) == {}
    np.testing.assert_array_equal(encoded.sent["tiny"], np.zeros(8))
    np.testing.assert_array_equal(encoded.residuals["tiny"], np.ones(8))


def test_sent_is_what_the_receiver_decodes(rng):
    arrays = random_arrays(rng)
    for spec in ("none", "fp16", "int8", "int8-channel", "topk:0.1"):
        encoded, decoded = round_trip(arrays, spec, rng)
        for name, array in arrays.items():
            np.testing.assert_array_equal(decoded.get(name, np.zeros_like(array)),
                                          encoded.sent[name])


def test_arrays_can_have_codecs_of_their_own(rng):
    arrays = random_arrays(rng)
    dense = {"layers.1.weight", "layers.2.weight"}
    int8 = get_codec("int8")
    encoded = encode_update(arrays, get_codec("topk:0.01"), codec_of={n: int8 for n in dense})
    decoded = decode_update(encoded.blob, {n: a.shape for n, a in arrays.items()})
    for name in dense:
        step = np.abs(arrays[name]).max() / 127
        assert np.all(np.abs(decoded[name] - arrays[name]) <= step / 2 * (1 + 1e-5))
    assert set(encoded.residuals) == set(arrays) - dense  # only top-k arrays keep a residual


def test_left_out_arrays_take_no_record_and_keep_their_residual(rng):
    arrays = {"w": rng.normal(size=(4, 5)).astype(np.float32),
              "stat": rng.normal(size=7).astype(np.float32)}
    residuals = {"stat": np.full(7, 0.5, np.float32)}
    encoded = encode_update(arrays, TopK(0.5), residuals, rng, omit=("stat",))
    assert encoded.records == 1
    decoded = decode_update(encoded.blob, {"w": (4, 5), "stat": (7,)})
    assert set(decoded) == {"w"}
    np.testing.assert_array_equal(encoded.sent["stat"], np.zeros(7))
    np.testing.assert_array_equal(encoded.residuals["stat"], residuals["stat"])
    dense = encode_update(arrays, get_codec("none"), omit=("stat",))
    assert dense.nbytes < encode_update(arrays, get_codec("none")).nbytes - 4 * 7
