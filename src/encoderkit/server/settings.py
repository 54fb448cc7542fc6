"""The server's settings: limits, security and batching, fixed at start-up (``encoderkit serve`` options).
The token budget of a batch belongs to the models (``ModelRegistry.load(token_budget=)``), as it sets their
engines' forward passes too."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

# text-embeddings-inference's defaults where it has one (payload limit, client batch size, concurrency)
DEFAULT_PAYLOAD_LIMIT = 2_000_000
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_REQUEST_TIMEOUT = 60.0


@dataclass(frozen=True)
class ServerSettings:
    """``max_concurrent_requests``: inference requests in flight (queued or running); beyond, 429.
    ``max_client_batch_size``: inputs per request; beyond, 413. ``payload_limit``: body bytes; beyond, 413.
    ``request_timeout``: seconds a request may wait for its results; then 504 and its queued work is dropped.
    ``api_key``: every route but /health requires ``Authorization: Bearer <key>``.
    ``cors_origins``: origins allowed to call from a browser (none by default)."""

    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    payload_limit: int = DEFAULT_PAYLOAD_LIMIT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_concurrent_requests", "max_client_batch_size", "payload_limit"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be at least 1, found {getattr(self, name)}")
        if self.request_timeout <= 0:
            raise InputError(f"request_timeout must be positive, found {self.request_timeout}")
        if self.api_key is not None and not self.api_key.strip():
            raise InputError("the API key is empty; give a non-empty key or none")
