// Max, average and global average pooling on NCHW tensors, forward and backward.
// Max pooling: padding never wins, and a window's gradient goes to its first maximum in row-major
// order, recomputed from x by the backward so no index tensor is needed. Average pooling divides by
// the whole window R*S, zero padding included.
//
// The window geometry is fixed at build time (one program per geometry, cached like the depthwise
// programs), so every loop over the window has constant bounds and the index arithmetic divides by
// constants:
//   POOL_R, POOL_S      window height and width
//   POOL_SH, POOL_SW    strides
//   POOL_PH, POOL_PW    padding
// Windows that tile the input (stride == window, no padding: POOL_TILES) take a fast max-pooling
// path: a work-item owns POOL_PB neighbouring windows along a row in each of POOL_RB rows; the
// forward writes their maxima, and the backward writes every input gradient under them (dy at the
// first maximum, 0 elsewhere: tiles never overlap, so no two work-items write the same element)
// plus zeros in the rows and columns no window covers. The input of a block is loaded as vectors
// where the window width allows (1: one load, 2: one load of twice the width split into even and
// odd lanes); other widths gather lane by lane. Overlapping or padded windows take the general
// path: one output (forward) or one input gradient gathered over the covering windows (backward)
// per work-item.
//
// Tuning defines (kernels/pool.py passes per-device defaults):
//   POOL_PB   windows per work-item along a row on the tiled path: 1, 2, 4, 8 or 16 (8 at most
//             when POOL_S == 2)
//   POOL_RB   rows of windows per work-item on the tiled path
//   POOL_WG   group size of the general path and of global_avgpool_backward (the tiled path's
//             3-D groups are sized at launch)
//   GAP_WG    global-average-pool forward group size (one group per (n, c) row), a power of two

#ifndef POOL_R
#define POOL_R 2
#endif
#ifndef POOL_S
#define POOL_S 2
#endif
#ifndef POOL_SH
#define POOL_SH 2
#endif
#ifndef POOL_SW
#define POOL_SW 2
#endif
#ifndef POOL_PH
#define POOL_PH 0
#endif
#ifndef POOL_PW
#define POOL_PW 0
#endif
#ifndef POOL_PB
#define POOL_PB 4
#endif
#ifndef POOL_RB
#define POOL_RB 1
#endif
#ifndef POOL_WG
#define POOL_WG 64
#endif
#ifndef GAP_WG
#define GAP_WG 64
#endif

#define POOL_TILES \
    (POOL_SH == POOL_R && POOL_SW == POOL_S && POOL_PH == 0 && POOL_PW == 0)

// (x / y, x % y) for x >= 0, y > 0. The remainder comes from mad_sat (exact: nothing overflows)
// rather than `%`: LLVM pairs a division and a remainder of the same operands through a `freeze`
// instruction, which oclgrind's uninitialized-value checker cannot interpret.
inline int2 divmod(const int x, const int y) {
    const int q = x / y;
    return (int2)(q, mad_sat(-q, y, x));
}

// ---- general path: any geometry ----------------------------------------------------------------

// Window tap (r, s) of the first maximum, in row-major order, of the window at (ih0, iw0).
inline int2 first_max_tap(const __global float* plane, const int H, const int W, const int ih0,
                          const int iw0) {
    const int r_begin = max(0, -ih0), r_end = min(POOL_R, H - ih0);
    const int s_begin = max(0, -iw0), s_end = min(POOL_S, W - iw0);
    float best = -INFINITY;
    int2 best_tap = (int2)(r_begin, s_begin);
    for (int r = 0; r < POOL_R; ++r) {
        if (r < r_begin || r >= r_end) continue;
        for (int s = 0; s < POOL_S; ++s) {
            if (s < s_begin || s >= s_end) continue;
            const float v = plane[(ih0 + r) * W + iw0 + s];
            if (v > best) {
                best = v;
                best_tap = (int2)(r, s);
            }
        }
    }
    return best_tap;
}

