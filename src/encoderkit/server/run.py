"""Running the app on uvicorn, with a graceful stop.

On SIGTERM (or Ctrl+C) uvicorn stops accepting connections, waits for the requests in flight to be answered
(the batchers keep running until then: they stop in the app's lifespan, after the connections), and returns.
uvicorn then raises the captured signal again for the handler that was there before it; for SIGTERM that is
ours, a no-op, so a stop that finished its work exits 0.
"""
from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import signal
from typing import Any

from .registry import ModelRegistry
from .settings import ServerSettings

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(registry: ModelRegistry, settings: ServerSettings, *, host: str = "127.0.0.1", port: int = 8080,
          log_level: str = "info", steady_memory: bool = False) -> int:
    """Serve until stopped; 0 after a graceful stop."""
    import uvicorn

    from .app import create_app

    if not is_loopback(host) and settings.api_key is None:
        log.warning("listening on %s without an API key: anyone who reaches this address can use the models "
                    "(set --api-key or ENCODERKIT_API_KEY)", host)
    if steady_memory:
        unapplied = return_large_blocks()
        if unapplied:
            log.warning("--steady-memory has no effect: %s", unapplied)
    config = uvicorn.Config(create_app(registry, settings), host=host, port=port, log_level=log_level,
                            lifespan="on", server_header=False, proxy_headers=False)
    server = uvicorn.Server(config)
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LARGE_BLOCK = 128 * 1024


def return_large_blocks() -> str | None:
    """Keep a long-running server's resident memory flat: blocks of 128 KiB and more (activations) are mapped and
    returned to the system when freed, and freed memory at the heap's top is released.

    Why: batches of every size come and go; glibc raises its mmap threshold after the first large free (up to
    32 MiB), so activations then come from the heap, whose free pieces of odd sizes are kept. Measured with
    bench/serve_load.py's soak (8 clients, all-MiniLM-L6-v2): resident memory climbed from 350 MiB to a 2.0 GiB
    plateau after about two minutes; with these settings it stays at about 870 MiB from the first 30 s, but the
    server's throughput fell by about 30% (each large block is mapped and faulted in anew), hence opt-in
    (``--steady-memory``). A user who
    sets MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ keeps their own choice. Not glibc: nothing changes.

    Returns None when the settings took effect, else why they did not (the server says so)."""
    own = [name for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if name in os.environ]
    if own:
        return f"{' and '.join(own)} {'is' if len(own) == 1 else 'are'} set in the environment, and kept"
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "this C library is not glibc (no libc.so.6 with mallopt); resident memory is left to it"
    if not (mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK) and mallopt(_M_TRIM_THRESHOLD, LARGE_BLOCK)):
        return "glibc refused the mallopt settings"
    return None


def _stopped(signum: int, frame: Any) -> None:
    """SIGTERM after uvicorn's graceful stop: the work is done, nothing left to do."""
