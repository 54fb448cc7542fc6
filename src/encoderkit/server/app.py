"""The HTTP app: ``create_app(registry, settings)``, a FastAPI app over the served models.

Routes (text-embeddings-inference's and OpenAI's where they have one): POST /embed, /v1/embeddings, /rerank,
/predict, /ner, /qa, /fill-mask, /tokenize, /search; GET /health, /info, /metrics; OpenAPI at /docs and
/openapi.json. ``GET /`` and ``/static`` belong to the web studio (``server.studio``), mounted when present.
"""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse

from .. import __version__
from .endpoints import RUNNERS, router
from .errors import install_error_handlers
from .guard import Guard
from .registry import ModelRegistry
from .settings import ServerSettings
from .state import ServerState
from .studio import ATTENTION_PATH as STUDIO_ATTENTION, is_public as studio_is_public, mount_studio

INFERENCE_PATHS = {"/embed", "/v1/embeddings", "/rerank", "/predict", "/ner", "/qa", "/fill-mask", "/search",
                   "/embed_sparse", "/embed_all"}
SERVICE_PATHS = {"/tokenize", "/health", "/info", "/metrics", "/docs", "/openapi.json", "/", "/v1/models"}


def create_app(registry: ModelRegistry, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    state = ServerState(registry, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start(RUNNERS)
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(title="encoderkit", version=__version__, lifespan=lifespan,
                  description="Encoder models over HTTP: embeddings (text-embeddings-inference and OpenAI "
                              "compatible), reranking, classification, NER, QA, fill-mask, search.")
    app.state.server = state
    app.state.registry = registry
    install_error_handlers(app)
    app.include_router(router)
    _service_routes(app, state)

    mount_studio(app, registry)

    # The studio's page and static files are public (a browser cannot send a key before the page asks for it);
    # its attention route is not, and it counts toward the concurrency limit like the other model routes.
    app.add_middleware(Guard, settings=settings, metrics=state.metrics,
                       inference_paths=INFERENCE_PATHS | {STUDIO_ATTENTION},
                       known_paths=INFERENCE_PATHS | SERVICE_PATHS | {STUDIO_ATTENTION}, is_public=studio_is_public)
    if settings.cors_origins:  # outermost: a browser's preflight is answered before the key is asked for
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    return app


def _service_routes(app: FastAPI, state: ServerState) -> None:
    registry, settings = state.registry, state.settings

    @app.get("/health", summary="200 while the server serves")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/info", summary="The served models: family, endpoints, dimensions, limits")
    async def info() -> JSONResponse:
        return JSONResponse(server_info(state))

    @app.get("/metrics", summary="Prometheus metrics (text format)")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", summary="The served models, as OpenAI's model list (what OpenAI clients ask first)")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "encoderkit"} for name in registry.names()]})

    del health, info, metrics, models  # registered on the app


def server_info(state: ServerState) -> dict[str, Any]:
    """The models and what each serves, the limits, and the index; the default model's facts also at the top
    level under text-embeddings-inference's names (model_id, model_dtype, max_input_length, ...)."""
    registry, settings = state.registry, state.settings
    models = []
    for name in registry.names():
        model = registry.get(name)
        models.append({**model.info(), "endpoints": state.routes_of(model),
                       "max_batch_tokens": min(model.token_budget(k) for k in model.kinds)})
    default = models[0]
    search = registry.search
    return {
        "model_id": default["name"], "model_dtype": default["dtype"], "max_input_length": default["max_input_length"],
        "max_batch_tokens": default["max_batch_tokens"],
        "max_concurrent_requests": settings.max_concurrent_requests,
        "max_client_batch_size": settings.max_client_batch_size, "payload_limit": settings.payload_limit,
        "request_timeout": settings.request_timeout, "auto_truncate": False, "version": __version__,
        "default_model": registry.default, "models": models,
        "index": None if search is None else {"count": len(search.index), "dimension": search.index.dimension,
                                              "metric": search.index.metric, "kind": search.index.kind,
                                              "model": search.model, "texts": search.texts is not None},
    }


__all__ = ["create_app", "server_info"]
