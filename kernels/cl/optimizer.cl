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
