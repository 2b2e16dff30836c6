"""Turns the library's expected errors into one clear line and a non-zero exit."""

from __future__ import annotations

import contextlib

import typer
from rich.console import Console

err_console = Console(stderr=True)


@contextlib.contextmanager
def user_errors():
    """Errors that mean 'bad input or environment' are printed without a traceback."""
    from client_runtime.device import DeviceNotFoundError, NoOpenCLDeviceError
    from kernels.device_errors import DeviceError
    from kernels.library import KernelBuildError

    expected = (
        NoOpenCLDeviceError,
        DeviceNotFoundError,
        KernelBuildError,
        DeviceError,  # names the kernel, buffer or copy that failed
        MemoryError,  # a budget or arena that cannot hold the model: the message says what fits
        ValueError,
        FileNotFoundError,
    )
    try:
        yield
    except expected as err:
        err_console.print(f"[bold red]error:[/] {err}")
        raise typer.Exit(2) from err
