"""Layer descriptions: argument normalisation, validation and per-sample shapes."""

from __future__ import annotations

import dataclasses
import zlib

import pytest

from mgfl.models.layers import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    dropout_seed,
)


def test_int_arguments_become_pairs_and_pool_stride_defaults_to_kernel():
    conv = Conv2d(8, 3, stride=2, padding=(0, 1))
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (2, 2), (0, 1))
    pool = MaxPool2d((1, 2))
    assert (pool.kernel_size, pool.stride, pool.padding) == ((1, 2), (1, 2), (0, 0))
    assert AvgPool2d(3, stride=1).stride == (1, 1)
    assert Conv2d(8, 3) == Conv2d(8, (3, 3), stride=(1, 1), padding=0)
    assert hash(Conv2d(8, 3)) == hash(Conv2d(8, (3, 3)))


def test_layers_are_frozen():
    layer = Linear(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layer.out_features = 5


@pytest.mark.parametrize(
    "make",
    [
        lambda: Linear(0),
        lambda: Conv2d(4, 0),
        lambda: Conv2d(4, (3, 3, 3)),
        lambda: Conv2d(4, 3, stride=0),
        lambda: Conv2d(4, 3, padding=-1),
        lambda: DepthwiseConv2d(True),
        lambda: MaxPool2d(2, padding=2),
        lambda: AvgPool2d(3, padding=2),
        lambda: BatchNorm(momentum=1.5),
        lambda: BatchNorm(eps=0.0),
        lambda: Dropout(1.0),
        lambda: Dropout(-0.1),
        lambda: Residual(()),
        lambda: Residual((ReLU(), "relu")),
    ],
)
def test_invalid_arguments_are_rejected(make):
    with pytest.raises(ValueError):
        make()


def test_shapes_and_parameters_of_each_layer():
    image = (3, 11, 7)
    conv = Conv2d(5, (3, 2), stride=2, padding=1)
    assert conv.output_shape(image) == (5, 6, 4)
    assert conv.parameter_shapes(image) == {"weight": (5, 3, 3, 2), "bias": (5,)}
    assert Conv2d(5, 1, bias=False).parameter_shapes(image) == {"weight": (5, 3, 1, 1)}
    depthwise = DepthwiseConv2d(3, stride=2, padding=1)
    assert depthwise.output_shape(image) == (3, 6, 4)
    assert depthwise.parameter_shapes(image) == {"weight": (3, 1, 3, 3), "bias": (3,)}
    assert MaxPool2d(3, stride=2, padding=1).output_shape(image) == (3, 6, 4)
    assert AvgPool2d(2).output_shape(image) == (3, 5, 3)
    assert GlobalAvgPool().output_shape(image) == (3,)
    assert Flatten().output_shape(image) == (231,)
    assert Linear(4).parameter_shapes((231,)) == {"weight": (4, 231), "bias": (4,)}
    assert BatchNorm().buffer_shapes(image) == {"running_mean": (3,), "running_var": (3,)}
    assert BatchNorm().parameter_shapes((6,)) == {"weight": (6,), "bias": (6,)}
    assert Residual((Conv2d(3, 3, padding=1), ReLU())).output_shape(image) == image


@pytest.mark.parametrize(
    ("layer", "shape", "message"),
    [
        (Linear(4), (3, 4, 4), "Flatten"),
        (Conv2d(4, 5), (3, 4, 9), "larger than its padded input"),
        (MaxPool2d(2), (8,), r"\(C, H, W\)"),
        (GlobalAvgPool(), (8,), r"\(C, H, W\)"),
        (BatchNorm(), (3, 4), r"\(C, H, W\) or \(F,\)"),
        (Residual((Conv2d(4, 1),)), (3, 5, 5), "needs them equal"),
    ],
)
def test_shape_errors_say_what_is_wrong(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer.output_shape(shape)


def test_dropout_seed_is_the_crc32_of_the_path():
    assert dropout_seed("layers.7") == zlib.crc32(b"layers.7")
    assert dropout_seed("layers.7") != dropout_seed("layers.8")
