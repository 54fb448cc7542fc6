"""The one thread a process's model work runs on, when it does not run on the caller's.

torch's CPU wheels run their parallel regions on GNU OpenMP (libgomp). libgomp gives every thread that starts a
parallel region a team of worker threads of its own, and counts the threads of all teams. Once it counts more
than the process may use CPUs, every team stops spinning between parallel regions and sleeps on a futex instead
(libgomp's "throttled" spin count), so each of the hundreds of short parallel regions of a forward pass pays a
wake-up. Loading a model on one thread (copying weights runs parallel regions) and running it on another is enough
to get there on a 2-CPU machine: there, a model loaded on one thread and run on another switched context about 150
times as often as one loaded and run on the same thread, and embedded more slowly.

So code that runs models away from the thread that calls it (the server's batchers, the studio, a Ray actor, whose
methods Ray calls on threads of its own) loads and runs them through ``on_compute_thread``: one thread per process,
never shut down (it waits idle, holding no team's threads busy).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")
THREAD_NAME = "encoderkit-compute"

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_ident: list[int] = []  # the compute thread's ident, once it runs


def compute_executor() -> ThreadPoolExecutor:
    """The process's compute thread, as an executor of one worker (for ``loop.run_in_executor``)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME,
                                           initializer=lambda: _ident.append(threading.get_ident()))
        return _executor


def on_compute_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` run on the compute thread: its result, or its exception raised here. Called
    on the compute thread itself, it calls ``function`` directly (no deadlock waiting for itself)."""
    if _ident and threading.get_ident() == _ident[0]:
        return function(*args, **kwargs)
    return compute_executor().submit(function, *args, **kwargs).result()
