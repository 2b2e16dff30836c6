// Inverted dropout with a counter-based hash: the mask is a pure function of (seed, step, index),
// so the backward recomputes it instead of storing it, and the host can reproduce it bit for bit.
//
//   key    = hash32(seed + 0x9E3779B9 * t)          t = step[0], the training-step counter
//   keep i = hash32(key ^ (i + index_offset)) >= threshold,   threshold = floor(p * 2^32)
//
// All arithmetic is uint32 with wrap-around. Kept values are scaled by 1 / (1 - p); drop_all is set
// for p == 1, whose threshold 2^32 does not fit 32 bits. Each work-item handles four consecutive
// elements with vector loads, and the tail of the tensor element by element.

#define DROPOUT_VEC 4

inline uint hash32(uint x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

inline float dropout_one(float v, uint index, uint key, uint index_offset, uint threshold,
                         int drop_all, float scale) {
    const bool keep = !drop_all && hash32(key ^ (index + index_offset)) >= threshold;
    return keep ? v * scale : 0.0f;
}

// out = mask * in * scale; the forward (x -> y) and the backward (dy -> dx) are the same map.
__kernel void dropout(__global const float* in, __global float* out, __global const int* step,
                      const int n, const uint seed, const uint index_offset, const uint threshold,
                      const int drop_all, const float scale) {
    const int first = get_global_id(0) * DROPOUT_VEC;
    if (first >= n) return;
    const uint key = hash32(seed + 0x9E3779B9U * (uint)step[0]);
    if (first + DROPOUT_VEC <= n) {
        const float4 v = vload4(0, in + first);
        const uint i = (uint)first;
        const float4 r = (float4)(
            dropout_one(v.s0, i, key, index_offset, threshold, drop_all, scale),
            dropout_one(v.s1, i + 1, key, index_offset, threshold, drop_all, scale),
            dropout_one(v.s2, i + 2, key, index_offset, threshold, drop_all, scale),
            dropout_one(v.s3, i + 3, key, index_offset, threshold, drop_all, scale));
        vstore4(r, 0, out + first);
    } else {
        for (int i = first; i < n; ++i)
            out[i] = dropout_one(in[i], (uint)i, key, index_offset, threshold, drop_all, scale);
    }
}
