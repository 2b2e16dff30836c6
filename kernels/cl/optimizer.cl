// In-place optimizer updates with PyTorch semantics, and the device's training-step counter.
//
// The learning rate is argument 0 of every update kernel, so a schedule can change it on launches
// that are already bound. Adam reads the step number t from the device counter and computes its
// bias corrections there, so nothing goes up per step. Each work-item updates four consecutive
// elements with vector loads; the last, partial group is loaded and stored element by element.

#define OPT_VEC 4

inline float4 load4(__global const float* p, const int first, const int n) {
    if (first + OPT_VEC <= n) return vload4(0, p + first);
    float4 v = (float4)(0.0f);
    v.s0 = p[first];
    if (first + 1 < n) v.s1 = p[first + 1];
    if (first + 2 < n) v.s2 = p[first + 2];
    return v;
}

inline void store4(const float4 v, __global float* p, const int first, const int n) {
    if (first + OPT_VEC <= n) {
        vstore4(v, 0, p + first);
        return;
    }
    p[first] = v.s0;
    if (first + 1 < n) p[first + 1] = v.s1;
    if (first + 2 < n) p[first + 2] = v.s2;
}

// param -= lr * (grad + weight_decay * param)
__kernel void sgd_plain(const float lr, __global float* param, __global const float* grad,
                        const int n, const float weight_decay) {
    const int first = get_global_id(0) * OPT_VEC;
    if (first >= n) return;
    const float4 p = load4(param, first, n);
    const float4 g = load4(grad, first, n) + weight_decay * p;
    store4(p - lr * g, param, first, n);
}

// g = grad + wd * param; v = momentum * v + g; d = nesterov ? g + momentum * v : v; param -= lr * d
__kernel void sgd_momentum(const float lr, __global float* param, __global const float* grad,
                           __global float* velocity, const int n, const float momentum,
                           const float weight_decay, const int nesterov) {
    const int first = get_global_id(0) * OPT_VEC;
    if (first >= n) return;
    const float4 p = load4(param, first, n);
    const float4 g = load4(grad, first, n) + weight_decay * p;
    const float4 v = momentum * load4(velocity, first, n) + g;
    const float4 d = nesterov ? g + momentum * v : v;
    store4(v, velocity, first, n);
    store4(p - lr * d, param, first, n);
}

// PyTorch Adam with L2 weight decay added to the gradient. The host passes 1 - beta and log(beta)
// computed in double precision; 1 - beta^t = -expm1(t * log(beta)) stays accurate for small t.
__kernel void adam_update(const float lr, __global float* param, __global const float* grad,
                          __global float* m, __global float* v, __global const int* step,
                          const int n, const float beta1, const float one_minus_beta1,
                          const float log_beta1, const float beta2, const float one_minus_beta2,
                          const float log_beta2, const float eps, const float weight_decay) {
    const int first = get_global_id(0) * OPT_VEC;
    if (first >= n) return;
    const float t = (float)step[0];
    const float correction1 = -expm1(t * log_beta1);
    const float correction2 = -expm1(t * log_beta2);
    const float step_size = lr / correction1;
    const float inv_sqrt_correction2 = rsqrt(correction2);

    const float4 p = load4(param, first, n);
    const float4 g = load4(grad, first, n) + weight_decay * p;
    const float4 m_new = beta1 * load4(m, first, n) + one_minus_beta1 * g;
    const float4 v_new = beta2 * load4(v, first, n) + one_minus_beta2 * g * g;
    const float4 denom = sqrt(v_new) * inv_sqrt_correction2 + eps;
    store4(m_new, m, first, n);
    store4(v_new, v, first, n);
    store4(p - step_size * m_new / denom, param, first, n);
}

// The training-step counter t: run once at the end of every training step.
__kernel void increment_step(__global int* step) {
    if (get_global_id(0) == 0) step[0] += 1;
}

// Multi-tensor updates: one launch updates every trainable parameter of a step. Parameters,
// gradients and optimizer states all live in one arena; a table in that arena (an int array at
// element offset table_offset) describes them:
//   table[0 .. count]: prefix sums of the work-items of each tensor (ceil(n / 4) each), so
//       table[count] is the number of work-items in all;
//   table[count + 1 + OPT_FIELDS * i ...]: n, param, grad, state0, state1 of tensor i, the last
//       four as element offsets into the arena (an unused state is 0 and never touched).
// A work-item finds its tensor by binary search over the prefix sums and updates four elements
// of it with the same arithmetic as the single-tensor kernels above. With zero_grad the gradient
// is zeroed after it is read (gradient accumulation: ready for the next effective batch).

