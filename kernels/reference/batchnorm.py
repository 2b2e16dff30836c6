"""Float64 references of the batch-normalization kernels, on (N, C, HW) arrays."""

from __future__ import annotations

import numpy as np


def _f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def batchnorm_forward_train(x, gamma, beta, running_mean, running_var, momentum=0.1, eps=1e-5):
    """Returns ``(y, mean, invstd, new_running_mean, new_running_var)`` (PyTorch semantics)."""
    x, gamma, beta, running_mean, running_var = _f64(x, gamma, beta, running_mean, running_var)
    count = x.shape[0] * x.shape[2]
    mean = x.mean(axis=(0, 2))
    var = ((x - mean[None, :, None]) ** 2).mean(axis=(0, 2))
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean[None, :, None]) * invstd[None, :, None]
    y = gamma[None, :, None] * xhat + beta[None, :, None]
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * var * count / (count - 1)
    return y, mean, invstd, new_mean, new_var


def batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, eps=1e-5):
    x, gamma, beta, running_mean, running_var = _f64(x, gamma, beta, running_mean, running_var)
    scale = gamma / np.sqrt(running_var + eps)
    return (x - running_mean[None, :, None]) * scale[None, :, None] + beta[None, :, None]


def batchnorm_backward(x, dy, gamma, mean, invstd):
    """Returns ``(dx, dgamma, dbeta)`` of the training forward."""
    x, dy, gamma, mean, invstd = _f64(x, dy, gamma, mean, invstd)
    count = x.shape[0] * x.shape[2]
    xhat = (x - mean[None, :, None]) * invstd[None, :, None]
    dbeta = dy.sum(axis=(0, 2))
    dgamma = (dy * xhat).sum(axis=(0, 2))
    dx = (gamma * invstd)[None, :, None] * (
        dy - dbeta[None, :, None] / count - xhat * dgamma[None, :, None] / count
    )
    return dx, dgamma, dbeta


def batchnorm_backward_frozen(x, dy, gamma, running_mean, running_var, eps=1e-5):
    """Returns ``(dx, dgamma, dbeta)`` of the affine forward over the running statistics."""
    x, dy, gamma, running_mean, running_var = _f64(x, dy, gamma, running_mean, running_var)
    invstd = 1.0 / np.sqrt(running_var + eps)
    xhat = (x - running_mean[None, :, None]) * invstd[None, :, None]
    dx = dy * (gamma * invstd)[None, :, None]
    return dx, (dy * xhat).sum(axis=(0, 2)), dy.sum(axis=(0, 2))
