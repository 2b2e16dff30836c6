"""What one message costs a SuperNode's ClientApp before and around training.

A SuperNode starts a new Python process (``flwr-clientapp``) for every message, so everything a
simulation pays once per actor is paid per round on a deployed client: the interpreter, the
imports, the OpenCL context, loading the data set, building the training step (programs from the
on-disk cache when it is warm) and the first step. This script runs that sequence in fresh
processes, phase by phase, and reports the median of each phase over ``--runs`` processes after
one process that warms the program cache.

    python examples/deploy/startup_cost.py [--model dscnn] [--dataset fsdd] [--runs 5] [--json F]
    python examples/deploy/startup_cost.py --importtime imports.txt   # + python -X importtime

Phases (seconds, in the order a ``flwr-clientapp`` process meets them):
  interpreter start  process start (interpreter, site) to the first line of this file
  numpy, pyopencl, flwr, flwr-clientapp runner, mgfl client path   imports, each on top of the last
  opencl-context  the node's device opened, as the ClientApp opens it (with its probe program)
  data            the node's share of the data set
  model           the model description and its initial state
  step-build      the compiled training step (programs from the disk cache, arena allocated)
  first-step      one training step, finished on the device
  message         the rest of a real training message through ``client_runtime.app:app``
                  (decode, ``local-steps`` steps, evaluation, encoding), everything above cached
  exit            from the report to the end of the process (interpreter and OpenCL teardown)
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()
_STARTED_CPU = time.process_time()  # CPU seconds of this process so far: the interpreter's start

# ruff: noqa: E402  (the clock above must start before any import)
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

# Modules a client never needs: importing one of them is start-up time for nothing.
HEAVY_MODULES = ("matplotlib", "scipy", "onnx", "onnxruntime", "torch", "tinygrad", "ray",
                 "pandas", "sklearn", "PIL", "spafe", "seglearn", "mlxtend", "hypothesis")
PROJECT_PACKAGES = ("mgfl", "client_runtime", "kernels", "server")
PHASES = ("interpreter start", "numpy", "pyopencl", "flwr", "flwr-clientapp runner",
          "mgfl client path", "opencl-context", "data", "model", "step-build", "first-step",
          "message", "exit")


def _top_level_packages() -> list[str]:
    return sorted({name.partition(".")[0] for name in sys.modules})


def _child(args: argparse.Namespace) -> dict:
    """One fresh process: each phase timed on top of the previous ones."""
    phases: dict[str, float] = {}
    cpu: dict[str, float] = {}
    clock, cpu_clock = time.perf_counter(), time.process_time()

    def lap(name: str) -> None:
        nonlocal clock, cpu_clock
        now, cpu_now = time.perf_counter(), time.process_time()
        phases[name], cpu[name] = now - clock, cpu_now - cpu_clock
        clock, cpu_clock = now, cpu_now

    import numpy as np

    lap("numpy")
    import pyopencl  # noqa: F401

    lap("pyopencl")
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict  # noqa: F401
    from flwr.clientapp import ClientApp  # noqa: F401

    lap("flwr")
    from flwr.supernode.cli import flwr_clientapp  # noqa: F401

    lap("flwr-clientapp runner")
    from client_runtime import federated
    from client_runtime.app import app as client_app

    lap("mgfl client path")
    packages_after_import = _top_level_packages()

    from flwr.supercore.task_identity import TaskIdentity

    from client_runtime.freezing import resolve_trainable
    from client_runtime.graph import OptimizerConfig
    from mgfl.codecs import encode_update, get_codec
    from mgfl.flower_records import bundle_record
    from mgfl.run_config import RunConfig
    from mgfl.update_layout import UpdateLayout

    config = RunConfig.from_mapping({
        "dataset": args.dataset, "model": args.model, "batch": args.batch,
        "local-steps": args.local_steps, "partition": "iid", "num-clients": args.clients,
        "eval-batch": args.batch, "optimizer": "adam", "lr": 0.001})
    device = federated._device(config.device)
    lap("opencl-context")
    data = federated.client_data(config, 0, args.clients)
    lap("data")
    model = federated._model(config)
    state = model.init_state(config.model_seed)
    lap("model")
    trainable = resolve_trainable(model, config.freeze)
    optimizer = OptimizerConfig(name=config.optimizer, lr=config.lr)
    batch = min(config.batch, len(data.y_train))
    before = dict(device.kernels.stats)
    step = federated._compiled_step(device, model, batch, state, trainable, optimizer)
    lap("step-build")
    x = np.ascontiguousarray(data.x_train[:batch], np.float32)
    y = np.ascontiguousarray(data.y_train[:batch], np.int32)
    step.train_step(x, y)
    device.queue.finish()
    lap("first-step")
    layout = UpdateLayout.of(model, trainable)
    travelling = {n: np.asarray(state[n], np.float32) for n in layout.travelling}
    content = RecordDict({
        "arrays": bundle_record(encode_update(travelling, get_codec("none")).blob),
        "config": ConfigRecord({**config.to_mapping(), "server-round": 1,
                                "frozen-digest": layout.frozen_digest(state)})})
    # flwr-clientapp stamps the process with its run, task and node before the app runs
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0, "num-partitions": args.clients})
    reply = client_app(Message(content, dst_node_id=1, message_type=MessageType.TRAIN), context)
    if reply.has_error():
        raise RuntimeError(f"the ClientApp failed: {reply.error}")
    lap("message")
    stats = device.kernels.stats
    return {
        "phases": phases,
        "cpu": {"interpreter start": _STARTED_CPU, **cpu},
        "cpu_so_far_s": time.process_time(),
        "since_start_s": time.perf_counter() - _STARTED,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "programs_compiled": stats["compiled"] - before["compiled"],
        "programs_from_disk": stats["loaded_from_disk"] - before["loaded_from_disk"],
        "packages_after_import": packages_after_import,
        "packages_after_message": _top_level_packages(),
        "project_modules_after_message": sorted(
            m for m in sys.modules if m.partition(".")[0] in PROJECT_PACKAGES),
        "device": device.info.describe(),
    }


def _run_child(args: argparse.Namespace, importtime: bool = False) -> tuple[dict, str]:
    """One measuring process; its start (interpreter, site) and its exit (teardown of the
    interpreter and the OpenCL objects) are timed from here around what it reports."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), __file__, "--child",
               "--model", args.model, "--dataset", args.dataset, "--batch", str(args.batch),
               "--local-steps", str(args.local_steps), "--clients", str(args.clients)]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=os.environ)
    report = process.stdout.readline()
    reported = time.perf_counter()
    rest, errors = process.communicate()
    ended = time.perf_counter()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_total = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime
                                                               - cpu_before.ru_stime)
    if process.returncode != 0 or not report.strip():
        raise SystemExit(f"the measuring process failed:\n{report}{rest[-2000:]}"
                         f"{errors[-4000:]}")
    result = json.loads(report)
    result["wall_s"] = ended - started
    result["cpu_s"] = cpu_total
    result["cpu"]["exit"] = cpu_total - result["cpu_so_far_s"]
    result["phases"] = {"interpreter start": reported - started - result["since_start_s"],
                        **result["phases"], "exit": ended - reported}
    return result, errors


