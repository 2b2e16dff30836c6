"""Sparse ternary compression in compact bundles: what travels is what the receiver decodes, every
byte is accounted for, error feedback keeps the rest, and the BatchNorm statistics arrive
unbiased, positive and within the codec's step."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.codecs import CodecError, decode_update, encode_update, get_codec
from mgfl.codecs.bits import best_rice_parameter, rice_cost
from mgfl.codecs.compact import layout_digest, statistic_scale
from mgfl.codecs.ternary import SparseTernary, from_bfloat16, to_bfloat16
from mgfl.codecs.wire import varint_size

SHAPES = {"conv.weight": (16, 1, 3, 3), "bn.weight": (16,), "bn.bias": (16,),
          "fc.weight": (10, 64), "fc.bias": (10,), "bn.running_mean": (16,),
          "bn.running_var": (16,)}
STATISTICS = ("bn.running_mean", "bn.running_var")
TRAINED = tuple(n for n in SHAPES if n not in STATISTICS)


def update(rng, scale: float = 0.01) -> dict[str, np.ndarray]:
    return {n: (rng.normal(size=s) * scale).astype(np.float32) for n, s in SHAPES.items()}


def global_statistics(rng) -> dict[str, np.ndarray]:
    return {"bn.running_mean": rng.normal(size=16).astype(np.float32),
            "bn.running_var": rng.uniform(1e-3, 5.0, size=16).astype(np.float32)}


def encode(arrays, spec="stc:0.05", residuals=None, rng=None, reference=None):
    codec = get_codec(spec)
    return encode_update(arrays, codec, residuals, rng,
                         codec_of={n: codec for n in STATISTICS}, reference=reference)


def test_spec_and_registry():
    codec = get_codec("stc:1%")
    assert isinstance(codec, SparseTernary) and codec.whole_update and codec.error_feedback
    assert (codec.fraction, codec.statistics_bits, codec.spec) == (0.01, 2, "stc:0.01")
    assert get_codec("stc:0.02:3").spec == "stc:0.02:3"
    assert get_codec(get_codec("stc:0.02:3").spec).statistics_bits == 3
    for bad in ("stc", "stc:0", "stc:0.01:0", "stc:0.01:9", "stc:0.01:x"):
        with pytest.raises(ValueError):
            get_codec(bad)


def test_what_is_sent_is_what_the_receiver_decodes(rng):
    arrays = update(rng)
    reference = global_statistics(rng)
    encoded = encode(arrays, rng=rng, reference=reference)
    assert encoded.blob[:3] == b"MGC"
    decoded = decode_update(encoded.blob, SHAPES, reference=reference)
    for name in SHAPES:
        np.testing.assert_array_equal(decoded.get(name, np.zeros(SHAPES[name], np.float32)),
                                      encoded.sent[name])
        assert decoded.get(name, encoded.sent[name]).dtype == np.float32


def test_top_k_over_the_whole_update_with_one_magnitude_per_array(rng):
    arrays = update(rng)
    arrays["fc.weight"] *= 10  # the loudest array takes most of the budget
    encoded = encode(arrays, "stc:0.05", rng=None)
    trained = np.concatenate([arrays[n].reshape(-1) for n in TRAINED])
    k = round(0.05 * trained.size)
    sent = np.concatenate([encoded.sent[n].reshape(-1) for n in TRAINED])
    kept = sent != 0
    assert kept.sum() == k
    assert np.abs(trained[kept]).min() >= np.abs(trained[~kept]).max()
    assert np.all(np.sign(sent[kept]) == np.sign(trained[kept]))
    for name in TRAINED:
        values = encoded.sent[name][encoded.sent[name] != 0]
        if values.size:
            mean = np.abs(arrays[name][encoded.sent[name] != 0]).mean()
            np.testing.assert_allclose(np.abs(values), mean, rtol=2.0**-8)
    assert np.count_nonzero(encoded.sent["fc.weight"]) > 0.8 * k


def test_byte_count_is_header_modes_positions_signs_magnitudes_and_codes(rng):
    arrays = update(rng)
    reference = global_statistics(rng)
    codec = get_codec("stc:0.05")
    encoded = encode(arrays, rng=rng, reference=reference)
    flat = np.concatenate([encoded.sent[n].reshape(-1) for n in TRAINED])
    positions = np.flatnonzero(flat)
    gaps = np.diff(positions, prepend=-1) - 1
    stream_bits = rice_cost(gaps, best_rice_parameter(gaps)) + len(positions)
    touched = sum(1 for n in TRAINED if np.any(encoded.sent[n]))
    statistics = sum(SHAPES[n][0] for n in STATISTICS)
    expected = (3 + 1 + 4 + -(-2 * len(SHAPES) // 8)
                + varint_size(len(positions)) + 1 + -(-stream_bits // 8) + 2 * touched
                + 1 + 4 + 2 * len(STATISTICS) + -(-codec.statistics_bits * statistics // 8))
    assert encoded.nbytes == expected


def test_a_dscnn_sized_update_fits_in_a_hundredth_of_float32(rng):
    """DS-CNN's 23,050 trained values and 1,152 statistics take 98,129 bytes as float32 records;
    stc:0.02 with 2-bit statistics stays within 980."""
    shapes = {"first.weight": (64, 1, 10, 4)}
    shapes.update({f"dw{i}.weight": (64, 1, 3, 3) for i in range(4)})
    shapes.update({f"pw{i}.weight": (64, 64, 1, 1) for i in range(4)})
    shapes.update({f"bn{i}.{p}": (64,) for i in range(9) for p in ("weight", "bias")})
    shapes["head.weight"], shapes["head.bias"] = (10, 64), (10,)
    assert sum(int(np.prod(s)) for s in shapes.values()) == 23_050
    shapes.update({f"bn{i}.running_{s}": (64,) for i in range(9) for s in ("mean", "var")})
    codec = get_codec("stc:0.02")
    arrays = {n: (rng.normal(size=s) * 0.01).astype(np.float32) for n, s in shapes.items()}
    reference = {n: np.full(s, 1.0, np.float32) for n, s in shapes.items() if "running" in n}
    encoded = encode_update(arrays, codec, None, rng, reference=reference,
                            codec_of={n: codec for n in reference})
    assert encoded.nbytes <= 980


def test_error_feedback_accounting_is_exact_per_round(rng):
    arrays = update(rng)
    residuals = {n: (rng.normal(size=SHAPES[n]) * 0.003).astype(np.float32) for n in TRAINED}
    encoded = encode(arrays, residuals=residuals, rng=rng, reference=global_statistics(rng))
    assert set(encoded.residuals) == set(TRAINED)  # statistics keep no residual
    for name in TRAINED:
        np.testing.assert_allclose(encoded.sent[name] + encoded.residuals[name],
                                   arrays[name] + residuals[name], rtol=0, atol=1e-8)


def test_error_feedback_delivers_everything_over_rounds(rng):
    residuals = None
    total_sent = {n: np.zeros(SHAPES[n]) for n in TRAINED}
    total_update = {n: np.zeros(SHAPES[n]) for n in TRAINED}
    for _ in range(40):
        arrays = update(rng)
        encoded = encode(arrays, "stc:0.1", residuals, rng, global_statistics(rng))
        residuals = encoded.residuals
        for name in TRAINED:
            total_sent[name] += encoded.sent[name]
            total_update[name] += arrays[name]
    for name in TRAINED:
        np.testing.assert_allclose(total_sent[name] + residuals[name], total_update[name],
                                   atol=1e-5)
    sent = np.concatenate([total_sent[n].reshape(-1) for n in TRAINED])
    assert np.count_nonzero(sent) > 0.9 * sent.size  # small entries arrive too, in time


def clipped_step(value: np.ndarray, bits: int = 2) -> tuple[float, np.ndarray]:
    """A code step of ``value``'s statistic (with bfloat16 rounding slack) and which entries lie
    beyond the clipped scale."""
    scale = statistic_scale(np.asarray(value, np.float64))
    return 2 * scale / ((1 << bits) - 1) * (1 + 2.0**-7), np.abs(value) > scale


def test_statistics_are_unbiased_positive_and_within_half_a_step(rng):
    reference = global_statistics(rng)
    local = {"bn.running_mean": reference["bn.running_mean"] + rng.normal(size=16) * 0.3,
             "bn.running_var": reference["bn.running_var"] * rng.uniform(0.2, 3.0, size=16)}
    local["bn.running_mean"][3] += 5.0  # an outlying channel: clipped, not everyone's step
    arrays = update(rng)
    for name in STATISTICS:
        arrays[name] = (local[name] - reference[name]).astype(np.float32)
    true_ratio = np.log(local["bn.running_var"] / reference["bn.running_var"])
    ratio_step, ratio_clipped = clipped_step(true_ratio)
    change = arrays["bn.running_mean"]
    step, clipped = clipped_step(change)
    assert clipped[3] and step < 0.7 * 2 * np.abs(change).max() / 3
    draws = []
    for _ in range(400):
        encoded = encode(arrays, rng=rng, reference=reference)
        decoded = decode_update(encoded.blob, SHAPES, reference=reference)
        variance = reference["bn.running_var"] + decoded["bn.running_var"]
        assert np.all(variance > 0)
        draws.append(decoded["bn.running_mean"])
        ratio = np.log(variance / reference["bn.running_var"])
        error = np.abs(ratio - true_ratio)[~ratio_clipped]
        assert np.all(error <= ratio_step / 2 + 1e-5)
        error = np.abs(decoded["bn.running_mean"] - change)[~clipped]
        assert np.all(error <= step / 2 + 1e-6)
    mean = np.mean(draws, axis=0)
    np.testing.assert_allclose(mean[~clipped], change[~clipped], atol=step * 0.06)
    scale = statistic_scale(change.astype(np.float64))
    np.testing.assert_allclose(mean[clipped], np.sign(change[clipped]) * scale, atol=step * 0.06)


def test_dither_errors_are_a_third_of_stochastic_roundings_variance(rng):
    """Subtractive dither: the error of a 2-bit code is uniform over one step whatever the value
    (variance step**2 / 12); stochastic rounding's is up to step**2 / 4 between levels."""
    reference = global_statistics(rng)
    arrays = update(rng)
    arrays["bn.running_mean"] = np.linspace(-1, 1, 16).astype(np.float32)
    step, _ = clipped_step(arrays["bn.running_mean"])
    errors = []
    for _ in range(600):
        encoded = encode(arrays, rng=rng, reference=reference)
        errors.append(decode_update(encoded.blob, SHAPES, reference=reference)
                      ["bn.running_mean"] - arrays["bn.running_mean"])
    variance = np.var(np.array(errors)) / step**2
    assert 0.07 < variance < 0.1  # 1/12 = 0.083; the previous stochastic rounding gave 0.146


