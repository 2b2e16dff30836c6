"""The classifier head that grows as classes arrive, and the feature extractor below it.

A model's last layer must be a ``Linear``: its rows are the classes in order of arrival. Growing
builds the same model with more rows, keeps the old rows and the rest of the network, and gives
the new rows the model's own initialisation (seeded, so runs repeat)."""

from __future__ import annotations

import numpy as np

from mgfl.models.layers import Linear
from mgfl.models.model import Model


def head_path(model: Model) -> str:
    """Path of the classifier (the last layer), which must be a Linear."""
    last = model.resolve()[-1]
    if not isinstance(last.layer, Linear):
        raise ValueError(
            f"class-incremental learning needs a Linear last layer; {model.name!r} ends with "
            f"{type(last.layer).__name__}"
        )
    return last.path


def with_classes(model: Model, num_classes: int) -> Model:
    """The same network with a head of ``num_classes`` outputs."""
    head_path(model)
    head = Linear(num_classes, model.layers[-1].bias)
    return Model(model.name, model.input_shape, (*model.layers[:-1], head))


def grow_head(
    model: Model, state: dict[str, np.ndarray], num_classes: int, seed: int
) -> tuple[Model, dict[str, np.ndarray]]:
    """``model`` with ``num_classes`` outputs and ``state`` carried over: old head rows kept,
    new rows initialised as the model would initialise them."""
    old = model.num_classes
    if num_classes < old:
        raise ValueError(f"the head only grows: {old} classes cannot become {num_classes}")
    grown = with_classes(model, num_classes)
    fresh = grown.init_state(seed)
    path = head_path(grown)
    new_state = {name: np.array(value, np.float32) for name, value in state.items()}
    for suffix in ("weight", "bias"):
        name = f"{path}.{suffix}"
        if name in fresh:
            merged = fresh[name].copy()
            merged[:old] = state[name]
            new_state[name] = merged
    return grown, new_state


def feature_model(model: Model) -> Model:
    """The network without its head: its output is the feature vector exemplars are chosen on."""
    head_path(model)
    if len(model.layers) < 2:
        raise ValueError(f"{model.name!r} has no layers below its head")
    return Model(f"{model.name}-features", model.input_shape, model.layers[:-1])


def feature_state(model: Model, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The part of ``state`` the feature extractor owns (everything but the head)."""
    prefix = head_path(model) + "."
    return {name: value for name, value in state.items() if not name.startswith(prefix)}
