// Depthwise Conv2d (channel multiplier 1) on NCHW tensors with weights (C, 1, R, S), forward and
// backward, all as gathers: every work-item computes the outputs it owns. The bias gradient is
// conv2d.cl's channel_bias_backward.
//
// The window geometry is fixed at build time, so that the taps unroll into straight-line vector
// code with constant offsets (PoCL's LLVM leaves loops with constant trip counts rolled, and a
// phone compiler does better with constants too):
//   DW_R, DW_S          window height and width
//   DW_SH, DW_SW        strides
//   DW_PH, DW_PW        zero padding
// Tuning defines (kernels/depthwise.py passes per-device defaults):
//   DW_FWD_PB           forward outputs per work-item along a row: a vector width 1, 2, 4, 8 or 16
//   DW_FWD_RB           forward output rows per work-item
//   DW_BWD_PB           backward-data inputs per work-item along a row, same widths
//   DW_BWD_RB           backward-data input rows per work-item
//   DW_BWW_PB           backward-weight positions per vector step along a row, same widths
//   DW_BWW_RSB          kernel taps per backward-weight work-group
//   DW_BWW_WG           backward-weight work-group size, a power of two
// (DW_FWD_WG and DW_BWD_WG size the forward and backward-data work-groups at launch.)
//   DW_FMA              1 where the device has fused multiply-adds (fma), else mad is used
//
// With stride 1 along a row every tap is one vector load; a vector that crosses the edge of a row
// reads columns of the neighbouring row, and select() zeroes those lanes. Such loads are used only
// where everything the work-item may read lies inside the tensor; elsewhere (the edges of the
// first and the last plane) and for wider strides every lane is loaded on its own behind a bounds
// check, so nothing outside the tensor is ever read. Vector loads only touch tensors the launch
// does not write.

#ifndef DW_R
#define DW_R 3
#endif
#ifndef DW_S
#define DW_S 3
#endif
#ifndef DW_SH
#define DW_SH 1
#endif
#ifndef DW_SW
#define DW_SW 1
#endif
#ifndef DW_PH
#define DW_PH 0
#endif
#ifndef DW_PW
#define DW_PW 0
#endif
#ifndef DW_FWD_PB
#define DW_FWD_PB 4
#endif
#ifndef DW_FWD_RB
#define DW_FWD_RB 1
#endif
#ifndef DW_BWD_PB
#define DW_BWD_PB 4
#endif
#ifndef DW_BWD_RB
#define DW_BWD_RB 1
#endif
#ifndef DW_BWW_PB
#define DW_BWW_PB 4
#endif
#ifndef DW_BWW_RSB
#define DW_BWW_RSB 9
#endif
#ifndef DW_BWW_WG
#define DW_BWW_WG 64
#endif
#ifndef DW_FMA
#define DW_FMA 0
#endif

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_RELU6 2

// ---- vectors of a width chosen by a define: width 1 is the scalar float ----------------------

#define DW_CAT(a, b) a##b
#define DW_XCAT(a, b) DW_CAT(a, b)

typedef float float1;
typedef int int1;
#define VEC(width) DW_XCAT(float, width)
#define IVEC(width) DW_XCAT(int, width)

#define VLOAD_1(p) (*(p))
#define VLOAD_2(p) vload2(0, p)
#define VLOAD_4(p) vload4(0, p)
#define VLOAD_8(p) vload8(0, p)
#define VLOAD_16(p) vload16(0, p)
#define VLOAD(width, p) DW_XCAT(VLOAD_, width)(p)

#define VSTORE_1(v, p) (*(p) = (v))
#define VSTORE_2(v, p) vstore2(v, 0, p)
#define VSTORE_4(v, p) vstore4(v, 0, p)
#define VSTORE_8(v, p) vstore8(v, 0, p)
#define VSTORE_16(v, p) vstore16(v, 0, p)
#define VSTORE(width, v, p) DW_XCAT(VSTORE_, width)(v, p)

#define LANES_1 0
#define LANES_2 (int2)(0, 1)
#define LANES_4 (int4)(0, 1, 2, 3)
#define LANES_8 (int8)(0, 1, 2, 3, 4, 5, 6, 7)
#define LANES_16 (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define LANES(width) DW_XCAT(LANES_, width)

