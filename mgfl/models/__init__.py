"""Model descriptions, the model zoo, initialisation and the float64 reference trainer.

``ReferenceTrainer`` is imported on first use: clients, which start a process per message on a
deployed SuperNode, need the descriptions but never the float64 reference."""

from mgfl.models.layers import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    ReLU6,
    Residual,
    ResidualEnd,
    dropout_seed,
)
from mgfl.models.model import Model, ResolvedLayer
from mgfl.models.zoo import ZOO, ZooEntry, build_model

__all__ = [
    "ZOO",
    "AvgPool2d",
    "BatchNorm",
    "Conv2d",
    "DepthwiseConv2d",
    "Dropout",
    "Flatten",
    "GlobalAvgPool",
    "Layer",
    "Linear",
    "MaxPool2d",
    "Model",
    "ReLU",
    "ReLU6",
    "ReferenceTrainer",
    "Residual",
    "ResidualEnd",
    "ResolvedLayer",
    "ZooEntry",
    "build_model",
    "dropout_seed",
]


def __getattr__(name: str):
    if name == "ReferenceTrainer":
        from mgfl.models.reference_trainer import ReferenceTrainer

        return ReferenceTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
