"""The model zoo: every model's shapes, parameter counts and options."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest

from mgfl.models import (
    ZOO,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    GlobalAvgPool,
    Linear,
    Residual,
    ResidualEnd,
    build_model,
)
from mgfl.models.zoo import make_divisible


def _buffer_count(model) -> int:
    return sum(prod(shape) for shape in model.buffer_shapes().values())


@pytest.mark.parametrize(
    ("name", "input_shape", "classes", "parameters", "buffers"),
    [
        ("mlp", (1, 28, 28), 16, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 16 + 16, 0),
        ("lenet5", (1, 28, 28), 10, 61_706, 0),
        # first conv 64*10*4, four blocks of depthwise 64*9 + pointwise 64*64, 9 BatchNorms
        (
            "dscnn",
            (1, 49, 10),
            12,
            64 * 40 + 4 * (64 * 9 + 64 * 64) + 9 * 128 + 64 * 12 + 12,
            9 * 128,
        ),
        # convolutions 6*5*32 + 32*5*64 + 64*3*64 without bias, 3 BatchNorms, 64 -> 7 classes
        ("cnn1d", (6, 1, 128), 7, 960 + 10240 + 12288 + 2 * (32 + 64 + 64) + 64 * 7 + 7, 320),
    ],
)
def test_defaults_shapes_and_parameter_counts(name, input_shape, classes, parameters, buffers):
    model = build_model(name)
    assert model.name == name
    assert model.input_shape == input_shape
    assert model.output_shape == (classes,) and model.num_classes == classes
    assert model.parameter_count() == parameters
    assert _buffer_count(model) == buffers


def test_every_zoo_model_initialises_to_its_shapes():
    for name in ZOO:
        model = build_model(name)
        state = model.init_state(0)
        expected = {**model.parameter_shapes(), **model.buffer_shapes()}
        assert {k: v.shape for k, v in state.items()} == expected
        assert all(np.all(np.isfinite(v)) for v in state.values())


def test_lenet5_layer_shapes():
    shapes = [r.output_shape for r in build_model("lenet5").resolve()]
    assert shapes == [
        (6, 28, 28), (6, 28, 28), (6, 14, 14),
        (16, 10, 10), (16, 10, 10), (16, 5, 5),
        (400,), (120,), (120,), (84,), (84,), (10,),
    ]  # fmt: skip


def test_dscnn_follows_hello_edge():
    resolved = build_model("dscnn").resolve()
    assert resolved[0].output_shape == (64, 25, 5)
    assert sum(isinstance(r.layer, DepthwiseConv2d) for r in resolved) == 4
    assert sum(isinstance(r.layer, BatchNorm) for r in resolved) == 9
    assert not any(isinstance(r.layer, Dropout) for r in resolved)
    narrow = build_model("dscnn", channels=32, dropout=0.2, num_classes=35)
    layers = narrow.resolve()
    assert layers[0].output_shape == (32, 25, 5)
    assert isinstance(layers[-2].layer, Dropout) and layers[-2].layer.p == 0.2
    assert isinstance(layers[-3].layer, GlobalAvgPool)
    assert narrow.num_classes == 35


def test_cnn1d_pools_along_time_only():
    shapes = [r.output_shape for r in build_model("cnn1d").resolve()]
    assert (32, 1, 64) in shapes and (64, 1, 32) in shapes
    assert shapes[-2:] == [(64,), (7,)]


def test_make_divisible_matches_the_mobilenet_rule():
    assert [make_divisible(c * 0.35) for c in (32, 16, 24, 32, 64, 96, 160, 320)] == [
        16, 8, 8, 16, 24, 32, 56, 112,
    ]  # fmt: skip
    assert make_divisible(1280) == 1280


def test_mobilenetv2_at_width_one_has_the_reference_parameter_count():
    """torchvision's mobilenet_v2() has 3,504,872 trainable parameters and 34,112 BatchNorm
    running statistics (Keras counts their sum, 3,538,984); strides do not change counts."""
    model = build_model(
        "mobilenetv2", input_shape=(3, 224, 224), num_classes=1000, width=1.0, small_input=False
    )
    assert model.parameter_count() == 3_504_872
    assert _buffer_count(model) == 34_112
    assert model.resolve()[-3].output_shape == (1280, 7, 7)


def test_mobilenetv2_default_parameter_count():
    """Counted by hand from the width-0.35 channel plan: 16-channel stem, then (t, c, n)."""
    count, channels = 3 * 9 * 16 + 2 * 16, 16
    for expansion, out, repeats in [
        (1, 8, 1), (6, 8, 2), (6, 16, 3), (6, 24, 4), (6, 32, 3), (6, 56, 3), (6, 112, 1),
    ]:  # fmt: skip
        for _ in range(repeats):
            hidden = channels * expansion
            if expansion != 1:
                count += channels * hidden + 2 * hidden  # 1x1 expand + BatchNorm
            count += 9 * hidden + 2 * hidden  # 3x3 depthwise + BatchNorm
            count += hidden * out + 2 * out  # 1x1 project + BatchNorm
            channels = out
    count += channels * 1280 + 2 * 1280 + 1280 * 10 + 10
    assert build_model("mobilenetv2").parameter_count() == count


def test_mobilenetv2_small_input_layout():
    model = build_model("mobilenetv2")
    resolved = model.resolve()
    assert model.input_shape == (3, 32, 32) and model.num_classes == 10
    stem = resolved[0].layer
    assert isinstance(stem, Conv2d) and stem.stride == (1, 1) and stem.out_channels == 16
    convs = [r.layer for r in resolved if isinstance(r.layer, (Conv2d, DepthwiseConv2d))]
    assert all(not layer.bias for layer in convs)
    # Outputs of the 17 project convolutions: one 1x1 conv after each depthwise.
    projects = [
        resolved[i + 3].output_shape
        for i, r in enumerate(resolved)
        if isinstance(r.layer, DepthwiseConv2d)
    ]
    assert [shape[0] for shape in projects] == [8] + [8] * 2 + [16] * 3 + [24] * 4 + [32] * 3 + [
        56
    ] * 3 + [112]
    # With the first two stride-2 stages at stride 1, the maps go 32 -> 16 -> 8.
    assert [shape[1] for shape in projects] == [32] * 6 + [16] * 7 + [8] * 4
    # A residual wraps each stride-1 block whose input and output widths agree: every repeat
    # after a stage's first, and at width 0.35 also the first c=24 block (8 -> 8 channels,
    # stride 1 here): 2 + 2 + 3 + 2 + 2.
    assert sum(isinstance(r.layer, Residual) for r in resolved) == 11
    assert sum(isinstance(r.layer, ResidualEnd) for r in resolved) == 11
    assert resolved[-4].output_shape == (1280, 8, 8)
    assert isinstance(resolved[-1].layer, Linear)
    with_dropout = build_model("mobilenetv2", dropout=0.2, width=0.5)
    assert isinstance(with_dropout.resolve()[-2].layer, Dropout)


def test_overrides_and_options():
    mlp = build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=(32,))
    assert mlp.parameter_count() == 64 * 32 + 32 + 32 * 10 + 10
    assert build_model("lenet5", num_classes=62).num_classes == 62


def test_unknown_names_and_options_are_clear_errors():
    with pytest.raises(ValueError, match="cnn1d, dscnn, lenet5, mlp, mobilenetv2"):
        build_model("resnet50")
    with pytest.raises(ValueError, match="no option width; options: channels, dropout"):
        build_model("dscnn", width=2)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", num_classes=0)