// Every second float from p: width lanes out of one load of 2 * width floats (the last of which is
// read and dropped).
#define VLOAD_EVEN_1(p) (*(p))
#define VLOAD_EVEN_2(p) vload4(0, p).even
#define VLOAD_EVEN_4(p) vload8(0, p).even
#define VLOAD_EVEN_8(p) vload16(0, p).even
#define VLOAD_EVEN_16(p) (float16)(vload16(0, p).even, vload16(0, (p) + 16).even)
#define VLOAD_EVEN(width, p) DW_XCAT(VLOAD_EVEN_, width)(p)

// Input columns ow*sw - pw + s of `width` neighbouring outputs as vector loads, for strides 1 and
// 2 (STRIDED_VECTORS); STRIDED_READ is how many floats the loads read from the first.
#if DW_SW == 1
#define STRIDED_LOAD(width, p) VLOAD(width, p)
#define STRIDED_READ(width) (width)
#define STRIDED_VECTORS 1
#elif DW_SW == 2
#define STRIDED_LOAD(width, p) VLOAD_EVEN(width, p)
#define STRIDED_READ(width) (2 * (width))
#define STRIDED_VECTORS 1
#else
#define STRIDED_VECTORS 0
#endif

// Sum of the lanes in a fixed order. Whole-vector operations only: oclgrind cannot interpret
// single-component reads of a vector accumulated in a loop, and it loses track of the halves of
// a float16, which therefore goes through private memory.
#define HSUM_1(v) (v)
#define HSUM_2(v) dot(v, (float2)(1.0f))
#define HSUM_4(v) dot(v, (float4)(1.0f))
#define HSUM_8(v) (HSUM_4((v).lo) + HSUM_4((v).hi))
#define HSUM_16(v) hsum16(v)
#define HSUM(width, v) DW_XCAT(HSUM_, width)(v)

#if DW_BWW_PB == 16
inline float hsum16(const float16 v) {
    float lanes[16];
    vstore16(v, 0, lanes);
    return HSUM_8(vload8(0, lanes) + vload8(1, lanes));
}
#endif

// ---- the taps of one window row, unrolled up to 16 ---------------------------------------------

#define DW_REP_1(M, a) M(a, 0)
#define DW_REP_2(M, a) DW_REP_1(M, a) M(a, 1)
#define DW_REP_3(M, a) DW_REP_2(M, a) M(a, 2)
#define DW_REP_4(M, a) DW_REP_3(M, a) M(a, 3)
#define DW_REP_5(M, a) DW_REP_4(M, a) M(a, 4)
#define DW_REP_6(M, a) DW_REP_5(M, a) M(a, 5)
#define DW_REP_7(M, a) DW_REP_6(M, a) M(a, 6)
#define DW_REP_8(M, a) DW_REP_7(M, a) M(a, 7)
#define DW_REP_9(M, a) DW_REP_8(M, a) M(a, 8)
#define DW_REP_10(M, a) DW_REP_9(M, a) M(a, 9)
#define DW_REP_11(M, a) DW_REP_10(M, a) M(a, 10)
#define DW_REP_12(M, a) DW_REP_11(M, a) M(a, 11)
#define DW_REP_13(M, a) DW_REP_12(M, a) M(a, 12)
#define DW_REP_14(M, a) DW_REP_13(M, a) M(a, 13)
#define DW_REP_15(M, a) DW_REP_14(M, a) M(a, 14)
#define DW_REP_16(M, a) DW_REP_15(M, a) M(a, 15)
#define DW_UNROLL_MAX 16

// M(a, s) for s = 0 .. DW_S - 1; unrolled with constant s when the window is at most 16 wide.
#if DW_S <= DW_UNROLL_MAX
#define FOR_EACH_TAP(M, a) DW_XCAT(DW_REP_, DW_S)(M, a)
#else
#define FOR_EACH_TAP(M, a) for (int tap_s = 0; tap_s < DW_S; ++tap_s) { M(a, tap_s) }
#endif

