"""Which arrays of a model travel in a federated round, and which stay where they are.

Only trainable parameters travel (both ways), together with the BatchNorm running statistics:
those are buffers, not parameters, but every client's training changes them and the server's
evaluation is wrong without them. Frozen parameters never travel: both sides rebuild them from the
run's model seed, and the server sends a digest of its frozen arrays so that a client whose
rebuild differs refuses to train instead of silently training a different model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mgfl.models.model import Model


@dataclass(frozen=True)
class UpdateLayout:
    """The names (in model order) and shapes of a model's arrays, split by what travels."""

    trainable: tuple[str, ...]
    buffers: tuple[str, ...]
    frozen: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: Model, trainable: set[str]) -> UpdateLayout:
        params = model.parameter_shapes()
        unknown = set(trainable) - set(params)
        if unknown:
            raise ValueError(f"trainable names not in {model.name}: {sorted(unknown)[:5]}")
        buffers = model.buffer_shapes()
        return cls(
            trainable=tuple(n for n in params if n in trainable),
            buffers=tuple(buffers),
            frozen=tuple(n for n in params if n not in trainable),
            shapes={**{n: tuple(s) for n, s in params.items()},
                    **{n: tuple(s) for n, s in buffers.items()}},
        )

    @property
    def travelling(self) -> tuple[str, ...]:
        return self.trainable + self.buffers

    def travelling_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: self.shapes[name] for name in self.travelling}

    def frozen_digest(self, state: Mapping[str, np.ndarray]) -> str:
        """A short hash of the frozen arrays' names and float32 bytes."""
        digest = hashlib.sha256()
        for name in self.frozen:
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(state[name], "<f4").tobytes())
        return digest.hexdigest()[:16]
