"""The growing head keeps old rows and initialises new ones; the feature model drops the head."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.continual.head import feature_model, feature_state, grow_head
from mgfl.models import Linear, Model, ReLU, build_model


def test_growing_keeps_the_network_and_old_rows():
    model = build_model("mlp", input_shape=(1, 4, 4), num_classes=3, hidden=(8,))
    state = {k: v + 1.0 for k, v in model.init_state(0).items()}
    grown, new_state = grow_head(model, state, 5, seed=0)
    assert grown.num_classes == 5
    head = "layers.3"
    np.testing.assert_array_equal(new_state[f"{head}.weight"][:3], state[f"{head}.weight"])
    np.testing.assert_array_equal(new_state[f"{head}.bias"][:3], state[f"{head}.bias"])
    fresh = grown.init_state(0)
    np.testing.assert_array_equal(new_state[f"{head}.weight"][3:], fresh[f"{head}.weight"][3:])
    np.testing.assert_array_equal(new_state["layers.1.weight"], state["layers.1.weight"])
    with pytest.raises(ValueError, match="only grows"):
        grow_head(grown, new_state, 4, seed=0)


def test_feature_model_and_state():
    model = Model("m", (6,), (Linear(5), ReLU(), Linear(3)))
    features = feature_model(model)
    assert features.output_shape == (5,)
    assert set(feature_state(model, model.init_state(0))) == {"layers.0.weight", "layers.0.bias"}


def test_a_model_without_a_linear_head_is_refused():
    with pytest.raises(ValueError, match="Linear last layer"):
        feature_model(Model("m", (6,), (Linear(5), ReLU())))
