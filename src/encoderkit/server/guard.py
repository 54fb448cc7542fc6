"""The gate every request passes before a handler: API key, concurrency, body size, and the request metrics.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which would hide the client's disconnect from the
handlers that watch for it). In order:

1. ``Authorization: Bearer <key>`` when the server has a key, on every route but /health: else 401.
2. An inference route (POST to a model endpoint) beyond ``max_concurrent_requests`` in flight: 429 with
   ``Retry-After``, answered at once, before the body is read.
3. The body is read here, at most ``payload_limit`` bytes (a larger Content-Length, or a stream that grows past
   it: 413), and replayed to the app; after it, the app's ``receive`` still reports the client's disconnect.
4. Every answer is counted by route and status, and timed.
"""
from __future__ import annotations

import hmac
import time
from typing import Any, Awaitable, Callable

from .errors import error_response
from .metrics import Metrics
from .settings import ServerSettings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health"})
RETRY_AFTER_SECONDS = 1


class Guard:
    def __init__(self, app: ASGIApp, *, settings: ServerSettings, metrics: Metrics, inference_paths: set[str],
                 known_paths: set[str], is_public: Callable[[str], bool] | None = None) -> None:
        self.app = app
        self.is_public = is_public or (lambda path: False)  # further paths served without a key
        self.settings = settings
        self.metrics = metrics
        self.inference_paths = inference_paths
        self.known_paths = known_paths  # the route label of an answer given before routing; others: "other"
        self.in_flight = 0
        self._expected_authorization = f"Bearer {settings.api_key}".encode() if settings.api_key else None
        metrics.in_flight.set(0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        started = time.perf_counter()
        status = [500]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        inference = scope["method"] == "POST" and path in self.inference_paths
        counted = False
        try:
            if self._expected_authorization is not None and path not in PUBLIC_PATHS \
                    and not self.is_public(path) and not self._authorized(scope):
                await error_response(401, "this server needs an API key: send the header "
                                          "'Authorization: Bearer <key>'",
                                     headers={"WWW-Authenticate": "Bearer"})(scope, receive, send_counted)
                return
            if inference:
                if self.in_flight >= self.settings.max_concurrent_requests:
                    await error_response(429, f"the server is at its limit of {self.settings.max_concurrent_requests}"
                                              " concurrent requests; retry later",
                                         headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
                                         )(scope, receive, send_counted)
                    return
                self.in_flight += 1
                counted = True
                self.metrics.in_flight.set(self.in_flight)
            if scope["method"] in ("POST", "PUT", "PATCH"):
                body, problem = await self._read_body(scope, receive)
                if problem is not None:
                    await problem(scope, receive, send_counted)
                    return
                if body is None:  # the client left while sending
                    status[0] = 499
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_counted)
        finally:
            if counted:
                self.in_flight -= 1
                self.metrics.in_flight.set(self.in_flight)
            # the route the app matched (its template), so that unknown paths do not each make a series
            route = getattr(scope.get("route"), "path", None) or (path if path in self.known_paths else "other")
            self.metrics.requests.inc(route=route, status=str(status[0]))
            self.metrics.latency.observe(time.perf_counter() - started, route=route)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                return hmac.compare_digest(value.strip(), self._expected_authorization)
        return False

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[bytes | None, Any]:
        """(the body, None), (None, None) if the client disconnected, or (None, a 413 response)."""
        limit = self.settings.payload_limit
        too_large = error_response(413, f"the request body is larger than the server's limit of {limit} bytes "
                                        "(--payload-limit); send fewer or shorter inputs per request")
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        return None, too_large
                except ValueError:
                    return None, error_response(400, "the Content-Length header is not a number")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None, too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read already, then the client's later messages (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
