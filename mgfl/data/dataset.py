"""The one shape every data set takes, so that models, partitions and the engine need not care
where the samples came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass
class Dataset:
    """Train and test arrays with labels and the natural client (speaker, subject) of each sample.

    Inputs are float32 of shape ``(N, *input_shape)``: images and audio features as ``(C, H, W)``,
    sensor windows as ``(C, 1, T)``. Labels and groups are int32 indices into :attr:`classes` and
    :attr:`group_names`."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    groups_train: np.ndarray
    groups_test: np.ndarray
    classes: list[str]
    group_names: list[str]
    attribution: str

    def __post_init__(self) -> None:
        self.x_train = np.asarray(self.x_train, dtype=np.float32)
        self.x_test = np.asarray(self.x_test, dtype=np.float32)
        for field in ("y_train", "y_test", "groups_train", "groups_test"):
            setattr(self, field, np.asarray(getattr(self, field), dtype=np.int32))
        self._check()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def subset(
        self,
        *,
        train: int | None = None,
        test: int | None = None,
        classes: Sequence[int] | None = None,
        groups: Sequence[int] | None = None,
        seed: int = 0,
    ) -> Dataset:
        """A smaller copy for quick runs: keeps only the given classes and groups, then at most
        ``train``/``test`` samples drawn with ``seed`` (original order kept). Labels and group ids
        keep their meaning, so :attr:`num_classes` does not change."""
        rng = np.random.default_rng(seed)
        keep_train = _select(self.y_train, self.groups_train, classes, groups, train, rng)
        keep_test = _select(self.y_test, self.groups_test, classes, groups, test, rng)
        return replace(
            self,
            x_train=self.x_train[keep_train],
            y_train=self.y_train[keep_train],
            groups_train=self.groups_train[keep_train],
            x_test=self.x_test[keep_test],
            y_test=self.y_test[keep_test],
            groups_test=self.groups_test[keep_test],
        )

    def _check(self) -> None:
        """Mismatched arrays are a loader bug; catching them here keeps them out of training."""
        for split in ("train", "test"):
            x, y, g = (getattr(self, f"{p}_{split}") for p in ("x", "y", "groups"))
            if not (len(x) == len(y) == len(g)):
                raise ValueError(
                    f"{self.name}: {split} arrays differ in length ({len(x)}, {len(y)}, {len(g)})"
                )
            if len(y) and (y.min() < 0 or y.max() >= len(self.classes)):
                raise ValueError(f"{self.name}: {split} label outside 0..{len(self.classes) - 1}")
            if len(g) and (g.min() < 0 or g.max() >= len(self.group_names)):
                last = len(self.group_names) - 1
                raise ValueError(f"{self.name}: {split} group outside 0..{last}")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(
                f"{self.name}: train inputs {self.x_train.shape[1:]} and test inputs "
                f"{self.x_test.shape[1:]} differ in shape"
            )


def _select(
    labels: np.ndarray,
    groups: np.ndarray,
    classes: Sequence[int] | None,
    keep_groups: Sequence[int] | None,
    limit: int | None,
    rng: np.random.Generator,
) -> np.ndarray:
    mask = np.ones(len(labels), dtype=bool)
    if classes is not None:
        mask &= np.isin(labels, np.asarray(classes))
    if keep_groups is not None:
        mask &= np.isin(groups, np.asarray(keep_groups))
    chosen = np.flatnonzero(mask)
    if limit is not None and limit < len(chosen):
        chosen = np.sort(rng.choice(chosen, size=limit, replace=False))
    return chosen