// First and last output index whose window (start o*stride - pad, length window) covers input
// index i.
#define COVERING_WINDOWS(i, pad, window, stride, O)                                   \
    (int2)(max(0, ((i) + (pad) - (window) + (stride)) / (stride)),                    \
           min((O) - 1, ((i) + (pad)) / (stride)))

// ---- tiled path: vectors of a width chosen by a define; width 1 is the scalar float ------------

#define POOL_CAT(a, b) a##b
#define POOL_XCAT(a, b) POOL_CAT(a, b)

typedef float float1;
typedef int int1;
#define VEC(width) POOL_XCAT(float, width)
#define IVEC(width) POOL_XCAT(int, width)

#define VLOAD_1(p) (*(p))
#define VLOAD_2(p) vload2(0, p)
#define VLOAD_4(p) vload4(0, p)
#define VLOAD_8(p) vload8(0, p)
#define VLOAD_16(p) vload16(0, p)
#define VLOAD(width, p) POOL_XCAT(VLOAD_, width)(p)

#define VSTORE_1(v, p) (*(p) = (v))
#define VSTORE_2(v, p) vstore2(v, 0, p)
#define VSTORE_4(v, p) vstore4(v, 0, p)
#define VSTORE_8(v, p) vstore8(v, 0, p)
#define VSTORE_16(v, p) vstore16(v, 0, p)
#define VSTORE(width, v, p) POOL_XCAT(VSTORE_, width)(v, p)

// Lane p of a is followed by lane p of b: the two columns of POOL_PB windows 2 wide.
#define INTERLEAVE_1(a, b) (float2)(a, b)
#define INTERLEAVE_2(a, b) shuffle2(a, b, (uint4)(0, 2, 1, 3))
#define INTERLEAVE_4(a, b) shuffle2(a, b, (uint8)(0, 4, 1, 5, 2, 6, 3, 7))
#define INTERLEAVE_8(a, b) \
    shuffle2(a, b, (uint16)(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15))
#define INTERLEAVE(width, a, b) POOL_XCAT(INTERLEAVE_, width)(a, b)

#define PVEC VEC(POOL_PB)
#define PIVEC IVEC(POOL_PB)
#define TILE_SPAN (POOL_PB * POOL_S)  // input columns under one block of windows
// The vector width of one row of a block of 2-wide windows (a literal, for the names above).
#if POOL_PB == 1
#define PAIR_WIDTH 2
#elif POOL_PB == 2
#define PAIR_WIDTH 4
#elif POOL_PB == 4
#define PAIR_WIDTH 8
#else
#define PAIR_WIDTH 16
#endif

// Lanes p < count of a vector to dst[p * step], for blocks cut by the end of a row and for window
// widths without a vector layout.
#define STORE_LANES(v, dst, step, count)                                   \
    do {                                                                   \
        float lanes_[POOL_PB];                                             \
        VSTORE(POOL_PB, v, lanes_);                                        \
        for (int p_ = 0; p_ < POOL_PB; ++p_)                               \
            if (p_ < (count)) (dst)[p_ * (step)] = lanes_[p_];             \
    } while (0)

// One tap column of the block's windows as a vector: lane p is x_row[p * POOL_S].
// `vector_ok` says every float from x_row to x_row + TILE_SPAN lies inside the tensor; otherwise
// lanes p >= count (past the end of the output row) are not read.
inline PVEC tile_column(const __global float* x_row, const bool vector_ok, const int count) {
#if POOL_S == 1
    if (vector_ok) return VLOAD(POOL_PB, x_row);
#endif
    float lanes_[POOL_PB];
    for (int p = 0; p < POOL_PB; ++p) lanes_[p] = p < count ? x_row[p * POOL_S] : 0.0f;
    return VLOAD(POOL_PB, lanes_);
}

