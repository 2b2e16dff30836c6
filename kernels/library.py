"""Builds the OpenCL programs of this package once per device and set of defines.

Compiling a program takes from tens of milliseconds (PoCL) to seconds (a phone's driver), and a
Flower SuperNode starts a fresh process for every message. Built binaries are therefore kept on
disk, keyed by the source text, the defines, the build options and the device and driver, so
that a second process loads them instead of compiling.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyopencl as cl

SOURCE_DIR = Path(__file__).parent / "cl"
CACHE_ENV = "MGFL_CACHE_DIR"
BUILD_OPTIONS = ("-cl-std=CL1.2", "-cl-mad-enable")

Defines = dict[str, "int | float | str"]


def default_cache_dir() -> Path:
    """``$MGFL_CACHE_DIR`` or the user's cache directory; programs live under ``programs/``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mgfl"))


class KernelBuildError(RuntimeError):
    """An OpenCL program failed to build; names the source file, the defines and the log."""


def _define_flags(defines: Defines) -> list[str]:
    flags = []
    for key in sorted(defines):
        value = defines[key]
        if isinstance(value, float):
            value = f"{value!r}f"
        flags.append(f"-D{key}={value}")
    return flags


class KernelLibrary:
    """Programs built for one device, with in-memory and on-disk caches.

    ``stats`` counts compilations and disk loads, so tests and benchmarks can see that a second
    process does not recompile.
    """

    def __init__(
        self,
        context: cl.Context,
        device: cl.Device,
        device_key: str,
        cache_dir: Path | None = None,
        use_disk_cache: bool = True,
    ):
        self.context = context
        self.device = device
        self.device_key = device_key
        self.cache_dir = (cache_dir or default_cache_dir()) / "programs"
        self.use_disk_cache = use_disk_cache
        self._programs: dict[tuple, cl.Program] = {}
        self.stats = {"compiled": 0, "loaded_from_disk": 0, "memory_hits": 0}

    def source(self, name: str) -> str:
        path = SOURCE_DIR / f"{name}.cl"
        if not path.exists():
            raise FileNotFoundError(f"No kernel source {path.name} in {SOURCE_DIR}")
        return path.read_text()

    def program(self, name: str, defines: Defines | None = None) -> cl.Program:
        """The built program ``kernels/cl/<name>.cl`` with the given build-time defines."""
        defines = dict(defines or {})
        options = [*BUILD_OPTIONS, *_define_flags(defines)]
        memo_key = (name, tuple(options))
        if memo_key in self._programs:
            self.stats["memory_hits"] += 1
            return self._programs[memo_key]
        source = self.source(name)
        digest = hashlib.sha256(
            "\0".join([source, *options, self.device_key]).encode()
        ).hexdigest()[:32]
        path = self.cache_dir / f"{name}-{digest}.bin"
        program = self._load(path, options) if self.use_disk_cache else None
        if program is None:
            program = self._compile(name, source, options, defines)
            if self.use_disk_cache:
                self._store(path, program)
        self._programs[memo_key] = program
        return program

    def kernel(
        self, program_name: str, kernel_name: str, defines: Defines | None = None
    ) -> cl.Kernel:
        """A fresh kernel object, so that each launch can bind its own arguments once."""
        return cl.Kernel(self.program(program_name, defines), kernel_name)

    def group_kernel(self, program_name: str, kernel_name: str, defines: Defines,
                     group_define: str) -> cl.Kernel:
        """``kernel``, checked to run work-groups of ``defines[group_define]`` items on this
        device (a kernel's own limit can be below the device's when it needs many registers)."""
        group = int(defines[group_define])
        kernel = self.kernel(program_name, kernel_name, defines)
        limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device)
        if group > limit:
            raise ValueError(
                f"{kernel_name} runs at most {limit} work-items per group on "
                f"{self.device.name.strip()}; build it with a smaller {group_define} (got {group})"
            )
        return kernel

    def _compile(self, name: str, source: str, options: list[str], defines: Defines) -> cl.Program:
        try:
            program = cl.Program(self.context, source).build(options=options, cache_dir=False)
        except cl.RuntimeError as err:
            raise KernelBuildError(
                f"Kernel source {name}.cl failed to build on {self.device.name.strip()} with "
                f"defines {defines}:\n{err}"
            ) from err
        self.stats["compiled"] += 1
        return program

    def _load(self, path: Path, options: list[str]) -> cl.Program | None:
        if not path.exists():
            return None
        try:
            binary = path.read_bytes()
            program = cl.Program(self.context, [self.device], [binary]).build(options=options)
        except (cl.Error, OSError):
            return None  # a stale or foreign binary: compile from source instead
        self.stats["loaded_from_disk"] += 1
        return program

    def _store(self, path: Path, program: cl.Program) -> None:
        try:
            binaries = program.get_info(cl.program_info.BINARIES)
            if not binaries or not binaries[0]:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(bytes(binaries[0]))
            os.replace(tmp, path)  # atomic: a concurrent reader sees a whole file or none
        except (cl.Error, OSError):
            pass  # the cache is an optimisation; a read-only disk must not stop training


def as_int(value: int) -> np.int32:
    """Kernel scalar arguments are 32-bit; fail loudly rather than wrap silently."""
    if not -(2**31) <= int(value) < 2**31:
        raise OverflowError(f"{value} does not fit a 32-bit kernel argument")
    return np.int32(value)
