"""Checkpoints are plain .npz files that load without pickle."""

from __future__ import annotations

import numpy as np

from server.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint


def test_round_trip_without_pickle(tmp_path, rng):
    state = {"layers.0.weight": rng.normal(size=(4, 3)).astype(np.float32),
             "layers.1.running_var": rng.uniform(size=4).astype(np.float64)}
    path = save_checkpoint(tmp_path / "run", 7, state)
    assert path == checkpoint_path(tmp_path / "run", 7) == tmp_path / "run" / "round-007.npz"
    with np.load(path, allow_pickle=False) as stored:
        assert sorted(stored.files) == sorted(state)
    loaded = load_checkpoint(path)
    for name, value in state.items():
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], value.astype(np.float32))
    assert not list((tmp_path / "run").glob("*.partial*"))


def test_a_later_save_replaces_the_round(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": np.zeros(2, np.float32)})
    save_checkpoint(tmp_path, 1, {"w": np.ones(2, np.float32)})
    np.testing.assert_array_equal(load_checkpoint(checkpoint_path(tmp_path, 1))["w"], [1, 1])
