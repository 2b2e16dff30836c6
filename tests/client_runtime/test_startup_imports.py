"""A deployed SuperNode starts a new Python process for every message, so whatever the client
path imports is paid every round. Libraries a client never uses (plotting, SciPy, ONNX, PyTorch,
Ray, the optional data-set packages) must stay out of it: checked in a fresh process that imports
the ClientApp and handles one real training message, as ``flwr-clientapp`` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "examples" / "deploy" / "startup_cost.py"
NOT_ON_THE_CLIENT_PATH = {"matplotlib", "scipy", "onnx", "onnxruntime", "torch", "tinygrad",
                          "ray", "pandas", "sklearn", "PIL", "spafe", "seglearn", "mlxtend",
                          "hypothesis", "server"}


def test_a_training_message_in_a_fresh_process_loads_no_heavy_library(device):
    # the device fixture gives the process the session's program cache
    done = subprocess.run(
        [sys.executable, str(PROBE), "--child", "--model", "mlp", "--dataset", "fsdd",
         "--batch", "16", "--local-steps", "1", "--clients", "2"],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    after_import = set(report["packages_after_import"])
    after_message = set(report["packages_after_message"])
    # the probe saw the client path: Flower, OpenCL and mgfl's engine were loaded
    assert {"flwr", "pyopencl", "numpy", "client_runtime", "kernels", "mgfl"} <= after_import
    assert after_import <= after_message
    assert not after_import & NOT_ON_THE_CLIENT_PATH
    assert not after_message & NOT_ON_THE_CLIENT_PATH
    # the simulation's phone cost model and the float64 reference trainer load on demand only
    project = set(report["project_modules_after_message"])
    assert "client_runtime.step" in project
    assert not project & {"mgfl.simulated_phone", "mgfl.cost_model", "mgfl.device_profiles",
                          "mgfl.models.reference_trainer", "mgfl.models.reference_layers"}
    assert set(report["phases"]) >= {"opencl-context", "step-build", "first-step", "message"}
