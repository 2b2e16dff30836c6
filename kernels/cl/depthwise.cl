// Depthwise Conv2d (channel multiplier 1) on NCHW tensors with weights (C, 1, R, S), forward and
// backward, all as gathers: every work-item computes the outputs it owns. The bias gradient is
// conv2d.cl's channel_bias_backward.
//
// Tuning defines (kernels/depthwise.py passes the defaults):
//   DW_FWD_PB, DW_FWD_WG  output pixels (along a row) per forward work-item; forward group size
//   DW_BWD_PB, DW_BWD_WG  input pixels per backward-data work-item; its group size
//   DW_BWW_RSB            kernel taps per backward-weight work-group
//   DW_BWW_WG             backward-weight work-group size, a power of two

#ifndef DW_FWD_PB
#define DW_FWD_PB 4
#endif
#ifndef DW_FWD_WG
#define DW_FWD_WG 64
#endif
#ifndef DW_BWD_PB
#define DW_BWD_PB 4
#endif
#ifndef DW_BWD_WG
#define DW_BWD_WG 64
#endif
#ifndef DW_BWW_RSB
#define DW_BWW_RSB 9
#endif
#ifndef DW_BWW_WG
#define DW_BWW_WG 64
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

// y[n, c, oh, ow] = act(b[c] + sum_{r, s} x[n, c, oh*sh - ph + r, ow*sw - pw + s] * w[c, r, s])
// Global size: N * C * OH * ceil(OW / DW_FWD_PB), rounded up to DW_FWD_WG.
__kernel __attribute__((reqd_work_group_size(DW_FWD_WG, 1, 1)))
void depthwise_forward(__global const float* x, __global const float* w, __global const float* b,
                       __global float* y, const int N, const int C, const int H, const int W,
                       const int R, const int S, const int stride_h, const int stride_w,
                       const int pad_h, const int pad_w, const int OH, const int OW,
                       const int has_bias, const int activation) {
    const int ow_blocks = (OW + DW_FWD_PB - 1) / DW_FWD_PB;
    const int block = get_global_id(0);
    if (block >= N * C * OH * ow_blocks) return;
    const int2 rest_owb = divmod(block, ow_blocks);
    const int2 nc_oh = divmod(rest_owb.x, OH);
    const int ow0 = rest_owb.y * DW_FWD_PB;
    const int oh = nc_oh.y;
    const int nc = nc_oh.x;
    const int c = divmod(nc, C).y;
    const int ih0 = oh * stride_h - pad_h;
    const int iw0 = ow0 * stride_w - pad_w;
    const int r_begin = max(0, -ih0);
    const int r_end = min(R, H - ih0);
    const __global float* x_plane = x + nc * H * W;
    const __global float* w_c = w + c * R * S;

    float acc[DW_FWD_PB];
    for (int p = 0; p < DW_FWD_PB; ++p) acc[p] = 0.0f;
    for (int r = r_begin; r < r_end; ++r) {
        const __global float* x_row = x_plane + (ih0 + r) * W;
        for (int s = 0; s < S; ++s) {
            const float wv = w_c[r * S + s];
            for (int p = 0; p < DW_FWD_PB; ++p) {
                const int iw = iw0 + p * stride_w + s;
                acc[p] += wv * ((iw >= 0 && iw < W) ? x_row[iw] : 0.0f);
            }
        }
    }

    const float bias = has_bias ? b[c] : 0.0f;
    __global float* y_row = y + (nc * OH + oh) * OW;
    for (int p = 0; p < DW_FWD_PB; ++p) {
        if (ow0 + p < OW) y_row[ow0 + p] = apply_activation(acc[p] + bias, activation);
    }
}

