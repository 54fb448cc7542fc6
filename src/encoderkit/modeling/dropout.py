"""Dropout for training on the CPU, with its keep-masks drawn 16 bits an element.

torch's CPU dropout draws a 32-bit Mersenne Twister number for every element (``bernoulli_``), one at a time.
Fine-tuning all-MiniLM-L6-v2 on SST-2 (2 threads, Intel Xeon), those draws took 13% of the step, about as long
as the optimizer and the gradient norm together (bench/finetune.py's step profile, in the same run as
transformers' Trainer, which pays the same). Here each mask comes from numpy's PCG64 generator, four elements
from one 64-bit draw: an element is dropped when its 16 bits fall below ``round(p * 65536)``, so the chance of a
drop is that count over 65536 (0.1000061 for p = 0.1), and the kept elements are scaled by the inverse of the
kept share, so that the expectation is exact. Each call seeds its generator from torch's default generator,
so ``torch.manual_seed`` makes the masks repeat, as it does torch's. Tensors on an accelerator, and chances not
on the 16-bit grid in between, use torch's dropout.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

LEVELS = 1 << 16  # the chance of a drop is a count of 1/65536ths


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[torch.Tensor, float]:
    """A boolean mask of ``shape`` keeping each element with chance 1 - round(p * 65536) / 65536, from 16 random
    bits an element, and the scale that keeps the expectation (the inverse of that chance)."""
    dropped_levels = round(p * LEVELS)
    count = math.prod(shape)
    seed = int(torch.randint(0, 2**62, (1,)).item())  # torch's default generator decides the mask
    words = np.random.PCG64(seed).random_raw((count + 3) // 4)
    bits = words.view(np.uint16)[:count]
    keep = torch.from_numpy(bits >= dropped_levels).view(shape)
    return keep, LEVELS / (LEVELS - dropped_levels)


class _Masked(torch.autograd.Function):
    """x * keep * scale, and the gradient likewise (torch's dropout kernel for both directions)."""

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
    keep, scale = keep_mask(x.shape, p)
    return _Masked.apply(x, keep, scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` drawing its CPU masks with ``dropout`` (no parameters: the state dict is unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)


__all__ = ["Dropout", "dropout", "keep_mask", "own_masks"]