// M(a, j) for j = 0 .. DW_BWW_RSB - 1, the same way.
#if DW_BWW_RSB <= DW_UNROLL_MAX
#define FOR_EACH_BWW_TAP(M, a) DW_XCAT(DW_REP_, DW_BWW_RSB)(M, a)
#else
#define FOR_EACH_BWW_TAP(M, a) for (int tap_j = 0; tap_j < DW_BWW_RSB; ++tap_j) { M(a, tap_j) }
#endif

// M(r, T) for the window rows r = 0 .. DW_R - 1, unrolled with constant r up to 16 rows.
#define DW_ROWREP_1(M, T) M(0, T)
#define DW_ROWREP_2(M, T) DW_ROWREP_1(M, T) M(1, T)
#define DW_ROWREP_3(M, T) DW_ROWREP_2(M, T) M(2, T)
#define DW_ROWREP_4(M, T) DW_ROWREP_3(M, T) M(3, T)
#define DW_ROWREP_5(M, T) DW_ROWREP_4(M, T) M(4, T)
#define DW_ROWREP_6(M, T) DW_ROWREP_5(M, T) M(5, T)
#define DW_ROWREP_7(M, T) DW_ROWREP_6(M, T) M(6, T)
#define DW_ROWREP_8(M, T) DW_ROWREP_7(M, T) M(7, T)
#define DW_ROWREP_9(M, T) DW_ROWREP_8(M, T) M(8, T)
#define DW_ROWREP_10(M, T) DW_ROWREP_9(M, T) M(9, T)
#define DW_ROWREP_11(M, T) DW_ROWREP_10(M, T) M(10, T)
#define DW_ROWREP_12(M, T) DW_ROWREP_11(M, T) M(11, T)
#define DW_ROWREP_13(M, T) DW_ROWREP_12(M, T) M(12, T)
#define DW_ROWREP_14(M, T) DW_ROWREP_13(M, T) M(13, T)
#define DW_ROWREP_15(M, T) DW_ROWREP_14(M, T) M(14, T)
#define DW_ROWREP_16(M, T) DW_ROWREP_15(M, T) M(15, T)
#if DW_R <= DW_UNROLL_MAX
#define FOR_EACH_WINDOW_ROW(M, T) DW_XCAT(DW_ROWREP_, DW_R)(M, T)
#else
#define FOR_EACH_WINDOW_ROW(M, T) for (int tap_r = 0; tap_r < DW_R; ++tap_r) { M(tap_r, T) }
#endif

#if DW_R * DW_S <= DW_BWW_RSB
#define BWW_FIRST_TAP 0  // one work-group holds every tap: tap indices are constants
#else
#define BWW_FIRST_TAP ((int)get_group_id(0) * DW_BWW_RSB)
#endif

// (x / y, x % y) for x >= 0, y > 0. The remainder comes from mad_sat (exact: nothing overflows)
// rather than `%`: LLVM pairs a division and a remainder of the same operands through a `freeze`
// instruction, which oclgrind's uninitialized-value checker cannot interpret.
inline int2 divmod(const int x, const int y) {
    const int q = x / y;
    return (int2)(q, mad_sat(-q, y, x));
}
// divmod by a build-time constant; division by 1 costs nothing.
#define DIVMOD_BY(x, d) ((d) == 1 ? (int2)((x), 0) : divmod((x), (d)))

// a * b + c: fused where the device has fused multiply-adds (DW_FMA), else whatever mad gives.
#if DW_FMA
#define MAC(a, b, c) fma(a, b, c)
#else
#define MAC(a, b, c) mad(a, b, c)
#endif

// Applies the activation to a value or a vector.
#define ACTIVATE(v, activation) \
    ((activation) == ACT_RELU ? fmax(v, 0.0f) \
     : (activation) == ACT_RELU6 ? fmin(fmax(v, 0.0f), 6.0f) : (v))

// Lanes p < count of a vector to consecutive floats at `dst`, for the partial block at the end of
// a row.
#define STORE_FIRST(width, v, dst, count)                                  \
    do {                                                                   \
        float lanes_[width];                                               \
        VSTORE(width, v, lanes_);                                          \
        for (int p_ = 0; p_ < (count); ++p_) (dst)[p_] = lanes_[p_];        \
    } while (0)

