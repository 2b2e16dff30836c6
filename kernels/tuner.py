"""Per-device tuning of the GEMM, im2col and depthwise kernels, bounded by a time budget.

CPU drivers and GPUs want different tile shapes, vector widths and work-group shapes (a GPU tile
runs at a few GFLOP/s on PoCL, ENGINE-NOTES), and phone GPUs differ among themselves. The tuner
times candidate build-time defines with OpenCL profiling events on representative shapes (square
products and the training shapes of the zoo models), checks every candidate against NumPy before
its time counts, skips candidates that do not build or exceed the device's limits, and keeps the
winners in the device's tuning cache (``kernels/tuning_cache.py``), which ``gemm()`` reads.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pyopencl as cl

from kernels import depthwise, im2col
from kernels.conv_shape import ConvShape
from kernels.gemm import MAX_LOCAL_MEMORY, GemmConfig, blocked_candidates, default_config, gemm
from kernels.launch import Launch
from kernels.library import KernelBuildError, KernelLibrary
from kernels.reference import depthwise as depthwise_ref
from kernels.reference import im2col as im2col_ref
from kernels.tuning_cache import GemmWinner, TuningCache, load_cache, save_cache, use_cache

TOLERANCE = 1e-4  # max |ours - float64| / max |float64|, as in the kernel tests
TARGET_SECONDS = 0.05  # device time spent timing one candidate (at least MIN_REPEATS runs)
MIN_REPEATS, MAX_REPEATS = 3, 25
GEMM_SHARE = 0.8  # of the budget; the rest goes to im2col and depthwise


CandidateSource = Callable[[cl.Device, "GemmShape"], list[GemmConfig]]


@dataclass(frozen=True)
class GemmShape:
    """One product ``op(A) (m x k) @ op(B) (k x n)`` to tune on, named for what it stands for."""

    label: str
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False


def square_shapes(sizes: Sequence[int] = (256, 512, 1024)) -> list[GemmShape]:
    return [GemmShape(f"square {s}", s, s, s) for s in sizes]


def training_shapes() -> list[GemmShape]:
    """The GEMMs that dominate the zoo models' training steps at their benchmark batches: the
    paper MLP's forward (x @ W^T), backward-data (dy @ W) and weight-gradient (dy^T @ x)
    products, and the per-image convolution products (W @ col) of LeNet-5, DS-CNN and
    MobileNetV2-0.35."""
    return [
        GemmShape("mlp fc1 forward", 32, 256, 784, trans_b=True),
        GemmShape("mlp fc1 backward data", 32, 784, 256),
        GemmShape("mlp fc1 weight grad", 256, 784, 32, trans_a=True),
        GemmShape("lenet5 conv2 forward", 16, 100, 150),
        GemmShape("dscnn pointwise forward", 64, 125, 64),
        GemmShape("dscnn pointwise weight grad", 64, 64, 125, trans_b=True),
        GemmShape("mobilenetv2 expand forward", 96, 1024, 16),
        GemmShape("mobilenetv2 head forward", 1280, 64, 112),
    ]


def default_shapes(device: cl.Device) -> list[GemmShape]:
    """Square 256/512/1024 and the training shapes; GPUs also 2048."""
    sizes = (256, 512, 1024) if device.type & cl.device_type.CPU else (256, 512, 1024, 2048)
    return [*square_shapes(sizes), *training_shapes()]


def _register_candidates(base: GemmConfig, dot: bool) -> list[GemmConfig]:
    if dot:
        grid = itertools.product((2, 3, 4), (2, 4, 6), (8, 16), (4, 8, 16))
        return [replace(base, dot_rows=r, dot_cols=c, dot_width=w, group_rows=g)
                for r, c, w, g in grid]
    grid = itertools.product((4, 6, 8), (8, 16), (1, 2), (64, 128, 256), (True, False), (8, 16))
    return [
        replace(base, rows_per_item=rm, vector_width=vw, vectors_per_row=nv, k_block=kc,
                pack_b=pack, group_rows=g)
        for rm, vw, nv, kc, pack, g in grid
    ]


def _local_candidates() -> list[GemmConfig]:
    found = []
    for tm, tn, tk, wm, wn in itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32),
                                                (4, 8), (4, 8)):
        try:
            found.append(GemmConfig(use_local_memory=True, tile_m=tm, tile_n=tn, tile_k=tk,
                                    wpt_m=wm, wpt_n=wn))
        except ValueError:
            continue  # a work per item that does not divide the tile
    return found


def gemm_candidates(device: cl.Device, shape: GemmShape) -> list[GemmConfig]:
    """The device's default for this shape first, then, on GPUs large enough for it, the blocked
    style's tiles (``blocked_candidates``: the likely winners there, so a short budget reaches
    them), then the other configurations of the default's style in a fixed shuffled order (so a
    short budget samples the whole space), without those that exceed the device's work-group
    size or the local-memory budget."""
    base = default_config(device, shape.m, shape.n)
    if base.use_local_memory:
        pool = _local_candidates()
    else:
        pool = _register_candidates(base, dot=shape.trans_b and not shape.trans_a)
    # Neighbours of the default first (a build costs seconds on a CPU driver, so a short budget
    # should try small changes), then farther configurations in a fixed shuffled order.
    shuffled = np.random.default_rng(0).permutation(len(pool))
    order = sorted(shuffled, key=lambda i: _distance(pool[i], base))
    budget = min(MAX_LOCAL_MEMORY, int(device.local_mem_size))
    limit = int(device.max_work_group_size)
    out = [base, *(c for c in blocked_candidates(device) if c != base)]
    for index in order:
        config = pool[index]
        if config == base or config.local_memory_bytes > budget:
            continue
        if config.use_local_memory:
            width, height = config.local_group
            if width * height > limit:
                continue
        out.append(config)
    return out


def _distance(config: GemmConfig, base: GemmConfig) -> int:
    a, b = asdict(config), asdict(base)
    return sum(a[name] != b[name] for name in a)


@dataclass
class Trial:
    """One candidate on one shape: its median time, or why it was not timed."""

    label: str
    candidate: dict
    seconds: float | None
    error: float | None = None
    skipped: str | None = None


@dataclass
class ShapeResult:
    """The outcome on one shape: the default's time, the winner's, and every trial."""

    label: str
    default_seconds: float | None
    best_seconds: float | None
    best: dict | None
    trials: list[Trial] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.default_seconds and self.best_seconds:
            return self.default_seconds / self.best_seconds
        return None


@dataclass
class TuneReport:
    device_key: str
    budget_s: float
    gemm: list[ShapeResult] = field(default_factory=list)
    families: list[ShapeResult] = field(default_factory=list)
    cache_file: str = ""

    @property
    def trials(self) -> int:
        """Candidates timed or rejected, over all shapes and families."""
        return sum(len(r.trials) for r in (*self.gemm, *self.families))

    def to_json(self) -> dict:
        return {
            "device_key": self.device_key, "budget_s": self.budget_s,
            "cache_file": self.cache_file, "trials": self.trials,
            "gemm": [_result_json(r) for r in self.gemm],
            "families": [_result_json(r) for r in self.families],
        }


def _result_json(result: ShapeResult) -> dict:
    return {"label": result.label, "default_s": result.default_seconds,
            "best_s": result.best_seconds, "speedup": result.speedup, "best": result.best,
            "trials": len(result.trials),
            "rejected": sum(t.seconds is None for t in result.trials)}


def require_profiling_queue(queue: cl.CommandQueue, what: str) -> None:
    """Raise a ValueError naming the fix when ``queue`` records no profiling events."""
    if not queue.properties & cl.command_queue_properties.PROFILING_ENABLE:
        raise ValueError(
            f"{what} times with OpenCL profiling events, but the queue was created without "
            "PROFILING_ENABLE: open the device with profiling=True (Device.open(selection, "
            "profiling=True), the default of client_runtime.device.Device)"
        )


def median_event_seconds(queue: cl.CommandQueue, launches: list[Launch], repeats: int) -> float:
    """Median over ``repeats`` of the device time of ``launches`` (OpenCL profiling events)."""
    require_profiling_queue(queue, "median_event_seconds")
    times = []
    for _ in range(repeats):
        events = [launch.enqueue(queue) for launch in launches]
        queue.finish()
        times.append(sum((e.profile.end - e.profile.start) * 1e-9 for e in events))
    return statistics.median(times)


def _repeats_for(seconds: float) -> int:
    return int(min(MAX_REPEATS, max(MIN_REPEATS, TARGET_SECONDS / max(seconds, 1e-9))))


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected|; infinite when ``actual`` holds NaN or Inf."""
    if not np.all(np.isfinite(actual)):
        return float("inf")
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    return float(np.max(np.abs(actual.astype(np.float64) - expected))) / scale


