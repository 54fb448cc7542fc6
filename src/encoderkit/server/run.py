"""Running the app on uvicorn, with a graceful stop.

On SIGTERM (or Ctrl+C) uvicorn stops accepting connections, waits for the requests in flight to be answered
(the batchers keep running until then: they stop in the app's lifespan, after the connections), and returns.
uvicorn then raises the captured signal again for the handler that was there before it; for SIGTERM that is
ours, a no-op, so a stop that finished its work exits 0.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
from typing import Any

from ..memory import return_large_blocks
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


def _stopped(signum: int, frame: Any) -> None:
    """SIGTERM after uvicorn's graceful stop: the work is done, nothing left to do."""
