// Conv2d on NCHW tensors with weights (K, C, R, S), forward and backward, all as gathers: every
// work-item computes the outputs it owns, so no two work-items write the same element and the
// order of every float addition is fixed.
//
// Tuning defines (a tuner varies them; kernels/conv2d.py passes the defaults):
//   FWD_KB x FWD_PB     output channels x output pixels (along a row) per forward work-item
//   FWD_WG_P, FWD_WG_K  forward work-group shape (pixel blocks, channel blocks)
//   BWD_CB x BWD_PB     input channels x input pixels per backward-data work-item
//   BWD_WG_P, BWD_WG_C  backward-data work-group shape
//   BWW_KB x BWW_CB     weights (output channels x flattened (c, r, s)) per backward-weight group
//   BWW_WG              backward-weight work-group size
//   BIAS_WG             bias-gradient work-group size, a power of two

#ifndef FWD_KB
#define FWD_KB 4
#endif
#ifndef FWD_PB
#define FWD_PB 4
#endif
#ifndef FWD_WG_P
#define FWD_WG_P 16
#endif
#ifndef FWD_WG_K
#define FWD_WG_K 4
#endif
#ifndef BWD_CB
#define BWD_CB 4
#endif
#ifndef BWD_PB
#define BWD_PB 4
#endif
#ifndef BWD_WG_P
#define BWD_WG_P 16
#endif
#ifndef BWD_WG_C
#define BWD_WG_C 4
#endif
#ifndef BWW_KB
#define BWW_KB 4
#endif
#ifndef BWW_CB
#define BWW_CB 4
#endif
#ifndef BWW_WG
#define BWW_WG 64
#endif
#ifndef BIAS_WG
#define BIAS_WG 64
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

// A position (n, oh, ow) in an N x OH x OW grid, walked in row-major order by reduction loops
// without a division per step.
typedef struct {
    int n, oh, ow;
} Position;

inline Position position_of(const int idx, const int OH, const int OW) {
    const int2 row_col = divmod(idx, OW);
    const int2 n_row = divmod(row_col.x, OH);
    Position pos = {n_row.x, n_row.y, row_col.y};
    return pos;
}

// pos += step, where step = position_of(stride) (so step.oh < OH and step.ow < OW).
inline void advance(Position* pos, const Position step, const int OH, const int OW) {
    pos->ow += step.ow;
    pos->oh += step.oh;
    pos->n += step.n;
    if (pos->ow >= OW) {
        pos->ow -= OW;
        pos->oh += 1;
    }
    if (pos->oh >= OH) {
        pos->oh -= OH;
        pos->n += 1;
    }
}

// y[n, k, oh, ow] = act(b[k] + sum_{c, r, s} x[n, c, oh*sh - ph + r, ow*sw - pw + s] * w[k, c, r, s])
// Global size: (N * OH * ceil(OW / FWD_PB), ceil(K / FWD_KB)), both rounded up to the group shape.
__kernel __attribute__((reqd_work_group_size(FWD_WG_P, FWD_WG_K, 1)))
void conv2d_forward(__global const float* x, __global const float* w, __global const float* b,
                    __global float* y, const int N, const int C, const int H, const int W,
                    const int K, const int R, const int S, const int stride_h, const int stride_w,
                    const int pad_h, const int pad_w, const int OH, const int OW,
                    const int has_bias, const int activation) {
    const int ow_blocks = (OW + FWD_PB - 1) / FWD_PB;
    const int block = get_global_id(0);
    const int k0 = get_global_id(1) * FWD_KB;
    if (block >= N * OH * ow_blocks || k0 >= K) return;
    const int2 rest_owb = divmod(block, ow_blocks);
    const int2 n_oh = divmod(rest_owb.x, OH);
    const int ow0 = rest_owb.y * FWD_PB;
    const int oh = n_oh.y;
    const int n = n_oh.x;
    const int ih0 = oh * stride_h - pad_h;
    const int iw0 = ow0 * stride_w - pad_w;
    const int r_begin = max(0, -ih0);
    const int r_end = min(R, H - ih0);

    // Channels past K (the last block) read channel K-1 and are never written.
    int w_base[FWD_KB];
    for (int kk = 0; kk < FWD_KB; ++kk) w_base[kk] = min(k0 + kk, K - 1) * C * R * S;

    float acc[FWD_KB][FWD_PB];
    for (int kk = 0; kk < FWD_KB; ++kk)
        for (int p = 0; p < FWD_PB; ++p) acc[kk][p] = 0.0f;

    for (int c = 0; c < C; ++c) {
        const __global float* x_plane = x + (n * C + c) * H * W;
        for (int r = r_begin; r < r_end; ++r) {
            const __global float* x_row = x_plane + (ih0 + r) * W;
            const int w_off = (c * R + r) * S;
            for (int s = 0; s < S; ++s) {
                float xv[FWD_PB];
                for (int p = 0; p < FWD_PB; ++p) {
                    const int iw = iw0 + p * stride_w + s;
                    xv[p] = (iw >= 0 && iw < W) ? x_row[iw] : 0.0f;
                }
                for (int kk = 0; kk < FWD_KB; ++kk) {
                    const float wv = w[w_base[kk] + w_off + s];
                    for (int p = 0; p < FWD_PB; ++p) acc[kk][p] += wv * xv[p];
                }
            }
        }
    }

    for (int kk = 0; kk < FWD_KB; ++kk) {
        const int k = k0 + kk;
        if (k >= K) break;
        const float bias = has_bias ? b[k] : 0.0f;
        __global float* y_row = y + ((n * K + k) * OH + oh) * OW;
        for (int p = 0; p < FWD_PB; ++p) {
            if (ow0 + p < OW) y_row[ow0 + p] = apply_activation(acc[kk][p] + bias, activation);
        }
    }
}