// ================================================================================================
// Forward: y[n, c, oh, ow] = act(b[c] + sum_{r, s} x[n, c, oh*sh - ph + r, ow*sw - pw + s] w[c, r, s])
// Work-item (ow block, oh block, n*C + c) computes DW_FWD_PB neighbouring outputs in each of
// DW_FWD_RB rows; the channel's weights and the block's edge masks stay in registers across the
// rows.
// Global size (ceil(OW / DW_FWD_PB), ceil(OH / DW_FWD_RB), N * C), each rounded up to the
// work-group shape.

// Input columns one work-item's vector loads read per row, from its first.
#define FWD_SPAN (STRIDED_READ(DW_FWD_PB) + DW_S - 1)
#define FWD_W(r, s) w_c[(r) * DW_S + (s)]

// Strides 1 and 2: one vector load per tap; lanes outside the input row are zeroed.
#define FWD_TAP_VECTOR(r, s)                                                           \
    {                                                                                  \
        const IVEC(DW_FWD_PB) col = lanes * DW_SW + (iw0 + (s));                       \
        const VEC(DW_FWD_PB) v = STRIDED_LOAD(DW_FWD_PB, x_row + iw0 + (s));           \
        acc = MAC((VEC(DW_FWD_PB))FWD_W(r, s),                                         \
                  select((VEC(DW_FWD_PB))(0.0f), v, col >= 0 && col < W), acc);        \
    }
#define FWD_ROW_VECTOR(r, unused)                                          \
    if (ih0 + (r) >= 0 && ih0 + (r) < H) {                                 \
        const __global float* x_row = x_plane + (ih0 + (r)) * W;           \
        FOR_EACH_TAP(FWD_TAP_VECTOR, r)                                    \
    }
#define FWD_WINDOW_VECTOR FOR_EACH_WINDOW_ROW(FWD_ROW_VECTOR, 0)
// Any stride: each lane on its own, behind its bounds check.
#define FWD_WINDOW_GATHER                                                          \
    for (int r = max(0, -ih0); r < min(DW_R, H - ih0); ++r) {                      \
        const __global float* x_row = x_plane + (ih0 + r) * W;                     \
        for (int s = 0; s < DW_S; ++s) {                                           \
            float lanes_[DW_FWD_PB];                                               \
            for (int p_ = 0; p_ < DW_FWD_PB; ++p_) {                               \
                const int iw = iw0 + s + p_ * DW_SW;                               \
                lanes_[p_] = (iw >= 0 && iw < W) ? x_row[iw] : 0.0f;               \
            }                                                                      \
            acc = MAC((VEC(DW_FWD_PB))FWD_W(r, s), VLOAD(DW_FWD_PB, lanes_), acc);  \
        }                                                                          \
    }
#define FWD_OUTPUT_ROWS(WINDOW)                                            \
    for (int oh = oh0; oh < oh_end; ++oh) {                                \
        const int ih0 = oh * DW_SH - DW_PH;                                \
        VEC(DW_FWD_PB) acc = bias;                                         \
        WINDOW                                                             \
        acc = ACTIVATE(acc, activation);                                   \
        __global float* y_row = y + (nc * OH + oh) * OW + ow0;             \
        if (whole) {                                                       \
            VSTORE(DW_FWD_PB, acc, y_row);                                 \
        } else {                                                           \
            STORE_FIRST(DW_FWD_PB, acc, y_row, OW - ow0);                  \
        }                                                                  \
    }

