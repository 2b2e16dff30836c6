"""One whole Flower deployment on this machine, from certificates to the finished run, with the
scripts beside this file: a TLS CA and node keys (make_certs.sh), a SuperLink with TLS and node
authentication (start_superlink.sh), N registered SuperNodes (register_node.sh,
start_supernode.sh), one `flwr run` (submit_run.sh); then every process is stopped and the server's
history stays in OUTPUT_DIR/history.json.

    python3 examples/deploy/local_federation.py --output-dir /abs/out/fp16 \\
        --run-config "num-rounds=20 codec='fp16'"

Several federations can run at once: each has its own ports (--port-base, else free ones), its
own FLWR_HOME, keys and SuperLink database under its work directory. Needs no Ray and no console
scripts: the flwr commands the scripts and Flower's processes call by name are written as small
wrappers around this Python's flwr (so `PYTHONPATH=/tmp/site:$PWD python3 ...` works where
flwr was installed with `pip install --target`). MGFL_DEVICE chooses the OpenCL device of the
SuperNodes' clients and of the server's evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
PROJECT = SCRIPTS.parents[1]
HOST = "127.0.0.1"


def log(label: str, message: str) -> None:
    print(f"[{label} {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------- run configuration


def parse_run_config(text: str) -> dict:
    """Flower's own reading of a --run-config string."""
    from flwr.common.config import parse_config_args

    return parse_config_args([text]) if text.strip() else {}


def format_run_config(values: dict) -> str:
    """``k=v`` pairs that Flower's parser reads back into ``values`` (strings single-quoted as
    TOML literals, or double-quoted when they hold a single quote)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v) if "'" in v else f"'{v}'"
        return repr(v)

    return " ".join(f"{k}={value(v)}" for k, v in values.items())


def checked_run_config(text: str, output_dir: Path | None) -> tuple[dict, int, Path]:
    """The run configuration with an absolute output-dir (the ServerApp does not run in this
    directory), checked by mgfl before anything starts; also the number of rounds it asks for."""
    from mgfl.run_config import RunConfig

    values = parse_run_config(text)
    if output_dir is not None:
        values["output-dir"] = str(output_dir)
    if "output-dir" not in values:
        raise SystemExit("give --output-dir or output-dir='...' in --run-config")
    values["output-dir"] = str(Path(values["output-dir"]).resolve())
    config = RunConfig.from_mapping(values)
    return values, config.num_rounds, Path(config.output_dir)


# ------------------------------------------------------------------------------------- processes


def _process_table() -> dict[int, tuple[int, int]]:
    """Every live process's parent and session, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return table


def family(roots: set[int]) -> set[int]:
    """``roots``, what they started, and the sessions of all of them: the SuperLink starts its
    SuperExec in a session of its own, and a SuperNode's SuperExec outlives its parent."""
    table = _process_table()
    members = {pid for pid in roots if pid in table}
    sessions = set(roots)
    while True:
        grown = {pid for pid, (ppid, sid) in table.items()
                 if pid not in members and (ppid in members or sid in sessions)}
        if not grown:
            return members
        members |= grown
        sessions |= {table[pid][1] for pid in grown}


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)  # a child of ours that exited: collect it
        except ChildProcessError:
            pass
        return False
    return True


def end_processes(pids: set[int], grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL for whatever is still there after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.3)


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """Ports the system hands out now; held together so that they differ."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# A console script's body: the flwr function, then, in a process that opened NVIDIA's OpenCL
# (the ServerApp's and ClientApp's processes), an exit without the interpreter's teardown, where
# that driver crashes while buffers are freed (as `mgfl`'s own commands end there).
WRAPPER = """#!{python}
import os
import sys

from {module} import {function}

try:
    code = {function}()
except SystemExit as done:
    code = done.code
if "client_runtime.device" in sys.modules:
    from client_runtime.device import crash_prone_driver_opened

    if crash_prone_driver_opened():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
