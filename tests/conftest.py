"""Fixtures shared by the whole suite: one opened OpenCL device per session, seeded randomness."""

from __future__ import annotations

import os

import numpy as np
import pytest

UNDER_OCLGRIND = os.environ.get("MGFL_UNDER_OCLGRIND") == "1"


@pytest.fixture(scope="session")
def device(tmp_path_factory):
    """The device named by MGFL_DEVICE (default: the preferred one), with a private cache."""
    os.environ.setdefault("MGFL_CACHE_DIR", str(tmp_path_factory.mktemp("mgfl-cache")))
    from client_runtime.device import Device

    return Device.open()


@pytest.fixture(scope="session")
def lib(device):
    return device.kernels


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: reproducible, different per test."""
    return np.random.default_rng(_stable_seed(request.node.nodeid))


def _stable_seed(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


_exit_status = {"code": 0}


def pytest_sessionfinish(session, exitstatus):
    _exit_status["code"] = int(exitstatus)


def pytest_unconfigure(config):
    """On NVIDIA's OpenCL, end without the interpreter's teardown (the driver crashes while
    buffers are freed there); the report has been printed by now."""
    import sys

    if "client_runtime.device" in sys.modules:
        from client_runtime.device import crash_prone_driver_opened

        if crash_prone_driver_opened():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(_exit_status["code"])
