// Softmax cross-entropy fused with its gradient, and the loss/accuracy accumulators it feeds.
//
// A single work-group walks the rows in passes: XENT_LANES consecutive work-items share one row,
// so XENT_GROUP / XENT_LANES rows are in flight per pass (few lanes for few classes, more for many).
// Every sum runs in a fixed order (private partials, then local trees), so the statistics added to
// `stats` are the same from run to run without float atomics.
//
// Labels: -1 ignores the row (zero gradient, not counted). Any other label outside [0, c) is a bug
// upstream; the row's loss and gradient become NaN so that it shows in the reported loss.
//
// Defines: XENT_GROUP (work-group size) and XENT_LANES (work-items per row), powers of two with
// XENT_LANES <= XENT_GROUP.

#ifndef XENT_GROUP
#define XENT_GROUP 128
#endif
#ifndef XENT_LANES
#define XENT_LANES 1
#endif
#define IGNORE_LABEL (-1)

// Sum over the XENT_LANES work-items that share a row; each of them gets the total.
inline float lanes_sum(float value, __local float* scratch) {
    const int lid = get_local_id(0);
    const int lane = lid & (XENT_LANES - 1);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = XENT_LANES / 2; s > 0; s >>= 1) {
        if (lane < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

// Maximum over the lanes of a row and the first column that holds it (ties go to the lower index).
inline float lanes_argmax(float value, int* index, __local float* scratch, __local int* where) {
    const int lid = get_local_id(0);
    const int lane = lid & (XENT_LANES - 1);
    scratch[lid] = value;
    where[lid] = *index;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = XENT_LANES / 2; s > 0; s >>= 1) {
        if (lane < s) {
            const float other = scratch[lid + s];
            const int other_index = where[lid + s];
            if (other > scratch[lid] || (other == scratch[lid] && other_index < where[lid])) {
                scratch[lid] = other;
                where[lid] = other_index;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float best = scratch[lid - lane];
    *index = where[lid - lane];
    barrier(CLK_LOCAL_MEM_FENCE);
    return best;
}

// Sum over the whole work-group, in a fixed tree order.
inline float group_sum(float value, __local float* scratch) {
    const int lid = get_local_id(0);
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = XENT_GROUP / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

inline void softmax_xent_rows(__global const float* logits, __global const int* labels,
                              __global float* dlogits, __global float* stats, const int n,
                              const int c, const float grad_scale, const int with_grad,
                              __local float* scratch, __local int* where) {
    const int lid = get_local_id(0);
    const int lane = lid & (XENT_LANES - 1);
    const int slot = lid / XENT_LANES;
    float loss_sum = 0.0f, correct_sum = 0.0f, counted_sum = 0.0f;

    for (int base = 0; base < n; base += XENT_GROUP / XENT_LANES) {
        const int row = base + slot;
        const bool valid = row < n;
        __global const float* z = logits + (size_t)row * c;
        const int label = valid ? labels[row] : IGNORE_LABEL;

        float top = -INFINITY;
        int top_index = INT_MAX;
        if (valid) {
            for (int j = lane; j < c; j += XENT_LANES) {
                if (j == lane || z[j] > top) {
                    top = z[j];
                    top_index = j;
                }
            }
        }
        top = lanes_argmax(top, &top_index, scratch, where);

        float partial = 0.0f;
        if (valid) {
            for (int j = lane; j < c; j += XENT_LANES) partial += exp(z[j] - top);
        }
        const float denom = lanes_sum(partial, scratch);

        if (!valid) continue;
        const bool ignored = label == IGNORE_LABEL;
        const bool in_range = label >= 0 && label < c;
        if (with_grad) {
            __global float* dz = dlogits + (size_t)row * c;
            const float inv_denom = 1.0f / denom;
            for (int j = lane; j < c; j += XENT_LANES) {
                const float p = exp(z[j] - top) * inv_denom;
                const float target = j == label ? 1.0f : 0.0f;
                dz[j] = ignored ? 0.0f : (in_range ? (p - target) * grad_scale : NAN);
            }
        }
        if (lane == 0 && !ignored) {
            loss_sum += in_range ? log(denom) - (z[label] - top) : NAN;
            correct_sum += top_index == label ? 1.0f : 0.0f;
            counted_sum += 1.0f;
        }
    }

    const float loss = group_sum(loss_sum, scratch);
    const float correct = group_sum(correct_sum, scratch);
    const float counted = group_sum(counted_sum, scratch);
    if (lid == 0) {
        stats[0] += loss;
        stats[1] += correct;
        stats[2] += counted;
    }
}

// dlogits = (softmax(logits) - onehot(label)) * grad_scale for counted rows, 0 for ignored rows;
// stats += [sum of losses, correct argmax predictions, counted rows].
__kernel __attribute__((reqd_work_group_size(XENT_GROUP, 1, 1)))
void softmax_xent(__global const float* logits, __global const int* labels,
                  __global float* dlogits, __global float* stats, const int n, const int c,
                  const float grad_scale) {
    __local float scratch[XENT_GROUP];
    __local int where[XENT_GROUP];
    softmax_xent_rows(logits, labels, dlogits, stats, n, c, grad_scale, 1, scratch, where);
}

// The same statistics without a gradient, for evaluation.
__kernel __attribute__((reqd_work_group_size(XENT_GROUP, 1, 1)))
void softmax_xent_eval(__global const float* logits, __global const int* labels,
                       __global float* stats, const int n, const int c) {
    __local float scratch[XENT_GROUP];
    __local int where[XENT_GROUP];
    softmax_xent_rows(logits, labels, 0, stats, n, c, 0.0f, 0, scratch, where);
}
