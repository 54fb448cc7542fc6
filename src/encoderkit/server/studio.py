"""The web studio: one page at ``/`` (hand-written HTML, JS and CSS under ``static/``, nothing from a CDN)
and the JSON routes that only the page needs.

- ``GET /``: the page. ``GET /studio/static/...``: its script and style sheet.
- ``GET /studio/models``: the served models as the page needs them (layers, heads, mask token, which task
  panels apply) and whether a search index is loaded.
- ``POST /studio/attention``: one head of one model for a text (or pair), under the model's own
  (bidirectional) mask and re-run under a causal mask, with the head's statistics under both.

The task panels (fill-mask, classify, NER, QA, search) call the server's own routes. The attention maps
of the last few inputs are kept, so moving between layers and heads does not run the model again.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ..analysis.attention import MASKS, AttentionAnalyzer, AttentionMaps, HeadStatistics
from ..errors import EncoderkitError, InputError
from ..threads import compute_executor
from .endpoints import parse
from .errors import ApiError, error_response

STATIC_DIR = Path(__file__).with_name("static")
STATIC_PREFIX = "/studio/static"
# What a browser fetches before it can send a key: the page, its script and its style sheet. They hold no data, so
# an API key guards the JSON routes, not these (the server's guard asks ``is_public``).
PUBLIC_PATHS = frozenset({"/"})
ATTENTION_PATH = "/studio/attention"  # the studio's one model route: it needs the key and counts as inference
MAX_TEXT_CHARS = 2000  # for the text and for the pair; beyond it 413 before anything is tokenised
MAX_TOKENS = 128  # a heatmap of 128 x 128 cells is as much as a page can show and read
CACHED_INPUTS = 4  # inputs whose maps (every layer and head, both masks) are kept
DECIMALS = 6  # weights are sent rounded: the page shows 6 decimals and 1e-6 is far below what the eye sees
# The page's own script and style only: no inline script, no other origin.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


class AttentionRequest(BaseModel):
    """The body of ``POST /studio/attention``. Strict, as the server's own bodies: "2" is not a layer."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: str = Field(description=f"the text, at most {MAX_TEXT_CHARS} characters")
    pair: Optional[str] = Field(None, description="an optional second text: the input is the pair (text, pair)")
    model: Optional[str] = Field(None, description="a served model's name; default: the first model")
    layer: int = Field(0, description="numbered from 0")
    head: int = Field(0, description="numbered from 0")


# The body is read by ``parse`` (the server's reader: 400 for bad JSON, 422 naming the field); this documents it.
ATTENTION_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": AttentionRequest.model_json_schema()}}}}


class Registry(Protocol):
    """What the studio needs from the server's model registry."""

    default: str
    index_path: Path | None

    def names(self) -> list[str]: ...
    def path(self, name: str) -> Path: ...
    def kinds(self, name: str) -> set[str]: ...


@dataclass
class _Input:
    """One input's maps under both masks, every layer and head, and their per-head statistics."""

    maps: dict[str, AttentionMaps]
    statistics: dict[str, HeadStatistics]


