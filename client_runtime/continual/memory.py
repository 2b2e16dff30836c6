"""A fixed-budget exemplar memory, balanced across classes.

The budget is a number of samples and optionally a number of bytes; the memory holds as many
exemplars as both allow at its storage precision, split evenly over the classes seen so far.
When classes arrive every class's share shrinks and each old class keeps the first exemplars of
its selection order (rebalancing). The memory lives on the client and never leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from client_runtime.continual.storage import StoredSamples, bytes_per_sample


@dataclass(frozen=True)
class MemoryBudget:
    samples: int = 200
    bytes: int | None = None

    def __post_init__(self) -> None:
        if self.samples < 0 or (self.bytes is not None and self.bytes < 0):
            raise ValueError(f"a memory budget cannot be negative: {self}")

    def capacity(self, sample_bytes: int) -> int:
        """How many exemplars of ``sample_bytes`` each fit in both budgets."""
        if self.bytes is None:
            return self.samples
        return min(self.samples, self.bytes // sample_bytes)


class ExemplarMemory:
    """Per-class exemplars in selection order, stored at ``dtype``."""

    def __init__(self, budget: MemoryBudget, dtype: str, sample_shape: tuple[int, ...]):
        self.budget = budget
        self.dtype = dtype
        self.sample_shape = tuple(sample_shape)
        self.sample_bytes = bytes_per_sample(self.sample_shape, dtype)
        self.capacity = budget.capacity(self.sample_bytes)
        self._store: dict[int, StoredSamples] = {}

    @property
    def classes(self) -> list[int]:
        return sorted(self._store)

    def quota(self, num_classes: int) -> int:
        """Exemplars per class once ``num_classes`` classes share the memory."""
        return self.capacity // num_classes if num_classes else 0

    def add_classes(self, exemplars: dict[int, np.ndarray]) -> None:
        """Store the ordered exemplars of new classes and shrink every class to the new quota."""
        overlap = sorted(set(exemplars) & set(self._store))
        if overlap:
            raise ValueError(f"classes {overlap} already have exemplars")
        quota = self.quota(len(self._store) + len(exemplars))
        for label, samples in exemplars.items():
            samples = np.asarray(samples, np.float32)
            if samples.shape[1:] != self.sample_shape:
                raise ValueError(
                    f"exemplars of class {label} have shape {samples.shape[1:]}, the memory "
                    f"holds {self.sample_shape}"
                )
            self._store[int(label)] = StoredSamples.encode(samples[:quota], self.dtype)
        for label in self._store:
            self._store[label] = self._store[label].head(quota)

    def stored(self) -> dict[int, StoredSamples]:
        """The exemplars in storage form, to keep in a client's own state between rounds."""
        return dict(self._store)

    def load(self, stored: dict[int, StoredSamples]) -> None:
        """Restore exemplars saved with :meth:`stored`."""
        for label, samples in stored.items():
            if samples.dtype != self.dtype or samples.data.shape[1:] != self.sample_shape:
                raise ValueError(f"stored exemplars of class {label} do not fit this memory")
            self._store[int(label)] = samples

    def counts(self) -> dict[int, int]:
        return {label: len(stored) for label, stored in sorted(self._store.items())}

    def class_samples(self, label: int) -> np.ndarray:
        return self._store[label].decode()

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """Every exemplar as float32, with its label (the replay set of the next task)."""
        xs = [self._store[c].decode() for c in self.classes]
        ys = [np.full(len(self._store[c]), c, np.int32) for c in self.classes]
        if not xs:
            return np.zeros((0, *self.sample_shape), np.float32), np.zeros(0, np.int32)
        return np.concatenate(xs), np.concatenate(ys)

    def __len__(self) -> int:
        return sum(len(s) for s in self._store.values())

    @property
    def nbytes(self) -> int:
        """Bytes the stored exemplars take (data and int8 scales)."""
        return sum(s.nbytes for s in self._store.values())
