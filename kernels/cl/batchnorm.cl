// Batch normalization over (N, C, HW) tensors: per-channel statistics over the N*HW values of a
// channel. One work-group owns one channel, so every reduction runs in a fixed order inside the
// group (private vector sums, then a local tree) and the results do not depend on scheduling.
//
// A channel is N runs of HW contiguous values. Work-items read them as vectors of BN_VW values
// ("slots": run n, vector v), so a CPU driver issues SIMD loads and a GPU 16-byte ones; the last
// vector of a run may be partial and its extra lanes are zeroed. Vector loads never reach past the
// end of the tensor: a partial vector at its very end is read lane by lane.
//
// Defines: BN_GROUP (work-group size, a power of two), BN_VW (vector width: 1, 2, 4, 8 or 16),
// BN_CONTIGUOUS (1: each item takes one contiguous range of slots, which suits a CPU that runs
// the items one after the other; 0: items interleave slot by slot, which suits a GPU's coalescing).
// Backward defines: WITH_DX, WITH_DGAMMA, WITH_DBETA (0 or 1) select which gradients are written.

#ifndef BN_GROUP
#define BN_GROUP 128
#endif
#ifndef BN_VW
#define BN_VW 4
#endif
#ifndef BN_CONTIGUOUS
#define BN_CONTIGUOUS 0
#endif
#ifndef WITH_DX
#define WITH_DX 1
#endif
#ifndef WITH_DGAMMA
#define WITH_DGAMMA 1
#endif
#ifndef WITH_DBETA
#define WITH_DBETA 1
#endif

#define BN_CAT(a, b) a##b
#define BN_XCAT(a, b) BN_CAT(a, b)

typedef float float1;
typedef int int1;
#define VECF BN_XCAT(float, BN_VW)
#define VECI BN_XCAT(int, BN_VW)

#if BN_VW == 1
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#define LANES 0
#define HSUM(v) (v)
#elif BN_VW == 2
#define VLOAD(p) vload2(0, p)
#define VSTORE(v, p) vstore2(v, 0, p)
#define LANES (int2)(0, 1)
#define HSUM(v) dot(v, (float2)(1.0f))
#elif BN_VW == 4
#define VLOAD(p) vload4(0, p)
#define VSTORE(v, p) vstore4(v, 0, p)
#define LANES (int4)(0, 1, 2, 3)
#define HSUM(v) dot(v, (float4)(1.0f))
#elif BN_VW == 8
#define VLOAD(p) vload8(0, p)
#define VSTORE(v, p) vstore8(v, 0, p)
#define LANES (int8)(0, 1, 2, 3, 4, 5, 6, 7)
#define HSUM(v) (dot((v).lo, (float4)(1.0f)) + dot((v).hi, (float4)(1.0f)))
#elif BN_VW == 16
#define VLOAD(p) vload16(0, p)
#define VSTORE(v, p) vstore16(v, 0, p)
#define LANES (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define HSUM(v) hsum16(v)
// oclgrind loses track of the halves of a float16; private memory keeps it exact.
inline float hsum16(const float16 v) {
    float lanes[16];
    vstore16(v, 0, lanes);
    const float8 h = vload8(0, lanes) + vload8(1, lanes);
    return dot(h.lo, (float4)(1.0f)) + dot(h.hi, (float4)(1.0f));
}
#else
#error "BN_VW must be 1, 2, 4, 8 or 16"
#endif

#if BN_GROUP & (BN_GROUP - 1)
#error "BN_GROUP must be a power of two"
#endif

// (x / y, x % y) for x >= 0, y > 0, without `%` (oclgrind cannot follow the `freeze` LLVM puts
// between a division and a remainder of the same operands).
inline int2 divmod(const int x, const int y) {
    const int q = x / y;
    return (int2)(q, mad_sat(-q, y, x));
}

