"""How much of a client round the on-disk program cache saves.

Flower may run every message in a fresh process (a SuperNode always does). Each fresh process
builds the compiled step of the model: without the cache every OpenCL program is compiled again,
with it the binaries are loaded. This script times that build in fresh processes, first with an
empty cache directory, then with the one the first process filled.

    python examples/simulation/program_cache.py [--model dscnn] [--data fsdd]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from client_runtime.device import Device
from client_runtime.step import CompiledStep
from mgfl.data.registry import load_dataset
from mgfl.models.zoo import build_model
data = load_dataset(sys.argv[2])
model = build_model(sys.argv[1], input_shape=data.input_shape, num_classes=data.num_classes)
device = Device.open()
t1 = time.perf_counter()
step = CompiledStep(device, model, int(sys.argv[3]), model.init_state(0))
t2 = time.perf_counter()
print(json.dumps({"startup_s": t1 - t0, "step_build_s": t2 - t1, **device.kernels.stats,
                  "device": device.info.describe()}))
"""


def build_in_fresh_process(model: str, data: str, batch: int, cache_dir: str) -> dict:
    # PoCL keeps a kernel cache of its own; it is turned off so that "empty" means empty.
    env = {**os.environ, "MGFL_CACHE_DIR": cache_dir, "POCL_KERNEL_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, model, data, str(batch)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dscnn")
    parser.add_argument("--data", default="fsdd")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mgfl-cache-") as cache_dir:
        cold = build_in_fresh_process(args.model, args.data, args.batch, cache_dir)
        warm = build_in_fresh_process(args.model, args.data, args.batch, cache_dir)
    print(f"device: {cold['device']}")
    for label, run in (("empty cache", cold), ("warm cache", warm)):
        print(f"{label:12s} step build {run['step_build_s']:7.2f} s | programs compiled "
              f"{run['compiled']:3d}, loaded from disk {run['loaded_from_disk']:3d}")
    print(f"saved per fresh process: {cold['step_build_s'] - warm['step_build_s']:.2f} s")


if __name__ == "__main__":
    main()