__kernel void depthwise_forward(__global const float* restrict x, __global const float* restrict w,
                                __global const float* restrict b, __global float* restrict y,
                                const int N, const int C, const int H, const int W, const int OH,
                                const int OW, const int has_bias, const int activation) {
    const int ow0 = get_global_id(0) * DW_FWD_PB;
    const int oh0 = get_global_id(1) * DW_FWD_RB;
    const int nc = get_global_id(2);
    if (ow0 >= OW || oh0 >= OH || nc >= N * C) return;
    const int oh_end = min(oh0 + DW_FWD_RB, OH);
    const int c = nc - (nc / C) * C;
    const int iw0 = ow0 * DW_SW - DW_PW;
    const int plane = nc * H * W;
    const __global float* x_plane = x + plane;
    const __global float* w_c = w + c * DW_R * DW_S;
    const IVEC(DW_FWD_PB) lanes = LANES(DW_FWD_PB);
    const VEC(DW_FWD_PB) bias = (VEC(DW_FWD_PB))(has_bias ? b[c] : 0.0f);
    const bool whole = ow0 + DW_FWD_PB <= OW;

#if STRIDED_VECTORS
    // Vector loads may cross into the neighbouring rows of the plane, but never past the tensor.
    if (plane + iw0 >= 0 && plane + (H - 1) * W + iw0 + FWD_SPAN <= N * C * H * W) {
        FWD_OUTPUT_ROWS(FWD_WINDOW_VECTOR)
        return;
    }
#endif
    FWD_OUTPUT_ROWS(FWD_WINDOW_GATHER)
}

// ================================================================================================
// Backward to the input: dx[n, c, ih, iw] = sum_{r, s} dy[n, c, oh, ow] w[c, r, s] over the
// (oh, ow) whose window holds (ih, iw), i.e. oh*sh = ih + ph - r and ow*sw = iw + pw - s.
// Work-item (iw block, ih block, n*C + c) computes DW_BWD_PB neighbouring inputs in each of
// DW_BWD_RB rows.
// Global size (ceil(W / DW_BWD_PB), ceil(H / DW_BWD_RB), N * C), each rounded up to the
// work-group shape.

#define BWD_W(r, s) w_c[(r) * DW_S + (s)]

// Stride 1: lane iw of tap s reads output column iw + pw - s; lanes outside the output row are
// zeroed.
#define BWD_TAP_VECTOR(r, s)                                                            \
    {                                                                                   \
        const IVEC(DW_BWD_PB) col = lanes + (col0 - (s));                               \
        const VEC(DW_BWD_PB) v = VLOAD(DW_BWD_PB, dy_row + col0 - (s));                 \
        acc = MAC((VEC(DW_BWD_PB))BWD_W(r, s),                                          \
                  select((VEC(DW_BWD_PB))(0.0f), v, col >= 0 && col < OW), acc);        \
    }
// Stride 2 (DW_BWD_PB even, so iw0 is even): lane p meets tap s when p + pw - s is even, which
// makes the lanes of one phase, (s + pw) & 1, and their output columns are consecutive from
// (col0 - s + phase) / 2. Each phase keeps its own half-width sum, interleaved at the store.
#if DW_BWD_PB == 2
#define BWD_HALF 1
#elif DW_BWD_PB == 4
#define BWD_HALF 2
#elif DW_BWD_PB == 8
#define BWD_HALF 4
#else
#define BWD_HALF 8
#endif
#define BWD_TAP_STRIDE2(r, s)                                                              \
    {                                                                                      \
        const int base = (col0 - (s) + (((s) + DW_PW) & 1)) / 2;                           \
        const IVEC(BWD_HALF) col = half_lanes + base;                                      \
        const VEC(BWD_HALF) v = select((VEC(BWD_HALF))(0.0f),                              \
                                       VLOAD(BWD_HALF, dy_row + base), col >= 0 && col < OW); \
        if ((((s) + DW_PW) & 1) == 0)                                                      \
            acc_even = MAC((VEC(BWD_HALF))BWD_W(r, s), v, acc_even);                      \
        else                                                                               \
            acc_odd = MAC((VEC(BWD_HALF))BWD_W(r, s), v, acc_odd);                        \
    }
// Window row r meets input row ih when (ih + ph - r) is a multiple of sh inside the output.
#define BWD_ROW(r, TAP)                                                     \
    {                                                                      \
        const int t = th - (r);                                            \
        const int2 q = DIVMOD_BY(max(t, 0), DW_SH);                        \
        if (t >= 0 && q.y == 0 && q.x < OH) {                              \
            const __global float* dy_row = dy_plane + q.x * OW;            \
            FOR_EACH_TAP(TAP, r)                                           \
        }                                                                  \
    }
