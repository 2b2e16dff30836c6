"""Model descriptions: resolution order, residual markers, names, shape errors, initialisation."""

from __future__ import annotations

from math import prod, sqrt

import numpy as np
import pytest

from mgfl.models import (
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    Model,
    ReLU,
    Residual,
    ResidualEnd,
    build_model,
)


def _nested_model() -> Model:
    return Model(
        "nested",
        (3, 8, 8),
        (
            Conv2d(4, 3, padding=1, bias=False),
            Residual((DepthwiseConv2d(3, padding=1), BatchNorm(), ReLU())),
            Residual((Residual((ReLU(),)), Conv2d(4, 1))),
            GlobalAvgPool(),
            Linear(5),
        ),
    )


def test_resolve_is_depth_first_with_residual_start_and_end_markers():
    resolved = _nested_model().resolve()
    order = [(r.path, type(r.layer).__name__) for r in resolved]
    assert order == [
        ("layers.0", "Conv2d"),
        ("layers.1", "Residual"),
        ("layers.1.body.0", "DepthwiseConv2d"),
        ("layers.1.body.1", "BatchNorm"),
        ("layers.1.body.2", "ReLU"),
        ("layers.1", "ResidualEnd"),
        ("layers.2", "Residual"),
        ("layers.2.body.0", "Residual"),
        ("layers.2.body.0.body.0", "ReLU"),
        ("layers.2.body.0", "ResidualEnd"),
        ("layers.2.body.1", "Conv2d"),
        ("layers.2", "ResidualEnd"),
        ("layers.3", "GlobalAvgPool"),
        ("layers.4", "Linear"),
    ]
    for r in resolved:
        if isinstance(r.layer, (Residual, ResidualEnd)):
            assert r.input_shape == r.output_shape == (4, 8, 8)
            assert r.params == {} and r.buffers == {}
    assert resolved[1].layer == _nested_model().layers[1]
    # Each layer's input is the previous entry's output, markers included.
    for before, after in zip(resolved, resolved[1:], strict=False):
        assert after.input_shape == before.output_shape


def test_parameter_and_buffer_names_follow_the_paths():
    model = _nested_model()
    assert model.parameter_shapes() == {
        "layers.0.weight": (4, 3, 3, 3),
        "layers.1.body.0.weight": (4, 1, 3, 3),
        "layers.1.body.0.bias": (4,),
        "layers.1.body.1.weight": (4,),
        "layers.1.body.1.bias": (4,),
        "layers.2.body.1.weight": (4, 4, 1, 1),
        "layers.2.body.1.bias": (4,),
        "layers.4.weight": (5, 4),
        "layers.4.bias": (5,),
    }
    assert model.buffer_shapes() == {
        "layers.1.body.1.running_mean": (4,),
        "layers.1.body.1.running_var": (4,),
    }
    assert model.parameter_count() == 108 + 36 + 4 + 8 + 16 + 4 + 20 + 5
    assert model.output_shape == (5,)
    assert model.num_classes == 5


def test_layer_index_counts_only_layers_with_parameters():
    model = _nested_model()
    assert model.layer_index_of("layers.0.weight") == 0
    assert model.layer_index_of("layers.1.body.0.bias") == 1
    assert model.layer_index_of("layers.1.body.1.weight") == 2
    assert model.layer_index_of("layers.1.body.1.running_var") == 2
    assert model.layer_index_of("layers.2.body.1.weight") == 3
    assert model.layer_index_of("layers.4.bias") == 4
    with pytest.raises(KeyError, match="layers.3.weight"):
        model.layer_index_of("layers.3.weight")


@pytest.mark.parametrize(
    ("layers", "path", "message"),
    [
        ((Conv2d(4, 3), Linear(10)), r"layers\.1 \(Linear\)", "Flatten"),
        (
            (Conv2d(4, 3), Residual((Conv2d(8, 1),))),
            r"layers\.1: Residual",
            r"\(4, 6, 6\) into \(8, 6, 6\)",
        ),
        (
            (Residual((ReLU(), Conv2d(3, 9, padding=0))),),
            r"layers\.0\.body\.1 \(Conv2d\)",
            "larger than its padded input",
        ),
        ((Flatten(), BatchNorm(), MaxPool2d(2)), r"layers\.2 \(MaxPool2d\)", r"\(C, H, W\)"),
    ],
)
def test_shape_errors_name_the_layer_path(layers, path, message):
    with pytest.raises(ValueError, match=path) as error:
        Model("bad", (3, 8, 8), layers)
    assert error.match(message)