sys.exit(code)
"""

# What Flower's processes import before their first heartbeat, and the apps: their bytecode is
# written once before anything starts. Without it (PYTHONDONTWRITEBYTECODE, or an install with
# --no-compile) a dozen processes that start together each compile the same modules, and a
# ClientApp that has sent no heartbeat 30 s after it was launched is replaced by another.
START_UP_MODULES = ("flwr.superlink.cli", "flwr.supernode.cli", "flwr.supercore.cli",
                    "flwr.cli.app", "server.app", "client_runtime.app")
COMPILE_IMPORTED = """
import importlib, importlib.util, os, py_compile, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
written = 0
for module in list(sys.modules.values()):
    source = getattr(module, "__file__", None) or ""
    if not source.endswith(".py"):
        continue
    cached = importlib.util.cache_from_source(source)
    try:
        if os.path.exists(cached) and os.stat(cached).st_mtime >= os.stat(source).st_mtime:
            continue
        py_compile.compile(source, cfile=cached, doraise=True)
        written += 1
    except (OSError, py_compile.PyCompileError):
        pass  # a read-only place: that module is compiled at each import
print(written)
"""


def flwr_command_wrappers(directory: Path) -> Path:
    """An executable for each of flwr's console scripts that runs it in this Python: the
    SuperLink and SuperNodes start `flower-superexec`, `flwr-serverapp` and `flwr-clientapp` by
    name, and an install with `pip --target` may leave no such commands on PATH."""
    from importlib import metadata

    directory.mkdir(parents=True, exist_ok=True)
    for entry in metadata.distribution("flwr").entry_points:
        if entry.group != "console_scripts":
            continue
        path = directory / entry.name
        path.write_text(WRAPPER.format(python=sys.executable, module=entry.module,
                                       function=entry.attr))
        path.chmod(0o755)
    return directory


def compile_start_up_modules() -> int:
    """Imports START_UP_MODULES in a child process and writes the bytecode of every module that
    import loaded; returns how many files were compiled."""
    done = subprocess.run([sys.executable, "-c", COMPILE_IMPORTED, *START_UP_MODULES],
                          timeout=600, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"importing Flower and the apps failed:\n{done.stderr}")
    return int(done.stdout.split()[-1])


# ------------------------------------------------------------------------------------ federation


@dataclass
class Federation:
    """The processes of one deployment and where they write."""

    label: str
    work: Path
    superlink_port: int
    node_ports: list[int]
    env: dict
    started: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def keys(self) -> Path:
        return self.work / "keys"

    def log_path(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    def script(self, name: str, *args: str, timeout: float = 300) -> None:
        """Runs one of the deployment scripts to its end; its output goes to its log."""
        with open(self.log_path(Path(name).stem), "ab") as out:
            done = subprocess.run(["bash", str(SCRIPTS / name), *args], env=self.env,
                                  cwd=self.work, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({done.returncode})")

    def register_nodes(self, count: int, timeout_s: float) -> None:
        """Registers every node's public key, all at once (each is a `flwr` command)."""
        registering = [self.start(f"register-{i}", ["bash", str(SCRIPTS / "register_node.sh"),
                                                    str(self.keys / f"node-{i}.pub")])
                       for i in range(count)]
        failed = [i for i, p in enumerate(registering) if p.wait(timeout=timeout_s)]
        if failed:
            raise RuntimeError(f"registration of node(s) {failed} failed")

    def start(self, name: str, command: list[str], **extra_env: str) -> subprocess.Popen:
        """A long-running process in a session of its own, its output in logs/NAME.log."""
        with open(self.log_path(name), "ab") as out:
            process = subprocess.Popen(command, env={**self.env, **extra_env}, cwd=self.work,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.started[name] = process
        return process

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["flwr", *args], env=self.env, cwd=self.work, capture_output=True,
                              text=True, timeout=timeout)

    def check_servers(self) -> None:
        """The SuperLink and the SuperNodes must run until the end."""
        for name, process in self.started.items():
            status = process.poll()
            if (name == "superlink" or name.startswith("supernode-")) and status is not None:
                raise RuntimeError(f"{name} exited with status {status}")

    def superlink_answers_tls(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.keys / "ca.crt"))
        try:
            with socket.create_connection((HOST, self.superlink_port), timeout=5) as raw, \
                    context.wrap_socket(raw, server_hostname=HOST):
                return True
        except OSError:
            return False

    def nodes_online(self) -> int:
        listed = self.flwr("supernode", "list", "deploy", "--format", "json")
        if listed.returncode != 0:
            return 0
        try:
            nodes = json.loads(listed.stdout).get("nodes", [])
        except json.JSONDecodeError:
            return 0
        return sum(node.get("status") == "online" for node in nodes)

    def stop(self) -> None:
        """SuperNodes first (they sign off at the SuperLink), then everything else that was
        started, with all the processes they started in turn."""
        nodes = {p.pid for name, p in self.started.items() if name.startswith("supernode-")}
        end_processes(family(nodes))
        end_processes(family({p.pid for p in self.started.values()}))
        for process in self.started.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        left = family({p.pid for p in self.started.values()})
        if left:
            log(self.label, f"processes still alive after stopping: {sorted(left)}")

    def log_tails(self, chars: int = 1500) -> str:
        """The end of the run's log and of every other log that reports an error."""
        tails = []
        for path in sorted((self.work / "logs").glob("*.log")):
            text = path.read_text(errors="replace")
            if path.name == "run.log" or "Traceback" in text or "ERROR" in text:
                tails.append(f"--- {path.name}:\n{text[-chars:]}")
        return "\n".join(tails)


