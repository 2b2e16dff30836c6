"""Error feedback loses nothing: what was sent plus what is kept is everything computed."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.codecs import encode_update, encode_with_feedback, get_codec


@pytest.mark.parametrize("spec", ["topk:0.01", "topk:0.2", "int8", "fp16"])
def test_one_step_accounting_is_exact(rng, spec):
    update = rng.normal(size=(32, 9)).astype(np.float32)
    residual = rng.normal(size=(32, 9)).astype(np.float32) * 0.1
    step = encode_with_feedback(get_codec(spec), update, residual, rng)
    np.testing.assert_array_equal(step.sent + step.residual, update + residual)


def test_accounting_over_rounds(rng):
    codec = get_codec("topk:0.02")
    shapes = {"w": (40, 25), "b": (25,)}
    residuals = None
    total_sent = {n: np.zeros(s, np.float64) for n, s in shapes.items()}
    total_update = {n: np.zeros(s, np.float64) for n, s in shapes.items()}
    for _ in range(30):
        update = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
        encoded = encode_update(update, codec, residuals, rng)
        residuals = encoded.residuals
        for name in shapes:
            total_sent[name] += encoded.sent[name]
            total_update[name] += update[name]
    for name in shapes:
        np.testing.assert_allclose(total_sent[name] + residuals[name], total_update[name],
                                   atol=1e-4)


def test_small_entries_arrive_through_the_residual():
    codec = get_codec("topk:0.1")  # one entry of ten per round
    update = np.array([1.0] + [0.3] * 9, np.float32)
    residual = None
    arrived = np.zeros(10)
    for _ in range(20):
        step = encode_with_feedback(codec, update, residual)
        residual = step.residual
        arrived += step.sent
    assert np.all(arrived[1:] > 0), "without feedback the 0.3 entries would never be sent"
    np.testing.assert_allclose(arrived + residual, update * 20, rtol=1e-5)


def test_codecs_without_feedback_return_no_residuals(rng):
    encoded = encode_update({"w": rng.normal(size=9).astype(np.float32)}, get_codec("int8"))
    assert encoded.residuals == {}
