// Batch normalization over (N, C, HW) tensors: per-channel statistics over the N*HW values of a
// channel. One work-group owns one channel, so every reduction runs in a fixed order inside the
// group (private partial sums, then a local tree) and the results do not depend on scheduling.
//
// Defines: BN_GROUP (work-group size, a power of two).
// Backward defines: WITH_DX, WITH_DGAMMA, WITH_DBETA (0 or 1) select which gradients are written.

#ifndef BN_GROUP
#define BN_GROUP 128
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

// Offset of the j-th value (0 <= j < n*hw) of channel c.
inline int channel_offset(int j, int c, int channels, int hw) {
    const int sample = j / hw;
    return (sample * channels + c) * hw + (j - sample * hw);
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

    float partial = 0.0f;
    for (int j = lid; j < count; j += BN_GROUP) partial += x[channel_offset(j, c, channels, hw)];
    const float mean = group_sum(partial, scratch) / (float)count;

    partial = 0.0f;
    for (int j = lid; j < count; j += BN_GROUP) {
        const float d = x[channel_offset(j, c, channels, hw)] - mean;
        partial += d * d;
    }
    const float squares = group_sum(partial, scratch);
    const float var = squares / (float)count;
    const float invstd = rsqrt(var + eps);

    const float g = gamma[c] * invstd;
    const float shift = beta[c] - mean * g;
    for (int j = lid; j < count; j += BN_GROUP) {
        const int i = channel_offset(j, c, channels, hw);
        y[i] = x[i] * g + shift;
    }
    if (lid == 0) {
        mean_out[c] = mean;
        invstd_out[c] = invstd;
        const float unbiased = squares / (float)(count - 1);
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
        running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
}

// Inference: normalize with the running statistics; one work-item per element.
__kernel void batchnorm_forward_eval(__global const float* x, __global const float* gamma,
                                     __global const float* beta, __global float* y,
                                     __global const float* running_mean,
                                     __global const float* running_var,
                                     const int n, const int channels, const int hw,
                                     const float eps) {
    const int i = get_global_id(0);
    if (i >= n * channels * hw) return;
    const int c = (i / hw) % channels;
    const float g = gamma[c] * rsqrt(running_var[c] + eps);
    y[i] = (x[i] - running_mean[c]) * g + beta[c];
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
    const float mean = mean_in[c];
    const float invstd = invstd_in[c];

    float partial_dy = 0.0f;
    float partial_dy_xhat = 0.0f;
    for (int j = lid; j < count; j += BN_GROUP) {
        const int i = channel_offset(j, c, channels, hw);
        const float g = dy[i];
        partial_dy += g;
        partial_dy_xhat += g * (x[i] - mean);
    }
    const float sum_dy = group_sum(partial_dy, scratch);
    const float sum_dy_xhat = group_sum(partial_dy_xhat, scratch) * invstd;

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
    for (int j = lid; j < count; j += BN_GROUP) {
        const int i = channel_offset(j, c, channels, hw);
        const float xhat = (x[i] - mean) * invstd;
        dx[i] = scale * (dy[i] - mean_dy - xhat * mean_dy_xhat);
    }
#endif
}
