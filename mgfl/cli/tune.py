"""``mgfl tune``: time kernel variants on this device and keep the fastest correct ones."""

from __future__ import annotations

import json
import re

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors

console = Console()


def parse_seconds(text: str) -> float:
    """``60``, ``60s``, ``2m`` or ``1.5min`` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min)?\s*", text)
    if not match:
        raise ValueError(f"Cannot read the budget {text!r}; write e.g. 60s or 2m")
    value = float(match.group(1))
    return value * 60 if match.group(2) in ("m", "min") else value


@app.command()
def tune(
    budget: str = typer.Option("60s", help="Time to spend, e.g. 60s or 2m."),
    device: str = typer.Option(
        None, help="OpenCL device (index, gpu/cpu, or part of its name); default MGFL_DEVICE."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Time GEMM tile sizes, vector widths and work-group shapes (and im2col and depthwise
    layouts) on square and training-shaped problems with OpenCL events; every candidate is
    checked against NumPy. Winners go to the device's tuning cache (keyed by device and driver),
    which training then uses. A trial that starts before the budget ends is finished."""
    from client_runtime.device import Device
    from kernels.tuner import Tuner, default_shapes

    with user_errors():
        seconds = parse_seconds(budget)
        if seconds <= 0:
            raise ValueError("The budget must be positive")
        dev = Device.open(device)
        shapes = default_shapes(dev.cl_device)
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=as_json,
                      disable=as_json) as progress:
            task = progress.add_task(f"tuning {dev.info.name}", total=seconds)
            tuner = Tuner(dev.kernels, dev.queue, seconds)
            started = tuner.clock()

            def update(trial) -> None:
                progress.update(task, completed=min(seconds, tuner.clock() - started),
                                description=f"{trial.label}: {len(done) + 1} trials")
                done.append(trial)

            done: list = []
            tuner.on_trial = update
            report = tuner.run(shapes)
            progress.update(task, completed=seconds)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    _print(report, dev)


def _print(report, dev) -> None:
    from dataclasses import asdict

    from kernels.gemm import default_config

    default = asdict(default_config(dev.cl_device))
    table = Table(title=f"Tuning on {dev.info.describe()}")
    for column in ("case", "trials", "rejected", "default", "best", "speedup", "winner"):
        table.add_column(column)
    for result in (*report.gemm, *report.families):
        rejected = sum(t.seconds is None for t in result.trials)
        table.add_row(
            result.label, str(len(result.trials)), str(rejected),
            _ms(result.default_seconds), _ms(result.best_seconds),
            f"{result.speedup:.2f}x" if result.speedup else "-", _brief(result.best, default),
        )
    console.print(table)
    console.print(f"{report.trials} trials; cache: {report.cache_file}")


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds else "-"


def _brief(best: dict | None, default: dict) -> str:
    """The winner's fields that differ from the device's default."""
    if best is None:
        return "-"
    if "use_local_memory" not in best:
        return ", ".join(f"{k}={v}" for k, v in best.items()) or "defaults"
    changed = [f"{k}={v}" for k, v in best.items() if default.get(k) != v]
    return ", ".join(changed) or "default"
