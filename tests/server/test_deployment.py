"""A real deployment on 127.0.0.1 with the scripts of examples/deploy: certificates, a SuperLink
with TLS and node authentication, two registered SuperNodes running mgfl's ClientApp on the local
OpenCL device, and ``flwr run`` of two rounds. Every connection is TLS; the one test that opens a
plain connection checks that it is refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "deploy"
BIN = Path(sys.executable).parent
RUN_CONFIG = ("num-rounds=2 dataset='synthetic:1,8,8:4' partition='iid' num-clients=2 "
              "model='mlp' batch=16 local-steps=3 eval-batch=64 min-train-nodes=2")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check, timeout: float, what: str, logs: list[Path] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f} s\n{tails(logs)}")


def tails(logs, chars: int = 3000) -> str:
    return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-chars:]}"
                     for log in logs if log.exists())


@lru_cache(maxsize=1)
def _process_tools():
    """The process-tree helpers of examples/deploy/local_federation.py, which starts and stops
    the same kind of federation."""
    from tests.server.test_local_federation import load_local_federation

    return load_local_federation()


def family(roots: set[int]) -> set[int]:
    return _process_tools().family(roots)


def end_processes(pids: set[int]) -> None:
    _process_tools().end_processes(pids, grace_s=30.0)


@dataclass
class Federation:
    """A running SuperLink with its certificates and the flwr connection "deploy"."""

    root: Path
    keys: Path
    port: int
    env: dict
    logs: list[Path] = field(default_factory=list)
    started: list[subprocess.Popen] = field(default_factory=list)

    def start(self, name: str, command: list[str], **env: str) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            process = subprocess.Popen(command, env={**self.env, **env}, cwd=self.root,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.started.append(process)
        return process

    def run_to_end(self, name: str, command: list[str], timeout: float = 300) -> tuple[int, str]:
        """A process that should end by itself; its exit status and output."""
        process = self.start(name, command)
        status = process.wait(timeout=timeout)
        return status, self.logs[-1].read_text(errors="replace")

    def script(self, name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPTS / name), *args], env=self.env, cwd=self.root,
                              capture_output=True, text=True, timeout=timeout)

    def nodes(self) -> list[dict]:
        listed = subprocess.run([str(BIN / "flwr"), "supernode", "list", "deploy", "--format",
                                 "json"], env=self.env, capture_output=True, text=True,
                                timeout=180)
        if listed.returncode != 0:
            return []
        return json.loads(listed.stdout).get("nodes", [])

    def stop(self) -> None:
        """SuperNodes first (they sign off at the SuperLink), then the SuperLink; then anything
        left of what they started."""
        nodes = [p for p in self.started[1:] if p.poll() is None]
        end_processes(family({p.pid for p in nodes}))
        end_processes(family({p.pid for p in self.started}))
        for process in self.started:
            process.wait(timeout=30)
        assert not family({p.pid for p in self.started}), "processes outlived the test"


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: make_certs.sh needs it")
    root = tmp_path_factory.mktemp("deploy")
    port = free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": sys.executable, "FLWR_HOME": str(root / "flwr-home"),
           "MGFL_SUPERLINK_PORT": str(port)}
    federation = Federation(root, root / "keys", port, env)
    made = federation.script("make_certs.sh", "keys", "127.0.0.1", "3")
    assert made.returncode == 0, made.stderr
    assert federation.script("connection.sh", "keys").returncode == 0
    try:
        federation.start("superlink", ["bash", str(SCRIPTS / "start_superlink.sh"), "keys",
                                       "state"])
        yield federation
    finally:
        federation.stop()


def tls_handshake(port: int, ca: Path) -> bool:
    """The SuperLink answers TLS with a certificate the deployment CA signed for 127.0.0.1."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1"):
            return True
    except OSError:
        return False


