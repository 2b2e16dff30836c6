// Element-wise activations and the residual add, forward and backward.
// Backward kernels read the forward output y, so the forward may run in place.
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
