"""Programs are built once per device and set of defines, and a second process loads them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernels.library import KernelBuildError, KernelLibrary

PROBE = """
import json
from client_runtime.device import Device
lib = Device.open().kernels
lib.program("elementwise")
lib.program("elementwise", {"UNUSED_DEFINE": 3})
print(json.dumps(lib.stats))
"""


def _probe(cache_dir) -> dict:
    import json

    env = {**os.environ, "MGFL_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.environ.get("MGFL_UNDER_OCLGRIND") == "1", reason="own process")
def test_a_second_process_does_not_recompile(tmp_path):
    first = _probe(tmp_path)
    assert first["compiled"] == 2 and first["loaded_from_disk"] == 0
    second = _probe(tmp_path)
    assert second["compiled"] == 0 and second["loaded_from_disk"] == 2


def test_same_defines_are_built_once_in_a_process(device, tmp_path):
    lib = KernelLibrary(device.context, device.cl_device, device.info.cache_key, tmp_path)
    a = lib.program("elementwise", {"X": 1})
    b = lib.program("elementwise", {"X": 1})
    assert a is b and lib.stats["compiled"] == 1 and lib.stats["memory_hits"] == 1
    lib.program("elementwise", {"X": 2})
    assert lib.stats["compiled"] == 2


def test_a_build_failure_names_the_source_and_defines(device, tmp_path):
    lib = KernelLibrary(device.context, device.cl_device, device.info.cache_key, tmp_path)
    with pytest.raises(KernelBuildError, match="elementwise.cl"):
        lib.program("elementwise", {"relu_forward(": 1})
