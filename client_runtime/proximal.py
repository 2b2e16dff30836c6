"""FedProx's proximal term on a compiled step, on the device.

FedProx adds ``mu/2 * ||w - w_global||^2`` to the local loss, which pulls every trainable array
back towards the round's global model. The pull is applied as a separate step after each
optimizer update, ``w -= lr * mu * (w - w_global)`` (operator splitting: the same step to first
order in ``lr``), by the existing SGD kernel given weight decay ``mu`` and the constant
"gradient" ``-mu * w_global``. So it costs one element-wise launch per trainable array and step,
and nothing travels per step: ``-mu * w_global`` goes up once per round.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyopencl as cl

from client_runtime.step import CompiledStep
from kernels import optimizer as opt_kernels
from kernels.launch import Launch


class ProximalPull:
    """Appends the pull launches to a step's training launches while active (``with``)."""

    def __init__(self, step: CompiledStep, anchors: Mapping[str, np.ndarray], mu: float, lr: float):
        if mu <= 0:
            raise ValueError(f"the proximal weight mu must be positive, got {mu}")
        self.step = step
        self.launches: list[Launch] = []
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        for name, anchor in anchors.items():
            target = np.ascontiguousarray(-mu * np.asarray(anchor, np.float32), np.float32)
            buffer = cl.Buffer(step.device.context, flags, hostbuf=target.reshape(-1))
            self.launches += opt_kernels.sgd_update(
                step.device.kernels,
                step.views[name],
                buffer,
                None,
                n=target.size,
                lr=lr,
                momentum=0.0,
                weight_decay=mu,
            )

    def __enter__(self) -> ProximalPull:
        self.step.train_launches.extend(self.launches)
        return self

    def __exit__(self, *exc) -> None:
        count = len(self.launches)
        if count:
            del self.step.train_launches[-count:]