// Maximum and first-maximum tap (r * POOL_S + s) of the block's POOL_PB windows in the row of
// windows starting at input row ih0 of x_plane, from column iw0 = ow0 * POOL_S.
#define TILE_UPDATE(v, k)                                                   \
    {                                                                       \
        const PIVEC better_ = (v) > best;                                   \
        best = select(best, (v), better_);                                  \
        tap = select(tap, (PIVEC)(k), better_);                             \
    }
#if POOL_S == 2
#define TILE_ROW(r)                                                             \
    {                                                                           \
        const __global float* x_row = x_plane + (ih0 + (r)) * W + iw0;          \
        if (vector_ok) {                                                        \
            const VEC(PAIR_WIDTH) pair = VLOAD(PAIR_WIDTH, x_row);                \
            TILE_UPDATE(pair.even, 2 * (r))                                     \
            TILE_UPDATE(pair.odd, 2 * (r) + 1)                                  \
        } else {                                                                \
            TILE_UPDATE(tile_column(x_row, false, count), 2 * (r))           \
            TILE_UPDATE(tile_column(x_row + 1, false, count), 2 * (r) + 1)   \
        }                                                                       \
    }
#else
#define TILE_ROW(r)                                                             \
    {                                                                           \
        const __global float* x_row = x_plane + (ih0 + (r)) * W + iw0;          \
        for (int s = 0; s < POOL_S; ++s)                                        \
            TILE_UPDATE(tile_column(x_row + s, vector_ok, count), (r) * POOL_S + s) \
    }
#endif
#define TILE_MAX                                                                \
    PVEC best = (PVEC)(-INFINITY);                                              \
    PIVEC tap = (PIVEC)(0);                                                     \
    for (int r = 0; r < POOL_R; ++r) TILE_ROW(r)

// The work-item's block: windows ow0 .. ow0 + POOL_PB - 1 (count of them inside the row) of rows
// oh0 .. oh_end - 1 of plane nc; vector loads wherever the block's last row stays in the tensor.
#define TILE_BLOCK                                                                            \
    const int ow0 = get_global_id(0) * POOL_PB;                                               \
    const int oh0 = get_global_id(1) * POOL_RB;                                               \
    const int nc = get_global_id(2);                                                          \
    if (ow0 >= OW || oh0 >= OH || nc >= NC) return;                                           \
    const int oh_end = min(oh0 + POOL_RB, OH);                                                \
    const int count = min(POOL_PB, OW - ow0);                                                 \
    const int iw0 = ow0 * POOL_S;                                                             \
    const __global float* x_plane = x + nc * H * W;                                           \
    const bool vector_ok =                                                                    \
        (nc * H + oh_end * POOL_R - 1) * W + iw0 + TILE_SPAN <= NC * H * W;

#if POOL_TILES

// Global size (ceil(OW / POOL_PB), ceil(OH / POOL_RB), N * C), each rounded up to the work-group
// shape.
__kernel void maxpool_forward(__global const float* restrict x, __global float* restrict y,
                              const int NC, const int H, const int W, const int OH, const int OW) {
    TILE_BLOCK
    for (int oh = oh0; oh < oh_end; ++oh) {
        const int ih0 = oh * POOL_R;
        TILE_MAX
        __global float* y_row = y + (nc * OH + oh) * OW + ow0;
        if (count == POOL_PB) {
            VSTORE(POOL_PB, best, y_row);
        } else {
            STORE_LANES(best, y_row, 1, count);
        }
    }
}

