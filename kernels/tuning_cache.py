"""Tuning results kept on disk per device and driver, and read back where kernels are launched.

The tuner (``kernels/tuner.py``) writes one JSON file per device under
``$MGFL_CACHE_DIR/tuning/``, keyed by the device's cache key (platform, driver and device name),
so a driver update starts from the defaults again. ``tuned_config`` is what ``gemm()`` asks when
no configuration is given: the winner tuned on the shape nearest to the product at hand, or the
device type's default. The file is read once per KernelLibrary.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import weakref
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kernels.library import KernelLibrary, default_cache_dir

TUNING_SUBDIR = "tuning"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class GemmWinner:
    """The fastest correct GemmConfig found for one product shape, and how fast it ran."""

    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    config: dict
    seconds: float
    default_seconds: float

    @property
    def gflops(self) -> float:
        return 2.0 * self.m * self.n * self.k / self.seconds / 1e9


@dataclass
class TuningCache:
    """Everything tuned on one device: GEMM winners by shape, and the winning defines of other
    kernel families (``im2col``, ``depthwise``) by family name."""

    device_key: str
    gemm: list[GemmWinner] = field(default_factory=list)
    defines: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "device_key": self.device_key,
            "gemm": [asdict(w) for w in self.gemm],
            "defines": self.defines,
        }

    @classmethod
    def from_json(cls, data: dict) -> TuningCache:
        names = {f.name for f in fields(GemmWinner)}
        winners = [GemmWinner(**{k: v for k, v in w.items() if k in names}) for w in data["gemm"]]
        defines = {family: {k: int(v) for k, v in d.items()} for family, d in
                   data.get("defines", {}).items()}
        return cls(device_key=data["device_key"], gemm=winners, defines=defines)

    def put_gemm(self, winner: GemmWinner) -> None:
        """Keep ``winner``, replacing an earlier winner of the same shape."""
        same = (winner.m, winner.n, winner.k, winner.trans_a, winner.trans_b)
        self.gemm = [w for w in self.gemm if (w.m, w.n, w.k, w.trans_a, w.trans_b) != same]
        self.gemm.append(winner)

    def nearest_gemm(self, m: int, n: int, k: int, trans_a: bool, trans_b: bool
                     ) -> GemmWinner | None:
        """The winner tuned on the shape closest to (m, n, k) in log scale, preferring the same
        transposition (it selects the kernel variant); None when nothing was tuned."""
        if not self.gemm:
            return None

        def distance(w: GemmWinner) -> tuple[bool, float]:
            size = sum(abs(math.log2(a / b)) for a, b in ((w.m, m), (w.n, n), (w.k, k)))
            return ((w.trans_a, w.trans_b) != (trans_a, trans_b), size)

        return min(self.gemm, key=distance)


def cache_path(device_key: str, cache_dir: Path | None = None) -> Path:
    """``<cache>/tuning/<readable name>-<hash of the key>.json`` for one device and driver."""
    root = cache_dir if cache_dir is not None else default_cache_dir()
    readable = re.sub(r"[^A-Za-z0-9]+", "-", device_key).strip("-")[:60]
    digest = hashlib.sha256(device_key.encode()).hexdigest()[:16]
    return Path(root) / TUNING_SUBDIR / f"{readable}-{digest}.json"


def load_cache(device_key: str, cache_dir: Path | None = None) -> TuningCache | None:
    """The device's tuning results, or None when it was never tuned (or the file is unreadable,
    or belongs to another key: untuned devices use the defaults)."""
    path = cache_path(device_key, cache_dir)
    try:
        data = json.loads(path.read_text())
        cache = TuningCache.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if data.get("version") != FORMAT_VERSION or cache.device_key != device_key:
        return None
    return cache


def save_cache(cache: TuningCache, cache_dir: Path | None = None) -> Path:
    """Write atomically, so a process that reads concurrently sees the old file or the new one."""
    path = cache_path(cache.device_key, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache.to_json(), indent=2))
    os.replace(tmp, path)
    return path


# One read per KernelLibrary: gemm() is called for every GEMM of a compiled step.
_LOADED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def library_cache(lib: KernelLibrary) -> TuningCache | None:
    """The tuning results of ``lib``'s device, read from disk on first use."""
    if lib not in _LOADED:
        _LOADED[lib] = load_cache(lib.device_key, lib.cache_dir.parent)
    return _LOADED[lib]


def use_cache(lib: KernelLibrary, cache: TuningCache | None) -> None:
    """Make ``lib`` use ``cache`` from now on (after tuning), without reading the disk again."""
    _LOADED[lib] = cache


def tuned_config(lib: KernelLibrary, m: int, n: int, k: int, trans_a: bool = False,
                 trans_b: bool = False):
    """The GemmConfig for this product on ``lib``'s device: the tuned winner of the nearest shape
    when the device was tuned, otherwise ``default_config`` for its size."""
    from kernels.gemm import GemmConfig, default_config

    cache = library_cache(lib)
    winner = cache.nearest_gemm(m, n, k, trans_a, trans_b) if cache else None
    if winner is None:
        return default_config(lib.device, m, n)
    try:
        return GemmConfig(**winner.config)
    except (TypeError, ValueError):
        return default_config(lib.device, m, n)  # an older GemmConfig's: the default


def tuned_defines(lib: KernelLibrary, family: str) -> dict[str, int] | None:
    """The tuned build-time defines of a kernel family (``im2col``, ``depthwise``), for the
    ``tuning=`` argument of its launch functions; None when the device was not tuned."""
    cache = library_cache(lib)
    if cache is None or family not in cache.defines:
        return None
    return dict(cache.defines[family])