def _top_imports(importtime_log: str, count: int = 25) -> list[tuple[int, str]]:
    """The slowest imports by cumulative time (microseconds) from ``-X importtime`` output."""
    rows = []
    for line in importtime_log.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dscnn")
    parser.add_argument("--dataset", default="fsdd")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--local-steps", type=int, default=1)
    parser.add_argument("--clients", type=int, default=2, help="IID shares of the data set")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes measured")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--importtime", help="also run once under -X importtime, log here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)), flush=True)
        return

    warm_up, _ = _run_child(args)
    print(f"device: {warm_up['device']}")
    print(f"warm-up process: {warm_up['programs_compiled']} programs compiled, "
          f"{warm_up['programs_from_disk']} loaded from disk, {warm_up['wall_s']:.2f} s")
    runs = [_run_child(args)[0] for _ in range(args.runs)]
    medians = {p: statistics.median(r["phases"][p] for r in runs) for p in PHASES}
    cpu_medians = {p: statistics.median(r["cpu"][p] for r in runs) for p in PHASES}
    total = statistics.median(r["wall_s"] for r in runs)
    cpu_total = statistics.median(r["cpu_s"] for r in runs)
    print(f"\nmedian of {args.runs} fresh processes ({args.model} on {args.dataset}, batch "
          f"{args.batch}, {args.local_steps} local step(s)); CPU time counts every thread, "
          "so it exceeds wall time where the OpenCL device computes on several cores:")
    print(f"  {'phase':<22} {'wall':>8}    {'CPU':>8}")
    for phase in PHASES:
        print(f"  {phase:<22} {medians[phase] * 1e3:8.0f} ms {cpu_medians[phase] * 1e3:8.0f} ms")
    print(f"  {'whole process':<22} {total * 1e3:8.0f} ms {cpu_total * 1e3:8.0f} ms")
    last = runs[-1]
    print(f"programs per process: {last['programs_compiled']} compiled, "
          f"{last['programs_from_disk']} from disk; peak resident memory "
          f"{last['peak_rss_bytes'] / 2**20:.0f} MiB")
    for when in ("import", "message"):
        heavy = sorted(set(HEAVY_MODULES) & set(last[f"packages_after_{when}"]))
        print(f"heavy modules loaded after the {when}: {', '.join(heavy) or 'none'}")
    if args.importtime:
        _, log = _run_child(args, importtime=True)
        with open(args.importtime, "w") as out:
            out.write(log)
        print("\nslowest imports (cumulative, -X importtime):")
        for micros, name in _top_imports(log):
            print(f"  {micros / 1e3:8.0f} ms  {name}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"settings": vars(args), "median_s": medians, "median_total_s": total,
                       "median_cpu_s": cpu_medians, "median_total_cpu_s": cpu_total,
                       "load_average": os.getloadavg(), "runs": runs}, out, indent=2)


if __name__ == "__main__":
    main()
