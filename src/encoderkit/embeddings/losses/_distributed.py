"""Embeddings gathered from every process of a ``torch.distributed`` run (torchrun / DDP), with gradients, so that
the in-batch negatives of a contrastive loss grow with the number of processes.

Each process p holds a local batch B_p of one size; ``gather`` returns the concatenation [B_0; B_1; ...] on every
process. Its backward sums, over the processes, the gradient each one computed for every row, and hands a
process the rows it contributed. Why that is the gradient of the one-process loss: let process p compute a
loss l_p from the gathered rows (its own anchors against every candidate). Process p's parameter gradient is then
sum over its rows e of (sum_q dl_q/de) de/dtheta, and DDP averages those over the W processes, which gives
d/dtheta of (1/W) sum_q l_q. So the losses need no world-size factor: when each l_q is the mean over process q's
anchors and the batches have one size, (1/W) sum_q l_q is the mean over the whole global batch, the loss of one
process on the concatenated batch; when each l_q is the loss of the whole global batch (CoSENT), it is that loss.

The batches must have one size on every process (an all-gather needs equal shapes); ``check_batch_sizes`` checks
it and raises a clear error otherwise. Every process must call the gathering loss, in the same order.

``StepWork``: a loss called several times on one batch (``MatryoshkaLoss``, once per dimension, inside the loss's
``step_scope()``) does the work that depends on the batch but not on the embeddings' values (this check, the
gathered text ids, the false-negative masks) once.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator, TypeVar

import torch
import torch.distributed as dist

from ...distributed import world_and_rank
from ...errors import InputError

T = TypeVar("T")


def check_batch_sizes(loss: str, size: int, device: torch.device) -> None:
    """Raise (on every process alike) unless every process holds ``size`` examples."""
    world, _ = world_and_rank()
    mine = torch.tensor([size], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine)
    found = torch.cat(sizes).tolist()  # one device-to-host copy
    if len(set(found)) > 1:
        raise InputError(f"{loss} gathers embeddings from {world} processes, which need batches of one size; found "
                         f"{found} (per process). Drop the last incomplete batch or give every process the same "
                         "number of examples (train_embedder does so).")


class StepWork:
    """Mixin of a loss: ``step_scope()`` marks calls on one batch (every process enters it alike, so the
    collectives skipped are skipped everywhere); inside it ``once(key, compute)`` computes once per key. Outside a
    scope every call computes."""

    _step_work: dict[Hashable, Any] | None = None

    @contextmanager
    def step_scope(self) -> Iterator[None]:
        if self._step_work is not None:  # already inside one (a scope within a scope): the outer one rules
            yield
            return
        self._step_work = {}
        try:
            yield
        finally:
            self._step_work = None

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        if self._step_work is None:
            return compute()
        if key not in self._step_work:
            self._step_work[key] = compute()
        return self._step_work[key]


def _wire_dtype(tensor: torch.Tensor) -> torch.dtype:
    """gloo reduces no 16-bit floats: send those as float32 (exact) on CPU."""
    if tensor.device.type == "cpu" and tensor.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return tensor.dtype


def _all_gather(tensor: torch.Tensor) -> torch.Tensor:
    world, _ = world_and_rank()
    wire = tensor.detach().to(_wire_dtype(tensor)).contiguous()
    parts = [torch.empty_like(wire) for _ in range(world)]
    dist.all_gather(parts, wire)
    return torch.cat(parts).to(tensor.dtype)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rank, ctx.rows = world_and_rank()[1], tensor.shape[0]
        return _all_gather(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        total = grad.to(_wire_dtype(grad), copy=True).contiguous()
        dist.all_reduce(total)  # every process's gradient for every row, summed
        begin = ctx.rank * ctx.rows
        return total[begin:begin + ctx.rows].to(grad.dtype)


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Rows of every process, concatenated in rank order; gradients reach each process's own rows (see the module
    docstring). Tensors without gradients (text ids, scores) are gathered as they are."""
    if tensor.requires_grad:
        return _Gather.apply(tensor)
    return _all_gather(tensor)