def test_statistics_without_a_reference_travel_as_differences(rng):
    arrays = update(rng)
    encoded = encode(arrays, rng=None, reference=None)
    decoded = decode_update(encoded.blob, SHAPES)
    for name in STATISTICS:
        step, clipped = clipped_step(arrays[name])
        error = np.abs(decoded[name] - arrays[name])[~clipped]
        assert np.all(error <= step / 2 + 1e-7)


def test_log_ratios_need_the_reference_to_decode(rng):
    reference = global_statistics(rng)
    blob = encode(update(rng), rng=rng, reference=reference).blob
    with pytest.raises(CodecError, match="needs the global statistics"):
        decode_update(blob, SHAPES)
    negative = dict(reference, **{"bn.running_var": -reference["bn.running_var"]})
    with pytest.raises(CodecError, match="non-positive"):
        decode_update(blob, SHAPES, reference=negative)


def test_layout_is_checked(rng):
    blob = encode(update(rng), rng=rng).blob
    with pytest.raises(CodecError, match="layout"):
        decode_update(blob)
    reordered = dict(reversed(list(SHAPES.items())))
    assert layout_digest(reordered) != layout_digest(SHAPES)
    with pytest.raises(CodecError, match="layout"):
        decode_update(blob, reordered)
    with pytest.raises(CodecError, match="layout"):
        decode_update(blob, {**SHAPES, "fc.bias": (11,)})


