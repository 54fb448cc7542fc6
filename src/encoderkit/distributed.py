"""The process group of a ``torch.distributed`` run (torchrun), read without importing the training code: the
gathering losses and the Trainer both ask it."""
from __future__ import annotations

import torch.distributed as dist


def world_and_rank() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) outside a distributed run."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
