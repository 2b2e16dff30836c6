// Knowledge distillation from a previous model's logits (iCaRL / LwF): for each row, over the first
// c_old classes,
//   loss = weight * T^2 * KL(softmax(old / T) || softmax(logits / T)),
//   dlogits[:c_old] += grad_scale * weight * T * (softmax(logits / T) - softmax(old / T)).
// The gradient is added to dlogits, which already holds the cross-entropy gradient, and the loss
// sum to stats[0]. As in softmax_xent.cl, one work-group walks the rows with DISTILL_LANES
// work-items per row and every sum runs in a fixed order, so stats are reproducible.
//
// Defines: DISTILL_GROUP (work-group size) and DISTILL_LANES (work-items per row), powers of two
// with DISTILL_LANES <= DISTILL_GROUP.

#ifndef DISTILL_GROUP
#define DISTILL_GROUP 128
#endif
#ifndef DISTILL_LANES
#define DISTILL_LANES 1
#endif

// Per-row reductions of two values at once over the DISTILL_LANES work-items sharing a row.
inline float2 lanes_max2(float2 value, __local float2* scratch) {
    const int lid = get_local_id(0);
    const int lane = lid & (DISTILL_LANES - 1);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DISTILL_LANES / 2; s > 0; s >>= 1) {
        if (lane < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float2 result = scratch[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

inline float2 lanes_sum2(float2 value, __local float2* scratch) {
    const int lid = get_local_id(0);
    const int lane = lid & (DISTILL_LANES - 1);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DISTILL_LANES / 2; s > 0; s >>= 1) {
        if (lane < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float2 result = scratch[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);
    return result;
}

// Sum over the whole work-group, in a fixed tree order.
inline float group_sum(float value, __local float2* scratch) {
    const int lid = get_local_id(0);
    scratch[lid].x = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = DISTILL_GROUP / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid].x += scratch[lid + s].x;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0].x;
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

__kernel __attribute__((reqd_work_group_size(DISTILL_GROUP, 1, 1)))
void distill_xent(__global const float* logits, __global const float* old_logits,
                  __global float* dlogits, __global float* stats, const int n, const int c_old,
                  const int c, const float inv_temperature, const float loss_factor,
                  const float grad_factor) {
    __local float2 scratch[DISTILL_GROUP];
    const int lid = get_local_id(0);
    const int lane = lid & (DISTILL_LANES - 1);
    const int slot = lid / DISTILL_LANES;
    float loss_sum = 0.0f;

    for (int base = 0; base < n; base += DISTILL_GROUP / DISTILL_LANES) {
        const int row = base + slot;
        const bool valid = row < n;
        __global const float* z = logits + (size_t)row * c;
        __global const float* o = old_logits + (size_t)row * c_old;

        // .x: the old model (teacher), .y: the current model, both divided by T.
        float2 top = (float2)(-INFINITY);
        if (valid) {
            for (int j = lane; j < c_old; j += DISTILL_LANES)
                top = fmax(top, (float2)(o[j], z[j]) * inv_temperature);
        }
        top = lanes_max2(top, scratch);

        float2 partial = (float2)(0.0f);
        if (valid) {
            for (int j = lane; j < c_old; j += DISTILL_LANES)
                partial += exp((float2)(o[j], z[j]) * inv_temperature - top);
        }
        const float2 log_norm = top + log(lanes_sum2(partial, scratch));

        // KL(p || q) = sum p * (log p - log q); the gradient uses q - p.
        float kl = 0.0f;
        if (valid) {
            __global float* dz = dlogits + (size_t)row * c;
            for (int j = lane; j < c_old; j += DISTILL_LANES) {
                const float2 log_prob = (float2)(o[j], z[j]) * inv_temperature - log_norm;
                const float p = exp(log_prob.x);
                kl += p * (log_prob.x - log_prob.y);
                dz[j] += grad_factor * (exp(log_prob.y) - p);
            }
        }
        kl = lanes_sum2((float2)(kl, 0.0f), scratch).x;
        if (valid && lane == 0) loss_sum += loss_factor * kl;
    }

    const float loss = group_sum(loss_sum, scratch);
    if (lid == 0) stats[0] += loss;
}