// dx[n, c, ih, iw] = sum_{k, r, s} dy[n, k, oh, ow] * w[k, c, r, s] over the (oh, ow) with
// oh*sh - ph + r == ih and ow*sw - pw + s == iw: the transposed convolution, gathered per input pixel.
// Global size: (N * H * ceil(W / BWD_PB), ceil(C / BWD_CB)), rounded up to the group shape.
__kernel __attribute__((reqd_work_group_size(BWD_WG_P, BWD_WG_C, 1)))
void conv2d_backward_data(__global const float* dy, __global const float* w, __global float* dx,
                          const int N, const int C, const int H, const int W, const int K,
                          const int R, const int S, const int stride_h, const int stride_w,
                          const int pad_h, const int pad_w, const int OH, const int OW) {
    const int iw_blocks = (W + BWD_PB - 1) / BWD_PB;
    const int block = get_global_id(0);
    const int c0 = get_global_id(1) * BWD_CB;
    if (block >= N * H * iw_blocks || c0 >= C) return;
    const int2 rest_iwb = divmod(block, iw_blocks);
    const int2 n_ih = divmod(rest_iwb.x, H);
    const int iw0 = rest_iwb.y * BWD_PB;
    const int ih = n_ih.y;
    const int n = n_ih.x;

    // Kernel rows r with (ih + ph - r) a multiple of sh and 0 <= (ih + ph - r) / sh < OH.
    const int th = ih + pad_h;
    int r_first = th - (OH - 1) * stride_h;
    if (r_first < 0) r_first = divmod(th, stride_h).y;
    const int r_last = min(R - 1, th);

    // Pixel p meets kernel column s where iw0 + p + pw - s == ow * sw: write iw0 + p + pw as
    // col_q[p] * sw + col_phase[p] and s as s_q * sw + s_phase; then s must have the pixel's phase
    // and ow = col_q[p] - s_q.
    int col_q[BWD_PB], col_phase[BWD_PB];
    for (int p = 0; p < BWD_PB; ++p) {
        const int2 qr = divmod(iw0 + p + pad_w, stride_w);
        col_q[p] = qr.x;
        col_phase[p] = qr.y;
    }

    int w_chan[BWD_CB];
    for (int cc = 0; cc < BWD_CB; ++cc) w_chan[cc] = min(c0 + cc, C - 1) * R * S;

    float acc[BWD_CB][BWD_PB];
    for (int cc = 0; cc < BWD_CB; ++cc)
        for (int p = 0; p < BWD_PB; ++p) acc[cc][p] = 0.0f;

    for (int k = 0; k < K; ++k) {
        const __global float* dy_plane = dy + (n * K + k) * OH * OW;
        const int w_k = k * C * R * S;
        for (int r = r_first; r <= r_last; r += stride_h) {
            const __global float* dy_row = dy_plane + ((th - r) / stride_h) * OW;
            int s_q = 0, s_phase = 0;
            for (int s = 0; s < S; ++s) {
                float dv[BWD_PB];
                for (int p = 0; p < BWD_PB; ++p) {
                    const int ow = col_q[p] - s_q;
                    const bool hit = s_phase == col_phase[p] && ow >= 0 && ow < OW;
                    dv[p] = hit ? dy_row[ow] : 0.0f;
                }
                for (int cc = 0; cc < BWD_CB; ++cc) {
                    const float wv = w[w_k + w_chan[cc] + r * S + s];
                    for (int p = 0; p < BWD_PB; ++p) acc[cc][p] += wv * dv[p];
                }
                if (++s_phase == stride_w) {
                    s_phase = 0;
                    ++s_q;
                }
            }
        }
    }

    for (int cc = 0; cc < BWD_CB; ++cc) {
        const int c = c0 + cc;
        if (c >= C) break;
        __global float* dx_row = dx + ((n * C + c) * H + ih) * W;
        for (int p = 0; p < BWD_PB; ++p) {
            if (iw0 + p < W) dx_row[iw0 + p] = acc[cc][p];
        }
    }
}

