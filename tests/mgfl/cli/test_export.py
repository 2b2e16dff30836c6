"""Weights files handed to ``mgfl export`` are read without unpickling anything."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.cli.export import load_weights


def test_plain_weights_load(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **{"fc.weight": np.ones((2, 3), np.float32)})
    assert load_weights(path, {"fc.weight": (2, 3)})["fc.weight"].shape == (2, 3)


def test_a_file_with_pickled_objects_is_refused(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **{"fc.weight": np.array([{"payload": 1}], dtype=object)})
    with pytest.raises(ValueError, match="pickle"):
        load_weights(path, {"fc.weight": (2, 3)})
