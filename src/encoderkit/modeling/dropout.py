"""Dropout for training on the CPU: keep-masks from a counter-based generator, drawn and applied in one native pass.

torch's CPU dropout draws a 32-bit Mersenne Twister number for every element (``bernoulli_``), one at a time, and
keeps the mask for the backward pass: a visible share of a fine-tuning step (bench/finetune.py's step profile). On
SQuAD the attention probabilities of a batch of 16 windows of 384 tokens are 28 million elements a layer.

Here, where encoderkit's native library is built (``encoderkit.native``, ``training.cpp``), the mask of element i is
a function of a seed and i alone: 16 bits of a Philox4x32-10 block (Salmon et al., SC 2011; the generator of
torch's CUDA kernels; training.cpp says which bits), drawn and applied in one pass on torch's threads. No mask is
stored: the backward pass draws it again from the seed. It is faster than numpy's masks (below) and torch's dropout,
forward and backward (bench/training_kernels.py, BENCHMARKS.md).

Without the native library, each mask is the same Philox4x32-10 bits computed by numpy (``philox_bits``), and is
kept for the backward pass: one seed trains the same on a machine without a compiler.

Either way an element is dropped when its 16 bits fall below ``round(p * 65536)``, so the chance of a drop is that
count over 65536 (0.1000061 for p = 0.1), and the kept elements are scaled by the inverse of the kept share, so that
the expectation is exact. Each call draws its seed from torch's default generator, so ``torch.manual_seed`` makes
the masks repeat, as it does torch's. Tensors on an accelerator, and chances not on the 16-bit grid in between, use
torch's dropout.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import kernels

LEVELS = 1 << 16  # the chance of a drop is a count of 1/65536ths


def draw_mask(p: float) -> tuple[int, int, float]:
    """A seed from torch's default generator, the drop count on the 16-bit grid, and the scale of kept elements."""
    dropped = round(p * LEVELS)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    return seed, dropped, LEVELS / (LEVELS - dropped)


_M0, _M1, _W0, _W1 = (np.uint64(v) for v in (0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85))  # Philox4x32's
_LOW32, _GROUP = np.uint64(0xFFFFFFFF), 128  # elements drawn together: 16 counters of 8 x 16 bits


def philox_bits(seed: int, count: int) -> np.ndarray:
    """The 16 bits of elements 0 .. count - 1 of ``seed``'s mask, as training.cpp draws them: Philox4x32-10 of counter
    (n, 0) under the key ``seed`` (low, high words); element 16k + j of group g takes counter 16g + j's word k / 2,
    its low half for an even k. Vectorised over the counters, in 64-bit lanes holding 32-bit words."""
    groups = -(-count // _GROUP)
    n = np.arange(16 * groups, dtype=np.uint64)
    c0, c1 = n & _LOW32, n >> np.uint64(32)
    c2 = c3 = np.zeros_like(n)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W0) & _LOW32, (k1 + _W1) & _LOW32
        p0, p1 = c0 * _M0, c2 * _M1  # < 2**64: 32-bit words times 32-bit constants
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _LOW32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _LOW32
    words = np.stack([c0, c1, c2, c3], axis=-1).reshape(groups, 16, 4)
    halves = np.stack([words & np.uint64(0xFFFF), words >> np.uint64(16)], axis=-1).reshape(groups, 16, 8)
    return halves.transpose(0, 2, 1).reshape(-1)[:count].astype(np.uint16)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[torch.Tensor, float]:
    """Without the native library: the boolean mask of ``shape`` the library would draw (``philox_bits`` at least
    round(p * 65536)), and the scale that keeps the expectation."""
    seed, dropped, scale = draw_mask(p)
    bits = philox_bits(seed, math.prod(shape))
    return torch.from_numpy(bits >= dropped).view(shape), scale


def native_keep_mask(seed: int, count: int, dropped: int) -> torch.Tensor:
    """The native library's (count,) keep-mask for ``seed`` (True: kept)."""
    keep = torch.empty(count, dtype=torch.bool)
    kernels.library().ek_dropout_mask(keep.data_ptr(), count, seed, dropped, torch.get_num_threads())
    return keep


def _apply(x: torch.Tensor, seed: int, dropped: int, scale: float) -> torch.Tensor:
    """x times the native mask of ``seed`` times ``scale``: one pass for fp32, else the mask and torch's product."""
    x = x.contiguous()
    if x.dtype == torch.float32:
        out = torch.empty_like(x)
        kernels.library().ek_dropout(x.data_ptr(), out.data_ptr(), x.numel(), seed, dropped, scale,
                                    torch.get_num_threads())
        return out
    return torch.ops.aten.native_dropout_backward(x, native_keep_mask(seed, x.numel(), dropped).view(x.shape), scale)


