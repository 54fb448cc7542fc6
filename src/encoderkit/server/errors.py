"""Errors as the server answers them: text-embeddings-inference's body, ``{"error": ..., "error_type": ...}``.

The types are TEI's (Validation, Overloaded, Backend, Unhealthy, Tokenizer) plus Unauthorized, NotFound and
Timeout for the cases TEI answers without a body. Every error a handler raises is an ``ApiError``; an
``EncoderkitError`` from a pipeline is the client's input (422); anything else is a bug (500, logged), and
the server goes on serving.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import EncoderkitError

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "Validation", 401: "Unauthorized", 404: "NotFound", 405: "Validation", 413: "Validation",
               415: "Validation", 422: "Validation", 429: "Overloaded", 500: "Backend", 503: "Unhealthy",
               504: "Timeout"}


class ApiError(Exception):
    """An error answered with ``status`` and a message that says what was wrong and what to do."""

    def __init__(self, status: int, message: str, error_type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ERROR_TYPES.get(status, "Backend")
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.error_type, self.headers)


def error_response(status: int, message: str, error_type: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type or ERROR_TYPES.get(status, "Backend")},
                        status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error path of the app answers in the one error shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EncoderkitError)
    async def input_error(request: Request, exc: EncoderkitError) -> JSONResponse:
        return error_response(422, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, describe_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /docs for the endpoints"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not take {request.method}; see /docs for the endpoints"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def describe_validation_errors(errors: list[dict[str, Any]]) -> str:
    """Pydantic's errors as one line that names each field: ``inputs[2]: Input should be a valid string``.
    A union reports one error per member; those are merged under their field."""
    by_field: dict[str, list[str]] = {}
    for error in errors:
        location = [part for part in error.get("loc", ()) if part != "body"]
        field = ""
        for part in location:
            if isinstance(part, int):
                field += f"[{part}]"
            elif not field:
                field = str(part)
            elif _is_union_tag(part):
                continue
            else:
                field += f".{part}"
        message = error.get("msg", "invalid")
        if error.get("type") == "missing":
            message = "this field is required"
        by_field.setdefault(field or "body", [])
        if message not in by_field[field or "body"]:
            by_field[field or "body"].append(message)
    return "; ".join(f"{field}: {' or '.join(messages)}" for field, messages in by_field.items())


def _is_union_tag(part: str) -> bool:
    """Pydantic names a union member in the location (``str``, ``list[str]``, ``function-after[...]``)."""
    return part in ("str", "int", "float", "bool") or "[" in part


__all__ = ["ApiError", "ERROR_TYPES", "describe_validation_errors", "error_response", "install_error_handlers"]
