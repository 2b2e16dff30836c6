// im2col and col2im on NCHW tensors, and the per-channel bias and activation that follow a GEMM:
// the pieces that let Conv2d run as a batched matrix product.
//
//   col[n, (c*R + r)*S + s, oh*OW + ow] = x[n, c, oh*sh - ph + r, ow*sw - pw + s]  (0 in the padding)
//
// Each work-item owns a small block of its output: a few rows (or planes) times a run of
// consecutive columns. Work-items are numbered with the columns fastest, so with runs of 1 (the GPU
// defaults) neighbouring work-items write neighbouring addresses and every step of a work-group is
// one coalesced access; with longer runs (the CPU defaults) each work-item copies contiguous
// stretches in a loop the compiler vectorises, and the index arithmetic (divisions) is paid once
// per block rather than once per element.
//
// The window geometry is fixed at build time (one program per geometry, as for the depthwise
// kernels), so the loops over a window have constant bounds and steps and the index arithmetic
// divides by constants:
//   IM_R, IM_S          window height and width
//   IM_SH, IM_SW        strides
//   IM_PH, IM_PW        zero padding
// im2col splits each run of columns into the stretch whose inputs lie inside the row, copied
// without per-element checks (a plain copy with stride 1), and the zeros on either side.
//
// Tuning defines (a tuner varies them; kernels/im2col.py passes defaults chosen by device type):
//   IM2COL_WG, IM2COL_ROWS, IM2COL_RUN    im2col work-group size; col rows x columns of one output
//                                         row (fixed oh) per work-item
//   COL2IM_WG, COL2IM_PLANES              col2im work-group size; (n, c) planes per work-item
//   BIAS_ACT_WG, BIAS_ACT_PLANES, BIAS_ACT_RUN
//                                         bias + activation work-group size; planes x run of
//                                         positions per work-item

#ifndef IM_R
#define IM_R 3
#endif
#ifndef IM_S
#define IM_S 3
#endif
#ifndef IM_SH
#define IM_SH 1
#endif
#ifndef IM_SW
#define IM_SW 1
#endif
#ifndef IM_PH
#define IM_PH 0
#endif
#ifndef IM_PW
#define IM_PW 0
#endif
#ifndef IM2COL_WG
#define IM2COL_WG 64
#endif
#ifndef IM2COL_ROWS
#define IM2COL_ROWS 4
#endif
#ifndef IM2COL_RUN
#define IM2COL_RUN 1
#endif
#ifndef COL2IM_WG
#define COL2IM_WG 64
#endif
#ifndef COL2IM_PLANES
#define COL2IM_PLANES 4
#endif
#ifndef BIAS_ACT_WG
#define BIAS_ACT_WG 64
#endif
#ifndef BIAS_ACT_PLANES
#define BIAS_ACT_PLANES 4
#endif
#ifndef BIAS_ACT_RUN
#define BIAS_ACT_RUN 1
#endif

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_RELU6 2

inline float apply_activation(const float v, const int activation) {
    if (activation == ACT_RELU) return fmax(v, 0.0f);
    if (activation == ACT_RELU6) return fmin(fmax(v, 0.0f), 6.0f);
    return v;
}

// (x / y, x % y) for x >= 0, y > 0. The remainder comes from mad_sat (exact: nothing overflows)
// rather than `%`: LLVM pairs a division and a remainder of the same operands through a `freeze`
// instruction, which oclgrind's uninitialized-value checker cannot interpret.
inline int2 divmod(const int x, const int y) {
    const int q = x / y;
    return (int2)(q, mad_sat(-q, y, x));
}

// im2col. Work-item g, numbered (row block, oh, column run) with the run fastest, writes rows
// row0 .. row0 + IM2COL_ROWS - 1 (clipped to the N*C*R*S rows) of col at columns
// oh*OW + ow0 .. oh*OW + ow0 + IM2COL_RUN - 1 (clipped to the output row).
// Global size: ceil(rows / IM2COL_ROWS) * OH * ceil(OW / IM2COL_RUN), rounded up to IM2COL_WG.
__kernel __attribute__((reqd_work_group_size(IM2COL_WG, 1, 1)))
void im2col(__global const float* restrict x, __global float* restrict col, const int N,
            const int C, const int H, const int W, const int OH, const int OW) {
    const int P = OH * OW;
    const int rows = N * C * IM_R * IM_S;
    const int runs = (OW + IM2COL_RUN - 1) / IM2COL_RUN;
    const int2 rest_run = divmod(get_global_id(0), runs);
    const int2 block_oh = divmod(rest_run.x, OH);
    const int row0 = block_oh.x * IM2COL_ROWS;
    if (row0 >= rows) return;
    const int oh = block_oh.y;
    const int ow0 = rest_run.y * IM2COL_RUN;
    const int ow_end = min(OW, ow0 + IM2COL_RUN);
    const int row_end = min(rows - row0, IM2COL_ROWS);

    // Row (plane, r, s) with plane = n*C + c, stepped without divisions.
    const int2 q_s = divmod(row0, IM_S);
    const int2 plane_r = divmod(q_s.x, IM_R);
    int plane = plane_r.x, r = plane_r.y, s = q_s.y;

    __global float* out = col + row0 * P + oh * OW;
    for (int i = 0; i < row_end; ++i, out += P) {
        const int ih = oh * IM_SH - IM_PH + r;
        // Columns lo .. hi - 1 read inside the input row (ow*sw - pw + s in [0, W)); the rest of
        // the run is padding.
        int lo = ow_end, hi = ow_end;
        if (ih >= 0 && ih < H) {
            const int first = IM_PW - s <= 0 ? 0 : (IM_PW - s + IM_SW - 1) / IM_SW;
            const int last = W - 1 + IM_PW - s < 0 ? -1 : (W - 1 + IM_PW - s) / IM_SW;
            lo = clamp(first, ow0, ow_end);
            hi = clamp(last + 1, lo, ow_end);
            const __global float* in = x + (plane * H + ih) * W + s - IM_PW;
            for (int ow = lo; ow < hi; ++ow) out[ow] = in[ow * IM_SW];
        }
        for (int ow = ow0; ow < lo; ++ow) out[ow] = 0.0f;
        for (int ow = hi; ow < ow_end; ++ow) out[ow] = 0.0f;
        if (++s == IM_S) {
            s = 0;
            if (++r == IM_R) {
                r = 0;
                ++plane;
            }
        }
    }
}

