// General matrix products C = act(alpha * op(A) @ op(B) + beta * C + bias), row-major, batched.
//
// Three kernels, one per memory hierarchy; GEMM_KERNEL selects which one a program holds, so a
// build compiles only the kernel it launches:
//   1 gemm_register  made for CPU drivers (PoCL): each work-item keeps an RM x (NV*VW) block of
//                    the result in vector registers and streams rows of B with vector loads, k in
//                    blocks of KC. Optionally (PACK_B) the work-group copies each k block of its
//                    B panels to local memory, which on a CPU is cache-resident scratch. Handles
//                    B stored (k, n); the host maps A^T @ B^T onto it by computing C^T = B @ A.
//   2 gemm_dot       for A @ B^T, where both operands are contiguous along k: each work-item
//                    keeps DM x DN dot products as VK-wide vectors along k.
//   3 gemm_local     GPU style: the work-group stages TILE_M x TILE_K and TILE_K x TILE_N tiles of
//                    op(A) and op(B) in local memory; each work-item computes WPT_M x WPT_N results.
//   4 gemm_blocked   GPU style for large GPUs: like gemm_local, but the tiles are double-buffered
//                    (the next k tile is fetched into registers while the current one is used,
//                    one barrier per k step), every item fetches a fixed set of float4 quads, and
//                    both local tiles are k-major float4 arrays; an EXACT build (sizes multiples
//                    of the tiles) drops every bounds check.
//
// Edges: sizes are arbitrary. The register kernels clamp row and column indices into the matrix
// (a clamped row or column computes a duplicate that is never stored), the local kernels pad
// their tiles with zeros through guarded loads. No kernel reads or writes outside a tensor.
// beta == 0 never reads C, so C may hold NaN before the product.

#ifndef GEMM_KERNEL
#define GEMM_KERNEL 1
#endif
#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef OUT_T
#define OUT_T 0  // gemm_register only: the result is stored transposed, its bias indexed by row
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACTIVATION
#define ACTIVATION 0  // 0 none, 1 relu, 2 relu6
#endif
#ifndef USE_FMA
#define USE_FMA 1  // register kernels: fma() where the device fuses in hardware, else mad()
#endif

// CPU compilers lower mad() to a multiply and an add; fma() becomes one fused instruction on a
// device that has it (and a slow software routine on one that has not).
#if USE_FMA
#define MULADD(x, y, z) fma((x), (y), (z))
#else
#define MULADD(x, y, z) mad((x), (y), (z))
#endif

#define CAT_(x, y) x##y
#define CAT(x, y) CAT_(x, y)

#if ACTIVATION == 1
#define ACT(v) fmax((v), 0.0f)
#elif ACTIVATION == 2
#define ACT(v) fmin(fmax((v), 0.0f), 6.0f)
#else
#define ACT(v) (v)
#endif

// One result element: scale, add beta * C (only when beta != 0), bias, activation.
inline float finish(const float acc, const float alpha, const float beta,
                    const __global float* c, const int index, const __global float* bias,
                    const int bias_index) {
    float v = alpha * acc;
    if (beta != 0.0f) v += beta * c[index];
#if HAS_BIAS
    v += bias[bias_index];
#endif
    return ACT(v);
}

// ------------------------------------------------------------------------------------------------
#if GEMM_KERNEL == 1

#ifndef RM
#define RM 6    // rows of the result per work-item
#endif
#ifndef VW
#define VW 8    // vector width along the columns
#endif
#ifndef NV
#define NV 2    // vectors per row: each work-item computes RM x (NV * VW)
#endif
#ifndef KC
#define KC 256  // k is walked in blocks of KC
#endif
#ifndef UNROLL_K
#define UNROLL_K 1
#endif
#ifndef PACK_B
#define PACK_B 0   // 1: each k block of B is copied to local memory first
#endif
#define VEC CAT(float, VW)
#define VLOAD CAT(vload, VW)
#define VSTORE CAT(vstore, VW)
#define BLOCK_N (NV * VW)

#if TRANS_A
#define A_AT(r, kk) a[(kk) * rows + (r)]
#else
#define A_AT(r, kk) a[(r) * depth + (kk)]
#endif

