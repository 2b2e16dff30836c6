"""Which class of kernel each engine kernel is, for the cost model.

A kernel class groups kernels that reach a similar fraction of the device's rate or bandwidth: a
tiled GEMM reuses every loaded value many times, a depthwise or pooling window reuses a few, and
normalisations, reductions and element-wise maps stream. The cost model scales each class by an
efficiency measured on a real device (``client_runtime.calibration``), so every kernel the engine
launches needs a class here: ``tests/mgfl/test_cost_model.py`` fails on one that has none.
"""

from __future__ import annotations

GEMM = "gemm"
CONVOLUTION = "convolution"  # direct and depthwise convolutions: small windows, some reuse
POOLING = "pooling"  # max/average pooling windows and their scatter-like backward
NORMALISATION = "normalisation"  # BatchNorm, reductions over rows or channels, softmax losses
ELEMENTWISE = "elementwise"  # one element in, one out: activations, adds, optimizer updates
COPY = "copy"  # data rearrangement without arithmetic: copies, fills, im2col/col2im

CLASSES = (GEMM, CONVOLUTION, POOLING, NORMALISATION, ELEMENTWISE, COPY)

_MEMBERS = {
    GEMM: ("gemm_register", "gemm_dot", "gemm_local", "gemm_blocked"),
    CONVOLUTION: (
        "conv2d_forward", "conv2d_backward_data", "conv2d_backward_weight",
        "depthwise_forward", "depthwise_backward_data", "depthwise_backward_weight",
    ),
    POOLING: (
        "maxpool_forward", "maxpool_backward", "avgpool_forward", "avgpool_backward",
    ),
    NORMALISATION: (
        "batchnorm_forward_train", "batchnorm_forward_eval", "batchnorm_backward",
        "batchnorm_backward_frozen", "sum_rows", "sum_channels", "channel_bias_backward",
        "global_avgpool_forward", "global_avgpool_backward", "softmax_xent",
        "softmax_xent_eval", "distill_xent",
    ),
    ELEMENTWISE: (
        "relu_forward", "relu6_forward", "relu_backward", "relu6_backward",
        "relu_forward_mask", "relu6_forward_mask", "masked_backward", "add_forward",
        "accumulate", "bias_activation", "dropout", "sgd_plain", "sgd_momentum", "adam_update",
        "sgd_plain_multi", "sgd_momentum_multi", "adam_update_multi", "increment_step",
    ),
    COPY: ("copy", "fill", "im2col", "col2im"),
}  # fmt: skip

KERNEL_CLASS: dict[str, str] = {name: cls for cls, names in _MEMBERS.items() for name in names}


def kernel_class(name: str) -> str:
    """The class of the kernel ``name`` (a ``Launch.name``); a kernel without one is an error, so
    that a new kernel cannot silently fall back to the GEMM's efficiency."""
    try:
        return KERNEL_CLASS[name]
    except KeyError:
        raise KeyError(
            f"kernel {name!r} has no cost-model class; add it to mgfl/kernel_classes.py"
        ) from None
