"""Freezing policies: which parameters a compiled step trains.

Frozen parameters get no gradient kernels and no optimizer state, and activations that only their
weight gradients would read are not kept (the planner sees no reader), which is where the memory
saving of transfer learning comes from (TinyTL trains biases only).

The two TinyTL policies freeze every weight. Their BatchNorms then keep their running statistics
(``mgfl.models.frozen_statistics``) and act as affine maps, and ReLU/ReLU6 keep a byte mask
instead of their output, so almost no activation is stored:
- ``bias``: biases and BatchNorm shifts (beta). Nothing but masks is kept for backward.
- ``bias+norm``: also BatchNorm scales (gamma), whose gradient reads each BatchNorm's input, kept
  in float32: twice the trainable parameters, but only 1.7-1.9x below full training's arena
  (``bias``: 8-14x; DS-CNN and MobileNetV2-0.35 at batch 32, README's Memory table).
"""

from __future__ import annotations

import fnmatch

from mgfl.models import layers as L
from mgfl.models.model import Model

POLICIES = (
    "all | head | last:K | bias (biases and BatchNorm shifts) | bias+norm (biases and all "
    "BatchNorm parameters) | NAME[,NAME...] (shell-style patterns allowed)"
)
_WEIGHT_LAYERS = (L.Linear, L.Conv2d, L.DepthwiseConv2d)


def _weight_layer_groups(model: Model) -> list[list[str]]:
    """Parameter names grouped by weight layer (Linear or convolution), each with the BatchNorms
    that follow it before the next weight layer, in execution order."""
    groups: list[list[str]] = []
    for rl in model.resolve():
        if not rl.params:
            continue
        if isinstance(rl.layer, _WEIGHT_LAYERS) or not groups:
            groups.append(list(rl.params))
        else:
            groups[-1].extend(rl.params)
    return groups


def resolve_trainable(model: Model, policy: str | None) -> set[str]:
    """The trainable parameter names of ``model`` under ``policy``; a clear error otherwise."""
    names = list(model.parameter_shapes())
    policy = (policy or "all").strip()
    if policy in ("all", "none", "full"):
        return set(names)
    groups = _weight_layer_groups(model)
    if policy == "head":
        return set(groups[-1]) if groups else set()
    if policy.startswith("last:"):
        count = policy.split(":", 1)[1]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"last:K needs a positive K, got {policy!r}")
        return {n for group in groups[-int(count) :] for n in group}
    if policy in ("bias", "bias+norm"):
        biases = {n for n in names if n.endswith(".bias")}  # BatchNorm's shift is its bias
        if policy == "bias":
            return biases
        bn_params = {
            n for rl in model.resolve() if isinstance(rl.layer, L.BatchNorm) for n in rl.params
        }
        return biases | bn_params
    chosen: set[str] = set()
    for pattern in (p.strip() for p in policy.split(",") if p.strip()):
        matched = fnmatch.filter(names, pattern)
        if not matched:
            raise ValueError(
                f"Freezing policy {policy!r}: {pattern!r} matches no parameter. Policies: "
                f"{POLICIES}. Parameters look like {names[:3]}"
            )
        chosen.update(matched)
    return chosen
