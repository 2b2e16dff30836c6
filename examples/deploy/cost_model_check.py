"""Checks the cost model (mgfl/cost_model.py) against measured training steps.

1. On the local OpenCL device: calibrate a profile of it (client_runtime/calibration.py: rate,
   bandwidth, lanes, class efficiencies from a calibration network that is none of these models),
   then for each zoo model compile a training step, time it (median over windows of steps, after a
   warm-up) and compare with the prediction from the step's own launches, with the full model and
   with the plain roofline (one lane, every class at efficiency 1) of the same calibration.
2. Against the H200 step times of BENCHMARKS.md, with the H200 reference profile (its class
   efficiencies are those measured on PoCL, mgfl.device_profiles.REFERENCE_EFFICIENCY), and with
   the efficiencies just measured on the local device in their place.

    python examples/deploy/cost_model_check.py [--json out.json] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import numpy as np

from client_runtime.calibration import calibrate
from client_runtime.device import Device
from client_runtime.graph import OptimizerConfig
from client_runtime.step import CompiledStep
from mgfl.cost_model import predict_step
from mgfl.device_profiles import H200, DeviceProfile, get_profile
from mgfl.models import build_model

# (model, options, batch) measured here; small batches keep the check quick on a shared CPU.
LOCAL_CASES = [
    ("mlp", {}, {}, 32),
    ("lenet5", {}, {}, 64),
    ("cnn1d", {}, {}, 32),
    ("dscnn", {"input_shape": (1, 40, 40), "num_classes": 10}, {}, 32),
    ("mobilenetv2", {}, {}, 8),
]
# BENCHMARKS.md, NVIDIA H200 through NVIDIA's OpenCL: (model, build args, batch, measured ms).
H200_CASES = [
    ("mlp", {}, 32, 0.63),
    ("lenet5", {}, 64, 1.78),
    ("dscnn", {}, 64, 2.54),
    ("mobilenetv2", {}, 32, 57.3),
    ("dscnn", {"input_shape": (1, 40, 40), "num_classes": 10}, 32, 4.13),
]


def _compile(device: Device, name: str, build: dict, batch: int) -> CompiledStep:
    model = build_model(name, **build)
    return CompiledStep(device, model, batch, model.init_state(0), optimizer=OptimizerConfig(),
                        profile=False)


def measure_step_seconds(step: CompiledStep, steps: int, windows: int = 3) -> float:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((step.batch, *step.model.input_shape)).astype(np.float32)
    y = rng.integers(0, step.model.num_classes, step.batch).astype(np.int32)
    queue = step.device.queue
    step.train_step(x, y)  # warm-up
    queue.finish()
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(steps):
            step.train_step(x, y)
        queue.finish()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def plain_roofline(profile: DeviceProfile) -> DeviceProfile:
    """The same figures without occupancy or class efficiencies."""
    return replace(profile, lanes=1, efficiency={})


def _row(label: str, batch: int, measured: float, predicted, plain) -> dict:
    return {"model": label, "batch": batch, "measured_ms": measured * 1e3,
            "predicted_ms": predicted.total_s * 1e3,
            "error": predicted.total_s / measured - 1,
            "plain_ms": plain.total_s * 1e3, "plain_error": plain.total_s / measured - 1, **{
                k: v * 1e3 for k, v in predicted.to_dict().items() if k.endswith("_s")}}


def check_local(device: Device, steps: int) -> tuple[dict, list[dict]]:
    """Calibration and the steps measured close in time, in one process (the machine is shared)."""
    profile = calibrate(device)
    rows = []
    for name, build, _, batch in LOCAL_CASES:
        step = _compile(device, name, build, batch)
        measured = measure_step_seconds(step, steps if name != "mobilenetv2" else 2)
        rows.append(_row(name + ("-fsdd" if build else ""), batch, measured,
                         predict_step(step, profile),
                         predict_step(step, plain_roofline(profile))))
    return profile.to_dict(), rows


def check_h200(device: Device, efficiency: dict | None = None) -> list[dict]:
    profile = H200 if efficiency is None else replace(H200, efficiency=efficiency)
    rows = []
    for name, build, batch, measured_ms in H200_CASES:
        step = _compile(device, name, build, batch)
        rows.append(_row(name + ("-fsdd" if build else ""), batch, measured_ms / 1e3,
                         predict_step(step, profile), predict_step(step, plain_roofline(H200))))
    return rows


def phone_table(device: Device) -> list[dict]:
    """Predicted step times of the FSDD DS-CNN (batch 32) on a few phones."""
    step = _compile(device, "dscnn", {"input_shape": (1, 40, 40), "num_classes": 10}, 32)
    return [{"profile": p, **{k: v * 1e3 for k, v in predict_step(step, get_profile(p))
                              .to_dict().items() if k.endswith("_s")}}
            for p in ("adreno-640", "adreno-660", "adreno-750", "mali-g76", "mali-g610")]


def _mean_abs(rows: list[dict]) -> float:
    return sum(abs(r["error"]) for r in rows) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--steps", type=int, default=6, help="steps per timing window")
    args = parser.parse_args()
    device = Device.open()
    profile, local = check_local(device, args.steps)
    h200 = check_h200(device)
    h200_local = check_h200(device, profile["efficiency"])
    phones = phone_table(device)
    print(f"device: {device.info.describe()}")
    print("calibrated profile:", json.dumps(profile))
    for title, rows in (("local device", local), ("H200 (BENCHMARKS.md)", h200),
                        ("H200 with this run's efficiencies", h200_local)):
        print(f"\n{title}: mean |error| {_mean_abs(rows):.0%}")
        for r in rows:
            print(f"  {r['model']:<14} b{r['batch']:<3} measured {r['measured_ms']:9.2f} ms  "
                  f"predicted {r['predicted_ms']:9.2f} ms  error {r['error']:+.0%}  plain "
                  f"{r['plain_ms']:.2f} ms {r['plain_error']:+.0%}  (compute "
                  f"{r['compute_s']:.2f}, memory {r['memory_s']:.2f}, launch {r['launch_s']:.2f},"
                  f" copy {r['copy_s']:.2f} ms)")
    print("\nDS-CNN on FSDD, batch 32, predicted on phones:")
    for r in phones:
        print(f"  {r['profile']:<11} {r['total_s']:8.1f} ms (launch overhead {r['launch_s']:.1f})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": device.info.to_dict(), "profile": profile, "local": local,
                       "h200": h200, "h200_local_efficiency": h200_local,
                       "phones": phones}, out, indent=2)


if __name__ == "__main__":
    main()