@pytest.mark.slow  # 2.5-8 minutes on the shared 2-core machine: Flower's processes start slowly
def test_two_supernodes_over_tls_with_node_authentication_improve_the_model(device, federation):
    fed = federation
    wait_for(lambda: tls_handshake(fed.port, fed.keys / "ca.crt"), 120, "the SuperLink's TLS",
             fed.logs)
    registered = fed.script("register_node.sh", "keys/node-0.pub")
    assert registered.returncode == 0, registered.stdout + registered.stderr
    # a key registered twice is reported as registered, not as a failure
    again = fed.script("register_node.sh", "keys/node-0.pub")
    assert again.returncode == 0 and "already registered" in again.stdout

    # the race seen before: node 1 starts before its key is registered; it is refused, and its
    # script starts it again until the registration has arrived
    for i in range(2):
        fed.start(f"supernode-{i}", ["bash", str(SCRIPTS / "start_supernode.sh"), "keys", str(i),
                                     "2", f"127.0.0.1:{fed.port}", str(free_port())],
                  MGFL_SUPERNODE_RETRY_S="5", MGFL_SUPERNODE_ATTEMPTS="20")
    node_1_log = fed.logs[-1]
    wait_for(lambda: "attempt 1 of 20" in node_1_log.read_text(errors="replace"), 300,
             "node 1 refused while unregistered", fed.logs)
    registered = fed.script("register_node.sh", "keys/node-1.pub")
    assert registered.returncode == 0, registered.stdout + registered.stderr
    wait_for(lambda: [n["status"] for n in fed.nodes()] == ["online", "online"], 300,
             "both SuperNodes online", fed.logs)

    out = fed.root / "run"
    run = subprocess.run(
        ["bash", str(SCRIPTS / "submit_run.sh"), str(REPO), f"{RUN_CONFIG} output-dir='{out}'"],
        env=fed.env, cwd=fed.root, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + tails(fed.logs)
    history = json.loads((out / "history.json").read_text())
    rounds = history["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for record in rounds[1:]:
        assert record["clients"] == 2 and record["rejected"] == record["failed"] == 0
        assert record["uplink_bytes"] > 0
    assert rounds[2]["loss"] < rounds[0]["loss"]
    assert history["final_accuracy"] > history["initial_accuracy"]
    # the runs went through the TLS port and each node trained its own half of the data
    superlink_log = fed.logs[0].read_text()
    assert f"Uvicorn running on https://127.0.0.1:{fed.port}" in superlink_log
    assert superlink_log.count("Push replies from node_id=") >= 4


def test_plain_connections_and_unregistered_nodes_are_refused(federation):
    fed = federation
    wait_for(lambda: tls_handshake(fed.port, fed.keys / "ca.crt"), 120, "the SuperLink's TLS",
             fed.logs)
    # the flwr command line over TLS works, the same command without TLS is refused
    assert subprocess.run([str(BIN / "flwr"), "ls", "deploy"], env=fed.env, capture_output=True,
                          timeout=120).returncode == 0
    plain_home = fed.root / "plain-home"
    plain_home.mkdir()
    (plain_home / "config.toml").write_text(
        f'[superlink]\ndefault = "plain"\n\n[superlink.plain]\n'
        f'address = "127.0.0.1:{fed.port}"\ninsecure = true\n')
    plain = subprocess.run([str(BIN / "flwr"), "ls", "plain"],
                           env={**fed.env, "FLWR_HOME": str(plain_home)},
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode != 0 and "unavailable" in plain.stdout + plain.stderr

    before = {n["node-id"] for n in fed.nodes()}
    # a SuperNode without TLS gives up; one with TLS but an unregistered key is not activated
    status, log = fed.run_to_end("insecure-supernode", [
        str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{fed.port}",
        "--max-retries", "2", "--port", str(free_port()),
        "--node-config", "partition-id=0 num-partitions=2"])
    assert status != 0 and "could not establish a connection" in log
    status, log = fed.run_to_end("unregistered-supernode", [
        str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{fed.port}",
        "--root-certificates", "keys/ca.crt", "--auth-supernode-private-key", "keys/node-2",
        "--max-retries", "2", "--port", str(free_port()),
        "--node-config", "partition-id=0 num-partitions=2"])
    assert status != 0 and "Failed to activate SuperNode" in log
    assert {n["node-id"] for n in fed.nodes()} == before