#define BWD_WINDOW_VECTOR FOR_EACH_WINDOW_ROW(BWD_ROW, BWD_TAP_VECTOR)
#define BWD_WINDOW_STRIDE2                                                          \
    VEC(BWD_HALF) acc_even = (VEC(BWD_HALF))(0.0f), acc_odd = (VEC(BWD_HALF))(0.0f); \
    FOR_EACH_WINDOW_ROW(BWD_ROW, BWD_TAP_STRIDE2)                                   \
    {                                                                               \
        float even_[BWD_HALF], odd_[BWD_HALF], both_[DW_BWD_PB];                    \
        VSTORE(BWD_HALF, acc_even, even_);                                          \
        VSTORE(BWD_HALF, acc_odd, odd_);                                            \
        for (int k_ = 0; k_ < BWD_HALF; ++k_) {                                     \
            both_[2 * k_] = even_[k_];                                              \
            both_[2 * k_ + 1] = odd_[k_];                                           \
        }                                                                           \
        acc = VLOAD(DW_BWD_PB, both_);                                              \
    }
// Any stride: lane p meets tap s when iw0 + p + pw - s is a multiple of sw inside the output.
#define BWD_WINDOW_GATHER                                                                 \
    for (int r = 0; r < DW_R; ++r) {                                                      \
        const int t = th - r;                                                             \
        const int2 q = DIVMOD_BY(max(t, 0), DW_SH);                                       \
        if (t < 0 || q.y != 0 || q.x >= OH) continue;                                     \
        const __global float* dy_row = dy_plane + q.x * OW;                               \
        for (int s = 0; s < DW_S; ++s) {                                                  \
            float lanes_[DW_BWD_PB];                                                      \
            for (int p_ = 0; p_ < DW_BWD_PB; ++p_) {                                      \
                const int u = col0 + p_ - s;                                              \
                const int2 v = DIVMOD_BY(max(u, 0), DW_SW);                               \
                lanes_[p_] = (u >= 0 && v.y == 0 && v.x < OW) ? dy_row[v.x] : 0.0f;       \
            }                                                                             \
            acc = MAC((VEC(DW_BWD_PB))BWD_W(r, s), VLOAD(DW_BWD_PB, lanes_), acc);         \
        }                                                                                 \
    }
#define BWD_INPUT_ROWS(WINDOW)                                             \
    for (int ih = ih0; ih < ih_end; ++ih) {                                \
        const int th = ih + DW_PH;                                         \
        VEC(DW_BWD_PB) acc = (VEC(DW_BWD_PB))(0.0f);                       \
        WINDOW                                                             \
        __global float* dx_row = dx + (nc * H + ih) * W + iw0;             \
        if (whole) {                                                       \
            VSTORE(DW_BWD_PB, acc, dx_row);                                \
        } else {                                                           \
            STORE_FIRST(DW_BWD_PB, acc, dx_row, W - iw0);                  \
        }                                                                  \
    }

__kernel void depthwise_backward_data(__global const float* restrict dy,
                                      __global const float* restrict w,
                                      __global float* restrict dx, const int N, const int C,
                                      const int H, const int W, const int OH, const int OW) {
    const int iw0 = get_global_id(0) * DW_BWD_PB;
    const int ih0 = get_global_id(1) * DW_BWD_RB;
    const int nc = get_global_id(2);
    if (iw0 >= W || ih0 >= H || nc >= N * C) return;
    const int ih_end = min(ih0 + DW_BWD_RB, H);
    const int c = nc - (nc / C) * C;
    const int plane = nc * OH * OW;
    const __global float* dy_plane = dy + plane;
    const __global float* w_c = w + c * DW_R * DW_S;
    const IVEC(DW_BWD_PB) lanes = LANES(DW_BWD_PB);
    const bool whole = iw0 + DW_BWD_PB <= W;
    const int col0 = iw0 + DW_PW;  // lane p of tap s meets column (col0 + p - s) / sw

    // Vector loads may cross into the neighbouring rows of the plane, but never past the tensor.
    if (DW_SW == 1 && plane + col0 - (DW_S - 1) >= 0 &&
        plane + (OH - 1) * OW + col0 + DW_BWD_PB <= N * C * OH * OW) {
        BWD_INPUT_ROWS(BWD_WINDOW_VECTOR)
    }
#if DW_SW == 2 && DW_BWD_PB >= 2
    else if (plane + (col0 - DW_S) / 2 - 1 >= 0 &&
             plane + (OH - 1) * OW + (col0 + 1) / 2 + BWD_HALF <= N * C * OH * OW) {
        const IVEC(BWD_HALF) half_lanes = LANES(BWD_HALF);
        BWD_INPUT_ROWS(BWD_WINDOW_STRIDE2)
    }
#endif
    else {
        BWD_INPUT_ROWS(BWD_WINDOW_GATHER)
    }
}