class Studio:
    """The studio's state: an attention analyzer per model, loaded on first use, and the last inputs' maps."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._analyzers: dict[str, AttentionAnalyzer] = {}
        self._model_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._inputs: OrderedDict[tuple[str, str, str | None], _Input] = OrderedDict()
        self._models: dict[str, Any] | None = None  # the registry is fixed at start-up: computed once

    def model_name(self, requested: str | None) -> str:
        names = list(self.registry.names())
        if not requested:
            return self.registry.default
        if requested not in names:
            raise ApiError(422, f"model: unknown model {requested!r}; this server has {', '.join(map(repr, names))}")
        return requested

    def _model_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._model_locks.setdefault(name, threading.Lock())

    def analyzer(self, name: str) -> AttentionAnalyzer:
        """The model's analyzer, loaded from its directory on first use (one load even under concurrent requests)."""
        with self._model_lock(name):
            if name not in self._analyzers:
                self._analyzers[name] = AttentionAnalyzer.from_pretrained(self.registry.path(name))
            return self._analyzers[name]

    def models(self) -> dict[str, Any]:
        """The served models with what the page needs to set up its controls (from config.json and the tokenizer)."""
        from ..config import EncoderConfig
        from ..io.hub import resolve_model

        if self._models is not None:
            return self._models

        models = []
        for name in self.registry.names():
            resolved = resolve_model(self.registry.path(name))
            config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
            models.append({"name": name, "family": config.model_type, "layers": config.num_hidden_layers,
                           "heads": config.num_attention_heads, "kinds": sorted(self.registry.kinds(name)),
                           "mask_token": _mask_token(resolved.tokenizer_dir)})
        self._models = {"default": self.registry.default, "models": models,
                        "search": self.registry.index_path is not None,
                        "limits": {"max_chars": MAX_TEXT_CHARS, "max_tokens": MAX_TOKENS}, "masks": list(MASKS)}
        return self._models

    def attention(self, request: AttentionRequest) -> dict[str, Any]:
        """The answer of ``POST /studio/attention`` (blocking: run it off the event loop)."""
        for field in ("text", "pair"):
            value = getattr(request, field)
            if value is not None and len(value) > MAX_TEXT_CHARS:
                raise ApiError(413, f"{field}: {len(value)} characters; the studio takes at most {MAX_TEXT_CHARS}")
        if not request.text.strip():
            raise ApiError(422, "text: the text is empty; type a sentence to see its attention")
        text, pair = request.text, request.pair if request.pair and request.pair.strip() else None
        layer, head = request.layer, request.head
        name = self.model_name(request.model)
        analyzer = self.analyzer(name)
        try:
            analyzer.check_layer_head(layer, head)
        except InputError as exc:
            raise ApiError(422, str(exc)) from None
        item = self._maps(name, analyzer, text, pair)
        first = item.maps["bidirectional"]
        answer: dict[str, Any] = {
            "model": name, "layers": first.num_layers, "heads": first.num_heads, "layer": layer, "head": head,
            "tokens": first.tokens, "special": first.special_positions, "segments": first.sequence_ids,
        }
        for mask in MASKS:
            answer[mask] = np.round(item.maps[mask].head(layer, head).astype(np.float64), DECIMALS).tolist()
        stats = item.statistics["bidirectional"]
        answer["statistics"] = {
            "categories": stats.categories, "descriptions": stats.category_descriptions,
            "uniform_entropy": stats.uniform_entropy,
            **{mask: head_summary(item.statistics[mask], layer, head) for mask in MASKS},
        }
        return answer

    def _maps(self, name: str, analyzer: AttentionAnalyzer, text: str, pair: str | None) -> _Input:
        key = (name, text, pair)
        with self._lock:
            if key in self._inputs:
                self._inputs.move_to_end(key)
                return self._inputs[key]
        limit = min(MAX_TOKENS, analyzer.max_length)
        count = len(analyzer.tokenizer.encode(text, pair, truncation=False))
        if count > limit:
            raise ApiError(413, f"the input is {count} tokens long; the attention explorer shows at most {limit} "
                                   "tokens: shorten the text")
        with self._model_lock(name):  # one forward at a time per model: they would only compete for the cores
            maps = {mask: analyzer.attend(text, pair, mask=mask) for mask in MASKS}
        item = _Input(maps=maps, statistics={mask: m.statistics() for mask, m in maps.items()})
        with self._lock:
            self._inputs[key] = item
            while len(self._inputs) > CACHED_INPUTS:
                self._inputs.popitem(last=False)
        return item


def is_public(path: str) -> bool:
    """Whether ``path`` is the studio's page or one of its static files (served without an API key)."""
    return path in PUBLIC_PATHS or path.startswith(STATIC_PREFIX + "/")


def head_summary(statistics: HeadStatistics, layer: int, head: int) -> dict[str, float]:
    """One head's shares per category and its entropy (nats), as plain floats."""
    summary = {name: float(statistics.shares[name][layer, head]) for name in statistics.categories}
    summary["entropy"] = float(statistics.entropy[layer, head])
    return summary


def _mask_token(tokenizer_dir: Path) -> str | None:
    from ..tokenizer import Tokenizer

    try:
        return Tokenizer.from_pretrained(tokenizer_dir).mask_token
    except EncoderkitError:
        return None


def mount_studio(app: FastAPI, registry: Registry) -> None:
    """Add the studio's page, static files and JSON routes to the server's FastAPI ``app``."""
    studio = Studio(registry)
    app.state.studio = studio

    @app.get("/", include_in_schema=False)
    async def studio_page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Cache-Control": "no-cache"})

    @app.get("/studio/models", tags=["studio"], summary="The served models as the web studio needs them")
    async def studio_models() -> JSONResponse:
        return JSONResponse(await run_in_threadpool(studio.models))

    @app.post(ATTENTION_PATH, tags=["studio"], openapi_extra=ATTENTION_OPENAPI,
              summary="One head's attention under the bidirectional and a causal mask, with its statistics")
    async def studio_attention(request: Request) -> JSONResponse:
        # Refusals are answered here, not left to the server's handlers: the studio also mounts on a bare app.
        try:
            body = await parse(request, AttentionRequest)
            # on the compute thread: its model (loaded there on first use) must not start OpenMP teams of its own
            return JSONResponse(await asyncio.get_running_loop().run_in_executor(compute_executor(), studio.attention,
                                                                                  body))
        except ApiError as exc:
            return exc.response()
        except InputError as exc:
            return error_response(422, str(exc))

    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="studio-static")
