"""Step times of the zoo's bench models under the engine's host-side choices, in one process on
the same inputs: the queue with or without profiling events, and the batch upload through
map/unmap staging or pinned memory with one write. Prints a JSON row per (model, choice).

    MGFL_DEVICE=gpu python3 examples/gpu/step_overhead.py --repeats 50
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from client_runtime.device import Device, crash_prone_driver_opened
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep
from mgfl.bench.report import median_wall_seconds
from mgfl.bench.step import LR, MODELS, MOMENTUM
from mgfl.models import build_model

CHOICES = (("profiling queue, map staging", True, "map"),
           ("profiling queue, pinned staging", True, "pinned"),
           ("plain queue, map staging", False, "map"),
           ("plain queue, pinned staging", False, "pinned"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    devices = {flag: Device.open(None, profiling=flag) for flag in (True, False)}
    rng = np.random.default_rng(0)
    for name, batch, options in MODELS:
        model = build_model(name, **options)
        state = model.init_state(0)
        x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
        y = rng.integers(0, model.num_classes, batch).astype(np.int32)
        for label, profiling, staging in CHOICES:
            device = devices[profiling]
            step = CompiledStep(device, model, batch, state, profile=False, staging=staging,
                                optimizer=OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM))

            def one(step=step, device=device, x=x, y=y) -> None:
                step.train_step(x, y)
                device.queue.finish()

            seconds = median_wall_seconds(one, args.repeats, warmup=3)
            print(json.dumps({"model": name, "batch": batch, "choice": label,
                              "step_ms": round(seconds * 1e3, 4),
                              "launches": step.launches_per_step()}), flush=True)
    if crash_prone_driver_opened():
        os._exit(0)


if __name__ == "__main__":
    main()
