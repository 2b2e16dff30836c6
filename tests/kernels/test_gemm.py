"""The batched GEMM against its float64 reference, in every kernel style, and the Linear backward
it serves against finite differences."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest

from kernels.gemm import (
    BLOCKED_TILES,
    MAX_BLOCKED_LOCAL_MEMORY,
    GemmConfig,
    blocked_candidates,
    blocked_path_defines,
    default_config,
    gemm,
)
from kernels.launch import run
from kernels.reference import gemm as ref
from tests.conftest import UNDER_OCLGRIND
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale

TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]

# The CPU style (register blocking, with the dot-product kernel for A @ B^T) and the GPU styles
# (local-memory tiles, and the double-buffered blocked tiles), each run on whatever device the
# tests use. Under oclgrind, which interprets every work-item, the local tiles are smaller.
STYLES = {
    "register": GemmConfig(use_local_memory=False),
    "local": GemmConfig(use_local_memory=True, tile_m=scale(64, 32), tile_n=scale(64, 32),
                        tile_k=scale(16, 8), wpt_m=4, wpt_n=4),
    "gpu_blocked": GemmConfig(style="gpu_blocked", tile_m=scale(128, 32), tile_n=scale(64, 16),
                              tile_k=scale(16, 8), wpt_m=scale(8, 4), wpt_n=4),
}
# The blocked style's first candidate on large GPUs (128 x 128 tiles, 8 x 8 per item).
BLOCKED_MAIN = GemmConfig(style="gpu_blocked", tile_m=scale(128, 32), tile_n=scale(128, 32),
                          tile_k=scale(16, 8), wpt_m=scale(8, 4), wpt_n=scale(8, 4))

# Other sizes a tuner may pick; each must stay correct at the edges.
VARIANTS = {
    "plain": GemmConfig(rows_per_item=1, vector_width=4, vectors_per_row=1, dot_rows=1,
                        dot_cols=1, dot_width=4, group_cols=1, group_rows=1, k_block=5,
                        unroll_k=1, pack_b=False, use_fma=False),
    "wide": GemmConfig(rows_per_item=5, vector_width=16, vectors_per_row=1, dot_rows=2,
                       dot_cols=5, dot_width=16, group_cols=2, group_rows=3, k_block=7,
                       unroll_k=3, pack_b=False),
    "packed": GemmConfig(rows_per_item=3, vector_width=4, vectors_per_row=3, group_cols=3,
                         group_rows=2, k_block=9),
    "local-narrow": GemmConfig(use_local_memory=True, tile_m=32, tile_n=16, tile_k=4, wpt_m=8,
                               wpt_n=4),
    "local-wide": GemmConfig(use_local_memory=True, tile_m=16, tile_n=32, tile_k=12, wpt_m=4,
                             wpt_n=8),
    # Several quads per item and operand, a k tile that is not a power of two.
    "blocked-narrow": GemmConfig(style="gpu_blocked", tile_m=32, tile_n=16, tile_k=12, wpt_m=8,
                                 wpt_n=4),
    # Fewer quads per tile than items: some items fetch nothing.
    "blocked-idle-items": GemmConfig(style="gpu_blocked", tile_m=64, tile_n=64, tile_k=4,
                                     wpt_m=4, wpt_n=4),
}


def _stored_shape(rows: int, cols: int, transposed: bool) -> tuple[int, int]:
    return (cols, rows) if transposed else (rows, cols)


def _run_gemm(device, lib, bufs, a, b, c, **kwargs) -> np.ndarray:
    """Runs the kernel on flat arrays and returns the whole flat C buffer afterwards."""
    bias = kwargs.pop("bias", None)
    c_buf = bufs.up(c)
    launch = gemm(lib, bufs.up(a), bufs.up(b), c_buf,
                  bias=None if bias is None else bufs.up(bias), **kwargs)
    run(device.queue, [launch])
    return bufs.down(c_buf, c.size)


def _random_case(rng, m, n, k, trans_a, trans_b):
    a = rng.normal(size=_stored_shape(m, k, trans_a)).astype(np.float32)
    b = rng.normal(size=_stored_shape(k, n, trans_b)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_product_matches_reference_on_odd_shapes(device, lib, bufs, rng, style, trans_a, trans_b):
    high = scale(300, 24)
    shapes = [tuple(odd_sizes(rng, 3, 1, high)) for _ in range(scale(3, 1))]
    shapes.append((1, scale(37, 9), scale(29, 7)))  # a single row, and primes
    for m, n, k in shapes:
        a, b = _random_case(rng, m, n, k, trans_a, trans_b)
        c = rng.normal(size=m * n).astype(np.float32)
        alpha, beta = float(rng.uniform(0.5, 2.0)), float(rng.uniform(-1.0, 1.0))
        kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        out = _run_gemm(device, lib, bufs, a, b, c, config=STYLES[style], **kwargs)
        assert_close(out, ref.gemm(a, b, c, **kwargs))


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize(
    "activation,trans_a,trans_b",
    [(None, False, False), ("relu6", True, False), (None, False, True), ("relu6", True, True)],
)
def test_bias_and_activation_without_reading_c(
    device, lib, bufs, rng, style, activation, trans_a, trans_b
):
    """ReLU with a bias is covered on every transpose by the batched test below."""
    m, n, k = odd_sizes(rng, 3, 1, scale(120, 20))
    a, b = _random_case(rng, m, n, k, trans_a, trans_b)
    bias = rng.normal(0, 3, n).astype(np.float32)
    c = np.full(m * n, np.nan, np.float32)  # beta == 0: C must not be read
    kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, alpha=1.5)
    out = _run_gemm(device, lib, bufs, a, b, c, bias=bias, activation=activation,
                    config=STYLES[style], **kwargs)
    assert_close(out, ref.gemm(a, b, c, bias=bias, activation=activation, **kwargs))


@pytest.mark.parametrize("style", list(STYLES))
@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_batched_with_shared_operands_and_gaps(device, lib, bufs, rng, style, trans_a, trans_b):
    """Batch entries with gaps between them, the weight shared (stride 0), as for a pointwise
    convolution per image: the gaps of C must keep their values."""
    batch = 3
    m, n, k = odd_sizes(rng, 3, 1, scale(70, 12))
    for shared in ("a", "b"):
        stride_a = 0 if shared == "a" else m * k + 5
        stride_b = 0 if shared == "b" else k * n + 3
        stride_c = m * n + 7
        a = rng.normal(size=max(stride_a * (batch - 1) + m * k, 1)).astype(np.float32)
        b = rng.normal(size=max(stride_b * (batch - 1) + k * n, 1)).astype(np.float32)
        c = rng.normal(size=stride_c * (batch - 1) + m * n).astype(np.float32)
        bias = rng.normal(size=n).astype(np.float32)
        kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, alpha=0.75, beta=0.5,
                      activation="relu", batch=batch, stride_a=stride_a, stride_b=stride_b,
                      stride_c=stride_c)
        out = _run_gemm(device, lib, bufs, a, b, c, bias=bias, config=STYLES[style], **kwargs)
        expected = ref.gemm(a, b, c, bias=bias, **kwargs)
        assert_close(out, expected)
        gaps = np.ones(c.size, bool)
        for i in range(batch):
            gaps[i * stride_c : i * stride_c + m * n] = False
        assert np.array_equal(out[gaps], c[gaps])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tuning_variants_stay_correct_at_edges(device, lib, bufs, rng, variant):
    config = VARIANTS[variant]
    sizes = [1, 2, 3, 5, 17] if UNDER_OCLGRIND else [1, 2, 7, 31, 67]
    for trans_a, trans_b in TRANSPOSES:
        m, n, k = (int(s) for s in rng.choice(sizes, 3))
        a, b = _random_case(rng, m, n, k, trans_a, trans_b)
        c = rng.normal(size=m * n).astype(np.float32)
        bias = rng.normal(size=n).astype(np.float32)
        kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, beta=-0.5,
                      activation="relu6")
        out = _run_gemm(device, lib, bufs, a, b, c, bias=bias, config=config, **kwargs)
        assert_close(out, ref.gemm(a, b, c, bias=bias, **kwargs))


@pytest.mark.parametrize("style", list(STYLES))
def test_linear_backward_products_match_finite_differences(device, lib, bufs, rng, style):
    """y = x @ W^T + b; with the loss sum(y * g): dx = g @ W and dW = g^T @ x."""
    batch, fin, fout = 5, 7, 3
    x, w = rng.normal(size=(batch, fin)), rng.normal(size=(fout, fin))
    bias, g = rng.normal(size=fout), rng.normal(size=(batch, fout))
    config = STYLES[style]
    bx, bw, bg = bufs.up(x), bufs.up(w), bufs.up(g)
    by, bdx, bdw = bufs.empty(batch * fout), bufs.empty(batch * fin), bufs.empty(fout * fin)
    run(device.queue, [
        gemm(lib, bx, bw, by, m=batch, n=fout, k=fin, trans_b=True, bias=bufs.up(bias),
             config=config),
        gemm(lib, bg, bw, bdx, m=batch, n=fin, k=fout, config=config),
        gemm(lib, bg, bx, bdw, m=fout, n=fin, k=batch, trans_a=True, config=config),
    ])
    assert_close(bufs.down(by, (batch, fout)), ref.linear_forward(x, w, bias))

    def loss_of_x(value):
        return float(np.sum(ref.linear_forward(value, w, bias) * g))

    def loss_of_w(value):
        return float(np.sum(ref.linear_forward(x, value, bias) * g))

    assert_close(bufs.down(bdx, (batch, fin)), numeric_grad(loss_of_x, x), rtol=2e-3)
    assert_close(bufs.down(bdw, (fout, fin)), numeric_grad(loss_of_w, w), rtol=2e-3)


def _fake_device(kind, vendor="", local_mem_size=32768, max_work_group_size=1024, fma=True,
                 width=8, units=8):
    """What default_config and blocked_candidates read of a cl.Device, for devices this machine
    does not have."""
    return SimpleNamespace(
        type=kind, vendor=vendor, name=f"{vendor} test device", local_mem_size=local_mem_size,
        max_work_group_size=max_work_group_size, native_vector_width_float=width,
        single_fp_config=cl.device_fp_config.FMA if fma else 0, max_compute_units=units,
    )


def test_default_config_follows_the_device_type(device):
    cpu = default_config(_fake_device(cl.device_type.CPU, local_mem_size=1 << 19))
    assert not cpu.use_local_memory and cpu.use_fma and cpu.pack_b
    assert not default_config(_fake_device(cl.device_type.CPU, fma=False)).use_fma
    tight_cpu = default_config(_fake_device(cl.device_type.CPU, local_mem_size=1024))
    assert not tight_cpu.pack_b
    avx512 = default_config(_fake_device(cl.device_type.CPU, local_mem_size=1 << 19, width=16))
    assert avx512.vector_width == 16 and avx512.dot_width == 16
    assert default_config(_fake_device(cl.device_type.CPU, width=4)).vector_width == 4

    desktop = default_config(_fake_device(cl.device_type.GPU, "NVIDIA Corporation", 49152))
    assert desktop.use_local_memory and desktop.tile_m == 128
    phone = default_config(_fake_device(cl.device_type.GPU, "Qualcomm", 32768))
    assert phone.use_local_memory and phone.tile_m == 64
    for limits in [(4096, 128), (1024, 64), (32768, 16)]:
        small = default_config(_fake_device(cl.device_type.GPU, "ARM", *limits))
        width, height = small.local_group
        assert small.local_memory_bytes <= limits[0] and width * height <= limits[1]
    with pytest.raises(ValueError, match="register-style"):
        default_config(_fake_device(cl.device_type.GPU, "ARM", 256, 8))
    assert isinstance(default_config(device.cl_device), GemmConfig)


def test_defines_carry_the_configuration():
    register = GemmConfig(rows_per_item=4, vector_width=16).defines()
    assert register["RM"] == 4 and register["VW"] == 16 and "TILE_M" not in register
    local = GemmConfig(use_local_memory=True, tile_m=128, wpt_m=8).defines()
    assert local["TILE_M"] == 128 and local["WPT_M"] == 8 and "RM" not in local
    assert all(isinstance(value, int) for value in {**register, **local}.values())


def test_launch_reports_work_and_keeps_its_buffers(lib, bufs):
    a, b, c, bias = bufs.empty(6), bufs.empty(12), bufs.empty(8), bufs.empty(4)
    launch = gemm(lib, a, b, c, m=2, n=4, k=3, bias=bias, beta=1.0)
    assert launch.flops == 2 * 4 * (2 * 3 + 2 + 1)
    assert launch.bytes_moved == 4 * (6 + 12 + 2 * 8 + 4)
    assert all(any(buf is kept for kept in launch.keep_alive) for buf in (a, b, c, bias))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation="gelu"), "Unknown activation"),
        (dict(m=0), "positive sizes"),
    ],
)
def test_bad_arguments_are_clear_errors(lib, bufs, kwargs, message):
    args = {"m": 2, "n": 2, "k": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        gemm(lib, bufs.empty(4), bufs.empty(4), bufs.empty(4), **args)


def test_configs_beyond_the_device_and_32_bit_offsets_are_refused(lib, bufs):
    limit = lib.device.max_work_group_size
    too_wide = GemmConfig(group_rows=limit + 1, pack_b=False)
    with pytest.raises(ValueError, match="work-groups of"):
        gemm(lib, bufs.empty(1), bufs.empty(1), bufs.empty(1), m=6 * (limit + 1), n=16, k=1,
             config=too_wide)
    with pytest.raises(OverflowError):
        gemm(lib, bufs.empty(1), bufs.empty(1), bufs.empty(1), m=50_000, n=1, k=50_000)


def test_invalid_configs_are_rejected():
    with pytest.raises(ValueError, match="vector widths"):
        GemmConfig(vector_width=3)
    with pytest.raises(ValueError, match="wpt_m"):
        GemmConfig(use_local_memory=True, tile_m=64, wpt_m=6)


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
@pytest.mark.parametrize("aligned", [True, False])
def test_blocked_fast_path_on_tile_multiples(device, lib, bufs, rng, trans_a, trans_b, aligned):
    """Sizes that are multiples of the tile build without bounds checks; batch strides that are
    multiples of 4 also use aligned float4 accesses, other strides unaligned ones."""
    config = BLOCKED_MAIN
    m, n, k = 2 * config.tile_m, config.tile_n, 3 * config.tile_k
    batch, gap = 2, 4 if aligned else 1
    stride_a, stride_b, stride_c = m * k + gap, k * n + 2 * gap, m * n + 3 * gap
    assert blocked_path_defines(config, m, n, k, trans_a, trans_b, stride_a, stride_b,
                                stride_c) == {"EXACT": 1, "ALIGNED": int(aligned)}
    a = rng.normal(size=stride_a * (batch - 1) + m * k).astype(np.float32)
    b = rng.normal(size=stride_b * (batch - 1) + k * n).astype(np.float32)
    c = rng.normal(size=stride_c * (batch - 1) + m * n).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, alpha=1.25, beta=-0.5,
                  activation="relu", batch=batch, stride_a=stride_a, stride_b=stride_b,
                  stride_c=stride_c)
    out = _run_gemm(device, lib, bufs, a, b, c, bias=bias, config=config, **kwargs)
    assert_close(out, ref.gemm(a, b, c, bias=bias, **kwargs))
    gaps = np.ones(c.size, bool)
    for i in range(batch):
        gaps[i * stride_c : i * stride_c + m * n] = False
    assert np.array_equal(out[gaps], c[gaps])


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_blocked_checked_path_on_odd_shapes(device, lib, bufs, rng, trans_a, trans_b):
    """The main blocked tile on sizes just past and just short of its multiples."""
    config = BLOCKED_MAIN
    m, n, k = config.tile_m + 3, config.tile_n - 5, 2 * config.tile_k + 1
    assert blocked_path_defines(config, m, n, k, trans_a, trans_b)["EXACT"] == 0
    a, b = _random_case(rng, m, n, k, trans_a, trans_b)
    c = np.full(m * n, np.nan, np.float32)
    kwargs = dict(m=m, n=n, k=k, trans_a=trans_a, trans_b=trans_b, alpha=0.5)
    out = _run_gemm(device, lib, bufs, a, b, c, config=config, **kwargs)
    assert_close(out, ref.gemm(a, b, c, **kwargs))


def test_blocked_path_defines_follow_sizes_and_strides():
    config = GemmConfig(style="gpu_blocked", tile_m=128, tile_n=64, tile_k=16, wpt_m=8, wpt_n=4)
    assert blocked_path_defines(config, 256, 128, 32, False, False) == {"EXACT": 1, "ALIGNED": 1}
    assert blocked_path_defines(config, 256, 128, 40, False, False) == {"EXACT": 0, "ALIGNED": 1}
    assert blocked_path_defines(config, 64, 128, 32, True, True) == {"EXACT": 0, "ALIGNED": 1}
    # A (m, k) with k = 18: its rows are not float4-aligned, though m and n are.
    assert blocked_path_defines(config, 128, 64, 18, False, False)["ALIGNED"] == 0
    assert blocked_path_defines(config, 128, 64, 18, True, True)["ALIGNED"] == 0
    assert blocked_path_defines(config, 130, 64, 16, True, False)["ALIGNED"] == 0  # A (k, m)
    assert blocked_path_defines(config, 128, 64, 16, False, False, stride_b=6)["ALIGNED"] == 0


def test_blocked_configs_are_validated():
    blocked = GemmConfig(style="gpu_blocked", tile_m=128, tile_n=128, tile_k=16, wpt_m=8,
                         wpt_n=8)
    assert blocked.use_local_memory and blocked.blocked
    assert blocked.local_memory_bytes == MAX_BLOCKED_LOCAL_MEMORY  # two buffers per operand
    assert blocked.local_group == (16, 16)
    assert blocked.defines()["TILE_K"] == 16
    with pytest.raises(ValueError, match="style must be"):
        GemmConfig(style="fast")
    with pytest.raises(ValueError, match="at most 256 items"):
        GemmConfig(style="gpu_blocked", tile_m=128, tile_n=128, wpt_m=4, wpt_n=4)
    with pytest.raises(ValueError, match="bytes"):
        GemmConfig(style="gpu_blocked", tile_m=128, tile_n=128, tile_k=32, wpt_m=8, wpt_n=8)
    assert all(GemmConfig(style="gpu_blocked", tile_m=tm, tile_n=tn, tile_k=tk, wpt_m=wm,
                          wpt_n=wn).blocked for tm, tn, tk, wm, wn in BLOCKED_TILES)


def test_blocked_candidates_only_on_large_gpus():
    from kernels.tuner import GemmShape, gemm_candidates

    h200 = _fake_device(cl.device_type.GPU, "NVIDIA Corporation", 49152, 1024, units=132)
    found = blocked_candidates(h200)
    assert len(found) == len(BLOCKED_TILES) and found[0].tile_m == 128 and found[0].wpt_m == 8
    listed = gemm_candidates(h200, GemmShape("square", 512, 512, 512))
    # The default of a shapeless call is the blocked tile that won on an H200 at n >= 2048; a
    # shape's candidates start with its own default, then the other blocked tiles.
    assert default_config(h200) == found[0]
    assert (found[0].tile_m, found[0].tile_n, found[0].tile_k) == (128, 128, 8)
    assert listed[0] == default_config(h200, 512, 512)
    assert sorted(map(str, listed[:len(found)])) == sorted(map(str, found))
    assert all(listed.count(c) == 1 for c in found)
    # A GPU with work-groups of at most 128 items gets only the tiles that fit them.
    tight = _fake_device(cl.device_type.GPU, "NVIDIA Corporation", 32768, 128, units=40)
    assert all(c.local_memory_bytes <= 32768 and c.local_group[0] * c.local_group[1] <= 128
               for c in blocked_candidates(tight)) and blocked_candidates(tight)
    phone = _fake_device(cl.device_type.GPU, "Qualcomm", 32768, 1024, units=4)
    assert blocked_candidates(phone) == [] and not default_config(phone).blocked

    assert not any(c.blocked for c in gemm_candidates(phone, GemmShape("square", 64, 64, 64)))
    assert blocked_candidates(_fake_device(cl.device_type.CPU, local_mem_size=1 << 19,
                                           units=64)) == []


def test_blocked_default_keeps_large_tiles_for_products_that_fill_the_gpu():
    """On 132 compute units a 2048 x 2048 product makes 256 work-groups of 128 x 128; the MLP's
    32 x 256 product would make two, so it takes 64 x 64 tiles (the tuner's winner there)."""
    h200 = _fake_device(cl.device_type.GPU, "NVIDIA Corporation", 49152, 1024, units=132)
    large = blocked_candidates(h200)[0]
    assert default_config(h200, 2048, 2048) == large
    small = default_config(h200, 32, 256)
    assert default_config(h200, 1024, 2048) == small  # 8 x 16 = 128 groups: four units short
    assert small.blocked and (small.tile_m, small.tile_n, small.tile_k) == (64, 64, 16)
    assert (small.wpt_m, small.wpt_n) == (4, 4)
    assert default_config(h200, 1024, 1024) == small  # 64 groups of 128 x 128
    assert default_config(h200, 64, 125) == small  # one batch entry of DS-CNN's pointwise
    # Phones and CPUs are not affected by the product's size.
    phone = _fake_device(cl.device_type.GPU, "Qualcomm", 32768, 1024, units=4)
    assert default_config(phone, 32, 256) == default_config(phone)
