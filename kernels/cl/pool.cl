// Max, average and global average pooling on NCHW tensors, forward and backward, all as gathers.
// Max pooling: padding never wins, and a window's gradient goes to its first maximum in row-major
// order, recomputed from x by the backward so no index tensor is needed. Average pooling divides by
// the whole window R*S, zero padding included.
//
// Tuning defines (kernels/pool.py passes the defaults):
//   POOL_WG  group size of the windowed kernels
//   GAP_WG   global-average-pool forward group size (one group per (n, c) row), a power of two

#ifndef POOL_WG
#define POOL_WG 64
#endif
#ifndef GAP_WG
#define GAP_WG 64
#endif

// (x / y, x % y) for x >= 0, y > 0. The remainder comes from mad_sat (exact: nothing overflows)
// rather than `%`: LLVM pairs a division and a remainder of the same operands through a `freeze`
// instruction, which oclgrind's uninitialized-value checker cannot interpret.
inline int2 divmod(const int x, const int y) {
    const int q = x / y;
    return (int2)(q, mad_sat(-q, y, x));
}

// Window tap (r, s) of the first maximum, in row-major order, of the window at (ih0, iw0).
inline int2 first_max_tap(const __global float* plane, const int H, const int W, const int R,
                         const int S, const int ih0, const int iw0) {
    const int r_begin = max(0, -ih0), r_end = min(R, H - ih0);
    const int s_begin = max(0, -iw0), s_end = min(S, W - iw0);
    float best = -INFINITY;
    int2 best_tap = (int2)(r_begin, s_begin);
    for (int r = r_begin; r < r_end; ++r) {
        for (int s = s_begin; s < s_end; ++s) {
            const float v = plane[(ih0 + r) * W + iw0 + s];
            if (v > best) {
                best = v;
                best_tap = (int2)(r, s);
            }
        }
    }
    return best_tap;
}

// First and last output index whose window (start o*stride - pad, length R) covers input index i.
inline int2 covering_windows(const int i, const int pad, const int R, const int stride,
                             const int O) {
    const int lo_num = i + pad - R + 1;
    const int lo = lo_num <= 0 ? 0 : (lo_num + stride - 1) / stride;
    const int hi = min(O - 1, (i + pad) / stride);
    return (int2)(lo, hi);
}

// One output per work-item. Global size: N * C * OH * OW rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool_forward(__global const float* x, __global float* y, const int NC, const int H,
                     const int W, const int R, const int S, const int stride_h,
                     const int stride_w, const int pad_h, const int pad_w, const int OH,
                     const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * OH * OW) return;
    const int2 rest_ow = divmod(i, OW);
    const int2 nc_oh = divmod(rest_ow.x, OH);
    const int ow = rest_ow.y;
    const int oh = nc_oh.y;
    const int nc = nc_oh.x;
    const int ih0 = oh * stride_h - pad_h;
    const int iw0 = ow * stride_w - pad_w;
    const __global float* plane = x + nc * H * W;
    const int2 tap = first_max_tap(plane, H, W, R, S, ih0, iw0);
    y[i] = plane[(ih0 + tap.x) * W + iw0 + tap.y];
}

// One input element per work-item: the sum of dy over the windows whose first maximum it is.
// Global size: N * C * H * W rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void maxpool_backward(__global const float* x, __global const float* dy, __global float* dx,
                      const int NC, const int H, const int W, const int R, const int S,
                      const int stride_h, const int stride_w, const int pad_h, const int pad_w,
                      const int OH, const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * H * W) return;
    const int2 rest_iw = divmod(i, W);
    const int2 nc_ih = divmod(rest_iw.x, H);
    const int iw = rest_iw.y;
    const int ih = nc_ih.y;
    const int nc = nc_ih.x;
    const __global float* plane = x + nc * H * W;
    const __global float* dy_plane = dy + nc * OH * OW;
    const int2 rows = covering_windows(ih, pad_h, R, stride_h, OH);
    const int2 cols = covering_windows(iw, pad_w, S, stride_w, OW);
    float acc = 0.0f;
    for (int oh = rows.x; oh <= rows.y; ++oh) {
        const int ih0 = oh * stride_h - pad_h;
        for (int ow = cols.x; ow <= cols.y; ++ow) {
            const int iw0 = ow * stride_w - pad_w;
            const int2 tap = first_max_tap(plane, H, W, R, S, ih0, iw0);
            if (tap.x == ih - ih0 && tap.y == iw - iw0) acc += dy_plane[oh * OW + ow];
        }
    }
    dx[i] = acc;
}

// One output per work-item. Global size: N * C * OH * OW rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void avgpool_forward(__global const float* x, __global float* y, const int NC, const int H,
                     const int W, const int R, const int S, const int stride_h,
                     const int stride_w, const int pad_h, const int pad_w, const int OH,
                     const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * OH * OW) return;
    const int2 rest_ow = divmod(i, OW);
    const int2 nc_oh = divmod(rest_ow.x, OH);
    const int ow = rest_ow.y;
    const int oh = nc_oh.y;
    const int nc = nc_oh.x;
    const int ih0 = oh * stride_h - pad_h;
    const int iw0 = ow * stride_w - pad_w;
    const int r_begin = max(0, -ih0), r_end = min(R, H - ih0);
    const int s_begin = max(0, -iw0), s_end = min(S, W - iw0);
    const __global float* plane = x + nc * H * W;
    float acc = 0.0f;
    for (int r = r_begin; r < r_end; ++r)
        for (int s = s_begin; s < s_end; ++s) acc += plane[(ih0 + r) * W + iw0 + s];
    y[i] = acc / (float)(R * S);
}

// One input element per work-item: the sum of dy over the windows that cover it, over R*S.
// Global size: N * C * H * W rounded up to POOL_WG.
__kernel __attribute__((reqd_work_group_size(POOL_WG, 1, 1)))
void avgpool_backward(__global const float* dy, __global float* dx, const int NC, const int H,
                      const int W, const int R, const int S, const int stride_h,
                      const int stride_w, const int pad_h, const int pad_w, const int OH,
                      const int OW) {
    const int i = get_global_id(0);
    if (i >= NC * H * W) return;
    const int2 rest_iw = divmod(i, W);
    const int2 nc_ih = divmod(rest_iw.x, H);
    const int iw = rest_iw.y;
    const int ih = nc_ih.y;
    const int nc = nc_ih.x;
    const __global float* dy_plane = dy + nc * OH * OW;
    const int2 rows = covering_windows(ih, pad_h, R, stride_h, OH);
    const int2 cols = covering_windows(iw, pad_w, S, stride_w, OW);
    float acc = 0.0f;
    for (int oh = rows.x; oh <= rows.y; ++oh)
        for (int ow = cols.x; ow <= cols.y; ++ow) acc += dy_plane[oh * OW + ow];
    dx[i] = acc / (float)(R * S);
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
