"""The tuner keeps only correct winners, stops at its budget, and its cache (keyed by device and
driver) is what gemm() uses when no configuration is given. Candidates here differ in work-group
shape only where possible, so that they share one built program and the file stays quick."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pyopencl as cl
import pytest

from kernels.gemm import GemmConfig, _geometry, default_config, gemm
from kernels.library import KernelLibrary
from kernels.tuner import GemmShape, Tuner, median_event_seconds
from kernels.tuning_cache import (
    GemmWinner,
    TuningCache,
    cache_path,
    load_cache,
    save_cache,
    tuned_config,
)
from tests.kernels.conftest import assert_close

SHAPE = GemmShape("tiny", 13, 21, 11)


class TrialClock:
    """A clock that advances one unit per finished trial: budgets become candidate counts."""

    def __init__(self) -> None:
        self.trials = 0

    def __call__(self) -> float:
        return float(self.trials)

    def tick(self, _trial) -> None:
        self.trials += 1


def _fresh_library(device, cache_dir) -> KernelLibrary:
    return KernelLibrary(device.context, device.cl_device, device.info.cache_key, cache_dir)


def _group_variants(device, _shape=None) -> list[GemmConfig]:
    base = default_config(device)
    if base.use_local_memory:
        return [base, replace(base, tile_k=8), replace(base, tile_k=4)]
    return [base, *(replace(base, group_rows=g) for g in (8, 4, 2, 1))]


def _winner(config: GemmConfig, m=13, n=21, k=11) -> GemmWinner:
    return GemmWinner(m, n, k, False, False, asdict(config), 1e-3, 2e-3)


def test_cache_round_trip_is_keyed_by_device(tmp_path):
    cache = TuningCache("platform|1.0|device A|driver 1", defines={"im2col": {"IM2COL_WG": 32}})
    cache.put_gemm(_winner(GemmConfig(rows_per_item=4)))
    cache.put_gemm(_winner(GemmConfig(rows_per_item=8)))  # same shape: replaces the first
    cache.put_gemm(_winner(GemmConfig(vector_width=16), 512, 512, 512))
    save_cache(cache, tmp_path)
    loaded = load_cache(cache.device_key, tmp_path)
    assert loaded == cache and len(loaded.gemm) == 2
    assert load_cache("platform|1.0|device A|driver 2", tmp_path) is None  # a driver update
    assert cache_path(cache.device_key, tmp_path).parent == tmp_path / "tuning"
    assert loaded.nearest_gemm(16, 16, 16, False, False).config["rows_per_item"] == 8
    assert loaded.nearest_gemm(400, 600, 500, False, False).config["vector_width"] == 16


def test_unreadable_cache_means_untuned(tmp_path):
    key = "platform|1.0|device B|driver 1"
    path = cache_path(key, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert load_cache(key, tmp_path) is None


def test_gemm_uses_the_cached_config(device, bufs, rng, tmp_path):
    untuned = _fresh_library(device, tmp_path / "untuned")
    assert tuned_config(untuned, 13, 21, 11) == default_config(device.cl_device)
    tuned = _variant_with_other_geometry(device)
    save_cache(TuningCache(device.info.cache_key, [_winner(tuned)]), tmp_path / "tuned")
    lib = _fresh_library(device, tmp_path / "tuned")
    assert tuned_config(lib, 13, 21, 11) == tuned

    a, b = rng.standard_normal((13, 11)), rng.standard_normal((11, 21))
    c = bufs.empty(13 * 21)
    launch = gemm(lib, bufs.up(a), bufs.up(b), c, m=13, n=21, k=11)
    style = 3 if tuned.use_local_memory else 1
    assert (launch.global_size, launch.local_size) == _geometry(tuned, style, 13, 21, 1)
    launch.enqueue(device.queue)
    assert_close(bufs.down(c, (13, 21)), a @ b)


def _variant_with_other_geometry(device) -> GemmConfig:
    base = default_config(device.cl_device)
    if base.use_local_memory:
        return replace(base, tile_k=8)
    return replace(base, group_rows=4)


class WrongDefaultTuner(Tuner):
    """The default configuration's kernel doubles its result: it must never be kept."""

    def gemm_launch(self, config, shape, a, b, c):
        wrong = config == default_config(self.lib.device)
        return gemm(self.lib, a, b, c, m=shape.m, n=shape.n, k=shape.k, config=config,
                    alpha=2.0 if wrong else 1.0)


def test_keeps_only_correct_winners_within_budget(device):
    clock = TrialClock()
    tuner = WrongDefaultTuner(device.kernels, device.queue, budget_s=3, clock=clock,
                              on_trial=clock.tick)
    result = tuner.tune_gemm(SHAPE, deadline=3.0, candidates=_group_variants)
    assert len(result.trials) == 3  # the budget of 3 trials, of the 4-5 candidates offered
    assert result.trials[0].seconds is None and "wrong" in result.trials[0].skipped
    assert result.default_seconds is None
    assert result.best is not None and result.best != asdict(default_config(device.cl_device))
    assert result.best_seconds == min(t.seconds for t in result.trials[1:])


def test_skips_candidates_beyond_device_limits(device):
    base = default_config(device.cl_device)
    too_big = replace(base, k_block=1 << 20) if not base.use_local_memory else replace(
        base, tile_m=128, tile_n=128, wpt_m=1, wpt_n=1)  # 16,384 work-items: above any device

    def candidates(_device, _shape):
        return [too_big, base]

    tuner = Tuner(device.kernels, device.queue, budget_s=60)
    result = tuner.tune_gemm(SHAPE, deadline=float("inf"), candidates=candidates)
    assert result.trials[0].skipped.startswith("not built")
    assert result.best == asdict(base)


def test_run_writes_the_cache_that_gemm_reads(device, tmp_path):
    lib = _fresh_library(device, tmp_path)
    clock = TrialClock()
    tuner = Tuner(lib, device.queue, budget_s=2, clock=clock, on_trial=clock.tick)
    report = tuner.run(shapes=[SHAPE], families=False, candidates=_group_variants)
    assert report.trials == 2
    stored = load_cache(device.info.cache_key, tmp_path)
    assert stored is not None and len(stored.gemm) == 1
    winner = stored.gemm[0]
    assert (winner.m, winner.n, winner.k) == (13, 21, 11) and winner.seconds > 0
    reread = _fresh_library(device, tmp_path)
    assert tuned_config(reread, 13, 21, 11) == GemmConfig(**winner.config)


def test_im2col_tuning_checks_every_candidate(device):
    from kernels.conv_shape import ConvShape

    clock = TrialClock()
    tuner = Tuner(device.kernels, device.queue, budget_s=2, clock=clock, on_trial=clock.tick)
    shape = ConvShape(2, 3, 7, 6, 4, 3, 3, pad_h=1, pad_w=1)
    result = tuner.tune_im2col(2.0, shapes=[shape])
    assert len(result.trials) == 2
    assert all(t.error is not None and t.error < 1e-4 for t in result.trials)
    assert result.best in (t.candidate for t in result.trials)
    assert np.isfinite(result.best_seconds) and result.best_seconds > 0


def test_timing_needs_a_profiling_queue(device):
    plain = cl.CommandQueue(device.context, device.cl_device)
    with pytest.raises(ValueError, match="profiling=True"):
        Tuner(device.kernels, plain, budget_s=1.0)
    with pytest.raises(ValueError, match="PROFILING_ENABLE"):
        median_event_seconds(plain, [], 1)
