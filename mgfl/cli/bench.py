"""``mgfl bench``: mgfl side by side with reference libraries on the same hardware."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

import typer
from rich.console import Console

from mgfl.cli import app
from mgfl.cli.errors import user_errors

SUITES = ("gemm", "step", "paper")


@app.command()
def bench(
    suite: str = typer.Option("all", help="gemm, step, paper or all."),
    device: str = typer.Option(
        None, help="OpenCL device (index, gpu/cpu, or part of its name); default MGFL_DEVICE."
    ),
    json_path: Path = typer.Option(None, "--json", help="Write the rows to this JSON file."),
    repeats: int = typer.Option(10, min=1, help="Timed repetitions per case (medians)."),
    quick: bool = typer.Option(False, help="Tiny cases only (a smoke test of the machinery)."),
    tinygrad_budget: float = typer.Option(
        600.0, min=1.0,
        help="Seconds tinygrad may take per model in the step suite (its kernels compile on first "
        "use); a model over budget gets a note instead of a row.",
    ),
) -> None:
    """Time GEMMs, training steps and the seed paper's experiment with mgfl and with NumPy,
    PyTorch (CPU or CUDA) and tinygrad (same OpenCL device, in a child process) where installed,
    on the same inputs, warm-up excluded, medians of repeats.
    ratio = reference time / mgfl time (above 1: mgfl is faster)."""
    from client_runtime.device import Device
    from mgfl.bench import gemm, paper, step
    from mgfl.bench.report import print_table, write_json

    with user_errors():
        chosen = SUITES if suite == "all" else (suite,)
        if any(s not in SUITES for s in chosen):
            raise ValueError(f"Unknown suite {suite!r}; expected one of {', '.join(SUITES)}, all")
        dev = Device.open(device)
        console = Console()
        rows, notes = [], []
        for name in chosen:
            if name == "gemm":
                rows += gemm.run(dev, repeats, quick)
            elif name == "step":
                found, missing = step.run(dev, repeats, quick,
                                          tinygrad_budget_s=tinygrad_budget)
                rows += found
                notes += missing
            else:
                rows += paper.run(dev, repeats, quick)
        print_table(rows, f"mgfl bench on {dev.info.describe()}", console)
        for note in notes:
            console.print(f"note: {note}")
        if json_path:
            meta = {"device": dev.info.to_dict(), "date": datetime.date.today().isoformat(),
                    "host": platform.node(), "suites": list(chosen), "repeats": repeats,
                    "quick": quick, "notes": notes}
            write_json(rows, json_path, meta)
