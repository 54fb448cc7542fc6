"""How glibc's malloc hands memory back to the system, set for the kind of job a process runs.

torch's CPU tensors come from malloc. glibc maps each block above its mmap threshold (128 KiB at first, raised
after each large free up to 32 MiB) with mmap and unmaps it when freed, and trims freed memory at the top of
its heap; memory taken again from the system is faulted in page by page, and each fault costs kernel time.

- Training (``keep_freed_memory``): a step allocates and frees the same activations and gradients as the step
  before, some of them larger than any threshold (all-MiniLM-L6-v2's word-embedding gradient: 45 MiB). So every
  block stays in the heap once freed, ready for the next step: a fine-tuning step then takes a tenth of the page
  faults it takes with glibc's defaults (tests/core/test_memory.py counts them). The heap then holds the step's peak
  (what the peak RSS was anyway) until the process ends.
- Serving (``return_large_blocks``, ``encoderkit serve --steady-memory``): the opposite, so that resident memory
  stays flat while batches of every size come and go, at a cost in speed (see there).

A user who set the MALLOC_* variables in the environment keeps their choice; on a C library other than glibc
nothing changes. Each function returns None when its settings took effect, else why they did not.
"""
from __future__ import annotations

import ctypes
import os

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
LARGE_BLOCK = 128 * 1024
_NEVER = 2**31 - 1  # mallopt takes an int

_kept = False  # keep_freed_memory's settings took effect (mallopt's settings last for the process)


def _mallopt(settings: dict[int, int], environment: tuple[str, ...]) -> str | None:
    own = [name for name in environment if name in os.environ]
    if own:
        return f"{' and '.join(own)} {'is' if len(own) == 1 else 'are'} set in the environment, and kept"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "this C library is not glibc (no libc.so.6 with mallopt); resident memory is left to it"
    if not all(mallopt(parameter, value) for parameter, value in settings.items()):
        return "glibc refused the mallopt settings"
    return None


def keep_freed_memory() -> str | None:
    """Training: freed blocks stay in the heap for the next step (no mmap for large blocks, no trimming)."""
    global _kept
    if _kept:
        return None
    unapplied = _mallopt({_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: _NEVER},
                         ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"))
    _kept = unapplied is None
    return unapplied


def return_large_blocks() -> str | None:
    """Keep a long-running server's resident memory flat: blocks of 128 KiB and more (activations) are mapped and
    returned to the system when freed, and freed memory at the heap's top is released.

    Why: batches of every size come and go; glibc raises its mmap threshold after the first large free (up to
    32 MiB), so activations then come from the heap, whose free pieces of odd sizes are kept. Measured with
    bench/serve_load.py's soak (8 clients, all-MiniLM-L6-v2): resident memory climbed from 350 MiB to a 2.0 GiB
    plateau after about two minutes; with these settings it stays at about 870 MiB from the first 30 s, but the
    server's throughput fell by about 30% (each large block is mapped and faulted in anew), hence opt-in
    (``--steady-memory``)."""
    return _mallopt({_M_MMAP_THRESHOLD: LARGE_BLOCK, _M_TRIM_THRESHOLD: LARGE_BLOCK},
                    ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"))


__all__ = ["keep_freed_memory", "return_large_blocks"]