// Global size as the forward's: one work-item per block of windows, writing every input
// gradient under them, and the uncovered rows and columns next to them.
__kernel void maxpool_backward(__global const float* restrict x, __global const float* restrict dy,
                               __global float* restrict dx, const int NC, const int H, const int W,
                               const int OH, const int OW) {
    TILE_BLOCK
    const bool last_block = ow0 + POOL_PB >= OW;
    const int covered_w = OW * POOL_S;
    __global float* dx_plane = dx + nc * H * W;
    for (int oh = oh0; oh < oh_end; ++oh) {
        const int ih0 = oh * POOL_R;
        TILE_MAX
        const __global float* dy_row = dy + (nc * OH + oh) * OW + ow0;
        PVEC d;
        if (count == POOL_PB) {
            d = VLOAD(POOL_PB, dy_row);
        } else {
            float lanes_[POOL_PB];
            for (int p = 0; p < POOL_PB; ++p) lanes_[p] = p < count ? dy_row[p] : 0.0f;
            d = VLOAD(POOL_PB, lanes_);
        }
        for (int r = 0; r < POOL_R; ++r) {
            __global float* dx_row = dx_plane + (ih0 + r) * W;
#if POOL_S == 2
            const VEC(PAIR_WIDTH) both = INTERLEAVE(POOL_PB,
                select((PVEC)(0.0f), d, tap == (PIVEC)(2 * r)),
                select((PVEC)(0.0f), d, tap == (PIVEC)(2 * r + 1)));
            if (count == POOL_PB) {
                VSTORE(PAIR_WIDTH, both, dx_row + iw0);
            } else {
                float lanes_[PAIR_WIDTH];
                VSTORE(PAIR_WIDTH, both, lanes_);
                for (int p = 0; p < PAIR_WIDTH; ++p)
                    if (p < 2 * count) dx_row[iw0 + p] = lanes_[p];
            }
#elif POOL_S == 1
            const PVEC g = select((PVEC)(0.0f), d, tap == (PIVEC)(r));
            if (count == POOL_PB) {
                VSTORE(POOL_PB, g, dx_row + iw0);
            } else {
                STORE_LANES(g, dx_row + iw0, 1, count);
            }
#else
            for (int s = 0; s < POOL_S; ++s) {
                const PVEC g = select((PVEC)(0.0f), d, tap == (PIVEC)(r * POOL_S + s));
                STORE_LANES(g, dx_row + iw0 + s, POOL_S, count);
            }
#endif
            if (last_block)
                for (int iw = covered_w; iw < W; ++iw) dx_row[iw] = 0.0f;
        }
    }
    if (oh_end == OH) {  // rows below the last row of windows
        const int iw_end = last_block ? W : iw0 + TILE_SPAN;
        for (int ih = OH * POOL_R; ih < H; ++ih)
            for (int iw = iw0; iw < iw_end; ++iw) dx_plane[ih * W + iw] = 0.0f;
    }
}

#else  // overlapping or padded windows

// One output per work-item. Global size: N * C * OH * OW rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool_forward(__global const float* restrict x, __global float* restrict y, const int NC,
                     const int H, const int W, const int OH, const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * OH * OW) return;
    const int2 rest_ow = divmod(i, OW);
    const int2 nc_oh = divmod(rest_ow.x, OH);
    const int ih0 = nc_oh.y * POOL_SH - POOL_PH;
    const int iw0 = rest_ow.y * POOL_SW - POOL_PW;
    const __global float* plane = x + nc_oh.x * H * W;
    const int2 tap = first_max_tap(plane, H, W, ih0, iw0);
    y[i] = plane[(ih0 + tap.x) * W + iw0 + tap.y];
}

// One input element per work-item: the sum of dy over the windows whose first maximum it is.
// Global size: N * C * H * W rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool_backward(__global const float* restrict x, __global const float* restrict dy,
                      __global float* restrict dx, const int NC, const int H, const int W,
                      const int OH, const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * H * W) return;
    const int2 rest_iw = divmod(i, W);
    const int2 nc_ih = divmod(rest_iw.x, H);
    const int iw = rest_iw.y;
    const int ih = nc_ih.y;
    const __global float* plane = x + nc_ih.x * H * W;
    const __global float* dy_plane = dy + nc_ih.x * OH * OW;
    const int2 rows = COVERING_WINDOWS(ih, POOL_PH, POOL_R, POOL_SH, OH);
    const int2 cols = COVERING_WINDOWS(iw, POOL_PW, POOL_S, POOL_SW, OW);
    float acc = 0.0f;
    for (int oh = rows.x; oh <= rows.y; ++oh) {
        const int ih0 = oh * POOL_SH - POOL_PH;
        for (int ow = cols.x; ow <= cols.y; ++ow) {
            const int iw0 = ow * POOL_SW - POOL_PW;
            const int2 tap = first_max_tap(plane, H, W, ih0, iw0);
            if (tap.x == ih - ih0 && tap.y == iw - iw0) acc += dy_plane[oh * OW + ow];
        }
    }
    dx[i] = acc;
}

