// Element-wise activations and the residual add, forward and backward.
// Backward kernels read the forward output y, so the forward may run in place. Where only the
// activation's own backward needs that output, the forward can instead leave a bit mask of where
// its slope is one (ReLU: 0 < x; ReLU6: 0 < x < 6), 1/32 of the float output's bytes.
//
// Each work-item maps EW_VW consecutive elements with one vector load and store (SIMD on a CPU,
// 16-byte accesses on a GPU); the work-item that holds the end of a tensor whose size is not a
// multiple of EW_VW maps the last elements one by one, so nothing past the tensor is touched.
// Inputs and outputs may be the same buffer: every item reads its elements before it writes them.
//
// Defines: EW_VW (vector width: 1, 2, 4, 8 or 16).

#ifndef EW_VW
#define EW_VW 4
#endif

#define EW_CAT(a, b) a##b
#define EW_XCAT(a, b) EW_CAT(a, b)

#if EW_VW == 1
typedef float float1;
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
#elif EW_VW == 2 || EW_VW == 4 || EW_VW == 8 || EW_VW == 16
#define VLOAD(p) EW_XCAT(vload, EW_VW)(0, p)
#define VSTORE(v, p) EW_XCAT(vstore, EW_VW)(v, 0, p)
#else
#error "EW_VW must be 1, 2, 4, 8 or 16"
#endif
#define VECF EW_XCAT(float, EW_VW)

// out[i] = EXPR for i < n, where EXPR reads a[i] (and b[i]) as `a` (and `b`): a vector of EW_VW
// elements, or a single float in the tail, with `zero` of the same type. The expressions are
// written so that both forms compile (select() and fmax/fmin with a float bound take either).
#define MAP1(name, EXPR)                                                                  \
    __kernel void name(__global const float* x, __global float* y, const int n) {         \
        const int i = get_global_id(0) * EW_VW;                                           \
        if (i + EW_VW <= n) {                                                             \
            const VECF a = VLOAD(x + i), zero = 0.0f;                                     \
            VSTORE(EXPR, y + i);                                                          \
        } else {                                                                          \
            for (int j = i; j < n; ++j) {                                                 \
                const float a = x[j], zero = 0.0f;                                        \
                y[j] = EXPR;                                                              \
            }                                                                             \
        }                                                                                 \
    }
#define MAP2(name, EXPR)                                                                  \
    __kernel void name(__global const float* xa, __global const float* xb,                \
                       __global float* out, const int n) {                                \
        const int i = get_global_id(0) * EW_VW;                                           \
        if (i + EW_VW <= n) {                                                             \
            const VECF a = VLOAD(xa + i);                                                 \
            const VECF b = VLOAD(xb + i), zero = 0.0f;                                    \
            VSTORE(EXPR, out + i);                                                        \
        } else {                                                                          \
            for (int j = i; j < n; ++j) {                                                 \
                const float a = xa[j];                                                    \
                const float b = xb[j], zero = 0.0f;                                       \
                out[j] = EXPR;                                                            \
            }                                                                             \
        }                                                                                 \
    }

// y = relu(x), y = relu6(x).
MAP1(relu_forward, fmax(a, 0.0f))
MAP1(relu6_forward, fmin(fmax(a, 0.0f), 6.0f))

// dx = dy where the forward output y shows the activation's slope is one, else 0 (a = y, b = dy).
MAP2(relu_backward, select(zero, b, a > 0.0f))
MAP2(relu6_backward, select(zero, b, a > 0.0f && a < 6.0f))

// y = act(x) and a bit mask of where act's slope is one: bit j of mask byte k is element 8k + j.
// Each work-item maps the 8 elements of one mask byte, whatever EW_VW is; x and y may be the same
// buffer (the mask of an output that an earlier kernel already activated is the same: act(y) = y).
// The mask byte is built lane by lane from scalar loads (oclgrind's --uninitialized check cannot
// follow a vector comparison packed into bits), before y is written: x may be y.
#define MASKED_FORWARD(name, EXPR, SLOPE)                                                 \
    __kernel void name(__global const float* x, __global float* y, __global uchar* mask,   \
                       const int n) {                                                     \
        const int k = get_global_id(0);                                                   \
        const int i = k * 8;                                                              \
        if (i >= n) return;                                                               \
        const int count = min(8, n - i);                                                  \
        uchar bits = 0;                                                                   \
        for (int j = 0; j < count; ++j) {                                                 \
            const float a = x[i + j];                                                     \
            bits |= (SLOPE) ? (uchar)(1 << j) : (uchar)0;                                 \
        }                                                                                 \
        if (count == 8) {                                                                 \
            const float8 a = vload8(0, x + i);                                            \
            vstore8(EXPR, 0, y + i);                                                      \
        } else {                                                                          \
            for (int j = i; j < n; ++j) {                                                 \
                const float a = x[j];                                                     \
                y[j] = EXPR;                                                              \
            }                                                                             \
        }                                                                                 \
        mask[k] = bits;                                                                   \
    }

MASKED_FORWARD(relu_forward_mask, fmax(a, 0.0f), a > 0.0f)
MASKED_FORWARD(relu6_forward_mask, fmin(fmax(a, 0.0f), 6.0f), a > 0.0f && a < 6.0f)

// dx = dy where the element's mask bit is set, else 0 (either activation); dx may alias dy.
__kernel void masked_backward(__global const uchar* mask, __global const float* dy,
                              __global float* dx, const int n) {
    const int k = get_global_id(0);
    const int i = k * 8;
    if (i + 8 <= n) {
        const int8 keep = ((int8)(mask[k]) & (int8)(1, 2, 4, 8, 16, 32, 64, 128)) != 0;
        vstore8(select((float8)(0.0f), vload8(0, dy + i), keep), 0, dx + i);
    } else if (i < n) {
        const uchar bits = mask[k];
        for (int j = i; j < n; ++j) dx[j] = (bits >> (j - i)) & 1 ? dy[j] : 0.0f;
    }
}

// out = a + b; the backward of a residual add is the identity to both inputs, so it needs no kernel
// of its own beyond accumulation: acc += g.
MAP2(add_forward, a + b)

__kernel void accumulate(__global float* acc, __global const float* g, const int n) {
    const int i = get_global_id(0) * EW_VW;
    if (i + EW_VW <= n) {
        VSTORE(VLOAD(acc + i) + VLOAD(g + i), acc + i);
    } else {
        for (int j = i; j < n; ++j) acc[j] += g[j];
    }
}

MAP1(copy, a)

__kernel void fill(__global float* dst, const float value, const int n) {
    const int i = get_global_id(0) * EW_VW;
    if (i + EW_VW <= n) {
        VSTORE((VECF)(value), dst + i);
    } else {
        for (int j = i; j < n; ++j) dst[j] = value;
    }
}
