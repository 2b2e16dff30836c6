"""Which BatchNorm layers train with frozen statistics (TinyTL-style transfer learning).

When a weight layer is frozen but the BatchNorm after it trains (its shift, or shift and scale),
the feature extractor is being adapted, not retrained: the BatchNorm keeps the running statistics
it was trained with and acts as the affine map ``y = gamma * (x - mean) / sqrt(var + eps) + beta``
in training too. Its statistics do not move, and its backward needs no stored input except for
gamma's gradient. A BatchNorm whose parameters are all frozen, or whose weight layer trains, keeps
batch statistics as before. The engine and the float64 reference read this one rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from mgfl.models import layers as L
from mgfl.models.model import Model

_WEIGHT_LAYERS = (L.Linear, L.Conv2d, L.DepthwiseConv2d)


def frozen_statistics_layers(model: Model, trainable: Iterable[str]) -> set[str]:
    """Paths of the BatchNorm layers of ``model`` that run over their running statistics when
    ``trainable`` parameters train: those after a frozen weight, with a parameter of their own
    that trains."""
    trainable = set(trainable)
    frozen: set[str] = set()
    weight_frozen = False  # no weight layer yet: nothing to keep statistics for
    for rl in model.resolve():
        if isinstance(rl.layer, _WEIGHT_LAYERS):
            weight_frozen = f"{rl.path}.weight" not in trainable
        elif isinstance(rl.layer, L.BatchNorm):
            if weight_frozen and any(p in trainable for p in rl.params):
                frozen.add(rl.path)
    return frozen