def test_description_values_are_checked():
    with pytest.raises(ValueError, match="input_shape"):
        Model("m", (3, 0, 8), (Flatten(),))
    with pytest.raises(ValueError, match="not a layer"):
        Model("m", (3, 8, 8), (Flatten(), "relu"))
    with pytest.raises(ValueError, match="not a layer"):
        Model("m", (3, 8, 8), (ResidualEnd(),))
    with pytest.raises(ValueError, match="name"):
        Model("", (3, 8, 8), (Flatten(),))
    with pytest.raises(ValueError, match="not flat"):
        _ = Model("m", (3, 8, 8), (ReLU(),)).num_classes


def test_lists_are_accepted_and_stored_as_tuples():
    model = Model("m", [1, 4, 4], [Flatten(), Linear(2)])
    assert model.input_shape == (1, 4, 4) and isinstance(model.layers, tuple)
    assert model == Model("m", (1, 4, 4), (Flatten(), Linear(2)))


def test_init_is_deterministic_and_float32():
    model = _nested_model()
    first, again, other = model.init_state(3), model.init_state(3), model.init_state(4)
    assert list(first) == [name for r in model.resolve() for name in {**r.params, **r.buffers}]
    for name, array in first.items():
        assert array.dtype == np.float32
        assert array.shape == {**model.parameter_shapes(), **model.buffer_shapes()}[name]
        np.testing.assert_array_equal(array, again[name])
    assert not np.array_equal(first["layers.0.weight"], other["layers.0.weight"])
    assert not np.array_equal(first["layers.0.weight"], first["layers.2.body.1.weight"][:, :3])


def test_a_parameter_starts_the_same_whatever_else_the_model_holds():
    small = Model("a", (1, 6, 6), (Flatten(), Linear(8)))
    large = Model("b", (1, 6, 6), (Flatten(), Linear(8), ReLU(), Linear(3), ReLU(), Linear(2)))
    a, b = small.init_state(11), large.init_state(11)
    np.testing.assert_array_equal(a["layers.1.weight"], b["layers.1.weight"])
    np.testing.assert_array_equal(a["layers.1.bias"], b["layers.1.bias"])


def test_init_follows_the_documented_rules():
    model = Model(
        "m",
        (16, 6, 6),
        (Conv2d(64, 3), BatchNorm(), DepthwiseConv2d(3), Flatten(), Linear(300)),
    )
    state = model.init_state(0)
    for name, fan_in in [
        ("layers.0", 16 * 9),
        ("layers.2", 9),
        ("layers.4", 64 * 2 * 2),
    ]:
        bound = 1.0 / sqrt(fan_in)
        for part in ("weight", "bias"):
            values = state[f"{name}.{part}"].astype(np.float64)
            assert np.all(np.abs(values) <= bound)
        weight = state[f"{name}.weight"].astype(np.float64)
        if weight.size > 1000:  # a uniform U(-b, b) has standard deviation b / sqrt(3)
            assert abs(weight.std() - bound / sqrt(3)) < 0.05 * bound
            assert abs(weight.mean()) < 0.05 * bound
    np.testing.assert_array_equal(state["layers.1.weight"], np.ones(64, np.float32))
    np.testing.assert_array_equal(state["layers.1.bias"], np.zeros(64, np.float32))
    np.testing.assert_array_equal(state["layers.1.running_mean"], np.zeros(64, np.float32))
    np.testing.assert_array_equal(state["layers.1.running_var"], np.ones(64, np.float32))
    with pytest.raises(ValueError, match="seed"):
        model.init_state(-1)


def test_parameter_count_matches_the_initial_state():
    model = build_model("lenet5")
    state = model.init_state(0)
    assert model.parameter_count() == sum(
        prod(state[name].shape) for name in model.parameter_shapes()
    )
