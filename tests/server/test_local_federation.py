"""The parts of examples/deploy/local_federation.py that decide whether a federation can run
where flwr was installed with `pip --target` and whether it leaves nothing behind: the run
configuration it hands to `flwr run`, the flwr command wrappers, and the stopping of process
families that leave their session. (A whole federation takes minutes: tests/server/
test_deployment.py runs the same scripts end to end.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_local_federation():
    spec = importlib.util.spec_from_file_location(
        "local_federation", REPO / "examples" / "deploy" / "local_federation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


lf = load_local_federation()


def test_run_config_survives_flowers_parser():
    values = {"num-rounds": 3, "lr": 0.0005, "codec": "topk:0.01", "resume": 0,
              "memory-budget": "", "output-dir": "/tmp/it's here", "server-lr": 1e-05}
    assert lf.parse_run_config(lf.format_run_config(values)) == values


def test_output_dir_becomes_absolute_and_overrides_the_run_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    values, rounds, out = lf.checked_run_config("num-rounds=2 output-dir='elsewhere'",
                                                Path("runs/fp16"))
    assert rounds == 2
    assert out == tmp_path / "runs" / "fp16"
    assert values["output-dir"] == str(out)
    _, rounds, out = lf.checked_run_config("codec='fp16' output-dir='x'", None)
    assert rounds == 20 and out == tmp_path / "x"  # pyproject's default number of rounds


def test_a_bad_run_config_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="unknown run-config key"):
        lf.checked_run_config("num-round=2", Path("/tmp/x"))
    with pytest.raises(SystemExit, match="output-dir"):
        lf.checked_run_config("num-rounds=2", None)


def test_wrappers_cover_flowers_console_scripts_and_run_in_this_python(tmp_path):
    bin_dir = lf.flwr_command_wrappers(tmp_path / "bin")
    names = {p.name for p in bin_dir.iterdir()}
    assert {"flwr", "flower-superlink", "flower-supernode", "flower-superexec",
            "flwr-serverapp", "flwr-clientapp"} <= names
    assert all(os.access(p, os.X_OK) for p in bin_dir.iterdir())
    assert (bin_dir / "flwr").read_text().startswith(f"#!{sys.executable}\n")
    done = subprocess.run([str(bin_dir / "flwr"), "--version"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
    assert done.returncode == 0 and "1.42" in done.stdout


def test_stopping_reaches_processes_in_sessions_of_their_own(tmp_path):
    # a parent whose child leaves for a new session, as the SuperLink's SuperExec does
    marker = tmp_path / "child.pid"
    parent = subprocess.Popen(
        ["bash", "-c", f"setsid sleep 300 & echo $! > {marker}; wait"],
        start_new_session=True)
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(marker.read_text())
    members = lf.family({parent.pid})
    assert {parent.pid, child} <= members
    lf.end_processes(members, grace_s=10)
    parent.wait(timeout=10)
    assert not lf._alive(child)
    assert not lf.family({parent.pid})
