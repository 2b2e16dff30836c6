"""``mgfl doctor``: is this machine (a phone under Termux, a laptop, a server) ready to be a client?

Checks in order, each one only if the one before passed: an OpenCL platform and the chosen device,
the engine's kernels build for the model, one training step on the device matches the float64
NumPy reference, and the model fits the memory budget (with the largest batch that does).
Exits 1 if any check fails, so scripts can gate on it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import typer
from rich.console import Console
from rich.table import Table

from mgfl.cli import app

console = Console()
CHECK_BATCH = 4
MAX_BATCH = 4096
STEP_RTOL = 1e-3
STEP_ATOL = 1e-4


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


class DoctorFailure(Exception):
    """A check failed; the checks after it cannot run."""


def _device_check(selection: str | None, checks: list[Check]):
    from client_runtime.device import Device, choose_device, list_devices

    try:
        found = list_devices()
        checks.append(Check("OpenCL platform", True, f"{len(found)} device(s): "
                            + "; ".join(d.describe() for d in found)))
        info = choose_device(selection)
    except Exception as err:  # no platform, or a selection that matches nothing
        checks.append(Check("OpenCL device", False, str(err)))
        raise DoctorFailure from err
    device = Device(info)
    checks.append(Check("OpenCL device", True, f"{info.describe()}, {info.opencl_version}, "
                        f"{info.global_mem_bytes / 2**20:.0f} MiB global memory"))
    return device


def _build_check(device, model, checks: list[Check]):
    from client_runtime.step import CompiledStep

    before = dict(device.kernels.stats)
    try:
        step = CompiledStep(device, model, CHECK_BATCH, model.init_state(0), profile=False)
    except Exception as err:
        checks.append(Check("kernels build", False, f"{type(err).__name__}: {err}"))
        raise DoctorFailure from err
    stats = device.kernels.stats
    compiled = stats["compiled"] - before["compiled"]
    loaded = stats["loaded_from_disk"] - before["loaded_from_disk"]
    checks.append(Check("kernels build", True, f"{len(step.train_launches)} launches per step; "
                        f"{compiled} programs compiled, {loaded} loaded from the disk cache"))
    return step


def _step_check(step, model, checks: list[Check]) -> None:
    import numpy as np

    from mgfl.models import ReferenceTrainer

    rng = np.random.default_rng(0)
    x = rng.standard_normal((CHECK_BATCH, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, CHECK_BATCH).astype(np.int32)
    opt = step.optimizer
    reference = ReferenceTrainer(model, model.init_state(0), optimizer=opt.name, lr=opt.lr,
                                 momentum=opt.momentum, weight_decay=opt.weight_decay)
    reference.train_step(x.astype(np.float64), y)
    step.train_step(x, y)
    engine = step.get_state()
    worst_name, worst = "", 0.0
    for name, value in engine.items():
        expected = np.asarray(reference.state[name])
        error = np.abs(value - expected) / (STEP_ATOL + STEP_RTOL * np.abs(expected))
        if error.max() > worst:
            worst_name, worst = name, float(error.max())
    ok = worst <= 1.0 and all(np.isfinite(v).all() for v in engine.values())
    detail = (f"{len(engine)} arrays after one step; worst {worst_name or '-'} at "
              f"{worst:.2f} of the tolerance (rtol {STEP_RTOL}, atol {STEP_ATOL})")
    checks.append(Check("training step matches NumPy", ok, detail))
    if not ok:
        raise DoctorFailure(detail)


def _memory_check(device, model, budget_text: str | None, checks: list[Check]) -> dict:
    from client_runtime.budget import (
        DEFAULT_BUDGET_FRACTION,
        format_bytes,
        largest_fitting_batch,
        parse_bytes,
        staging_bytes,
    )
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import default_alignment, estimate_memory

    info = device.info
    budget = (parse_bytes(budget_text) if budget_text
              else int(info.global_mem_bytes * DEFAULT_BUDGET_FRACTION))
    budget = min(budget, info.global_mem_bytes)
    align = default_alignment(info.mem_base_addr_align_bytes)
    trainable = set(model.parameter_shapes())

    def peak_of(batch: int) -> int:
        arena = estimate_memory(model, batch, trainable, OptimizerConfig(), align).peak_bytes
        return min(arena, info.max_alloc_bytes + 1) + staging_bytes(model, batch)

    largest = largest_fitting_batch(peak_of, budget, MAX_BATCH)
    source = "--memory-budget" if budget_text else f"{DEFAULT_BUDGET_FRACTION:.0%} of the device"
    if largest:
        detail = (f"budget {format_bytes(budget)} ({source}): largest batch {largest}"
                  f"{'+' if largest == MAX_BATCH else ''} at {format_bytes(peak_of(largest))}; "
                  f"batch 1 needs {format_bytes(peak_of(1))}")
    else:
        detail = (f"budget {format_bytes(budget)} ({source}) is below the "
                  f"{format_bytes(peak_of(1))} that batch 1 needs; raise it or freeze layers")
    checks.append(Check("memory budget", bool(largest), detail))
    return {"budget_bytes": budget, "largest_batch": largest, "batch1_bytes": peak_of(1)}


def run_checks(selection: str | None, model_name: str, budget: str | None) -> tuple[list, dict]:
    """All checks that can run; stops at the first failure."""
    from mgfl.models import build_model

    checks: list[Check] = []
    facts: dict = {}
    try:
        try:
            model = build_model(model_name)
        except ValueError as err:
            checks.append(Check("model", False, str(err)))
            raise DoctorFailure from err
        device = _device_check(selection, checks)
        facts["device"] = device.info.to_dict()
        step = _build_check(device, model, checks)
        _step_check(step, model, checks)
        facts["memory"] = _memory_check(device, model, budget, checks)
    except DoctorFailure:
        pass
    return checks, facts


@app.command()
def doctor(
    device: str = typer.Option(None, help="OpenCL device (index, gpu/cpu, or part of its name)."),
    model: str = typer.Option("mlp", help="Zoo model to build, step and fit."),
    memory_budget: str = typer.Option(
        None, "--memory-budget", help="Bytes the client may use (e.g. 512MB); default a quarter "
        "of the device's global memory."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check that this machine can train as an mgfl client: OpenCL, kernels, a step against NumPy,
    memory. Exits 1 when a check fails."""
    checks, facts = run_checks(device, model, memory_budget)
    ok = all(c.ok for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "model": model, "checks": [asdict(c) for c in checks],
                          **facts}, indent=2))
    else:
        table = Table(title=f"mgfl doctor ({model})")
        for column in ("check", "result", "detail"):
            table.add_column(column)
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[bold red]FAILED[/]", c.detail)
        console.print(table)
        console.print("[green]ready[/]" if ok else "[bold red]not ready:[/] fix the first failed "
                      "check and run mgfl doctor again")
    if not ok:
        raise typer.Exit(1)
