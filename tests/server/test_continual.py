"""Merging replies whose heads have different sizes."""

from __future__ import annotations

import numpy as np
import pytest

from server.continual import merge_growing_head

HEAD = "layers.2"


def _state(rows: int, fill: float, features: int = 3) -> dict[str, np.ndarray]:
    return {
        "layers.0.weight": np.full((4, 5), fill, np.float32),
        f"{HEAD}.weight": np.arange(rows * features, dtype=np.float32).reshape(rows, features)
        + fill,
        f"{HEAD}.bias": np.full(rows, fill, np.float32),
    }


def test_rows_are_averaged_over_the_clients_that_know_them():
    global_state = _state(2, 0.0)
    a, b = _state(4, 1.0), _state(2, 3.0)  # a knows 4 classes, b still 2
    merged = merge_growing_head(global_state, HEAD, [(a, 30, 4), (b, 10, 2)])
    np.testing.assert_allclose(merged["layers.0.weight"], 0.75 * 1.0 + 0.25 * 3.0)
    w = merged[f"{HEAD}.weight"]
    assert w.shape == (4, 3)
    np.testing.assert_allclose(w[:2], 0.75 * a[f"{HEAD}.weight"][:2] + 0.25 * b[f"{HEAD}.weight"])
    np.testing.assert_allclose(w[2:], a[f"{HEAD}.weight"][2:])  # only a sent rows 2 and 3
    np.testing.assert_allclose(merged[f"{HEAD}.bias"], [1.5, 1.5, 1.0, 1.0])


def test_rows_nobody_sent_keep_their_global_value():
    global_state = _state(4, 5.0)
    merged = merge_growing_head(global_state, HEAD, [(_state(2, 1.0), 8, 2)])
    np.testing.assert_allclose(merged[f"{HEAD}.weight"][2:], global_state[f"{HEAD}.weight"][2:])
    np.testing.assert_allclose(merged[f"{HEAD}.bias"], [1.0, 1.0, 5.0, 5.0])


def test_no_replies_keep_the_global_model():
    state = _state(2, 1.0)
    merged = merge_growing_head(state, HEAD, [])
    assert all(np.array_equal(merged[k], state[k]) for k in state)


def test_mismatched_backbones_fail_loudly():
    with pytest.raises(ValueError):
        merge_growing_head(_state(2, 0.0), HEAD, [(_state(2, 1.0, features=4), 1, 2)])
