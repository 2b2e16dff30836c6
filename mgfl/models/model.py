"""A model described once: its layers, shapes and named parameters, for server and client alike."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from mgfl.models.init import initial_state
from mgfl.models.layers import Layer, Residual, ResidualEnd, Shape


@dataclass(frozen=True)
class ResolvedLayer:
    """One layer placed in its model: where it is, what it sees, what it owns.

    ``params`` and ``buffers`` map full names (``f"{path}.weight"``) to shapes and are empty
    for parameter-free layers and for the residual markers."""

    path: str
    layer: Layer
    input_shape: Shape
    output_shape: Shape
    params: dict[str, Shape]
    buffers: dict[str, Shape]


@dataclass(frozen=True)
class Model:
    """A named stack of layers applied to a per-sample ``input_shape``.

    The description is checked when it is built: a shape that does not fit raises
    ``ValueError`` naming the layer's path."""

    name: str
    input_shape: tuple[int, ...]
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"A model needs a non-empty name, got {self.name!r}")
        shape = tuple(self.input_shape)
        if not shape or any(
            not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1 for d in shape
        ):
            raise ValueError(f"Model input_shape must hold positive ints, got {self.input_shape!r}")
        object.__setattr__(self, "input_shape", tuple(int(d) for d in shape))
        layers = tuple(self.layers)
        for index, layer in enumerate(layers):
            if not isinstance(layer, Layer) or isinstance(layer, ResidualEnd):
                raise ValueError(f"layers.{index} is {layer!r}, which is not a layer")
        object.__setattr__(self, "layers", layers)
        self.resolve()

    def resolve(self) -> list[ResolvedLayer]:
        """Every layer depth-first, in execution order, with its path, shapes and parameters.

        A ``Residual`` at path ``P`` becomes three parts, so that a compiler sees where the skip
        starts and joins:

        1. a ``ResolvedLayer`` whose ``layer`` is the ``Residual`` itself, at path ``P``, with
           ``input_shape == output_shape`` == the block's input: keep ``x`` here;
        2. the body layers, at paths ``f"{P}.body.{i}"`` (nested residuals recurse);
        3. a ``ResolvedLayer`` whose ``layer`` is a ``ResidualEnd``, at the same path ``P``, with
           ``input_shape`` the body's output and ``output_shape`` the block's: add ``x`` here.

        Parts 1 and 3 own no parameters or buffers."""
        resolved: list[ResolvedLayer] = []
        _resolve_into(resolved, self.layers, "layers", self.input_shape)
        return resolved

    @property
    def output_shape(self) -> Shape:
        """The per-sample shape the last layer produces."""
        resolved = self.resolve()
        return resolved[-1].output_shape if resolved else self.input_shape

    @property
    def num_classes(self) -> int:
        """Number of outputs (logits) of a classifier; the output must be flat."""
        shape = self.output_shape
        if len(shape) != 1:
            raise ValueError(
                f"Model {self.name!r} outputs shape {shape}, not flat (classes,) logits"
            )
        return shape[0]

    def parameter_shapes(self) -> dict[str, Shape]:
        """Trainable arrays, ``"<path>.weight"`` and ``"<path>.bias"``, in execution order."""
        return {name: shape for r in self.resolve() for name, shape in r.params.items()}

    def buffer_shapes(self) -> dict[str, Shape]:
        """Non-trainable arrays, ``"<path>.running_mean"`` and ``"<path>.running_var"``."""
        return {name: shape for r in self.resolve() for name, shape in r.buffers.items()}

    def init_state(self, seed: int) -> dict[str, np.ndarray]:
        """Float32 initial parameters and buffers; each array depends only on (seed, its name)."""
        return initial_state(self.resolve(), seed)

    def parameter_count(self) -> int:
        """Number of trainable scalars (buffers excluded)."""
        return sum(prod(shape) for shape in self.parameter_shapes().values())

    def layer_index_of(self, param_name: str) -> int:
        """Position of the layer owning ``param_name`` (or a buffer) among the layers that own
        parameters, counted from 0 at the input: the unit of layer freezing."""
        owners = [r for r in self.resolve() if r.params]
        for index, owner in enumerate(owners):
            if param_name in owner.params or param_name in owner.buffers:
                return index
        raise KeyError(
            f"Model {self.name!r} has no parameter {param_name!r}; it has "
            f"{', '.join(self.parameter_shapes())}"
        )


def _resolve_into(
    resolved: list[ResolvedLayer], layers: tuple[Layer, ...], prefix: str, shape: Shape
) -> Shape:
    for index, layer in enumerate(layers):
        path = f"{prefix}.{index}"
        if isinstance(layer, Residual):
            resolved.append(ResolvedLayer(path, layer, shape, shape, {}, {}))
            body_shape = _resolve_into(resolved, layer.body, f"{path}.body", shape)
            if body_shape != shape:
                raise ValueError(
                    f"{path}: Residual body turns shape {shape} into {body_shape}; the skip "
                    "connection needs them equal"
                )
            resolved.append(ResolvedLayer(path, ResidualEnd(), body_shape, shape, {}, {}))
            continue
        try:
            output = layer.output_shape(shape)
            params = {f"{path}.{k}": v for k, v in layer.parameter_shapes(shape).items()}
            buffers = {f"{path}.{k}": v for k, v in layer.buffer_shapes(shape).items()}
        except ValueError as error:
            raise ValueError(f"{path} ({type(layer).__name__}): {error}") from None
        resolved.append(ResolvedLayer(path, layer, shape, output, params, buffers))
        shape = output
    return shape
