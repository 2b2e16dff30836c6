"""Runs every other kernel test under oclgrind, which reports invalid accesses and data races.

oclgrind exits 0 even when it finds an error, so the test reads its log. On CI the tool must be
there (``.ci/run`` installs Debian's ``oclgrind``); elsewhere the test is skipped without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import UNDER_OCLGRIND

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(UNDER_OCLGRIND, reason="already running under oclgrind")
def test_kernel_tests_run_clean_under_oclgrind(tmp_path):
    oclgrind = shutil.which("oclgrind")
    if oclgrind is None:
        if os.environ.get("CI"):
            pytest.fail("oclgrind is required on CI: apt-get install oclgrind")
        pytest.skip("oclgrind is not installed (apt-get install oclgrind)")
    log = tmp_path / "oclgrind.log"
    env = {
        **os.environ,
        "MGFL_UNDER_OCLGRIND": "1",
        "MGFL_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("MGFL_DEVICE", None)  # oclgrind's own platform is the only one it lists
    cmd = [
        oclgrind,
        "--data-races",
        "--uninitialized",
        "--log",
        str(log),
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(ROOT / "tests" / "kernels"),
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    report = log.read_text() if log.exists() else ""
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "passed" in result.stdout
    assert report.strip() == "", f"oclgrind reported:\n{report[:6000]}"
