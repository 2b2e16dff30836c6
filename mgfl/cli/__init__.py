"""The ``mgfl`` command line. Each sub-command lives in a module of its own and registers itself
on :data:`app`; heavy imports happen inside the commands so that ``mgfl --help`` stays fast."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="mgfl",
    help="Federated and continual learning on phone GPUs through OpenCL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Federated and continual learning on phone GPUs through OpenCL.

    Select the OpenCL device of any command with --device or the MGFL_DEVICE variable (an index,
    gpu/cpu/accelerator, or part of the device's name); `mgfl devices` lists them."""


# Sub-command modules register themselves on `app` when imported.
from mgfl.cli import (  # noqa: E402,F401
    bench,
    data,  # noqa: E402,F401
    devices,
    doctor,
    export,
    incremental,
    memory,
    simulate,  # noqa: E402,F401
    train,
    tune,
)


def main() -> None:
    app()