// dx[n, c, ih, iw] = sum_{r, s} dy[n, c, oh, ow] * w[c, r, s] over the (oh, ow) whose window
// holds (ih, iw). Global size: N * C * H * ceil(W / DW_BWD_PB), rounded up to DW_BWD_WG.
__kernel __attribute__((reqd_work_group_size(DW_BWD_WG, 1, 1)))
void depthwise_backward_data(__global const float* dy, __global const float* w,
                             __global float* dx, const int N, const int C, const int H,
                             const int W, const int R, const int S, const int stride_h,
                             const int stride_w, const int pad_h, const int pad_w, const int OH,
                             const int OW) {
    const int iw_blocks = (W + DW_BWD_PB - 1) / DW_BWD_PB;
    const int block = get_global_id(0);
    if (block >= N * C * H * iw_blocks) return;
    const int2 rest_iwb = divmod(block, iw_blocks);
    const int2 nc_ih = divmod(rest_iwb.x, H);
    const int iw0 = rest_iwb.y * DW_BWD_PB;
    const int ih = nc_ih.y;
    const int nc = nc_ih.x;
    const int c = divmod(nc, C).y;

    // Kernel rows r with (ih + ph - r) a multiple of sh and 0 <= (ih + ph - r) / sh < OH.
    const int th = ih + pad_h;
    int r_first = th - (OH - 1) * stride_h;
    if (r_first < 0) r_first = divmod(th, stride_h).y;

    // Pixel p meets kernel column s where iw0 + p + pw - s == ow * sw: write iw0 + p + pw as
    // col_q[p] * sw + col_phase[p] and s as s_q * sw + s_phase; then s must have the pixel's phase
    // and ow = col_q[p] - s_q.
    int col_q[DW_BWD_PB], col_phase[DW_BWD_PB];
    for (int p = 0; p < DW_BWD_PB; ++p) {
        const int2 qr = divmod(iw0 + p + pad_w, stride_w);
        col_q[p] = qr.x;
        col_phase[p] = qr.y;
    }
    const int r_last = min(R - 1, th);
    const __global float* dy_plane = dy + nc * OH * OW;
    const __global float* w_c = w + c * R * S;

    float acc[DW_BWD_PB];
    for (int p = 0; p < DW_BWD_PB; ++p) acc[p] = 0.0f;
    for (int r = r_first; r <= r_last; r += stride_h) {
        const __global float* dy_row = dy_plane + ((th - r) / stride_h) * OW;
        int s_q = 0, s_phase = 0;
        for (int s = 0; s < S; ++s) {
            const float wv = w_c[r * S + s];
            for (int p = 0; p < DW_BWD_PB; ++p) {
                const int ow = col_q[p] - s_q;
                const bool hit = s_phase == col_phase[p] && ow >= 0 && ow < OW;
                acc[p] += wv * (hit ? dy_row[ow] : 0.0f);
            }
            if (++s_phase == stride_w) {
                s_phase = 0;
                ++s_q;
            }
        }
    }

    __global float* dx_row = dx + (nc * H + ih) * W;
    for (int p = 0; p < DW_BWD_PB; ++p) {
        if (iw0 + p < W) dx_row[iw0 + p] = acc[p];
    }
}

// dw[c, r, s] (+)= sum_{n, oh, ow} dy[n, c, oh, ow] * x[n, c, oh*sh - ph + r, ow*sw - pw + s]
// One work-group per channel and block of DW_BWW_RSB taps: its work-items split the N * OH * OW
// positions, then add their partial sums in local memory in a fixed order.
// Global size: (ceil(R*S / DW_BWW_RSB) * DW_BWW_WG, C); local size (DW_BWW_WG, 1).
__kernel __attribute__((reqd_work_group_size(DW_BWW_WG, 1, 1)))
void depthwise_backward_weight(__global const float* x, __global const float* dy,
                               __global float* dw, const int N, const int C, const int H,
                               const int W, const int R, const int S, const int stride_h,
                               const int stride_w, const int pad_h, const int pad_w, const int OH,
                               const int OW, const int accumulate) {
    __local float partial[DW_BWW_RSB * DW_BWW_WG];
    const int lid = get_local_id(0);
    const int rs0 = get_group_id(0) * DW_BWW_RSB;
    const int c = get_group_id(1);

    // Taps past R*S (the last block) read a valid tap and are never written.
    int dr[DW_BWW_RSB], ds[DW_BWW_RSB];
    for (int j = 0; j < DW_BWW_RSB; ++j) {
        const int2 r_s = divmod(min(rs0 + j, R * S - 1), S);
        dr[j] = r_s.x - pad_h;
        ds[j] = r_s.y - pad_w;
    }
    float acc[DW_BWW_RSB];
    for (int j = 0; j < DW_BWW_RSB; ++j) acc[j] = 0.0f;

    // (n, oh, ow) of the flat position lid, advanced by DW_BWW_WG per step without a division.
    const int2 step_row_ow = divmod(DW_BWW_WG, OW);
    const int2 step_n_oh = divmod(step_row_ow.x, OH);
    const int2 row_ow = divmod(lid, OW);
    const int2 n_oh = divmod(row_ow.x, OH);
    int n = n_oh.x, oh = n_oh.y, ow = row_ow.y;
    while (n < N) {
        const float dv = dy[((n * C + c) * OH + oh) * OW + ow];
        const __global float* x_plane = x + (n * C + c) * H * W;
        for (int j = 0; j < DW_BWW_RSB; ++j) {
            const int ih = oh * stride_h + dr[j];
            const int iw = ow * stride_w + ds[j];
            acc[j] += dv * ((ih >= 0 && ih < H && iw >= 0 && iw < W) ? x_plane[ih * W + iw] : 0.0f);
        }
        ow += step_row_ow.y;
        oh += step_n_oh.y;
        n += step_n_oh.x;
        if (ow >= OW) {
            ow -= OW;
            oh += 1;
        }
        if (oh >= OH) {
            oh -= OH;
            n += 1;
        }
    }

    for (int j = 0; j < DW_BWW_RSB; ++j) partial[j * DW_BWW_WG + lid] = acc[j];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = DW_BWW_WG / 2; span > 0; span >>= 1) {
        if (lid < span) {
            for (int j = 0; j < DW_BWW_RSB; ++j)
                partial[j * DW_BWW_WG + lid] += partial[j * DW_BWW_WG + lid + span];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int j = lid; j < DW_BWW_RSB; j += DW_BWW_WG) {
        if (rs0 + j < R * S) {
            const int i = c * R * S + rs0 + j;
            const float v = partial[j * DW_BWW_WG];
            dw[i] = accumulate ? dw[i] + v : v;
        }
    }
}
