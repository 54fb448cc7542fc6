"""encoderkit.memory: glibc's malloc keeps a training step's freed memory for the next step (no page faults)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# In a child process: mallopt changes the allocator of the whole process it runs in. A 64 MiB tensor (above any
# mmap threshold glibc sets itself) is allocated, written and freed, as a training step does, eight times: the page
# faults of the last four (the heap has settled by then; it can take the first two or three to do so).
CHILD = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from encoderkit.memory import keep_freed_memory
    print("unapplied:", keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(8):
    if step == 4:
        before = faults()
    block = torch.ones(16 * 2**20)
    del block
print("faults:", faults() - before)
"""


def _run(mode: str, environment: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")} | (environment or {})
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(line.split(": ", 1) for line in done.stdout.strip().splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_reuses_large_blocks_without_page_faults():
    pages = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert int(_run("default")["faults"]) > 3 * pages  # glibc maps the block anew each time: a fault per page
    kept = _run("keep")
    assert kept["unapplied"] == "None"
    assert int(kept["faults"]) < pages // 20  # the freed block came back from the heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_leaves_a_users_malloc_settings_alone():
    kept = _run("keep", {"MALLOC_MMAP_MAX_": "65536"})
    assert kept["unapplied"] == "MALLOC_MMAP_MAX_ is set in the environment, and kept"