class Tuner:
    """Times candidates on one device until ``budget_s`` seconds (by ``clock``) are spent, and
    keeps the fastest correct one per shape (GEMM) or per family (im2col, depthwise)."""

    def __init__(self, lib: KernelLibrary, queue: cl.CommandQueue, budget_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_trial: Callable[[Trial], None] | None = None, seed: int = 0):
        require_profiling_queue(queue, "The tuner")
        self.lib, self.queue, self.budget_s = lib, queue, float(budget_s)
        self.clock, self.on_trial = clock, on_trial
        self.rng = np.random.default_rng(seed)
        self._deadline = 0.0

    # -- the whole run ---------------------------------------------------------------------
    def run(self, shapes: Sequence[GemmShape] | None = None, families: bool = True,
            save: bool = True, candidates: CandidateSource | None = None) -> TuneReport:
        """Tune ``shapes`` (default: ``default_shapes``) and, with ``families``, im2col and
        depthwise; merge the winners into the device's cache and (with ``save``) write it.
        ``candidates`` (default: ``gemm_candidates``) lists the configurations of one shape."""
        start = self.clock()
        self._deadline = start + self.budget_s
        shapes = list(shapes) if shapes is not None else default_shapes(self.lib.device)
        report = TuneReport(self.lib.device_key, self.budget_s)
        cache = load_cache(self.lib.device_key, self.lib.cache_dir.parent)
        cache = cache or TuningCache(self.lib.device_key)
        gemm_end = start + self.budget_s * (GEMM_SHARE if families else 1.0)
        for index, shape in enumerate(shapes):
            share = (gemm_end - self.clock()) / (len(shapes) - index)
            result = self.tune_gemm(shape, self.clock() + share, candidates)
            report.gemm.append(result)
            if result.best is not None:
                cache.put_gemm(GemmWinner(shape.m, shape.n, shape.k, shape.trans_a,
                                          shape.trans_b, result.best, result.best_seconds,
                                          result.default_seconds or result.best_seconds))
        if families:
            for index, (family, tune) in enumerate(self._families()):
                share = (self._deadline - self.clock()) / (2 - index)
                result = tune(self.clock() + share)
                report.families.append(result)
                if result.best is not None:
                    cache.defines[family] = result.best
        if save:
            report.cache_file = str(save_cache(cache, self.lib.cache_dir.parent))
        use_cache(self.lib, cache)
        return report

    def _families(self):
        return (("im2col", self.tune_im2col), ("depthwise", self.tune_depthwise))

    def _time_left(self, deadline: float) -> bool:
        return self.clock() < min(deadline, self._deadline or deadline)

    # -- GEMM --------------------------------------------------------------------------------
    def gemm_launch(self, config: GemmConfig, shape: GemmShape, a, b, c) -> Launch:
        """The launch a candidate is timed as (a method, so a test can substitute a faulty
        kernel and see it rejected)."""
        return gemm(self.lib, a, b, c, m=shape.m, n=shape.n, k=shape.k, trans_a=shape.trans_a,
                    trans_b=shape.trans_b, config=config)

    def tune_gemm(self, shape: GemmShape, deadline: float,
                  candidates: CandidateSource | None = None) -> ShapeResult:
        """The first candidate (the default) always, then the others while time is left."""
        operands = self._gemm_operands(shape)
        result = ShapeResult(shape.label, None, None, None)
        best_config = None
        source = candidates or gemm_candidates
        for number, config in enumerate(source(self.lib.device, shape)):
            if number and not self._time_left(deadline):
                break
            trial = self._gemm_trial(config, shape, operands)
            result.trials.append(trial)
            if self.on_trial:
                self.on_trial(trial)
            if trial.seconds is None:
                continue
            if number == 0:
                result.default_seconds = trial.seconds
            if result.best_seconds is None or trial.seconds < result.best_seconds:
                result.best_seconds, best_config = trial.seconds, config
        if best_config is not None:
            # Checked once more on fresh operands before it is kept.
            recheck = self._gemm_trial(best_config, shape, self._gemm_operands(shape), time=False)
            if recheck.skipped is None:
                result.best = asdict(best_config)
            else:
                result.best_seconds = None
        return result

    def _gemm_operands(self, shape: GemmShape):
        a_shape = (shape.k, shape.m) if shape.trans_a else (shape.m, shape.k)
        b_shape = (shape.n, shape.k) if shape.trans_b else (shape.k, shape.n)
        a = self.rng.standard_normal(a_shape).astype(np.float32)
        b = self.rng.standard_normal(b_shape).astype(np.float32)
        op_a = a.T if shape.trans_a else a
        op_b = b.T if shape.trans_b else b
        expected = op_a.astype(np.float64) @ op_b.astype(np.float64)
        return a, b, expected

    def _gemm_trial(self, config: GemmConfig, shape: GemmShape, operands, time: bool = True
                    ) -> Trial:
        a, b, expected = operands
        ctx = self.lib.context
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        out = np.full(expected.shape, np.nan, np.float32)
        bufs = (cl.Buffer(ctx, flags, hostbuf=a), cl.Buffer(ctx, flags, hostbuf=b),
                cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=out))
        candidate = asdict(config)
        try:
            launch = self.gemm_launch(config, shape, *bufs)
        except (KernelBuildError, ValueError, cl.Error) as err:
            return Trial(shape.label, candidate, None, skipped=f"not built: {_first_line(err)}")
        return self._check_and_time(shape.label, candidate, [launch],
                                    lambda: _read(self.queue, bufs[2], out), expected, time)

    def _check_and_time(self, label: str, candidate: dict, launches: list[Launch],
                        read: Callable[[], np.ndarray], expected: np.ndarray, time: bool,
                        poison: Callable[[], None] | None = None) -> Trial:
        try:
            if poison:
                poison()  # an element the candidate leaves unwritten must fail the check
            first = median_event_seconds(self.queue, launches, 1)
            error = relative_error(read(), expected)
            if not error < TOLERANCE:
                return Trial(label, candidate, None, error, skipped=f"wrong: error {error:.2g}")
            seconds = (median_event_seconds(self.queue, launches, _repeats_for(first))
                       if time else first)
        except cl.Error as err:  # out of resources at launch time on some drivers
            return Trial(label, candidate, None, skipped=f"failed: {_first_line(err)}")
        return Trial(label, candidate, seconds, error)

    # -- im2col and depthwise ----------------------------------------------------------------
    def _tune_defines(self, family: str, candidates: list[dict[str, int]], cases: list,
                      deadline: float) -> ShapeResult:
        """Like tune_gemm, but one winner for all ``cases`` (total time over them): each case is
        (build(defines) -> launches, read() -> array, expected array, poison() refilling the
        outputs with NaN)."""
        result = ShapeResult(family, None, None, None)
        for number, defines in enumerate(candidates):
            if number and not self._time_left(deadline):
                break
            total, trial = 0.0, None
            for build, read, expected, poison in cases:
                try:
                    launches = build(defines)
                except (KernelBuildError, ValueError, cl.Error) as err:
                    trial = Trial(family, defines, None, skipped=f"not built: {_first_line(err)}")
                    break
                trial = self._check_and_time(family, defines, launches, read, expected, True,
                                             poison)
                if trial.seconds is None:
                    break
                total += trial.seconds
            trial = replace(trial, seconds=total) if trial.seconds is not None else trial
            result.trials.append(trial)
            if self.on_trial:
                self.on_trial(trial)
            if trial.seconds is None:
                continue
            if number == 0:
                result.default_seconds = total
            if result.best_seconds is None or total < result.best_seconds:
                result.best_seconds, result.best = total, dict(defines)
        return result

    def tune_im2col(self, deadline: float, shapes: Sequence[ConvShape] | None = None
                    ) -> ShapeResult:
        """im2col layouts (work-group size, rows and column runs per work-item) on the dense
        convolutions of LeNet-5, DS-CNN and MobileNetV2."""
        shapes = shapes or [
            ConvShape(64, 1, 28, 28, 6, 5, 5, pad_h=2, pad_w=2),
            ConvShape(64, 1, 49, 10, 64, 10, 4, 2, 2, 5, 1),
            ConvShape(32, 3, 32, 32, 16, 3, 3, pad_h=1, pad_w=1),
        ]
        names = ("IM2COL_WG", "IM2COL_ROWS", "IM2COL_RUN")
        grid = [dict(zip(names, v, strict=True))
                for v in itertools.product((32, 64, 128), (1, 4, 8), (1, 8, 32))]
        candidates = [{}, *grid]  # {}: the launch function's own defaults for the device
        cases = []
        for shape in shapes:
            x = self.rng.standard_normal((shape.n, shape.c, shape.h, shape.w)).astype(np.float32)
            expected = im2col_ref.im2col(x, shape)
            x_buf, (col_buf, col) = self._upload(x), self._poisoned(expected.shape)

            def build(defines, shape=shape, x_buf=x_buf, col_buf=col_buf):
                return im2col.im2col(self.lib, x_buf, col_buf, shape=shape, tuning=defines)

            cases.append((build, self._reader(col_buf, col), expected,
                          self._poisoner(col_buf, col)))
        return self._tune_defines("im2col", candidates, cases, deadline)

    def tune_depthwise(self, deadline: float, shapes: Sequence[ConvShape] | None = None
                       ) -> ShapeResult:
        """Depthwise forward and backward-data blocking (outputs per work-item, work-group size)
        on DS-CNN's and MobileNetV2's depthwise layers."""
        shapes = shapes or [
            ConvShape(64, 64, 25, 5, 64, 3, 3, pad_h=1, pad_w=1),
            ConvShape(32, 96, 32, 32, 96, 3, 3, pad_h=1, pad_w=1),
        ]
        names = ("DW_FWD_PB", "DW_FWD_WG", "DW_BWD_PB", "DW_BWD_WG")
        grid = [dict(zip(names, (pb, wg, pb, wg), strict=True))
                for pb, wg in itertools.product((1, 2, 4, 8), (32, 64, 128, 256))]
        candidates = [{}, *grid]  # {}: the launch function's own defaults for the device
        cases = []
        for shape in shapes:
            x = self.rng.standard_normal((shape.n, shape.c, shape.h, shape.w)).astype(np.float32)
            w = self.rng.standard_normal((shape.c, 1, shape.r, shape.s)).astype(np.float32)
            dy = self.rng.standard_normal(
                (shape.n, shape.c, shape.out_h, shape.out_w)).astype(np.float32)
            y_ref = depthwise_ref.depthwise_forward(x, w, None, shape)
            dx_ref = depthwise_ref.depthwise_backward_data(dy, w, shape)
            x_buf, w_buf, dy_buf = self._upload(x), self._upload(w), self._upload(dy)
            (y_buf, y), (dx_buf, dx) = self._poisoned(y_ref.shape), self._poisoned(dx_ref.shape)

            def build(defines, shape=shape, bufs=(x_buf, w_buf, dy_buf, y_buf, dx_buf)):
                xb, wb, dyb, yb, dxb = bufs
                return [*depthwise.depthwise_forward(self.lib, xb, wb, None, yb, shape=shape,
                                                     tuning=defines),
                        *depthwise.depthwise_backward_data(self.lib, dyb, wb, dxb, shape=shape,
                                                           tuning=defines)]

            read_y, read_dx = self._reader(y_buf, y), self._reader(dx_buf, dx)
            expected = np.concatenate([y_ref.ravel(), dx_ref.ravel()])
            cases.append((build, lambda ry=read_y, rd=read_dx: np.concatenate(
                [ry().ravel(), rd().ravel()]), expected, self._poisoner(y_buf, y, dx_buf, dx)))
        return self._tune_defines("depthwise", candidates, cases, deadline)

    # -- buffers -----------------------------------------------------------------------------
    def _upload(self, array: np.ndarray) -> cl.Buffer:
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        return cl.Buffer(self.lib.context, flags, hostbuf=np.ascontiguousarray(array))

    def _poisoned(self, shape) -> tuple[cl.Buffer, np.ndarray]:
        host = np.full(shape, np.nan, np.float32)
        return self._upload(host), host

    def _poisoner(self, *pairs) -> Callable[[], None]:
        """Refills (buffer, host array) pairs with NaN on the device."""
        def poison() -> None:
            for buf, host in zip(pairs[::2], pairs[1::2], strict=True):
                cl.enqueue_copy(self.queue, buf, np.full_like(host, np.nan))
            self.queue.finish()
        return poison

    def _reader(self, buf: cl.Buffer, host: np.ndarray) -> Callable[[], np.ndarray]:
        return lambda: _read(self.queue, buf, host)


def _read(queue: cl.CommandQueue, buf: cl.Buffer, host: np.ndarray) -> np.ndarray:
    cl.enqueue_copy(queue, host, buf)
    queue.finish()
    return host.copy()


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:160] if text else type(err).__name__
