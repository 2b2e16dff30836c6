"""Whole federated runs on Flower's simulation engine (Ray) with the project's apps: the command
line, a run at scale, a run on an existing two-node Ray cluster, and ``flwr run .`` offline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mgfl.cli import app as cli_app

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL = ["--data", "synthetic:1,8,8:4", "--model", "mlp", "--batch", "16", "--local-steps", "3",
         "-c", "eval-batch=64"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")


def stop_group(process: subprocess.Popen) -> None:
    """Ends a process started in its own session, and what it started there."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def test_three_rounds_with_four_clients_improve_accuracy(device, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli_app, ["simulate", "--rounds", "3", *SMALL, "--output-dir",
                                          str(out), "--json", str(tmp_path / "run.json")])
    assert result.exit_code == 0, result.output
    history = json.loads((tmp_path / "run.json").read_text())
    rounds = history["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for record in rounds[1:]:
        assert record["clients"] == 4 and record["rejected"] == record["failed"] == 0
        assert record["uplink_bytes"] > 0 and record["downlink_bytes"] > 0
        assert {"accuracy", "loss"} <= set(record)
    assert history["final_accuracy"] >= history["initial_accuracy"] + 0.3
    assert (out / "rounds.png").stat().st_size > 0
    for r in range(4):
        with np.load(out / f"round-{r:03d}.npz", allow_pickle=False) as checkpoint:
            assert "layers.1.weight" in checkpoint.files


@pytest.mark.slow
def test_one_hundred_clients_ten_per_round(device, tmp_path):
    out = tmp_path / "scale"
    result = CliRunner().invoke(cli_app, [
        "simulate", "--rounds", "3", "--data", "fsdd", "--model", "mlp", "--partition", "iid",
        "--clients", "100", "--fraction", "0.1", "--local-steps", "4", "--batch", "16",
        "--client-cpus", "0.5", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    history = json.loads((out / "history.json").read_text())
    trained = history["rounds"][1:]
    assert [r["clients"] for r in trained] == [10, 10, 10]
    assert trained[-1]["loss"] < history["rounds"][0]["loss"]  # 27 samples a client: loss, not
    # accuracy, is the steady sign of learning after three short rounds
    # clients are created per message: the actors' peak memory does not grow with the rounds
    peaks = [r["client_metrics"]["process-peak-rss-bytes"] for r in trained]
    assert peaks[-1] <= 1.25 * peaks[0]


@pytest.mark.slow
def test_runs_on_an_existing_two_node_ray_cluster(device, tmp_path):
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="mgflray", dir="/tmp")  # Ray's socket paths must be short
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats", "--block"]
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}",
         "--include-dashboard=false", f"--ray-client-server-port={free_port()}", *common],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    worker = None
    address = f"127.0.0.1:{port}"

    def alive_nodes() -> int:
        status = subprocess.run([str(BIN / "ray"), "status", "--address", address],
                                capture_output=True, text=True, timeout=60)
        return status.stdout.count(" node_")

    try:
        wait_for(lambda: alive_nodes() == 1, 120, "the Ray head starting")
        worker = subprocess.Popen(
            [str(BIN / "ray"), "start", f"--address={address}", *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: alive_nodes() == 2, 120, "the second Ray node joining")
        out = tmp_path / "cluster"
        # one CPU a client on two one-CPU nodes: the two actors run on different nodes
        run = subprocess.run(
            [sys.executable, "-m", "mgfl", "simulate", "--rounds", "2", *SMALL,
             "--client-cpus", "1", "--ray-address", address, "--output-dir", str(out)],
            capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        history = json.loads((out / "history.json").read_text())
        assert [r["clients"] for r in history["rounds"][1:]] == [4, 4]
        assert alive_nodes() == 2  # the cluster outlives the run: it is not ours to stop
    finally:
        for process in (worker, head):
            if process is not None:
                stop_group(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_flwr_run_offline_with_own_superlink(device, tmp_path):
    """``flwr run .`` against a SuperLink started with runtime dependency installation off."""
    port = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "offline"\n\n[superlink.offline]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    superlink = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation",
         "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(home / "state.db")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    out = tmp_path / "flwr-run"
    try:
        wait_for(lambda: _port_open(port), 60, "the SuperLink listening")
        overrides = (f"num-rounds=2 dataset='synthetic:1,8,8:4' model='mlp' batch=16 "
                     f"local-steps=3 eval-batch=64 output-dir='{out}'")
        run = subprocess.run(
            [str(BIN / "flwr"), "run", ".", "offline", "--federation-config",
             "num-supernodes=4", "--run-config", overrides, "--stream"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        history = json.loads((out / "history.json").read_text())
        assert [r["round"] for r in history["rounds"]] == [0, 1, 2]
        assert history["final_accuracy"] > history["initial_accuracy"]
    finally:
        _stop_superlink(superlink)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _stop_superlink(superlink: subprocess.Popen) -> None:
    """The SuperLink starts its SuperExec in a session of its own: end that child by its id,
    then the SuperLink's group."""
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(superlink.pid)],
                              capture_output=True, text=True).stdout.split()
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    stop_group(superlink)