// part += op(A)[rows, kk] * B[kk, block] for one k index, B's row kk at `brow_kk`.
#define ACCUMULATE_ROW(brow_kk, kk)                                                    \
    {                                                                                  \
        VEC bv[NV];                                                                    \
        _Pragma("unroll") for (int v = 0; v < NV; ++v) bv[v] = VLOAD(v, (brow_kk));    \
        _Pragma("unroll") for (int i = 0; i < RM; ++i) {                               \
            const VEC av = (VEC)(A_AT(row[i], (kk)));                                  \
            _Pragma("unroll") for (int v = 0; v < NV; ++v)                             \
                part[i][v] = MULADD(av, bv[v], part[i][v]);                            \
        }                                                                              \
    }

// part += op(A)[rows, k0:k1] @ B[k0:k1, block], B's rows read from `brow` on, `step` apart;
// UNROLL_K rows at a time (written out: LLVM does not unroll this loop on request under PoCL).
#define ACCUMULATE_BLOCK(brow, step)                                                   \
    {                                                                                  \
        int kk = k0;                                                                   \
        for (; kk + UNROLL_K <= k1; kk += UNROLL_K, brow += UNROLL_K * (step))         \
            _Pragma("unroll") for (int u = 0; u < UNROLL_K; ++u)                       \
                ACCUMULATE_ROW(brow + u * (step), kk + u)                              \
        for (; kk < k1; ++kk, brow += (step)) ACCUMULATE_ROW(brow, kk)                 \
    }

// D = op(A) @ B with D (rows x cols), op(A) (rows x depth), B stored (depth, cols).
// Without OUT_T, D is C; with OUT_T, D is C^T and is stored as c[col * rows + row].
// With PACK_B, the work-group first copies each k block of its column
// panels into b_pack (KC * BLOCK_N floats per work-item column), so that the block is read from
// contiguous memory instead of rows `cols` floats apart: a power-of-two row length otherwise maps
// a whole panel onto a few cache sets.
__kernel void gemm_register(const __global float* restrict a, const __global float* restrict b,
                            __global float* c, const __global float* restrict bias,
                            const int rows, const int cols, const int depth,
                            const float alpha, const float beta,
                            const int stride_a, const int stride_b, const int stride_c
#if PACK_B
                            , __local float* b_pack
#endif
                            ) {
    // Items past the matrix (the NDRange is rounded up to whole work-groups) compute clamped
    // duplicates and store nothing: with PACK_B every item must reach every barrier.
    const int item_col = get_global_id(0) * BLOCK_N;
    const int item_row = get_global_id(1) * RM;
    a += get_global_id(2) * stride_a;
    b += get_global_id(2) * stride_b;
    c += get_global_id(2) * stride_c;

    int row[RM];
#pragma unroll
    for (int i = 0; i < RM; ++i) row[i] = min(item_row + i, rows - 1);

    VEC acc[RM][NV];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int v = 0; v < NV; ++v) acc[i][v] = (VEC)(0.0f);

    // A block at the right edge is shifted left to stay whole; it stores only its own columns.
    const int first_col = cols >= BLOCK_N ? min(item_col, cols - BLOCK_N) : 0;
    for (int k0 = 0; k0 < depth; k0 += KC) {
        const int k1 = min(k0 + KC, depth);
        VEC part[RM][NV];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int v = 0; v < NV; ++v) part[i][v] = (VEC)(0.0f);
#if PACK_B
        // Barriers stay outside any branch: PoCL's kernel compiler rejects a barrier under a
        // condition even when every work-item takes the same way.
        __local float* panel = b_pack + get_local_id(0) * (KC * BLOCK_N);
        for (int kk = k0 + (int)get_local_id(1); kk < k1; kk += get_local_size(1)) {
            __local float* dst = panel + (kk - k0) * BLOCK_N;
            if (cols >= BLOCK_N) {
#pragma unroll
                for (int v = 0; v < NV; ++v) VSTORE(VLOAD(v, b + kk * cols + first_col), v, dst);
            } else {
                for (int j = 0; j < BLOCK_N; ++j) dst[j] = b[kk * cols + min(j, cols - 1)];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const __local float* brow = panel;
        ACCUMULATE_BLOCK(brow, BLOCK_N)
#else
        if (cols >= BLOCK_N) {
            const __global float* brow = b + k0 * cols + first_col;
            ACCUMULATE_BLOCK(brow, cols)
        } else {
            // Narrower than one block: gather each column with a clamped index.
            for (int kk = k0; kk < k1; ++kk) {
                float gathered[BLOCK_N];
#pragma unroll
                for (int j = 0; j < BLOCK_N; ++j) gathered[j] = b[kk * cols + min(j, cols - 1)];
                const float* grow = gathered;
                ACCUMULATE_ROW(grow, kk)
            }
        }
#endif
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int v = 0; v < NV; ++v) acc[i][v] += part[i][v];
#if PACK_B
        barrier(CLK_LOCAL_MEM_FENCE);  // the panel is refilled for the next block
#endif
    }

#pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int r = item_row + i;
        if (r < rows) {
            float out[BLOCK_N];
#pragma unroll
            for (int v = 0; v < NV; ++v) VSTORE(acc[i][v], v, out);
            for (int j = 0; j < BLOCK_N; ++j) {
                const int col = first_col + j;
                if (col >= item_col && col < cols) {
#if OUT_T
                    const int index = col * rows + r;
                    c[index] = finish(out[j], alpha, beta, c, index, bias, r);
#else
                    const int index = r * cols + col;
                    c[index] = finish(out[j], alpha, beta, c, index, bias, col);
#endif
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
#elif GEMM_KERNEL == 2

#ifndef DM
#define DM 3    // rows of the result per work-item
#endif
#ifndef DN
#define DN 4    // columns of the result per work-item
#endif
#ifndef VK
#define VK 8    // vector width along k
#endif
#define VEC CAT(float, VK)
#define VLOAD CAT(vload, VK)
#define VSTORE CAT(vstore, VK)
#if VK != 4 && VK != 8 && VK != 16
#error "VK must be 4, 8 or 16"
#endif

// Pairwise, in a fixed order. The vector goes through a private array: oclgrind's checker of
// uninitialized values cannot follow extracted vector components.
inline float horizontal_sum(const VEC v) {
    float t[VK];
    VSTORE(v, 0, t);
#pragma unroll
    for (int width = VK / 2; width > 0; width /= 2)
#pragma unroll
        for (int i = 0; i < width; ++i) t[i] += t[i + width];
    return t[0];
}

// C = A @ B^T with A stored (m, k) and B stored (n, k): every operand row is contiguous along k.
__kernel void gemm_dot(const __global float* restrict a, const __global float* restrict b,
                       __global float* c, const __global float* restrict bias,
                       const int m, const int n, const int k,
                       const float alpha, const float beta,
                       const int stride_a, const int stride_b, const int stride_c) {
    const int item_col = get_global_id(0) * DN;
    const int item_row = get_global_id(1) * DM;
    if (item_col >= n || item_row >= m) return;
    a += get_global_id(2) * stride_a;
    b += get_global_id(2) * stride_b;
    c += get_global_id(2) * stride_c;

    const __global float* arow[DM];
    const __global float* brow[DN];
#pragma unroll
    for (int i = 0; i < DM; ++i) arow[i] = a + min(item_row + i, m - 1) * k;
#pragma unroll
    for (int j = 0; j < DN; ++j) brow[j] = b + min(item_col + j, n - 1) * k;

    VEC acc[DM][DN];
#pragma unroll
    for (int i = 0; i < DM; ++i)
#pragma unroll
        for (int j = 0; j < DN; ++j) acc[i][j] = (VEC)(0.0f);

    const int whole = k / VK;
    for (int q = 0; q < whole; ++q) {
        VEC av[DM];
#pragma unroll
        for (int i = 0; i < DM; ++i) av[i] = VLOAD(q, arow[i]);
#pragma unroll
        for (int j = 0; j < DN; ++j) {
            const VEC bv = VLOAD(q, brow[j]);
#pragma unroll
            for (int i = 0; i < DM; ++i) acc[i][j] = MULADD(av[i], bv, acc[i][j]);
        }
    }

    float sum[DM][DN];
#pragma unroll
    for (int i = 0; i < DM; ++i)
#pragma unroll
        for (int j = 0; j < DN; ++j) sum[i][j] = horizontal_sum(acc[i][j]);
    for (int kk = whole * VK; kk < k; ++kk) {
#pragma unroll
        for (int i = 0; i < DM; ++i)
#pragma unroll
            for (int j = 0; j < DN; ++j) sum[i][j] = MULADD(arow[i][kk], brow[j][kk], sum[i][j]);
    }

#pragma unroll
    for (int i = 0; i < DM; ++i) {
        const int r = item_row + i;
#pragma unroll
        for (int j = 0; j < DN; ++j) {
            const int col = item_col + j;
            if (r < m && col < n) {
                const int index = r * n + col;
                c[index] = finish(sum[i][j], alpha, beta, c, index, bias, col);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
#elif GEMM_KERNEL == 3

#ifndef TILE_M
#define TILE_M 64
#endif
#ifndef TILE_N
#define TILE_N 64
#endif
#ifndef TILE_K
#define TILE_K 16
#endif
#ifndef WPT_M
#define WPT_M 4
#endif
#ifndef WPT_N
#define WPT_N 4
#endif
#define GROUP_M (TILE_M / WPT_M)
#define GROUP_N (TILE_N / WPT_N)
#define GROUP_SIZE (GROUP_M * GROUP_N)

#if TILE_M % WPT_M || TILE_N % WPT_N || TILE_M % 4 || TILE_N % 4 || TILE_K % 4
#error "tiles must divide by the work per item and by the vector width 4"
#endif

// Copies one rows x cols tile of a row-major matrix (height x width, leading dimension width)
// starting at (row0, col0) into local memory, transposed or not, zero past the matrix edges.
// The copy moves float4 quads along the contiguous dimension; a quad that crosses an edge falls
// back to guarded scalar loads.
inline void stage_tile(__local float* tile, const int tile_ld, const int transpose,
                       const __global float* src, const int height, const int width,
                       const int row0, const int col0, const int tile_rows, const int tile_cols,
                       const int tid) {
    const int quads_per_row = tile_cols / 4;
    for (int q = tid; q < tile_rows * quads_per_row; q += GROUP_SIZE) {
        // The remainder is spelled out: LLVM pairs a division and a remainder of the same
        // operands through a `freeze`, an instruction oclgrind cannot run.
        const int tr = q / quads_per_row;
        const int tc = (q - tr * quads_per_row) * 4;
        const int r = row0 + tr;
        const int col = col0 + tc;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < height) {
            const __global float* p = src + r * width + col;
            if (col + 4 <= width) {
                vstore4(vload4(0, p), 0, v);
            } else {
                for (int e = 0; e < 3; ++e)
                    if (col + e < width) v[e] = p[e];
            }
        }
        if (transpose) {
#pragma unroll
            for (int e = 0; e < 4; ++e) tile[(tc + e) * tile_ld + tr] = v[e];
        } else {
            vstore4(vload4(0, v), 0, tile + tr * tile_ld + tc);
        }
    }
}

// Local tiles are stored k-major: a_tile[kk][row], b_tile[kk][col]; each work-item reads its
// WPT_M rows and WPT_N columns as float4 vectors.
__kernel __attribute__((reqd_work_group_size(GROUP_N, GROUP_M, 1)))
void gemm_local(const __global float* restrict a, const __global float* restrict b,
                __global float* c, const __global float* restrict bias,
                const int m, const int n, const int k,
                const float alpha, const float beta,
                const int stride_a, const int stride_b, const int stride_c) {
    __local float a_tile[TILE_K * TILE_M];
    __local float b_tile[TILE_K * TILE_N];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * GROUP_N + tx;
    const int row0 = get_group_id(1) * TILE_M;
    const int col0 = get_group_id(0) * TILE_N;
    a += get_global_id(2) * stride_a;
    b += get_global_id(2) * stride_b;
    c += get_global_id(2) * stride_c;

    float acc[WPT_M][WPT_N];
#pragma unroll
    for (int i = 0; i < WPT_M; ++i)
#pragma unroll
        for (int j = 0; j < WPT_N; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < k; k0 += TILE_K) {
#if TRANS_A
        // A stored (k, m): the tile's rows run along k, already k-major.
        stage_tile(a_tile, TILE_M, 0, a, k, m, k0, row0, TILE_K, TILE_M, tid);
#else
        stage_tile(a_tile, TILE_M, 1, a, m, k, row0, k0, TILE_M, TILE_K, tid);
#endif
#if TRANS_B
        stage_tile(b_tile, TILE_N, 1, b, n, k, col0, k0, TILE_N, TILE_K, tid);
#else
        stage_tile(b_tile, TILE_N, 0, b, k, n, k0, col0, TILE_K, TILE_N, tid);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll 4
        for (int kk = 0; kk < TILE_K; ++kk) {
            float av[WPT_M];
            float bv[WPT_N];
#pragma unroll
            for (int i = 0; i < WPT_M; i += 4)
                vstore4(vload4(0, a_tile + kk * TILE_M + ty * WPT_M + i), 0, av + i);
#pragma unroll
            for (int j = 0; j < WPT_N; j += 4)
                vstore4(vload4(0, b_tile + kk * TILE_N + tx * WPT_N + j), 0, bv + j);
#pragma unroll
            for (int i = 0; i < WPT_M; ++i)
#pragma unroll
                for (int j = 0; j < WPT_N; ++j) acc[i][j] = mad(av[i], bv[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#pragma unroll
    for (int i = 0; i < WPT_M; ++i) {
        const int r = row0 + ty * WPT_M + i;
#pragma unroll
        for (int j = 0; j < WPT_N; ++j) {
            const int col = col0 + tx * WPT_N + j;
            if (r < m && col < n) {
                const int index = r * n + col;
                c[index] = finish(acc[i][j], alpha, beta, c, index, bias, col);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
#elif GEMM_KERNEL == 4

#ifndef TILE_M
#define TILE_M 128
#endif
#ifndef TILE_N
#define TILE_N 128
#endif
#ifndef TILE_K
#define TILE_K 16
#endif
#ifndef WPT_M
#define WPT_M 8
#endif
#ifndef WPT_N
#define WPT_N 8
#endif
#ifndef EXACT
#define EXACT 0    // 1: m, n, k are multiples of TILE_M, TILE_N, TILE_K: no bounds checks
#endif
#ifndef ALIGNED
#define ALIGNED 0  // 1: leading dimensions and batch strides are multiples of 4 floats
#endif

#define GROUP_M (TILE_M / WPT_M)
#define GROUP_N (TILE_N / WPT_N)
#define GROUP_SIZE (GROUP_M * GROUP_N)
// An item's results are WPT_M / 4 x WPT_N / 4 blocks of 4 x 4, GROUP_M * 4 rows and GROUP_N * 4
// columns apart, so that the items of a row read consecutive float4s of the local tile.
#define BLOCKS_M (WPT_M / 4)
#define BLOCKS_N (WPT_N / 4)
#define A_QUADS (TILE_K * TILE_M / 4)
#define B_QUADS (TILE_K * TILE_N / 4)
#define A_SLOTS ((A_QUADS + GROUP_SIZE - 1) / GROUP_SIZE)
#define B_SLOTS ((B_QUADS + GROUP_SIZE - 1) / GROUP_SIZE)
// Whether quad slot s of this item holds a quad of the tile (always, when the group divides it).
#define A_SLOT_USED(s) (A_QUADS % GROUP_SIZE == 0 || tid + (s) * GROUP_SIZE < A_QUADS)
#define B_SLOT_USED(s) (B_QUADS % GROUP_SIZE == 0 || tid + (s) * GROUP_SIZE < B_QUADS)

#if TILE_M % WPT_M || TILE_N % WPT_N || WPT_M % 4 || WPT_N % 4 || TILE_K % 4
#error "tiles must divide by the work per item, itself a multiple of the vector width 4"
#endif

// A whole float4 at p: through a float4 pointer where ALIGNED promises 16-byte alignment (one
// 128-bit load on GPUs), through vload4 otherwise.
#if ALIGNED
#define LOAD4(p) (*(const __global float4*)(p))
#else
#define LOAD4(p) vload4(0, (p))
#endif

// The quad at (row, col) of a row-major (height x width) matrix, col a multiple of 4; zeros past
// its edges in a checked build. With ALIGNED, width is a multiple of 4: a quad is all in or out.
inline float4 fetch_quad(const __global float* src, const int height, const int width,
                         const int row, const int col) {
    const __global float* p = src + row * width + col;
#if EXACT
    return LOAD4(p);
#else
    if (row >= height || col >= width) return (float4)(0.0f);
#if ALIGNED
    return LOAD4(p);
#else
    if (col + 4 <= width) return vload4(0, p);
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int e = 0; e < 3; ++e)
        if (col + e < width) v[e] = p[e];
    return vload4(0, v);
#endif
#endif
}

// Operand layouts. A tile of op(A) is TILE_M x TILE_K, kept k-major in local memory. Stored
// (k, m) (TRANS_A), its quads run along m and go to local memory as they are ("direct"); stored
// (m, k), they run along k and are scattered transposed. Likewise for op(B), TILE_K x TILE_N:
// stored (k, n) direct, stored (n, k) (TRANS_B) transposed. QPR: quads per stored tile row.
#if TRANS_A
#define A_QPR (TILE_M / 4)
#define A_FETCH(r, q, k0) fetch_quad(a, k, m, (k0) + (r), row0 + 4 * (q))
#else
#define A_QPR (TILE_K / 4)
#define A_FETCH(r, q, k0) fetch_quad(a, m, k, row0 + (r), (k0) + 4 * (q))
#endif
#if TRANS_B
#define B_QPR (TILE_K / 4)
#define B_FETCH(r, q, k0) fetch_quad(b, n, k, col0 + (r), (k0) + 4 * (q))
#else
#define B_QPR (TILE_N / 4)
#define B_FETCH(r, q, k0) fetch_quad(b, k, n, (k0) + (r), col0 + 4 * (q))
#endif

// Writes the quads an item fetched (`staged`, 4 floats per slot) into a k-major local tile of
// `width` (TILE_M or TILE_N) columns; quad (r, q) of a transposed operand is column r, rows
// 4q..4q+3 of the tile.
#define STORE_DIRECT(tile, width, slots, used, rr, qq, staged)                               \
    _Pragma("unroll") for (int s = 0; s < (slots); ++s) if (used(s))                         \
        (tile)[rr[s] * ((width) / 4) + qq[s]] = vload4(s, (staged));
#define STORE_TRANSPOSED(tile, width, slots, used, rr, qq, staged)                           \
    _Pragma("unroll") for (int s = 0; s < (slots); ++s) if (used(s)) {                       \
        __local float* t = (__local float*)(tile);                                           \
        _Pragma("unroll") for (int e = 0; e < 4; ++e)                                        \
            t[(4 * qq[s] + e) * (width) + rr[s]] = (staged)[4 * s + e];                      \
    }
#if TRANS_A
#define STORE_A STORE_DIRECT
#else
#define STORE_A STORE_TRANSPOSED
#endif
#if TRANS_B
#define STORE_B STORE_TRANSPOSED
#else
#define STORE_B STORE_DIRECT
#endif

// Fetches the operand quads of the k tile at k0 into private registers.
#define FETCH_TILES(k0)                                                                       \
    {                                                                                         \
        _Pragma("unroll") for (int s = 0; s < A_SLOTS; ++s) if (A_SLOT_USED(s))               \
            vstore4(A_FETCH(a_row[s], a_quad[s], (k0)), s, a_staged);                         \
        _Pragma("unroll") for (int s = 0; s < B_SLOTS; ++s) if (B_SLOT_USED(s))               \
            vstore4(B_FETCH(b_row[s], b_quad[s], (k0)), s, b_staged);                         \
    }

// Local tiles: a_tiles[buffer][kk][row], b_tiles[buffer][kk][col], as float4 so that every read
// of the inner loop is one aligned 128-bit access.
__kernel __attribute__((reqd_work_group_size(GROUP_N, GROUP_M, 1)))
void gemm_blocked(const __global float* restrict a, const __global float* restrict b,
                  __global float* c, const __global float* restrict bias,
                  const int m, const int n, const int k,
                  const float alpha, const float beta,
                  const int stride_a, const int stride_b, const int stride_c) {
    __local float4 a_tiles[2 * TILE_K * TILE_M / 4];
    __local float4 b_tiles[2 * TILE_K * TILE_N / 4];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * GROUP_N + tx;
    const int row0 = get_group_id(1) * TILE_M;
    const int col0 = get_group_id(0) * TILE_N;
    a += get_group_id(2) * stride_a;
    b += get_group_id(2) * stride_b;
    c += get_group_id(2) * stride_c;

    // The quads this item fetches: slot s is quad tid + s * GROUP_SIZE of the stored tile, row
    // r = quad / QPR, quad column q (the remainder, spelled out: LLVM pairs a division and a
    // remainder through a `freeze`, which oclgrind cannot run).
    int a_row[A_SLOTS], a_quad[A_SLOTS], b_row[B_SLOTS], b_quad[B_SLOTS];
#pragma unroll
    for (int s = 0; s < A_SLOTS; ++s) {
        const int quad = tid + s * GROUP_SIZE;
        a_row[s] = quad / A_QPR;
        a_quad[s] = quad - a_row[s] * A_QPR;
    }
#pragma unroll
    for (int s = 0; s < B_SLOTS; ++s) {
        const int quad = tid + s * GROUP_SIZE;
        b_row[s] = quad / B_QPR;
        b_quad[s] = quad - b_row[s] * B_QPR;
    }
    float a_staged[4 * A_SLOTS];
    float b_staged[4 * B_SLOTS];

    float acc[WPT_M][WPT_N];
#pragma unroll
    for (int i = 0; i < WPT_M; ++i)
#pragma unroll
        for (int j = 0; j < WPT_N; ++j) acc[i][j] = 0.0f;

    const int tiles = (k + TILE_K - 1) / TILE_K;
    FETCH_TILES(0)
    STORE_A(a_tiles, TILE_M, A_SLOTS, A_SLOT_USED, a_row, a_quad, a_staged)
    STORE_B(b_tiles, TILE_N, B_SLOTS, B_SLOT_USED, b_row, b_quad, b_staged)
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int t = 0; t < tiles; ++t) {
        const int current = t & 1;
        const __local float4* a_tile = a_tiles + current * (TILE_K * TILE_M / 4);
        const __local float4* b_tile = b_tiles + current * (TILE_K * TILE_N / 4);
        const int more = t + 1 < tiles;  // the same for every item of the group
        if (more) FETCH_TILES((t + 1) * TILE_K)

#pragma unroll
        for (int kk = 0; kk < TILE_K; ++kk) {
            float av[WPT_M];
            float bv[WPT_N];
#pragma unroll
            for (int i = 0; i < BLOCKS_M; ++i)
                vstore4(a_tile[kk * (TILE_M / 4) + i * GROUP_M + ty], i, av);
#pragma unroll
            for (int j = 0; j < BLOCKS_N; ++j)
                vstore4(b_tile[kk * (TILE_N / 4) + j * GROUP_N + tx], j, bv);
#pragma unroll
            for (int i = 0; i < WPT_M; ++i)
#pragma unroll
                for (int j = 0; j < WPT_N; ++j) acc[i][j] = mad(av[i], bv[j], acc[i][j]);
        }

        // The other buffer was last read before the previous barrier: refill it, then one
        // barrier makes it visible and frees the current one.
        if (more) {
            __local float4* a_next = a_tiles + (1 - current) * (TILE_K * TILE_M / 4);
            __local float4* b_next = b_tiles + (1 - current) * (TILE_K * TILE_N / 4);
            STORE_A(a_next, TILE_M, A_SLOTS, A_SLOT_USED, a_row, a_quad, a_staged)
            STORE_B(b_next, TILE_N, B_SLOTS, B_SLOT_USED, b_row, b_quad, b_staged)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#pragma unroll
    for (int i = 0; i < WPT_M; ++i) {
        const int r = row0 + (i / 4) * (GROUP_M * 4) + ty * 4 + (i & 3);
#pragma unroll
        for (int j = 0; j < BLOCKS_N; ++j) {
            const int col = col0 + j * (GROUP_N * 4) + tx * 4;
#if EXACT && ALIGNED
            // Whole float4 rows of C: in the matrix and 16-byte aligned.
            __global float4* out = (__global float4*)(c + r * n + col);
            float4 v = alpha * vload4(j, acc[i]);
            if (beta != 0.0f) v += beta * *out;
#if HAS_BIAS
            v += *(const __global float4*)(bias + col);
#endif
            *out = ACT(v);
#else
            if (r < m) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (col + e < n) {
                        const int index = r * n + col + e;
                        c[index] = finish(acc[i][4 * j + e], alpha, beta, c, index, bias,
                                          col + e);
                    }
                }
            }
#endif
        }
    }
}

#else
#error "GEMM_KERNEL must be 1 (register), 2 (dot), 3 (local) or 4 (blocked)"
#endif
