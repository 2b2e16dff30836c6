// Bias-gradient reductions: sums over rows (Linear) and over batch and space (convolution, BN).
//
// Deterministic: every work-item adds its elements in a fixed order, then the work-group combines
// the partial sums by a tree in local memory whose shape depends only on the build-time group
// size, never on timing. One work-group produces each output element, so no atomics are needed.

#ifndef GROUP_COLS
#define GROUP_COLS 16  // sum_rows: columns per work-group (one per item along dimension 0)
#endif
#ifndef GROUP_ROWS
#define GROUP_ROWS 16  // sum_rows: row lanes per column; a power of two
#endif
#ifndef GROUP_SIZE
#define GROUP_SIZE 256  // sum_channels: items per channel; a power of two
#endif

#if (GROUP_ROWS & (GROUP_ROWS - 1)) || (GROUP_SIZE & (GROUP_SIZE - 1))
#error "GROUP_ROWS and GROUP_SIZE must be powers of two"
#endif

// out[j] (+)= sum_i x[i * cols + j]. Work-group (GROUP_COLS, GROUP_ROWS): item (lx, ly) sums rows
// ly, ly + GROUP_ROWS, ... of column j, reading GROUP_COLS neighbouring columns per row together.
__kernel __attribute__((reqd_work_group_size(GROUP_COLS, GROUP_ROWS, 1)))
void sum_rows(const __global float* restrict x, __global float* restrict out,
              const int rows, const int cols, const int accumulate) {
    __local float partial[GROUP_ROWS][GROUP_COLS];
    const int lx = get_local_id(0);
    const int ly = get_local_id(1);
    const int j = get_global_id(0);
    float sum = 0.0f;
    if (j < cols)
        for (int i = ly; i < rows; i += GROUP_ROWS) sum += x[i * cols + j];
    partial[ly][lx] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = GROUP_ROWS / 2; stride > 0; stride /= 2) {
        if (ly < stride) partial[ly][lx] += partial[ly + stride][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (ly == 0 && j < cols) out[j] = accumulate ? out[j] + partial[0][lx] : partial[0][lx];
}

// out[ch] (+)= sum over images b and positions p of x[(b * c + ch) * hw + p], x of shape (n, c, hw).
// One work-group per channel; item t walks the channel's n * hw elements with stride GROUP_SIZE.
__kernel __attribute__((reqd_work_group_size(GROUP_SIZE, 1, 1)))
void sum_channels(const __global float* restrict x, __global float* restrict out,
                  const int n, const int c, const int hw, const int accumulate) {
    __local float partial[GROUP_SIZE];
    const int t = get_local_id(0);
    const int ch = get_group_id(0);
    // Element t + s * GROUP_SIZE of the channel, as (image, position), advanced without division.
    const int image_step = GROUP_SIZE / hw;
    const int position_step = GROUP_SIZE - image_step * hw;
    int image = t / hw;
    int position = t - image * hw;
    float sum = 0.0f;
    while (image < n) {
        sum += x[(image * c + ch) * hw + position];
        image += image_step;
        position += position_step;
        if (position >= hw) {
            position -= hw;
            image += 1;
        }
    }
    partial[t] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride = GROUP_SIZE / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) out[ch] = accumulate ? out[ch] + partial[0] : partial[0];
}
