"""Launches of the batched general matrix product, the work-horse of Linear and 1x1 convolutions.

``gemm`` computes, for every batch entry, ``C = act(alpha * op(A) @ op(B) + beta * C + bias)``.
The kernel styles share one source (``cl/gemm.cl``): register blocking for CPU drivers, where
each work-item keeps a block of C in vector registers (and local memory, which is cache on a CPU,
only holds packed blocks of B), local-memory tiling for GPUs, and, for GPUs with many compute
units, ``gpu_blocked``: double-buffered 128 x 128 class tiles with 8 x 8 results per work-item and
a bounds-check-free build for sizes that are multiples of the tile. ``GemmConfig`` holds every
size a tuner may vary; ``default_config`` picks by device type and ``blocked_candidates`` lists
the blocked tiles a device can run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

ACTIVATIONS = {None: 0, "relu": 1, "relu6": 2}
REGISTER, DOT, LOCAL, BLOCKED = 1, 2, 3, 4  # GEMM_KERNEL values of cl/gemm.cl
KERNEL_NAMES = {REGISTER: "gemm_register", DOT: "gemm_dot", LOCAL: "gemm_local",
                BLOCKED: "gemm_blocked"}
VECTOR_WIDTHS = (4, 8, 16)
# "standard": the register (or dot) kernel, or with use_local_memory the local one; "gpu_blocked":
# the double-buffered kernel, which always stages its tiles in local memory.
STYLES = ("standard", "gpu_blocked")
# The blocked style stays within what phone GPUs offer a work-group (Adreno and Mali: 32 KiB of
# local memory, 256 work-items and more), so a tuner may try it anywhere it fits.
MAX_BLOCKED_LOCAL_MEMORY = 32 * 1024
MAX_BLOCKED_GROUP = 256


@dataclass(frozen=True)
class GemmConfig:
    """Build-time sizes of the GEMM kernels; the defaults are the register style tuned on a CPU.

    Register style (``use_local_memory=False``): each work-item computes
    ``rows_per_item x (vectors_per_row * vector_width)`` results in vector registers, in
    work-groups of ``group_cols x group_rows`` items, walking k in blocks of ``k_block``
    (unrolled ``unroll_k`` times). ``pack_b`` has the work-group copy each k block of its B
    panels to local memory first, so that a power-of-two row length cannot crowd B's rows onto a
    few cache sets. A @ B^T runs as ``dot_rows x dot_cols`` dot products, ``dot_width`` wide along
    k. ``use_fma`` asks for fused multiply-adds, which CPU compilers do not make from ``mad``.

    Local style (``use_local_memory=True``): work-groups of ``(tile_n / wpt_n) x
    (tile_m / wpt_m)`` items stage ``tile_m x tile_k`` and ``tile_k x tile_n`` tiles in local
    memory and each item computes ``wpt_m x wpt_n`` results.

    Blocked style (``style="gpu_blocked"``, which implies ``use_local_memory``): the same tile
    sizes, with two local buffers per operand (at most 32 KiB in all) and at most 256 items.
    """

    use_local_memory: bool = False
    style: str = "standard"
    rows_per_item: int = 6
    vector_width: int = 8
    vectors_per_row: int = 2
    dot_rows: int = 3
    dot_cols: int = 4
    dot_width: int = 8
    group_cols: int = 1
    group_rows: int = 16
    k_block: int = 128
    unroll_k: int = 1
    pack_b: bool = True
    use_fma: bool = True
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    wpt_m: int = 4
    wpt_n: int = 4

    def __post_init__(self) -> None:
        if self.style == "gpu_blocked" and not self.use_local_memory:
            object.__setattr__(self, "use_local_memory", True)  # its tiles live there
        problems = []
        if self.style not in STYLES:
            problems.append(f"style must be one of {STYLES}")
        if self.vector_width not in VECTOR_WIDTHS or self.dot_width not in VECTOR_WIDTHS:
            problems.append(f"vector widths must be one of {VECTOR_WIDTHS}")
        sizes = (self.rows_per_item, self.vectors_per_row, self.dot_rows, self.dot_cols,
                 self.group_cols, self.group_rows, self.tile_k, self.k_block, self.unroll_k)
        if min(sizes) < 1:
            problems.append("sizes must be positive")
        for tile, wpt, name in ((self.tile_m, self.wpt_m, "m"), (self.tile_n, self.wpt_n, "n")):
            if wpt < 4 or wpt % 4 or tile % wpt:
                problems.append(f"wpt_{name} must be a multiple of 4 that divides tile_{name}")
        if self.tile_k % 4:
            problems.append("tile_k must be a multiple of 4")
        if self.blocked and not problems:
            width, height = self.local_group
            if width * height > MAX_BLOCKED_GROUP:
                problems.append(f"gpu_blocked work-groups hold at most {MAX_BLOCKED_GROUP} items")
            if self.local_memory_bytes > MAX_BLOCKED_LOCAL_MEMORY:
                problems.append(f"gpu_blocked tiles take at most {MAX_BLOCKED_LOCAL_MEMORY} bytes")
        if problems:
            raise ValueError(f"Invalid GemmConfig {self}: " + "; ".join(problems))

    @property
    def blocked(self) -> bool:
        return self.style == "gpu_blocked"

    @property
    def local_group(self) -> tuple[int, int]:
        """Work-group shape (columns, rows) of the local-memory kernel."""
        return self.tile_n // self.wpt_n, self.tile_m // self.wpt_m

    @property
    def local_memory_bytes(self) -> int:
        """Local memory of one work-group at most, in the style this configuration selects."""
        if self.blocked:  # two buffers per operand
            return 2 * 4 * self.tile_k * (self.tile_m + self.tile_n)
        if self.use_local_memory:
            return 4 * self.tile_k * (self.tile_m + self.tile_n)
        if self.pack_b:
            block_n = self.vector_width * self.vectors_per_row
            return 4 * self.k_block * block_n * self.group_cols
        return 0

    def defines(self) -> dict[str, int]:
        """The build-time defines of the kernel style this configuration selects (the blocked
        style's EXACT and ALIGNED depend on the product: see ``blocked_path_defines``)."""
        if self.use_local_memory:
            return {"TILE_M": self.tile_m, "TILE_N": self.tile_n, "TILE_K": self.tile_k,
                    "WPT_M": self.wpt_m, "WPT_N": self.wpt_n}
        return {"RM": self.rows_per_item, "VW": self.vector_width, "NV": self.vectors_per_row,
                "KC": self.k_block, "UNROLL_K": self.unroll_k, "PACK_B": int(self.pack_b),
                "USE_FMA": int(self.use_fma),
                "DM": self.dot_rows, "DN": self.dot_cols, "VK": self.dot_width}


# Desktop GPUs, with large register files, take 128 x 128 tiles with 8 x 8 results per item
# (about 19 TFLOP/s against 15 for 64 x 64 on an H200 at n = 4096); phone GPUs keep 64 x 64
# tiles with 4 x 4 per item, light on registers.
_LARGE_TILE_VENDORS = ("nvidia", "advanced micro devices", "amd")
_LOCAL_CANDIDATES = (  # (tile, tile_k, work per item), best first
    (128, 16, 8), (64, 16, 4), (64, 8, 4), (32, 8, 4), (32, 4, 4), (16, 4, 4),
)
MAX_LOCAL_MEMORY = 16 * 1024


# CPU register blocks by the SIMD width the driver reports: 16 floats (AVX-512, 32 registers)
# take 8 x 32 blocks (140 to 180 GFLOP/s on two Xeon cores at n = 1024, where 6 x 16 gave 93);
# 8 floats (AVX2, 16 registers) take 6 x 16; narrower units 6 x 8.
_CPU_BLOCKS = {16: (8, 16, 2), 8: (6, 8, 2), 4: (6, 4, 2)}  # width: (rows, vector width, vectors)


def default_config(device: cl.Device, m: int | None = None,
                   n: int | None = None) -> GemmConfig:
    """Register blocking on CPUs, sized by the device's SIMD width, with fused multiply-adds where
    the device has them; the blocked style on large GPUs (``suits_blocked``), its large tiles only
    for products (``m x n``, when given) that fill every compute unit with them; local-memory
    tiles on other GPUs (phones) and devices, the largest that fit the device's work-group and
    local-memory limits (and at most 16 KiB)."""
    if device.type & cl.device_type.CPU:
        width = max(w for w in _CPU_BLOCKS if w <= max(4, int(device.native_vector_width_float)))
        rows, vector_width, vectors = _CPU_BLOCKS[width]
        config = GemmConfig(
            rows_per_item=rows, vector_width=vector_width, vectors_per_row=vectors,
            dot_width=max(8, vector_width),
            use_fma=bool(device.single_fp_config & cl.device_fp_config.FMA),
        )
        if config.local_memory_bytes > int(device.local_mem_size):
            config = replace(config, pack_b=False)
        return config
    blocked = blocked_candidates(device)
    if blocked:
        # Measured on an H200 (benchmarks/h200-2026-11-30-gemm-sweep.json): 128 x 128 x 8 tiles
        # of 8 x 8 per item reached 88-97% of cuBLAS float32 at n = 2048-4096, twice the
        # local-memory style's rate; the tuner still tries every tile per shape.
        return blocked_default(device, blocked, m, n)
    large = any(name in device.vendor.lower() for name in _LARGE_TILE_VENDORS)
    budget = min(MAX_LOCAL_MEMORY, int(device.local_mem_size))
    for tile, tile_k, wpt in _LOCAL_CANDIDATES:
        config = GemmConfig(use_local_memory=True, tile_m=tile, tile_n=tile, tile_k=tile_k,
                            wpt_m=wpt, wpt_n=wpt)
        width, height = config.local_group
        fits = (config.local_memory_bytes <= budget
                and width * height <= int(device.max_work_group_size))
        if fits and (large or tile <= 64):
            return config
    raise ValueError(
        f"{device.name.strip()} offers {device.max_work_group_size} work-items and "
        f"{device.local_mem_size} bytes of local memory per work-group, too few for any GEMM "
        "tile; use a register-style GemmConfig(use_local_memory=False) on it"
    )


# Blocked tiles as (tile_m, tile_n, tile_k, wpt_m, wpt_n), the expected fastest on a large GPU
# first: 128 x 128 with 8 x 8 per item is the classic shape of fast SGEMMs (64 accumulators and
# 16 operand registers per item, 256 items); narrower tiles give more work-groups on mid sizes.
BLOCKED_TILES = (
    (128, 128, 8, 8, 8), (128, 128, 16, 8, 8), (128, 64, 16, 8, 4), (64, 128, 16, 4, 8),
    (128, 64, 8, 8, 4), (64, 64, 16, 8, 8), (64, 64, 16, 4, 4), (64, 64, 8, 4, 4),
)
# Devices the blocked style is tried on: GPUs whose work-groups get 32 KiB of local memory and
# that have the compute units to fill with 128 x 128 tiles (desktop and data-centre GPUs; phone
# GPUs report 1-16 compute units).
BLOCKED_MIN_LOCAL_MEMORY = 32 * 1024
BLOCKED_MIN_COMPUTE_UNITS = 16


# The blocked tile for products too small to give every compute unit a 128 x 128 tile: the
# tuner's winner on an H200 for every shape below n = 2048 it tried (square 256-1024 and the
# zoo's training shapes, 1.4-2.5x faster than 128 x 128; benchmarks/h200-2026-11-30-tune.json).
SMALL_PRODUCT_TILE = (64, 64, 16, 4, 4)


def blocked_default(device: cl.Device, blocked: list[GemmConfig], m: int | None,
                    n: int | None) -> GemmConfig:
    """The first (largest) blocked tile when one product gives it at least one work-group per
    compute unit, else the small-product tile: on a 132-unit GPU a 32 x 256 product makes two
    128 x 128 work-groups and leaves 130 units idle. (A batch of small products fills the units
    too, but mostly with the padding of tiles larger than each product.)"""
    if m is None or n is None:
        return blocked[0]
    large = blocked[0]
    groups = -(-m // large.tile_m) * -(-n // large.tile_n)
    if groups >= int(device.max_compute_units):
        return large
    for config in blocked:
        if (config.tile_m, config.tile_n, config.tile_k, config.wpt_m,
                config.wpt_n) == SMALL_PRODUCT_TILE:
            return config
    return blocked[-1]


def suits_blocked(device: cl.Device) -> bool:
    """Whether ``device`` is a GPU large enough for the blocked style to be worth tuning."""
    return bool(device.type & cl.device_type.GPU
                and int(device.local_mem_size) >= BLOCKED_MIN_LOCAL_MEMORY
                and int(device.max_compute_units) >= BLOCKED_MIN_COMPUTE_UNITS)


def blocked_candidates(device: cl.Device) -> list[GemmConfig]:
    """The blocked configurations that fit ``device``'s work-group and local-memory limits,
    in ``BLOCKED_TILES`` order; empty on devices that do not suit the style."""
    if not suits_blocked(device):
        return []
    found = []
    for tile_m, tile_n, tile_k, wpt_m, wpt_n in BLOCKED_TILES:
        config = GemmConfig(style="gpu_blocked", tile_m=tile_m, tile_n=tile_n, tile_k=tile_k,
                            wpt_m=wpt_m, wpt_n=wpt_n)
        width, height = config.local_group
        if (width * height <= int(device.max_work_group_size)
                and config.local_memory_bytes <= int(device.local_mem_size)):
            found.append(config)
    return found


def blocked_path_defines(config: GemmConfig, m: int, n: int, k: int, trans_a: bool,
                         trans_b: bool, stride_a: int = 0, stride_b: int = 0,
                         stride_c: int = 0) -> dict[str, int]:
    """EXACT: m, n, k are multiples of the tile, so the build has no bounds checks; ALIGNED:
    every leading dimension and batch stride is a multiple of 4 floats, so float4 accesses are
    16-byte aligned (buffers, sub-buffers included, start aligned)."""
    exact = m % config.tile_m == 0 and n % config.tile_n == 0 and k % config.tile_k == 0
    leading = (m if trans_a else k, k if trans_b else n, n)
    aligned = all(size % 4 == 0 for size in (*leading, stride_a, stride_b, stride_c))
    return {"EXACT": int(exact), "ALIGNED": int(aligned)}


def gemm(
    lib: KernelLibrary,
    a: cl.Buffer,
    b: cl.Buffer,
    c: cl.Buffer,
    *,
    m: int,
    n: int,
    k: int,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: cl.Buffer | None = None,
    activation: str | None = None,
    batch: int = 1,
    stride_a: int = 0,
    stride_b: int = 0,
    stride_c: int = 0,
    config: GemmConfig | None = None,
) -> Launch:
    """``C[i] = act(alpha * op(A[i]) @ op(B[i]) + beta * C[i] + bias)`` for ``i < batch``.

    ``op(A)`` is (m x k), stored (m, k) or, with ``trans_a``, (k, m); ``op(B)`` is (k x n),
    stored (k, n) or, with ``trans_b``, (n, k). Batch entry i starts ``i * stride`` elements into
    each buffer; stride 0 shares the operand. ``bias`` has n entries; ``beta == 0`` never reads C.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {activation!r}; expected one of {list(ACTIVATIONS)}")
    if min(m, n, k, batch) < 1:
        raise ValueError(f"gemm needs positive sizes, got m={m}, n={n}, k={k}, batch={batch}")
    if config is None:  # the device's tuned winner for the nearest shape, else the default
        from kernels.tuning_cache import tuned_config

        config = tuned_config(lib, m, n, k, trans_a, trans_b)
    defines = {**config.defines(), "HAS_BIAS": int(bias is not None),
               "ACTIVATION": ACTIVATIONS[activation]}

    # The register kernel reads B (k, n) rows; A^T @ B^T becomes C^T = B @ A with C stored
    # transposed. A @ B^T, whose operands are both contiguous along k, is a dot product.
    first, second, rows, cols = a, b, m, n
    stride_first, stride_second = stride_a, stride_b
    if config.blocked:
        style = BLOCKED
        defines.update(TRANS_A=int(trans_a), TRANS_B=int(trans_b),
                       **blocked_path_defines(config, m, n, k, trans_a, trans_b,
                                              stride_a, stride_b, stride_c))
    elif config.use_local_memory:
        style = LOCAL
        defines.update(TRANS_A=int(trans_a), TRANS_B=int(trans_b))
    elif trans_b and not trans_a:
        style = DOT
    else:
        style = REGISTER
        swap = trans_a and trans_b
        if swap:
            first, second, rows, cols = b, a, n, m
            stride_first, stride_second = stride_b, stride_a
        defines.update(TRANS_A=int(trans_a and not swap), TRANS_B=0, OUT_T=int(swap))
    defines["GEMM_KERNEL"] = style

    # Kernels index with 32-bit integers: the last element of each operand must have an index.
    for extent in ((batch - 1) * stride_a + m * k, (batch - 1) * stride_b + k * n,
                   (batch - 1) * stride_c + m * n):
        as_int(extent)
    global_size, local_size = _geometry(config, style, rows, cols, batch)
    scratch = []
    if style == REGISTER and config.pack_b:
        block_n = config.vector_width * config.vectors_per_row
        scratch.append(cl.LocalMemory(4 * config.k_block * block_n * local_size[0]))
    _check_fits(lib.device, config, local_size, sum(mem.size for mem in scratch))

    name = KERNEL_NAMES[style]
    kernel = lib.kernel("gemm", name, defines)
    kernel.set_args(
        first, second, c, bias,
        as_int(rows), as_int(cols), as_int(k), np.float32(alpha), np.float32(beta),
        as_int(stride_first), as_int(stride_second), as_int(stride_c), *scratch,
    )
    return Launch(
        name, kernel, global_size, local_size,
        flops=_flops(m, n, k, batch, alpha, beta, bias, activation),
        bytes_moved=_bytes_moved(m, n, k, batch, stride_a, stride_b, beta, bias),
        keep_alive=[buf for buf in (a, b, c, bias) if buf is not None],
    )


def _check_fits(device: cl.Device, config: GemmConfig, local_size, scratch_bytes: int) -> None:
    items = local_size[0] * local_size[1] * local_size[2]
    local_bytes = config.local_memory_bytes if config.use_local_memory else scratch_bytes
    if items > int(device.max_work_group_size) or local_bytes > int(device.local_mem_size):
        raise ValueError(
            f"{config} needs work-groups of {items} items and {local_bytes} bytes of local "
            f"memory; {device.name.strip()} allows {device.max_work_group_size} items and "
            f"{device.local_mem_size} bytes. Use default_config(device) or smaller groups/tiles."
        )


def _geometry(
    config: GemmConfig, style: int, rows: int, cols: int, batch: int
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """NDRange (columns, rows, batch) and work-group shape of one launch."""
    if style in (LOCAL, BLOCKED):
        group_cols, group_rows = config.local_group
        return (
            (round_up(cols, config.tile_n) // config.wpt_n,
             round_up(rows, config.tile_m) // config.wpt_m, batch),
            (group_cols, group_rows, 1),
        )
    if style == DOT:
        items_cols, items_rows = -(-cols // config.dot_cols), -(-rows // config.dot_rows)
    else:
        block_n = config.vector_width * config.vectors_per_row
        items_cols, items_rows = -(-cols // block_n), -(-rows // config.rows_per_item)
    group_cols = min(config.group_cols, items_cols)
    group_rows = min(config.group_rows, items_rows)
    return (
        (round_up(items_cols, group_cols), round_up(items_rows, group_rows), batch),
        (group_cols, group_rows, 1),
    )


def _flops(m, n, k, batch, alpha, beta, bias, activation) -> int:
    per_element = 2 * k + (alpha != 1.0) + 2 * (beta != 0.0) + (bias is not None)
    per_element += activation is not None
    return batch * m * n * per_element


def _bytes_moved(m, n, k, batch, stride_a, stride_b, beta, bias) -> int:
    """Compulsory traffic: each operand read once (a shared operand once for all entries), C
    written and, with beta, read; tiles re-read from cache are not counted."""
    reads_a = m * k * (batch if stride_a else 1)
    reads_b = k * n * (batch if stride_b else 1)
    c_traffic = batch * m * n * (2 if beta != 0.0 else 1)
    return 4 * (reads_a + reads_b + c_traffic + (n if bias is not None else 0))