def wait_until(check, timeout_s: float, what: str, poll_s: float = 1.0,
               while_running=lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        while_running()
        if check():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s:.0f} s")


def report_progress(label: str, history_path: Path, shown: int, num_rounds: int) -> int:
    """Prints the rounds the server has added to its history since the last call."""
    try:
        rounds = json.loads(history_path.read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return shown
    for record in rounds[shown:]:
        accuracy = record.get("accuracy")
        accuracy = "n/a" if accuracy is None else f"{100 * accuracy:.1f}%"
        log(label, f"round {record['round']}/{num_rounds}: accuracy {accuracy}, "
                   f"{record['clients']} clients, uplink {record['uplink_bytes']:,} B, "
                   f"at {record['seconds']:.0f} s")
    return len(rounds)


def run_federation(args: argparse.Namespace) -> int:
    values, num_rounds, output_dir = checked_run_config(args.run_config, args.output_dir)
    label = args.label or output_dir.name
    nodes = args.nodes
    if args.port_base:
        ports = list(range(args.port_base, args.port_base + nodes + 1))
        busy = [p for p in ports if not port_is_free(p)]
        if busy:
            raise SystemExit(f"ports in use: {busy} (choose another --port-base)")
    else:
        ports = free_ports(nodes + 1)
    if args.work_dir and args.work_dir.exists() and any(args.work_dir.iterdir()):
        raise SystemExit(f"--work-dir {args.work_dir} is not empty")
    # The work directory goes onto PATH (the command wrappers): no ':' from a codec name in it.
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", label)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"mgfl-federation-{safe}-")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    history_path = output_dir / "history.json"
    history_path.unlink(missing_ok=True)

    bin_dir = flwr_command_wrappers(work / "bin")
    compiled = compile_start_up_modules()
    env = {**os.environ,
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHON": sys.executable,
           "FLWR_TELEMETRY_ENABLED": os.environ.get("FLWR_TELEMETRY_ENABLED", "0"),
           "FLWR_HOME": str(work / "flwr-home"),
           "MGFL_SUPERLINK_PORT": str(ports[0]),
           "MGFL_SUPERNODE_RETRY_S": os.environ.get("MGFL_SUPERNODE_RETRY_S", "5")}
    fed = Federation(label, work, ports[0], ports[1:], env)
    log(label, f"{nodes} SuperNodes, SuperLink on {HOST}:{ports[0]}, work directory {work}; "
               f"{compiled} modules compiled")
    started = time.monotonic()
    completed = False
    try:
        fed.script("make_certs.sh", str(fed.keys), HOST, str(nodes))
        fed.script("connection.sh", str(fed.keys), HOST)
        fed.start("superlink", ["bash", str(SCRIPTS / "start_superlink.sh"), str(fed.keys),
                                str(work / "state"), HOST])
        wait_until(fed.superlink_answers_tls, args.start_timeout, "the SuperLink's TLS port",
                   while_running=fed.check_servers)
        fed.register_nodes(nodes, args.start_timeout)
        for i, port in enumerate(fed.node_ports):
            fed.start(f"supernode-{i}", ["bash", str(SCRIPTS / "start_supernode.sh"),
                                         str(fed.keys), str(i), str(nodes),
                                         f"{HOST}:{fed.superlink_port}", str(port)])
        wait_until(lambda: fed.nodes_online() == nodes, args.start_timeout,
                   f"{nodes} SuperNodes online", poll_s=2.0,
                   while_running=fed.check_servers)
        log(label, f"federation up after {time.monotonic() - started:.0f} s; "
                   f"submitting {num_rounds} rounds")

        submitted = time.monotonic()
        run = fed.start("run", ["bash", str(SCRIPTS / "submit_run.sh"), str(args.project),
                                format_run_config(values)])
        shown = 0
        deadline = submitted + args.timeout
        while run.poll() is None and time.monotonic() < deadline:
            shown = report_progress(label, history_path, shown, num_rounds)
            fed.check_servers()
            time.sleep(2.0)
        shown = report_progress(label, history_path, shown, num_rounds)
        if run.poll() is None:
            log(label, f"the run did not finish within {args.timeout:.0f} s: stopping it")
        elif run.returncode != 0:
            log(label, f"flwr run ended with status {run.returncode}")
        completed = run.returncode == 0 and shown == num_rounds + 1
        log(label, f"run {'finished' if completed else 'INCOMPLETE'}: {max(shown - 1, 0)} of "
                   f"{num_rounds} rounds in {time.monotonic() - submitted:.0f} s "
                   f"({time.monotonic() - started:.0f} s with the start-up)")
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as error:
        log(label, f"FAILED: {error}")
    finally:
        fed.stop()
        log(label, f"all processes stopped; history: {history_path}")
    if completed and not args.keep_work_dir:
        shutil.rmtree(work, ignore_errors=True)
    elif not completed:
        log(label, f"logs kept in {work / 'logs'}\n{fed.log_tails()}")
    return 0 if completed else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-config", default="",
                        help="Flower run config, e.g. \"num-rounds=20 codec='fp16'\".")
    parser.add_argument("--output-dir", type=Path,
                        help="Where the server writes history.json and checkpoints "
                             "(overrides output-dir in --run-config).")
    parser.add_argument("--nodes", type=int, default=6,
                        help="SuperNodes = partitions (6: one per FSDD speaker).")
    parser.add_argument("--port-base", type=int, default=0,
                        help="SuperLink on this port, SuperNodes on the next NODES ports "
                             "(default: free ports).")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="Seconds the run may take once submitted; then it is stopped.")
    parser.add_argument("--start-timeout", type=float, default=300.0,
                        help="Seconds each start-up step (SuperLink, registration, nodes) "
                             "may take.")
    parser.add_argument("--work-dir", type=Path,
                        help="Keys, flwr home, SuperLink state and logs: a new or empty "
                             "directory (default: a temporary one); removed after a complete "
                             "run unless --keep-work-dir.")
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--label", default="", help="Prefix of the progress lines.")
    parser.add_argument("--project", type=Path, default=PROJECT,
                        help="The Flower app project (its pyproject.toml) that flwr run submits.")
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")

    def stop_on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_signal)
    try:
        sys.exit(run_federation(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
