"""Linear layers whose training products run on oneDNN (fp32) where that is the faster kernel, applied to a model
in place for training.

PyTorch's CPU ``F.linear`` and the matrix products of its backward go to MKL's sgemm. On CPUs that are not Intel's
(AMD EPYC: MKL takes a generic path there) oneDNN's fp32 kernels are faster at the shapes of a training step
(tokens x 384 x 1536), and all three products of a linear layer -- the forward, the input gradient and the weight
gradient -- can run there. On Intel CPUs MKL is the faster one (bench/training_kernels.py;
``onednn_for_training``). The results are fp32 products either way (oneDNN accumulates in another
order: the same outputs within fp32 rounding, tested against float64 and MKL).

``for_training(model)`` turns the model's plain ``nn.Linear`` modules into ``TrainingLinear``: still
``nn.Linear`` (same parameters, same state dict), using oneDNN only while a gradient is wanted, on CPU, in
fp32, outside autocast, tracing and compiling; every other call is ``F.linear`` unchanged. Inference keeps its
own pre-packed layers (``modeling.inference``).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def onednn_linear_available() -> bool:
    """Whether this build has oneDNN's linear op, and it runs (a build or CPU without it uses F.linear)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        x, w = torch.ones(2, 3), torch.ones(4, 3)
        out = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return bool(torch.equal(out, torch.full((2, 4), 3.0)))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@functools.cache
def onednn_for_training() -> bool:
    """Whether training products run on oneDNN: where it works and the CPU is not Intel's (see the module doc)."""
    from ..precision import cpu_vendor

    return onednn_linear_available() and cpu_vendor() != "GenuineIntel"


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T (+ bias) on oneDNN, x and weight 2-D fp32 (either may be a transposed view)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = _product(grad, weight.t(), None) if ctx.needs_input_grad[0] else None
        grad_weight = _product(grad.t(), x.t(), None) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad)):
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if bias is not None and bias.dtype != torch.float32:
        return False
    if torch.is_autocast_enabled("cpu") or torch.jit.is_tracing() or torch.jit.is_scripting():
        return False
    if torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export():
        return False
    return x.numel() > 0 and onednn_for_training()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, on oneDNN when training in fp32 on CPU (see the module doc)."""
    if not _use_onednn(x, weight, bias):
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out = _OneDnnLinear.apply(rows, weight, bias)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], weight.shape[0])


class TrainingLinear(nn.Linear):
    """An ``nn.Linear`` whose training products run on oneDNN (see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def for_training(model: nn.Module) -> nn.Module:
    """Turn ``model``'s plain ``nn.Linear`` modules into ``TrainingLinear``, in place; returns the model.
    Subclasses (the inference engine's packed layers, a user's own) are left alone."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = TrainingLinear
    return model


__all__ = ["TrainingLinear", "for_training", "linear", "onednn_for_training", "onednn_linear_available"]
