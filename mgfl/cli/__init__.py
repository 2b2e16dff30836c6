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
    try:
        app()
    except SystemExit as done:
        _end(done.code)
        raise
    _end(0)


def _end(code) -> None:
    """After a command that used NVIDIA's OpenCL, leave without the interpreter's teardown, where
    the driver crashes while buffers are freed; everything has been written and flushed."""
    import sys

    if "client_runtime.device" not in sys.modules:
        return
    from client_runtime.device import crash_prone_driver_opened

    if crash_prone_driver_opened():
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))
