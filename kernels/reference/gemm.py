"""Float64 reference of the batched general matrix product of ``kernels.gemm``.

Works on flat arrays with the kernel's element offsets, so that batch strides, shared operands and
the elements of C outside every batch entry are checked as the kernel sees them.
"""

from __future__ import annotations

import numpy as np

from kernels.reference.elementwise import activation_forward


def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    *,
    m: int,
    n: int,
    k: int,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: np.ndarray | None = None,
    activation: str | None = None,
    batch: int = 1,
    stride_a: int = 0,
    stride_b: int = 0,
    stride_c: int = 0,
) -> np.ndarray:
    """The flat C after the product: ``C[i] = act(alpha * op(A[i]) @ op(B[i]) + beta * C[i] +
    bias)`` for each batch entry; other elements of ``c`` are returned unchanged. With
    ``beta == 0`` the old C is ignored, NaN included."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    out = np.array(c, np.float64).ravel()
    for i in range(batch):
        a_i = a[i * stride_a : i * stride_a + m * k]
        b_i = b[i * stride_b : i * stride_b + k * n]
        op_a = a_i.reshape(k, m).T if trans_a else a_i.reshape(m, k)
        op_b = b_i.reshape(n, k).T if trans_b else b_i.reshape(k, n)
        value = alpha * (op_a @ op_b)
        c_slice = slice(i * stride_c, i * stride_c + m * n)
        if beta != 0.0:
            value = value + beta * out[c_slice].reshape(m, n)
        if bias is not None:
            value = value + np.asarray(bias, np.float64).reshape(1, n)
        if activation is not None:
            value = activation_forward(activation, value)
        out[c_slice] = value.ravel()
    return out


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``y = x @ W^T + b`` with W (out, in), as PyTorch's Linear: the forward whose backward the
    engine composes from three products (y, dx = dy @ W, dW = dy^T @ x)."""
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    return x @ weight.T + np.asarray(bias, np.float64)