// Sum of the work-group's values; every work-item gets the total. Leaves `scratch` free to reuse.
inline float group_sum(float value, __local float* scratch) {
    const int lid = get_local_id(0);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = BN_GROUP / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

#if BN_CONTIGUOUS
// BODY(at, valid) for this work-item's slots: one contiguous range of slots (slot j is run
// j / vectors, vector j % vectors), walked run by run; whole vectors first, then the run's
// partial vector, if any.
#define FOR_EACH_SLOT(BODY)                                                                 \
    {                                                                                       \
        const int slots_ = n * vectors;                                                     \
        const int per_item_ = (slots_ + BN_GROUP - 1) / BN_GROUP;                           \
        const int first_ = min((int)get_local_id(0) * per_item_, slots_);                  \
        const int2 from_ = divmod(first_, vectors);                                         \
        const int2 to_ = divmod(min(first_ + per_item_, slots_), vectors);                  \
        for (int run_ = from_.x; run_ <= min(to_.x, n - 1); ++run_) {                       \
            const int base_ = (run_ * channels + c) * hw;                                   \
            const int begin_ = run_ == from_.x ? from_.y : 0;                               \
            const int end_ = run_ == to_.x ? to_.y : vectors;                               \
            for (int v_ = begin_; v_ < min(end_, whole_vectors); ++v_)                      \
                BODY(base_ + v_ * BN_VW, BN_VW)                                             \
            if (end_ > whole_vectors)                                                       \
                BODY(base_ + whole_vectors * BN_VW, hw - whole_vectors * BN_VW)             \
        }                                                                                   \
    }
#else
// The slots of this work-item: slot j is (run j / vectors, vector j % vectors) for j = lid,
// lid + BN_GROUP, ...; the walk keeps (run, vector) up to date without a division per slot.
typedef struct {
    int j, end, run, vec, step_run, step_vec;
} SlotWalk;

inline SlotWalk slot_walk(const int runs, const int vectors) {
    SlotWalk w;
    w.j = get_local_id(0);
    w.end = runs * vectors;
    const int2 first = divmod(w.j, vectors);
    const int2 step = divmod(BN_GROUP, vectors);
    w.run = first.x;
    w.vec = first.y;
    w.step_run = step.x;
    w.step_vec = step.y;
    return w;
}

inline void slot_next(SlotWalk* w, const int vectors) {
    w->j += BN_GROUP;
    w->run += w->step_run;
    w->vec += w->step_vec;
    if (w->vec >= vectors) {
        w->vec -= vectors;
        w->run += 1;
    }
}

// BODY(at, valid) for this work-item's slots.
#define FOR_EACH_SLOT(BODY)                                                                 \
    for (SlotWalk w_ = slot_walk(n, vectors); w_.j < w_.end; slot_next(&w_, vectors)) {     \
        BODY((w_.run * channels + c) * hw + w_.vec * BN_VW, min(BN_VW, hw - w_.vec * BN_VW)) \
    }
#endif

// The values of one slot starting at element `at`; lanes past the run (lane >= count) are zero.
// Reads only the slot's own elements.
inline VECF load_slot_exact(const __global float* src, const int at, const int count) {
    if (count == BN_VW) return VLOAD(src + at);
    float lanes[BN_VW];
    for (int p = 0; p < BN_VW; ++p) lanes[p] = p < count ? src[at + p] : 0.0f;
    return VLOAD(lanes);
}

// The same, with one vector load that may read (and discard) the next run's first elements, where
// they are inside the tensor. Only for tensors that no work-item of the launch writes.
inline VECF load_slot(const __global float* src, const int at, const int count, const int total) {
    if (count < BN_VW && at + BN_VW <= total)
        return select((VECF)(0.0f), VLOAD(src + at), LANES < count);
    return load_slot_exact(src, at, count);
}

inline void store_slot(__global float* dst, const int at, const int count, const VECF v) {
    if (count == BN_VW) {
        VSTORE(v, dst + at);
    } else {
        float lanes[BN_VW];
        VSTORE(v, lanes);
        for (int p = 0; p < count; ++p) dst[at + p] = lanes[p];
    }
}

// Batch statistics (mean, then the biased variance around it: two passes for accuracy), the
// normalized output, the saved mean/invstd and the running statistics (PyTorch semantics).
__kernel __attribute__((reqd_work_group_size(BN_GROUP, 1, 1)))
void batchnorm_forward_train(__global const float* x, __global const float* gamma,
                             __global const float* beta, __global float* y,
                             __global float* mean_out, __global float* invstd_out,
                             __global float* running_mean, __global float* running_var,
                             const int n, const int channels, const int hw,
                             const float momentum, const float eps) {
    __local float scratch[BN_GROUP];
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    const int count = n * hw;
    const int total = count * channels;
    const int vectors = (hw + BN_VW - 1) / BN_VW;
    const int whole_vectors = hw / BN_VW;

    VECF sum = 0.0f;
#define ADD_X(at, valid) sum += load_slot(x, at, valid, total);
    FOR_EACH_SLOT(ADD_X)
    const float mean = group_sum(HSUM(sum), scratch) / (float)count;

    VECF squares_v = 0.0f;
#define ADD_SQUARE(at, valid)                                                   \
    {                                                                           \
        const VECF d = load_slot(x, at, valid, total) - mean;                   \
        squares_v = mad(d, select((VECF)(0.0f), d, LANES < (valid)), squares_v); \
    }
    FOR_EACH_SLOT(ADD_SQUARE)
    const float squares = group_sum(HSUM(squares_v), scratch);
    const float var = squares / (float)count;
    const float invstd = rsqrt(var + eps);

    // (x - mean) * g rather than x * g - mean * g: no cancellation when |mean| >> std.
    const float g = gamma[c] * invstd;
    const float b = beta[c];
#define NORMALIZE(at, valid) \
    store_slot(y, at, valid, mad(load_slot(x, at, valid, total) - mean, (VECF)(g), (VECF)(b)));
    FOR_EACH_SLOT(NORMALIZE)
    if (lid == 0) {
        mean_out[c] = mean;
        invstd_out[c] = invstd;
        const float unbiased = squares / (float)(count - 1);
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
        running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
}

// Inference: normalize with the running statistics; one work-group per channel, like training.
// Each item reads only the slots it writes, so y may alias x.
__kernel __attribute__((reqd_work_group_size(BN_GROUP, 1, 1)))
void batchnorm_forward_eval(__global const float* x, __global const float* gamma,
                            __global const float* beta, __global float* y,
                            __global const float* running_mean,
                            __global const float* running_var,
                            const int n, const int channels, const int hw, const float eps) {
    const int c = get_group_id(0);
    const int vectors = (hw + BN_VW - 1) / BN_VW;
    const int whole_vectors = hw / BN_VW;
    const float g = gamma[c] * rsqrt(running_var[c] + eps);
    const float mean = running_mean[c];
    const float b = beta[c];
#define NORMALIZE_IN_PLACE(at, valid) \
    store_slot(y, at, valid, mad(load_slot_exact(x, at, valid) - mean, (VECF)(g), (VECF)(b)));
    FOR_EACH_SLOT(NORMALIZE_IN_PLACE)
}

// Gradients from the forward input x and the saved mean/invstd, xhat = (x - mean) * invstd:
//   dbeta = sum(dy), dgamma = sum(dy * xhat),
//   dx = gamma * invstd * (dy - dbeta / m - xhat * dgamma / m), m = n * hw.
// The sums are reduced inside the channel's work-group, which then writes dx for the channel.
__kernel __attribute__((reqd_work_group_size(BN_GROUP, 1, 1)))
void batchnorm_backward(__global const float* x, __global const float* dy,
                        __global const float* gamma, __global const float* mean_in,
                        __global const float* invstd_in, __global float* dx,
                        __global float* dgamma, __global float* dbeta,
                        const int n, const int channels, const int hw, const int accumulate) {
    __local float scratch[BN_GROUP];
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    const int count = n * hw;
    const int total = count * channels;
    const int vectors = (hw + BN_VW - 1) / BN_VW;
    const int whole_vectors = hw / BN_VW;
    const float mean = mean_in[c];
    const float invstd = invstd_in[c];

    VECF sum_dy_v = 0.0f;
    VECF sum_dy_xc_v = 0.0f;
#define ADD_GRADIENTS(at, valid)                                                \
    {                                                                           \
        const VECF g = load_slot(dy, at, valid, total); /* zero past the run */ \
        sum_dy_v += g;                                                          \
        sum_dy_xc_v = mad(g, load_slot(x, at, valid, total) - mean, sum_dy_xc_v); \
    }
    FOR_EACH_SLOT(ADD_GRADIENTS)
    const float sum_dy = group_sum(HSUM(sum_dy_v), scratch);
    const float sum_dy_xhat = group_sum(HSUM(sum_dy_xc_v), scratch) * invstd;

    if (lid == 0) {
#if WITH_DGAMMA
        dgamma[c] = (accumulate ? dgamma[c] : 0.0f) + sum_dy_xhat;
#endif
#if WITH_DBETA
        dbeta[c] = (accumulate ? dbeta[c] : 0.0f) + sum_dy;
#endif
    }
#if WITH_DX
    const float scale = gamma[c] * invstd;
    const float mean_dy = sum_dy / (float)count;
    const float mean_dy_xhat = sum_dy_xhat / (float)count;
#define INPUT_GRADIENT(at, valid)                                                \
    {                                                                            \
        const VECF xhat = (load_slot(x, at, valid, total) - mean) * invstd;      \
        const VECF g = load_slot(dy, at, valid, total);                          \
        store_slot(dx, at, valid, scale * (g - mean_dy - xhat * mean_dy_xhat));  \
    }
    FOR_EACH_SLOT(INPUT_GRADIENT)
#endif
}

// Backward of the affine forward with frozen (running) statistics, the TinyTL transfer case:
// y = gamma * xhat + beta with xhat = (x - running_mean) * invstd, invstd = rsqrt(running_var + eps):
//   dx = dy * gamma * invstd, dbeta = sum(dy), dgamma = sum(dy * xhat).
// Only dgamma reads the forward input x (WITH_DGAMMA); without it x may be anything. dx may alias
// dy: the sums are complete (group barriers) before any item writes, and each item then reads
// only the elements it writes.
__kernel __attribute__((reqd_work_group_size(BN_GROUP, 1, 1)))
void batchnorm_backward_frozen(__global const float* x, __global const float* dy,
                               __global const float* gamma,
                               __global const float* running_mean,
                               __global const float* running_var, __global float* dx,
                               __global float* dgamma, __global float* dbeta,
                               const int n, const int channels, const int hw, const float eps,
                               const int accumulate) {
    __local float scratch[BN_GROUP];
    const int c = get_group_id(0);
    const int lid = get_local_id(0);
    const int total = n * hw * channels;
    const int vectors = (hw + BN_VW - 1) / BN_VW;
    const int whole_vectors = hw / BN_VW;
    const float invstd = rsqrt(running_var[c] + eps);
#if WITH_DGAMMA || WITH_DBETA
    const float mean = running_mean[c];
    VECF sum_dy_v = 0.0f;
#if WITH_DGAMMA
    VECF sum_dy_xc_v = 0.0f;
#define ADD_FROZEN(at, valid)                                                   \
    {                                                                           \
        const VECF g = load_slot_exact(dy, at, valid);                          \
        sum_dy_v += g;                                                          \
        sum_dy_xc_v = mad(g, load_slot_exact(x, at, valid) - mean, sum_dy_xc_v); \
    }
#else
#define ADD_FROZEN(at, valid) sum_dy_v += load_slot_exact(dy, at, valid);
#endif
    FOR_EACH_SLOT(ADD_FROZEN)
    const float sum_dy = group_sum(HSUM(sum_dy_v), scratch);
#if WITH_DGAMMA
    const float sum_dy_xhat = group_sum(HSUM(sum_dy_xc_v), scratch) * invstd;
    if (lid == 0) dgamma[c] = (accumulate ? dgamma[c] : 0.0f) + sum_dy_xhat;
#endif
#if WITH_DBETA
    if (lid == 0) dbeta[c] = (accumulate ? dbeta[c] : 0.0f) + sum_dy;
#endif
#endif
#if WITH_DX
    const VECF scale = (VECF)(gamma[c] * invstd);
#define SCALE_GRADIENT(at, valid) store_slot(dx, at, valid, load_slot_exact(dy, at, valid) * scale);
    FOR_EACH_SLOT(SCALE_GRADIENT)
#endif
}
