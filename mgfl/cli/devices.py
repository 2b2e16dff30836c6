"""``mgfl devices``: the OpenCL devices a client could train on."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from mgfl.cli import app
from mgfl.cli.errors import user_errors


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.1f} GiB"


@app.command()
def devices(
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List OpenCL platforms and devices with the figures that memory planning and kernel tuning
    use. The device marked * is the one chosen by default (MGFL_DEVICE, else a GPU if present)."""
    from client_runtime.device import choose_device, list_devices

    with user_errors():
        found = list_devices()
        chosen = choose_device(None).index
    if as_json:
        typer.echo(
            json.dumps([{**d.to_dict(), "default": d.index == chosen} for d in found], indent=2)
        )
        return
    table = Table(title="OpenCL devices")
    for col in (
        "#",
        "device",
        "kind",
        "platform",
        "driver",
        "global mem",
        "CUs",
        "local mem",
        "max WG",
        "fp16",
    ):
        table.add_column(col)
    for d in found:
        table.add_row(
            f"{d.index}{'*' if d.index == chosen else ''}",
            d.name,
            d.kind,
            d.platform,
            d.driver_version,
            _mib(d.global_mem_bytes),
            str(d.compute_units),
            f"{d.local_mem_bytes // 1024} KiB",
            str(d.max_work_group_size),
            "yes" if d.fp16 else "no",
        )
    Console().print(table)