// dw[k, c, r, s] (+)= sum_{n, oh, ow} dy[n, k, oh, ow] * x[n, c, oh*sh - ph + r, ow*sw - pw + s]
// One work-group per block of BWW_KB output channels x BWW_CB flattened (c, r, s) weights: its
// work-items split the N * OH * OW positions, then add their partial sums in local memory in a
// fixed order.
// Global size: (ceil(C*R*S / BWW_CB) * BWW_WG, ceil(K / BWW_KB)); local size (BWW_WG, 1).
__kernel __attribute__((reqd_work_group_size(BWW_WG, 1, 1)))
void conv2d_backward_weight(__global const float* x, __global const float* dy, __global float* dw,
                            const int N, const int C, const int H, const int W, const int K,
                            const int R, const int S, const int stride_h, const int stride_w,
                            const int pad_h, const int pad_w, const int OH, const int OW,
                            const int accumulate) {
    __local float partial[BWW_KB * BWW_CB * BWW_WG];
    const int lid = get_local_id(0);
    const int crs0 = get_group_id(0) * BWW_CB;
    const int k0 = get_group_id(1) * BWW_KB;
    const int CRS = C * R * S;
    const int P = OH * OW;

    // Weights past the tensor (the last blocks) read valid elements and are never written.
    int x_chan[BWW_CB], dr[BWW_CB], ds[BWW_CB];
    for (int j = 0; j < BWW_CB; ++j) {
        const int2 cr_s = divmod(min(crs0 + j, CRS - 1), S);
        const int2 c_r = divmod(cr_s.x, R);
        x_chan[j] = c_r.x * H * W;
        dr[j] = c_r.y - pad_h;
        ds[j] = cr_s.y - pad_w;
    }
    int dy_chan[BWW_KB];
    for (int kk = 0; kk < BWW_KB; ++kk) dy_chan[kk] = min(k0 + kk, K - 1) * P;

    float acc[BWW_KB][BWW_CB];
    for (int kk = 0; kk < BWW_KB; ++kk)
        for (int j = 0; j < BWW_CB; ++j) acc[kk][j] = 0.0f;

    const Position step = position_of(BWW_WG, OH, OW);
    for (Position pos = position_of(lid, OH, OW); pos.n < N; advance(&pos, step, OH, OW)) {
        const int pq = pos.oh * OW + pos.ow;
        float dv[BWW_KB];
        for (int kk = 0; kk < BWW_KB; ++kk) dv[kk] = dy[pos.n * K * P + dy_chan[kk] + pq];
        const __global float* x_n = x + pos.n * C * H * W;
        for (int j = 0; j < BWW_CB; ++j) {
            const int ih = pos.oh * stride_h + dr[j];
            const int iw = pos.ow * stride_w + ds[j];
            const float xv = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? x_n[x_chan[j] + ih * W + iw]
                                                                       : 0.0f;
            for (int kk = 0; kk < BWW_KB; ++kk) acc[kk][j] += dv[kk] * xv;
        }
    }

    // Work-item e adds weight e's BWW_WG partial sums in order. With BWW_KB * BWW_CB <= BWW_WG
    // weights that is BWW_WG adds on the critical path, against BWW_KB * BWW_CB * log2(BWW_WG)
    // for a tree over all of them, and one barrier instead of log2(BWW_WG).
    const int count = BWW_KB * BWW_CB;
    for (int kk = 0; kk < BWW_KB; ++kk)
        for (int j = 0; j < BWW_CB; ++j) partial[lid * count + kk * BWW_CB + j] = acc[kk][j];
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int e = lid; e < count; e += BWW_WG) {
        const int2 kk_j = divmod(e, BWW_CB);
        const int k = k0 + kk_j.x;
        const int crs = crs0 + kk_j.y;
        if (k < K && crs < CRS) {
            float v = 0.0f;
            for (int item = 0; item < BWW_WG; ++item) v += partial[item * count + e];
            const int i = k * CRS + crs;
            dw[i] = accumulate ? dw[i] + v : v;
        }
    }
}

// db[k] (+)= sum_{n, p} dy[n, k, p] over the P spatial positions: one work-group per channel.
// Global size: (K * BIAS_WG); local size (BIAS_WG).
__kernel __attribute__((reqd_work_group_size(BIAS_WG, 1, 1)))
void channel_bias_backward(__global const float* dy, __global float* db, const int N, const int K,
                           const int P, const int accumulate) {
    __local float partial[BIAS_WG];
    const int lid = get_local_id(0);
    const int k = get_group_id(0);
    float acc = 0.0f;
    const Position step = position_of(BIAS_WG, 1, P);
    for (Position pos = position_of(lid, 1, P); pos.n < N; advance(&pos, step, 1, P)) {
        acc += dy[(pos.n * K + k) * P + pos.ow];
    }
    partial[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = BIAS_WG / 2; span > 0; span >>= 1) {  // a fixed-order tree
        if (lid < span) partial[lid] += partial[lid + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) db[k] = accumulate ? db[k] + partial[0] : partial[0];
}
