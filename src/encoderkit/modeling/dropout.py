"""Dropout for training on the CPU: keep-masks from a counter-based generator, drawn and applied in one native pass.

torch's CPU dropout draws a 32-bit Mersenne Twister number for every element (``bernoulli_``), one at a time, and
keeps the mask for the backward pass. Fine-tuning all-MiniLM-L6-v2 on SST-2 (2 threads, Intel Xeon), those draws
took 13% of the step (bench/finetune.py's step profile, in the same run as transformers' Trainer, which pays the
same). On SQuAD the attention probabilities of a batch of 16 windows of 384 tokens are 28 million elements a layer.

Here, where encoderkit's native library is built (``encoderkit.native``, ``training.cpp``), the mask of element i is
a function of a seed and i alone: 16 bits of a Philox4x32-10 block (Salmon et al., SC 2011; the generator of
torch's CUDA kernels; training.cpp says which bits), drawn and applied in one pass on torch's threads. No mask is
stored: the backward pass draws it again from the seed. Measured on those 28 million elements (Intel Xeon, Cascade
Lake, 2 threads), forward and backward: 51 ms, against 132 ms with numpy masks (below) and 319 ms with torch's
dropout; on SST-2's (438, 1536) MLP states 1.6 ms against 3.5 and 7.8.

Without the native library, each mask comes from numpy's PCG64 generator, four elements from one 64-bit draw, and is
kept for the backward pass.

Either way an element is dropped when its 16 bits fall below ``round(p * 65536)``, so the chance of a drop is that
count over 65536 (0.1000061 for p = 0.1), and the kept elements are scaled by the inverse of the kept share, so that
the expectation is exact. Each call draws its seed from torch's default generator, so ``torch.manual_seed`` makes
the masks repeat, as it does torch's. Tensors on an accelerator, and chances not on the 16-bit grid in between, use
torch's dropout.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import native

LEVELS = 1 << 16  # the chance of a drop is a count of 1/65536ths


def _draw(p: float) -> tuple[int, int, float]:
    """A seed from torch's default generator, the drop count on the 16-bit grid, and the scale of kept elements."""
    dropped = round(p * LEVELS)
    seed = int(torch.randint(0, 2**62, (1,)).item())
    return seed, dropped, LEVELS / (LEVELS - dropped)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[torch.Tensor, float]:
    """Without the native library: a boolean mask of ``shape`` keeping each element with chance
    1 - round(p * 65536) / 65536, from numpy's PCG64 (16 bits an element), and the scale that keeps the expectation."""
    seed, dropped, scale = _draw(p)
    count = math.prod(shape)
    words = np.random.PCG64(seed).random_raw((count + 3) // 4)
    bits = words.view(np.uint16)[:count]
    return torch.from_numpy(bits >= dropped).view(shape), scale


def native_keep_mask(seed: int, count: int, dropped: int) -> torch.Tensor:
    """The native library's (count,) keep-mask for ``seed`` (True: kept)."""
    keep = torch.empty(count, dtype=torch.bool)
    native.library().ek_dropout_mask(keep.data_ptr(), count, seed, dropped, torch.get_num_threads())
    return keep


def _apply(x: torch.Tensor, seed: int, dropped: int, scale: float) -> torch.Tensor:
    """x times the native mask of ``seed`` times ``scale``: one pass for fp32, else the mask and torch's product."""
    x = x.contiguous()
    if x.dtype == torch.float32:
        out = torch.empty_like(x)
        native.library().ek_dropout(x.data_ptr(), out.data_ptr(), x.numel(), seed, dropped, scale,
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
    if native.library() is not None:
        return _Dropout.apply(x, *_draw(p))
    keep, scale = keep_mask(x.shape, p)
    return _Masked.apply(x, keep, scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its CPU masks with ``dropout`` (no parameters: the state dict is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


__all__ = ["Dropout", "dropout", "keep_mask", "native_keep_mask", "own_masks"]