// The window offsets that reach padded coordinate t along one axis, and the output positions they
// meet: offsets first, first + stride, ... (while < window and <= t), meeting out_first,
// out_first - 1, ... With t = q * stride + phase the offsets are those congruent to the phase, and
// the largest output position in range, min(q, OUT - 1), gives the first: (first, out_first).
inline int2 first_tap(const int t, const int stride, const int OUT) {
    const int out_first = min(t / stride, OUT - 1);
    return (int2)(t - out_first * stride, out_first);
}

// col2im, the adjoint of im2col, gathered: dx[plane, ih, iw] is the sum, in a fixed order, of the
// col elements of every (r, s, oh, ow) with oh*sh - ph + r == ih and ow*sw - pw + s == iw. No two
// work-items write the same element: no atomics, and a result independent of scheduling.
// Work-item g, numbered (plane block, ih, iw) with iw fastest, writes planes
// plane0 .. plane0 + COL2IM_PLANES - 1 (clipped to N*C) at (ih, iw); they share the window taps.
// Global size: ceil(N*C / COL2IM_PLANES) * H * W, rounded up to COL2IM_WG.
__kernel __attribute__((reqd_work_group_size(COL2IM_WG, 1, 1)))
void col2im(__global const float* restrict col, __global float* restrict dx, const int N,
            const int C, const int H, const int W, const int OH, const int OW) {
    const int planes = N * C;
    const int P = OH * OW;
    const int HW = H * W;
    const int2 block_pixel = divmod(get_global_id(0), HW);
    const int plane0 = block_pixel.x * COL2IM_PLANES;
    if (plane0 >= planes) return;
    const int2 ih_iw = divmod(block_pixel.y, W);
    const int th = ih_iw.x + IM_PH;
    const int tw = ih_iw.y + IM_PW;
    const int2 row_tap = first_tap(th, IM_SH, OH);
    const int2 col_tap = first_tap(tw, IM_SW, OW);
    const int r_end = min(IM_R, th + 1);
    const int s_end = min(IM_S, tw + 1);
    const int plane_end = min(planes - plane0, COL2IM_PLANES);

    const __global float* col_plane = col + plane0 * IM_R * IM_S * P;
    __global float* out = dx + plane0 * HW + block_pixel.y;
    for (int i = 0; i < plane_end; ++i, col_plane += IM_R * IM_S * P, out += HW) {
        float acc = 0.0f;
        for (int r = row_tap.x, oh = row_tap.y; r < r_end; r += IM_SH, --oh) {
            const __global float* col_r = col_plane + r * IM_S * P + oh * OW;
            for (int s = col_tap.x, ow = col_tap.y; s < s_end; s += IM_SW, --ow) {
                acc += col_r[s * P + ow];
            }
        }
        *out = acc;
    }
}

// y[n, c, p] = act(y[n, c, p] + b[c]) in place on (N, C, HW): the epilogue of a convolution run as
// a GEMM, whose bias runs along the rows (channels) rather than the GEMM's columns.
// Work-item g, numbered (plane block, run) with the run fastest, updates planes
// plane0 .. plane0 + BIAS_ACT_PLANES - 1 (clipped to N*C) at positions p0 .. p0 + BIAS_ACT_RUN - 1
// (clipped to HW).
// Global size: ceil(N*C / BIAS_ACT_PLANES) * ceil(HW / BIAS_ACT_RUN), rounded up to BIAS_ACT_WG.
__kernel __attribute__((reqd_work_group_size(BIAS_ACT_WG, 1, 1)))
void bias_activation(__global float* y, __global const float* b, const int N, const int C,
                     const int HW, const int has_bias, const int activation) {
    const int planes = N * C;
    const int runs = (HW + BIAS_ACT_RUN - 1) / BIAS_ACT_RUN;
    const int2 block_run = divmod(get_global_id(0), runs);
    const int plane0 = block_run.x * BIAS_ACT_PLANES;
    if (plane0 >= planes) return;
    const int p0 = block_run.y * BIAS_ACT_RUN;
    const int p_end = min(HW, p0 + BIAS_ACT_RUN);
    const int plane_end = min(planes - plane0, BIAS_ACT_PLANES);
    int c = divmod(plane0, C).y;
    __global float* row = y + plane0 * HW;
    for (int i = 0; i < plane_end; ++i, row += HW) {
        const float bias = has_bias ? b[c] : 0.0f;
        for (int p = p0; p < p_end; ++p) row[p] = apply_activation(row[p] + bias, activation);
        if (++c == C) c = 0;
    }
}