def test_every_truncation_and_trailing_byte_is_refused(rng):
    reference = global_statistics(rng)
    blob = encode(update(rng), rng=rng, reference=reference).blob
    for cut in range(len(blob)):
        with pytest.raises(CodecError):
            decode_update(blob[:cut], SHAPES, reference=reference)
    with pytest.raises(CodecError, match="trailing"):
        decode_update(blob + b"\0", SHAPES, reference=reference)


def test_statistics_cannot_be_left_to_another_codec(rng):
    with pytest.raises(CodecError, match="whole update"):
        encode_update(update(rng), get_codec("stc:0.01"),
                      codec_of={n: get_codec("int8") for n in STATISTICS})


def test_refuses_non_finite_and_non_float32_updates(rng):
    arrays = update(rng)
    arrays["fc.bias"][0] = np.nan
    with pytest.raises(CodecError, match="NaN"):
        encode(arrays)
    with pytest.raises(CodecError, match="float32"):
        encode({n: a.astype(np.float64) for n, a in update(rng).items()})


def test_an_all_zero_update_sends_only_the_header():
    arrays = {n: np.zeros(s, np.float32) for n, s in SHAPES.items()}
    encoded = encode_update(arrays, get_codec("stc:0.01"))
    assert encoded.nbytes == 3 + 1 + 4 + 2 + 1
    assert decode_update(encoded.blob, SHAPES) == {}


