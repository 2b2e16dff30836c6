"""Class-incremental learning on the engine: exemplar memory, selection, growing head, learner."""

from client_runtime.continual.learner import (
    IncrementalConfig,
    IncrementalLearner,
    IncrementReport,
)
from client_runtime.continual.memory import ExemplarMemory, MemoryBudget
from client_runtime.continual.storage import STORAGE_DTYPES, StoredSamples, bytes_per_sample

__all__ = [
    "STORAGE_DTYPES",
    "ExemplarMemory",
    "IncrementReport",
    "IncrementalConfig",
    "IncrementalLearner",
    "MemoryBudget",
    "StoredSamples",
    "bytes_per_sample",
]
