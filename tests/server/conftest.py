"""Fixtures for server tests: a process identity for Flower messages, and a grid of fake nodes."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity


@pytest.fixture
def flower_identity():
    """Flower stamps new messages with the process's run, task and node ids."""
    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


class FakeGrid:
    """Only what strategies ask of a grid while configuring a round: the connected nodes."""

    def __init__(self, nodes: int):
        self.nodes = list(range(1, nodes + 1))

    def get_node_ids(self):
        return list(self.nodes)


@pytest.fixture
def grid():
    return FakeGrid(4)


def on_grid(rng: np.random.Generator, shape, step: float = 2.0**-6, bound: float = 2.0):
    """Random values on a coarse binary grid: sums and differences of them are exact in float32
    and in float16, so a lossless path must reproduce them bit for bit."""
    return (rng.integers(-int(bound / step), int(bound / step), size=shape) * step).astype(
        np.float32)