#define OPT_FIELDS 5

typedef struct {
    int n;       // elements of the tensor
    int first;   // first of this work-item's four elements
    int param;   // element offsets into the arena
    int grad;
    int state0;
    int state1;
} opt_slice;

// The largest i < count with starts[i] <= item (starts[0] == 0 <= item).
inline int opt_find_tensor(__global const int* starts, const int count, const int item) {
    int lo = 0;
    int hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

inline opt_slice opt_locate(__global const float* arena, const int table_offset,
                            const int count, const int item) {
    __global const int* table = (__global const int*)(arena + table_offset);
    const int i = opt_find_tensor(table, count, item);
    __global const int* entry = table + count + 1 + OPT_FIELDS * i;
    opt_slice s;
    s.n = entry[0];
    s.first = (item - table[i]) * OPT_VEC;
    s.param = entry[1];
    s.grad = entry[2];
    s.state0 = entry[3];
    s.state1 = entry[4];
    return s;
}

inline int opt_items(__global const float* arena, const int table_offset, const int count) {
    return ((__global const int*)(arena + table_offset))[count];
}

inline float4 opt_read_grad(__global float* arena, const opt_slice s, const int zero_grad) {
    const float4 g = load4(arena + s.grad, s.first, s.n);
    if (zero_grad) store4((float4)(0.0f), arena + s.grad, s.first, s.n);
    return g;
}

__kernel void sgd_plain_multi(const float lr, __global float* arena, const int table_offset,
                              const int count, const float weight_decay, const int zero_grad) {
    const int item = get_global_id(0);
    if (item >= opt_items(arena, table_offset, count)) return;
    const opt_slice s = opt_locate(arena, table_offset, count, item);
    __global float* param = arena + s.param;
    const float4 p = load4(param, s.first, s.n);
    const float4 g = opt_read_grad(arena, s, zero_grad) + weight_decay * p;
    store4(p - lr * g, param, s.first, s.n);
}

__kernel void sgd_momentum_multi(const float lr, __global float* arena, const int table_offset,
                                 const int count, const float momentum, const float weight_decay,
                                 const int nesterov, const int zero_grad) {
    const int item = get_global_id(0);
    if (item >= opt_items(arena, table_offset, count)) return;
    const opt_slice s = opt_locate(arena, table_offset, count, item);
    __global float* param = arena + s.param;
    __global float* velocity = arena + s.state0;
    const float4 p = load4(param, s.first, s.n);
    const float4 g = opt_read_grad(arena, s, zero_grad) + weight_decay * p;
    const float4 v = momentum * load4(velocity, s.first, s.n) + g;
    const float4 d = nesterov ? g + momentum * v : v;
    store4(v, velocity, s.first, s.n);
    store4(p - lr * d, param, s.first, s.n);
}

// The step number t is the int at element offset step_offset of the arena.
__kernel void adam_update_multi(const float lr, __global float* arena, const int table_offset,
                                const int count, const int step_offset, const float beta1,
                                const float one_minus_beta1, const float log_beta1,
                                const float beta2, const float one_minus_beta2,
                                const float log_beta2, const float eps, const float weight_decay,
                                const int zero_grad) {
    const int item = get_global_id(0);
    if (item >= opt_items(arena, table_offset, count)) return;
    const opt_slice s = opt_locate(arena, table_offset, count, item);
    const float t = (float)((__global const int*)(arena + step_offset))[0];
    const float correction1 = -expm1(t * log_beta1);
    const float correction2 = -expm1(t * log_beta2);
    const float step_size = lr / correction1;
    const float inv_sqrt_correction2 = rsqrt(correction2);

    __global float* param = arena + s.param;
    __global float* m = arena + s.state0;
    __global float* v = arena + s.state1;
    const float4 p = load4(param, s.first, s.n);
    const float4 g = opt_read_grad(arena, s, zero_grad) + weight_decay * p;
    const float4 m_new = beta1 * load4(m, s.first, s.n) + one_minus_beta1 * g;
    const float4 v_new = beta2 * load4(v, s.first, s.n) + one_minus_beta2 * g * g;
    const float4 denom = sqrt(v_new) * inv_sqrt_correction2 + eps;
    store4(m_new, m, s.first, s.n);
    store4(v_new, v, s.first, s.n);
    store4(p - step_size * m_new / denom, param, s.first, s.n);
}
