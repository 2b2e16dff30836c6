"""Initial parameters, reproducible from (seed, parameter name) alone.

Each array draws from its own generator, ``np.random.default_rng([seed, crc32(name)])``, so a
parameter starts the same whatever else the model holds, on every machine. The rules are
PyTorch's defaults:

- weights of Linear, Conv2d and DepthwiseConv2d: Kaiming uniform with ``a = sqrt(5)``, that is
  ``U(-b, b)`` with ``b = sqrt(6 / ((1 + 5) * fan_in)) = 1 / sqrt(fan_in)``, where ``fan_in`` is
  the product of the weight's shape after its first axis;
- their biases: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with the weight's ``fan_in``;
- BatchNorm: weight 1, bias 0, running_mean 0, running_var 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from math import prod, sqrt
from typing import TYPE_CHECKING

import numpy as np

from mgfl.models.layers import BatchNorm, Conv2d, DepthwiseConv2d, Layer, Linear, Shape

if TYPE_CHECKING:
    from mgfl.models.model import ResolvedLayer


def check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"An initialisation seed must be a non-negative int, got {seed!r}")


def parameter_rng(seed: int, name: str) -> np.random.Generator:
    """The generator of one named array; depends on nothing but ``seed`` and ``name``."""
    check_seed(seed)
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def initial_array(
    layer: Layer, local_name: str, shape: Shape, weight_shape: Shape | None, seed: int, name: str
) -> np.ndarray:
    """The float32 initial value of ``name`` (``local_name`` is its last part, e.g. ``"bias"``).

    ``weight_shape`` is the shape of the layer's weight, which sets a bias's fan-in."""
    if isinstance(layer, BatchNorm):
        fill = 1.0 if local_name in ("weight", "running_var") else 0.0
        return np.full(shape, fill, dtype=np.float32)
    if isinstance(layer, (Linear, Conv2d, DepthwiseConv2d)) and local_name in ("weight", "bias"):
        fan_in = prod((weight_shape or shape)[1:])
        bound = 1.0 / sqrt(fan_in)
        values = parameter_rng(seed, name).uniform(-bound, bound, size=shape)
        return values.astype(np.float32)
    raise ValueError(f"No initialisation rule for {name!r} of a {type(layer).__name__}")


def initial_state(resolved: Iterable[ResolvedLayer], seed: int) -> dict[str, np.ndarray]:
    """Parameters then buffers of each layer, in execution order, as float32 arrays."""
    check_seed(seed)
    state: dict[str, np.ndarray] = {}
    for entry in resolved:
        weight_shape = entry.params.get(f"{entry.path}.weight")
        for name, shape in {**entry.params, **entry.buffers}.items():
            local_name = name.rsplit(".", 1)[1]
            state[name] = initial_array(entry.layer, local_name, shape, weight_shape, seed, name)
    return state
