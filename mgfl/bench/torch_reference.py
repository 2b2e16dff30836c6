"""PyTorch as the reference library, when it is installed (the optional ``bench`` extra): the
same zoo model written with torch modules, with mgfl's initial weights copied in."""

from __future__ import annotations

import os


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_torch():
    """torch with CUDA and TF32 off (float32 like mgfl), or None."""
    torch = torch_or_none()
    if torch is None or not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_device(torch) -> str:
    """CUDA where present, else the CPU with every core."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return "cuda"
    torch.set_num_threads(os.cpu_count() or 1)
    return "cpu"


def build_torch_model(torch, model, state: dict):
    """A torch.nn.Module computing ``model`` (an mgfl Model), its parameters and BatchNorm
    statistics set from ``state`` (mgfl's names are the resolved layer paths)."""
    from mgfl.models import layers as L

    nn = torch.nn

    class Add(nn.Module):
        def __init__(self, body):
            super().__init__()
            self.body = body

        def forward(self, x):
            return x + self.body(x)

    def convert(layer, in_shape, path):
        if isinstance(layer, L.Linear):
            return nn.Linear(in_shape[0], layer.out_features, bias=layer.bias)
        if isinstance(layer, L.Conv2d):
            return nn.Conv2d(in_shape[0], layer.out_channels, L.as_pair(layer.kernel_size, "k"),
                             L.as_pair(layer.stride, "s"), L.as_pair(layer.padding, "p"),
                             bias=layer.bias)
        if isinstance(layer, L.DepthwiseConv2d):
            return nn.Conv2d(in_shape[0], in_shape[0], L.as_pair(layer.kernel_size, "k"),
                             L.as_pair(layer.stride, "s"), L.as_pair(layer.padding, "p"),
                             groups=in_shape[0], bias=layer.bias)
        if isinstance(layer, L.BatchNorm):
            return nn.BatchNorm2d(in_shape[0], eps=layer.eps, momentum=layer.momentum)
        if isinstance(layer, L.ReLU):
            return nn.ReLU()
        if isinstance(layer, L.ReLU6):
            return nn.ReLU6()
        if isinstance(layer, L.MaxPool2d):
            return nn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding)
        if isinstance(layer, L.AvgPool2d):
            return nn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding)
        if isinstance(layer, L.GlobalAvgPool):
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        if isinstance(layer, L.Flatten):
            return nn.Flatten()
        if isinstance(layer, L.Dropout):
            return nn.Dropout(layer.p)
        if isinstance(layer, L.Residual):
            return Add(sequence(layer.body, in_shape, f"{path}.body"))
        raise ValueError(f"No torch equivalent for {type(layer).__name__} at {path}")

    names: dict[str, str] = {}

    def sequence(layer_list, shape, prefix):
        modules = []
        for index, layer in enumerate(layer_list):
            module = convert(layer, shape, f"{prefix}.{index}")
            modules.append(module)
            names[f"{prefix}.{index}"] = module
            shape = layer.output_shape(shape)
        return nn.Sequential(*modules)

    net = sequence(model.layers, model.input_shape, "layers")
    with torch.no_grad():
        for name, value in state.items():
            path, attribute = name.rsplit(".", 1)
            target = getattr(names[path], attribute)
            target.copy_(torch.from_numpy(value.reshape(target.shape)))
    return net