class _Dropout(torch.autograd.Function):
    """x * keep * scale, and the gradient likewise, the mask drawn again from the seed in the backward pass."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seed: int, dropped: int, scale: float) -> torch.Tensor:
        ctx.mask = (seed, dropped, scale)
        return _apply(x, seed, dropped, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _apply(grad, *ctx.mask), None, None, None


class _Masked(torch.autograd.Function):
    """x * keep * scale with a stored mask, and the gradient likewise (torch's dropout kernel for both directions)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, keep, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None, None


def own_masks(device: torch.device, p: float) -> bool:
    """Whether ``dropout`` draws the masks itself for tensors on ``device`` (the CPU, a chance of a drop on the
    16-bit grid strictly between 0 and 1); elsewhere it is torch's dropout."""
    return device.type == "cpu" and 0.0 < p < 1.0 and 0 < round(p * LEVELS) < LEVELS


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the mask drawn as the module doc says on the CPU."""
    if not training or p == 0.0:
        return x
    if x.numel() == 0 or not own_masks(x.device, p):
        return F.dropout(x, p, training)
    if kernels.library() is not None:
        return _Dropout.apply(x, *draw_mask(p))
    keep, scale = keep_mask(x.shape, p)
    return _Masked.apply(x, keep, scale)


_kernels_on = True  # the training kernels (``kernel_mask``); ``training_kernels(False)`` turns them off


@contextmanager
def training_kernels(enabled: bool):
    """The native training kernels (attention's ``_TrainingAttention``, ``add_norm``'s) on or off within the block;
    off, every layer takes its PyTorch operations (what benchmarks and tests compare the kernels with)."""
    global _kernels_on
    saved, _kernels_on = _kernels_on, enabled
    try:
        yield
    finally:
        _kernels_on = saved


def kernel_mask(p: float, device: torch.device) -> tuple[int, int, float] | None:
    """The dropout mask a native training kernel applies for chance ``p`` (seed, dropped count, scale of kept elements):
    none to apply (0, 0, 1.0) for p = 0, one drawn as ``dropout`` draws it where that draws its own; None where the
    kernels are off, the library is not built or torch's dropout would run (the caller then takes its PyTorch ops)."""
    if not _kernels_on or kernels.library() is None or torch.compiler.is_compiling():
        return None
    if p == 0.0:
        return 0, 0, 1.0
    return draw_mask(p) if own_masks(device, p) else None


class _AddDropoutNorm(torch.autograd.Function):
    """LayerNorm(residual + dropout(y)) in one native pass (``ek_add_dropout_norm``), and its gradient in one more:
    the (rows, width) normalised rows and each row's 1 / standard deviation are kept, the mask drawn again."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                eps: float, mask: tuple[int, int, float]) -> torch.Tensor:
        rows, width = residual.shape
        out, normed = torch.empty_like(residual), torch.empty_like(residual)
        rstd = residual.new_empty(rows)
        seed, dropped, keep_scale = mask
        kernels.library().ek_add_dropout_norm(
            residual.data_ptr(), y.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
            out.data_ptr(), normed.data_ptr(), rstd.data_ptr(), rows, width, eps, seed, dropped, keep_scale,
            torch.get_num_threads())
        ctx.save_for_backward(normed, rstd, weight)
        ctx.mask, ctx.has_bias = mask, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        normed, rstd, weight = ctx.saved_tensors
        grad = grad.contiguous()
        rows, width = grad.shape
        grad_residual, grad_y = torch.empty_like(grad), torch.empty_like(grad)
        grad_weight = weight.new_empty(width)
        grad_bias = weight.new_empty(width) if ctx.has_bias else None
        seed, dropped, keep_scale = ctx.mask
        kernels.library().ek_add_dropout_norm_backward(
            grad.data_ptr(), normed.data_ptr(), rstd.data_ptr(), weight.data_ptr(), grad_residual.data_ptr(),
            grad_y.data_ptr(), grad_weight.data_ptr(), None if grad_bias is None else grad_bias.data_ptr(), rows,
            width, seed, dropped, keep_scale, torch.get_num_threads())
        return grad_residual, grad_y, grad_weight, grad_bias, None, None


def _fused_mask(residual: torch.Tensor, y: torch.Tensor, dropout: nn.Module,
                norm: nn.Module) -> tuple[int, int, float] | None:
    """The mask for ``_AddDropoutNorm`` where it applies (training on the CPU in fp32, with gradients, an affine
    LayerNorm over rows of a multiple of 16 values, the native library); None where ``add_norm`` takes torch's ops."""
    if not (torch.is_grad_enabled() and type(norm) is nn.LayerNorm and norm.weight is not None
            and residual.dim() == 2 and residual.shape == y.shape and residual.shape[1] % 16 == 0
            and norm.normalized_shape == (residual.shape[1],)):
        return None
    tensors = (residual, y, norm.weight) + (() if norm.bias is None else (norm.bias,))
    if any(t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
        return None
    if isinstance(dropout, nn.Dropout):
        if dropout.inplace:
            return None
        p = dropout.p if dropout.training else 0.0
    elif isinstance(dropout, nn.Identity):
        p = 0.0
    else:  # some other module: it runs as it is
        return None
    return kernel_mask(p, y.device)


def add_norm(residual: torch.Tensor, y: torch.Tensor, dropout: nn.Module, norm: nn.Module) -> torch.Tensor:
    """``norm(residual + dropout(y))``, a post-norm layer's sublayer output. In training on the CPU, with the native
    library, one pass forward and one backward (``_AddDropoutNorm``; the mask as ``dropout`` draws it)."""
    mask = _fused_mask(residual, y, dropout, norm) if norm.training else None
    if mask is None:
        return norm(residual + dropout(y).to(residual.dtype))
    return _AddDropoutNorm.apply(residual, y, norm.weight, norm.bias, norm.eps, mask)


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its CPU masks with ``dropout`` (no parameters: the state dict is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


__all__ = ["Dropout", "add_norm", "draw_mask", "dropout", "keep_mask", "kernel_mask", "native_keep_mask",
           "own_masks", "training_kernels"]
