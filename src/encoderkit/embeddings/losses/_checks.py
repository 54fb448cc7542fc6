"""Input checks shared by the embedding losses: every error names what it found."""
from __future__ import annotations

import torch

from ...errors import InputError


def check_embeddings(loss: str, names: tuple[str, ...], *tensors: torch.Tensor) -> int:
    """Each tensor is (batch, dim), with one batch size and one dim throughout; returns the batch size."""
    if len(tensors) != len(names):
        raise InputError(f"{loss} takes {len(names)} embedding tensors ({', '.join(names)}), found {len(tensors)}")
    first = tensors[0]
    for name, tensor in zip(names, tensors):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2 or not tensor.is_floating_point():
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise InputError(f"{loss}: {name} must be a float tensor of shape (batch, dim), found {shape}")
        if tensor.shape != first.shape:
            raise InputError(f"{loss}: {name} has shape {tuple(tensor.shape)}, but {names[0]} has "
                             f"{tuple(first.shape)}; every column needs one row per example")
    if first.shape[0] == 0:
        raise InputError(f"{loss}: the batch is empty")
    return first.shape[0]


def check_targets(loss: str, name: str, values: torch.Tensor, batch: int, *, low: float | None = None,
                  high: float | None = None) -> torch.Tensor:
    """A (batch,) vector of finite numbers, within [low, high] where given; returned flattened."""
    values = torch.as_tensor(values)
    if values.numel() != batch:
        raise InputError(f"{loss}: expected {batch} {name} (one per example), found {values.numel()} "
                         f"of shape {tuple(values.shape)}")
    values = values.reshape(-1)
    bad = ~torch.isfinite(values.double())
    if low is not None:
        bad |= values.double() < low
    if high is not None:
        bad |= values.double() > high
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        span = f" outside [{low:g}, {high:g}]" if low is not None and high is not None else " not finite"
        raise InputError(f"{loss}: {name[:-1] if name.endswith('s') else name} {values[index].item()!r} of "
                         f"example {index} is{span}")
    return values