// ================================================================================================
// Backward to the weights: dw[c, r, s] (+)= sum_{n, oh, ow} dy[n, c, oh, ow] x[n, c, oh*sh - ph + r,
// ow*sw - pw + s]. One work-group per channel and block of DW_BWW_RSB taps. Its work-items split
// the rows (n, oh) and the column blocks of DW_BWW_PB outputs: neighbouring items take
// neighbouring blocks of a row, and each item walks its block down many rows, so the block's
// edge masks are set up once. Each item keeps a vector sum per tap; the work-group then adds the
// items' sums in local memory in a fixed order.
// Global size: (ceil(R*S / DW_BWW_RSB) * DW_BWW_WG, C); local size (DW_BWW_WG, 1).

// One tap of one row: acc[j] += dv * (the input vector under tap j), when the tap's input row is
// inside the input. With strides 1 and 2 the input is one vector load whose lanes outside the
// input row or past the end of the output row are zeroed; in general every lane is loaded behind
// its own bounds check.
#define BWW_TAP_BEGIN(j)                                                          \
    {                                                                             \
        const int ih = ih0 + tap_row[j];                                          \
        if (ih >= 0 && ih < H) {                                                  \
            const __global float* x_row = x_plane + ih * W;                       \
            const int col0 = iw0 + tap_col[j];
#define BWW_TAP_END }}
#define BWW_TAP_VECTOR(unused, j)                                                   \
    BWW_TAP_BEGIN(j)                                                              \
    const IVEC(DW_BWW_PB) col = lanes * DW_SW + col0;                             \
    const VEC(DW_BWW_PB) v = STRIDED_LOAD(DW_BWW_PB, x_row + col0);               \
    acc[j] = MAC(dv, select((VEC(DW_BWW_PB))(0.0f), v, out_lane && col >= 0 && col < W), \
                 acc[j]);                                                         \
    BWW_TAP_END
#define BWW_TAP_GATHER(unused, j)                                                 \
    BWW_TAP_BEGIN(j)                                                              \
    float lanes_[DW_BWW_PB];                                                      \
    for (int p_ = 0; p_ < DW_BWW_PB; ++p_) {                                      \
        const int iw = col0 + p_ * DW_SW;                                         \
        lanes_[p_] = (iw >= 0 && iw < W && p_ < out_count) ? x_row[iw] : 0.0f;    \
    }                                                                             \
    acc[j] = MAC(dv, VLOAD(DW_BWW_PB, lanes_), acc[j]);                           \
    BWW_TAP_END
// Tap j of the work-group's block as (row, column) of the window; taps past R*S (the last block)
// repeat a valid tap and are never written.
#define BWW_INIT_TAP(unused, j)                                          \
    {                                                                    \
        const int2 r_s = divmod(min(rs0 + (j), DW_R * DW_S - 1), DW_S);  \
        tap_row[j] = r_s.x;                                              \
        tap_col[j] = r_s.y;                                              \
        acc[j] = (VEC(DW_BWW_PB))(0.0f);                                 \
    }
#define BWW_SAVE_TAP(unused, j) partial[(j) * DW_BWW_WG + lid] = HSUM(DW_BWW_PB, acc[j]);

// Input columns the vector loads of one block read per window row, from its first.
#define BWW_SPAN (STRIDED_READ(DW_BWW_PB) + DW_S - 1)

__kernel __attribute__((reqd_work_group_size(DW_BWW_WG, 1, 1)))
void depthwise_backward_weight(__global const float* restrict x, __global const float* restrict dy,
                               __global float* restrict dw, const int N, const int C, const int H,
                               const int W, const int OH, const int OW, const int accumulate) {
    __local float partial[DW_BWW_RSB * DW_BWW_WG];
    const int lid = get_local_id(0);
    const int rs0 = BWW_FIRST_TAP;
    const int c = get_group_id(1);
    const IVEC(DW_BWW_PB) lanes = LANES(DW_BWW_PB);

    int tap_row[DW_BWW_RSB], tap_col[DW_BWW_RSB];
    VEC(DW_BWW_PB) acc[DW_BWW_RSB];
    FOR_EACH_BWW_TAP(BWW_INIT_TAP, 0)

    // Item lid takes blocks first_block, first_block + block_step, ... of rows first_row,
    // first_row + row_step, ... (rows counted over n and oh together).
    const int blocks = (OW + DW_BWW_PB - 1) / DW_BWW_PB;
    int first_block = lid, block_step = DW_BWW_WG, first_row = 0, row_step = 1;
    if (blocks <= DW_BWW_WG) {
        const int2 row_block = divmod(lid, blocks);
        first_block = row_block.y;
        block_step = blocks;
        first_row = row_block.x;
        row_step = DW_BWW_WG / blocks;
        if (first_row >= row_step) first_row = N * OH;  // the items left over take no rows
    }
    // Rows advance by row_step as (n, oh) without a division.
    const int2 first_n_oh = divmod(first_row, OH);
    const int2 step_n_oh = divmod(row_step, OH);
    const int x_total = N * C * H * W;
    const int dy_total = N * C * OH * OW;

    for (int block = first_block; block < blocks; block += block_step) {
        const int ow0 = block * DW_BWW_PB;
        const int out_count = min(DW_BWW_PB, OW - ow0);  // lanes that are outputs
        const IVEC(DW_BWW_PB) out_lane = lanes < out_count;
        const int iw0 = ow0 * DW_SW - DW_PW;
        int n = first_n_oh.x, oh = first_n_oh.y;
        while (n < N) {
            const int ih0 = oh * DW_SH - DW_PH;
            const int plane = (n * C + c) * H * W;
            const __global float* x_plane = x + plane;
            const int dy_at = ((n * C + c) * OH + oh) * OW + ow0;
            const __global float* dy_row = dy + dy_at;
            VEC(DW_BWW_PB) dv;
            if (out_count == DW_BWW_PB) {
                dv = VLOAD(DW_BWW_PB, dy_row);
            } else if (dy_at + DW_BWW_PB <= dy_total) {
                dv = select((VEC(DW_BWW_PB))(0.0f), VLOAD(DW_BWW_PB, dy_row), out_lane);
            } else {
                float dy_lanes[DW_BWW_PB];
                for (int p = 0; p < DW_BWW_PB; ++p) dy_lanes[p] = p < out_count ? dy_row[p] : 0.0f;
                dv = VLOAD(DW_BWW_PB, dy_lanes);
            }
#if STRIDED_VECTORS
            // Vector loads may cross into the neighbouring rows of the plane, never past the
            // tensor.
            if (plane + iw0 >= 0 && plane + (H - 1) * W + iw0 + BWW_SPAN <= x_total) {
                FOR_EACH_BWW_TAP(BWW_TAP_VECTOR, 0)
            } else
#endif
            {
                FOR_EACH_BWW_TAP(BWW_TAP_GATHER, 0)
            }
            oh += step_n_oh.y;
            n += step_n_oh.x;
            if (oh >= OH) {
                oh -= OH;
                n += 1;
            }
        }
    }

    FOR_EACH_BWW_TAP(BWW_SAVE_TAP, 0)
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = DW_BWW_WG / 2; span > 0; span >>= 1) {
        if (lid < span) {
            for (int j = 0; j < DW_BWW_RSB; ++j)
                partial[j * DW_BWW_WG + lid] += partial[j * DW_BWW_WG + lid + span];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int j = lid; j < DW_BWW_RSB; j += DW_BWW_WG) {
        if (rs0 + j < DW_R * DW_S) {
            const int i = c * DW_R * DW_S + rs0 + j;
            const float v = partial[j * DW_BWW_WG];
            dw[i] = accumulate ? dw[i] + v : v;
        }
    }
}
