"""The server's own evaluation of the global model on the held-out set, every round.

It runs on the server's OpenCL device with the same engine the clients train with: one compiled
evaluation step, built once, whose weights are replaced each round with ``set_state``.
"""

from __future__ import annotations

import numpy as np

from mgfl.models.model import Model


class ServerEvaluator:
    """Loss and accuracy of a full model state on ``(x_test, y_test)``."""

    def __init__(self, model: Model, x_test: np.ndarray, y_test: np.ndarray, batch: int,
                 device: str = ""):
        if len(y_test) == 0:
            raise ValueError("the held-out set is empty: the server has nothing to evaluate on")
        self.model = model
        self.x_test = np.ascontiguousarray(x_test, np.float32)
        self.y_test = np.ascontiguousarray(y_test, np.int32)
        self.batch = max(1, min(batch, len(y_test)))
        self.device_selection = device or None
        self._step = None

    def __call__(self, state: dict[str, np.ndarray]) -> dict:
        if self._step is None:
            from client_runtime.device import Device
            from client_runtime.step import CompiledStep

            device = Device.open(self.device_selection)
            self._step = CompiledStep(device, self.model, self.batch, state, trainable=set(),
                                      profile=False)
        else:
            self._step.set_state(state)
        return self._step.evaluate(self.x_test, self.y_test)
