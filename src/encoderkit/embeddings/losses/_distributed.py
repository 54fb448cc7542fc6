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

The batches must have one size on every process (an all-gather needs equal shapes); ``batch_sizes`` checks it
and raises a clear error otherwise. Every process must call the gathering loss, in the same order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...errors import InputError


def process_group() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) outside a distributed run."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def check_batch_sizes(loss: str, size: int, device: torch.device) -> None:
    """Raise (on every process alike) unless every process holds ``size`` examples."""
    world, _ = process_group()
    mine = torch.tensor([size], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(sizes, mine)
    found = [int(s) for s in sizes]
    if len(set(found)) > 1:
        raise InputError(f"{loss} gathers embeddings from {world} processes, which need batches of one size; found "
                         f"{found} (per process). Drop the last incomplete batch or give every process the same "
                         "number of examples (train_embedder does so).")


def _wire_dtype(tensor: torch.Tensor) -> torch.dtype:
    """gloo reduces no 16-bit floats: send those as float32 (exact) on CPU."""
    if tensor.device.type == "cpu" and tensor.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return tensor.dtype


def _all_gather(tensor: torch.Tensor) -> torch.Tensor:
    world, _ = process_group()
    wire = tensor.detach().to(_wire_dtype(tensor)).contiguous()
    parts = [torch.empty_like(wire) for _ in range(world)]
    dist.all_gather(parts, wire)
    return torch.cat(parts).to(tensor.dtype)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.rank, ctx.rows = process_group()[1], tensor.shape[0]
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