#endif

// One output per work-item. Global size: N * C * OH * OW rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void avgpool_forward(__global const float* restrict x, __global float* restrict y, const int NC,
                     const int H, const int W, const int OH, const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * OH * OW) return;
    const int2 rest_ow = divmod(i, OW);
    const int2 nc_oh = divmod(rest_ow.x, OH);
    const int ih0 = nc_oh.y * POOL_SH - POOL_PH;
    const int iw0 = rest_ow.y * POOL_SW - POOL_PW;
    const __global float* plane = x + nc_oh.x * H * W;
    float acc = 0.0f;
    for (int r = 0; r < POOL_R; ++r) {
        if (ih0 + r < 0 || ih0 + r >= H) continue;
        for (int s = 0; s < POOL_S; ++s)
            if (iw0 + s >= 0 && iw0 + s < W) acc += plane[(ih0 + r) * W + iw0 + s];
    }
    y[i] = acc / (float)(POOL_R * POOL_S);
}

// One input element per work-item: the sum of dy over the windows that cover it, over R*S.
// Global size: N * C * H * W rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void avgpool_backward(__global const float* restrict dy, __global float* restrict dx,
                      const int NC, const int H, const int W, const int OH, const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * H * W) return;
    const int2 rest_iw = divmod(i, W);
    const int2 nc_ih = divmod(rest_iw.x, H);
    const __global float* dy_plane = dy + nc_ih.x * OH * OW;
    const int2 rows = COVERING_WINDOWS(nc_ih.y, POOL_PH, POOL_R, POOL_SH, OH);
    const int2 cols = COVERING_WINDOWS(rest_iw.y, POOL_PW, POOL_S, POOL_SW, OW);
    float acc = 0.0f;
    for (int oh = rows.x; oh <= rows.y; ++oh)
        for (int ow = cols.x; ow <= cols.y; ++ow) acc += dy_plane[oh * OW + ow];
    dx[i] = acc / (float)(POOL_R * POOL_S);
}

// y[row] = mean of x[row, 0:HW] for row = n * C + c: one work-group per row, float4 loads, and a
// fixed-order tree in local memory. Global size: NC * GAP_WG; local size GAP_WG.
__kernel __attribute__((reqd_work_group_size(GAP_WG, 1, 1)))
void global_avgpool_forward(__global const float* x, __global float* y, const int HW) {
    __local float partial[GAP_WG];
    const int lid = get_local_id(0);
    const int row = get_group_id(0);
    const __global float* x_row = x + row * HW;
    float4 acc4 = (float4)(0.0f);
    for (int q = lid; 4 * q + 3 < HW; q += GAP_WG) acc4 += vload4(q, x_row);
    float acc = dot(acc4, (float4)(1.0f));
    for (int i = (HW / 4) * 4 + lid; i < HW; i += GAP_WG) acc += x_row[i];
    partial[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = GAP_WG / 2; span > 0; span >>= 1) {
        if (lid < span) partial[lid] += partial[lid + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) y[row] = partial[0] / (float)HW;
}

// dx[row, i] = dy[row] / HW. Global size: NC * HW rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void global_avgpool_backward(__global const float* dy, __global float* dx, const int NC,
                             const int HW) {
    const int i = get_global_id(0);
    if (i < NC * HW) dx[i] = dy[i / HW] / (float)HW;
}
