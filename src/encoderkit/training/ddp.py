"""Data-parallel training under torchrun: joining and leaving the process group, and skipping the gradient
all-reduce of micro-batches before the last of a step."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


def init_distributed(device: str | None = None) -> bool:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on GPU (``device``:
    where the job will train; None: a GPU when there is one)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        on_gpu = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
        backend = "nccl" if on_gpu else "gloo"
        torch.distributed.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return True


@contextmanager
def distributed_run(device: str | None = None) -> Iterator[None]:
    """The body of a training entry point: in the process group under torchrun (``init_distributed``), left
    when the body ends, however it ends."""
    joined = init_distributed(device)
    try:
        yield
    finally:
        if joined:
            torch.distributed.destroy_process_group()


class _maybe_no_sync:
    def __init__(self, model: nn.Module, sync: bool) -> None:
        self.context = model.no_sync() if not sync and hasattr(model, "no_sync") else None

    def __enter__(self):
        return self.context.__enter__() if self.context is not None else None

    def __exit__(self, *exc):
        return self.context.__exit__(*exc) if self.context is not None else False