def test_per_array_records_in_an_mgu_bundle(rng):
    """Alone, the codec sends one array as an ``stc`` record (top-k of that array)."""
    codec = SparseTernary(0.1)
    array = rng.normal(size=(20, 10)).astype(np.float32)
    payload = codec.encode(array)
    decoded = codec.decode(payload, array.shape, np.dtype(np.float32))
    kept = decoded != 0
    assert kept.sum() == 20
    assert np.abs(array[kept]).min() >= np.abs(array[~kept]).max()
    np.testing.assert_allclose(np.abs(decoded[kept]), np.abs(array[kept]).mean(), rtol=2.0**-8)
    assert codec.encode(np.zeros(8, np.float32)) is None
    with pytest.raises(CodecError, match="trailing"):
        codec.decode(payload + b"\0", array.shape, np.dtype(np.float32))


def test_bfloat16_rounding():
    values = np.array([1.0, 3.14159, 1e-30, 6e37, 0.0], np.float32)
    nearest = from_bfloat16(to_bfloat16(values))
    np.testing.assert_allclose(nearest, values, rtol=2.0**-8)
    up = from_bfloat16(to_bfloat16(values, round_up=True))
    assert np.all(up >= values) and np.all(up <= values * (1 + 2.0**-7))


def test_left_out_statistics_take_no_bytes_and_keep_the_global_values(rng):
    arrays = update(rng)
    reference = global_statistics(rng)
    codec = get_codec("stc:0.05")
    residuals = {n: (rng.normal(size=SHAPES[n]) * 0.01).astype(np.float32) for n in TRAINED}
    full = encode(arrays, residuals=residuals, rng=np.random.default_rng(3), reference=reference)
    residuals["bn.running_mean"] = np.ones(16, np.float32)  # kept as it is when left out
    lean = encode_update(arrays, codec, residuals, np.random.default_rng(3),
                         codec_of={n: codec for n in STATISTICS}, reference=reference,
                         omit=STATISTICS)
    statistic_bytes = 1 + 4 + 2 * len(STATISTICS) + 32 * 2 // 8  # bits, seed, scales, codes
    assert lean.nbytes == full.nbytes - statistic_bytes
    decoded = decode_update(lean.blob, SHAPES, reference=reference)
    assert not set(STATISTICS) & set(decoded)
    for name in STATISTICS:
        np.testing.assert_array_equal(lean.sent[name], np.zeros(SHAPES[name], np.float32))
    np.testing.assert_array_equal(lean.residuals["bn.running_mean"], np.ones(16))
    for name in TRAINED:
        np.testing.assert_array_equal(decoded.get(name, np.zeros(SHAPES[name], np.float32)),
                                      lean.sent[name])
        np.testing.assert_allclose(lean.residuals[name],
                                   arrays[name] + residuals[name] - lean.sent[name], atol=1e-7)


def test_only_arrays_of_the_update_can_be_left_out(rng):
    with pytest.raises(CodecError, match="does not hold"):
        encode_update(update(rng), get_codec("stc:0.05"), omit=("bn.missing",))
