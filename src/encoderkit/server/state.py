"""What the app holds while it runs: the models, the settings, the metrics, the worker thread and one batcher per
model and kind of work; and the two things every endpoint does with them (pick the model, run the work)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from fastapi import Request
from starlette.responses import Response

from ..threads import compute_executor
from .batching import Batcher
from .errors import ApiError
from .metrics import Metrics
from .registry import ModelRegistry, ServedModel, UnknownModel
from .settings import ServerSettings

# kind of endpoint -> the routes that serve it
ROUTES = {"embed": ("/embed", "/v1/embeddings"), "rerank": ("/rerank",), "predict": ("/predict",), "ner": ("/ner",),
          "qa": ("/qa",), "fill-mask": ("/fill-mask",), "embed_sparse": ("/embed_sparse",),
          "embed_all": ("/embed_all",)}
WHAT = {"embed": "embed", "rerank": "rerank", "predict": "classify", "ner": "tag entities", "qa": "answer questions",
        "fill-mask": "fill masks", "embed_sparse": "give sparse vectors", "embed_all": "give token vectors"}
# a kind's work -> the batcher it goes through (rerank and predict both run the classifier on sequences)
WORK = {"embed": "embed", "rerank": "classify", "predict": "classify", "ner": "ner", "qa": "qa",
        "fill-mask": "fill-mask", "embed_sparse": "embed_sparse", "embed_all": "embed_all"}


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its queued work was dropped."""


class ServerState:
    def __init__(self, registry: ModelRegistry, settings: ServerSettings) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = Metrics()
        self.executor: ThreadPoolExecutor | None = None
        self.tokenizer_thread: ThreadPoolExecutor | None = None
        self.batchers: dict[tuple[str, str], Batcher] = {}

    # ----- life cycle ---------------------------------------------------------------------------
    def start(self, runners: dict[str, Callable[[ServedModel], Callable[[list[Any]], Sequence[Any]]]]) -> None:
        """One worker thread for the models (the CPU runs one batch at a time): the process's compute thread, which
        loaded them (``encoderkit.threads``); a batcher per model and work; and one thread for the server's
        tokenizers (one thread: a tokenizer's truncation setting is state)."""
        self.executor = compute_executor()
        self.tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoderkit-tokenize")
        for name in self.registry.names():
            model = self.registry.get(name)
            for kind in sorted(model.kinds):
                work = WORK[kind]
                if (name, work) in self.batchers:
                    continue
                batcher = Batcher(f"{name}/{work}", runners[work](model), token_budget=model.token_budget(kind),
                                  executor=self.executor, metrics=self.metrics, labels={"model": name, "kind": work})
                batcher.start()
                self.batchers[(name, work)] = batcher

    async def stop(self) -> None:
        for batcher in self.batchers.values():
            await batcher.stop()
        self.batchers.clear()
        if self.tokenizer_thread is not None:  # the compute thread is the process's: it stays, idle
            self.tokenizer_thread.shutdown(wait=True)
        self.executor = self.tokenizer_thread = None

    # ----- what every endpoint does ---------------------------------------------------------------
    def model_for(self, kind: str, name: str | None) -> ServedModel:
        """The requested model (or the default for ``kind``), checked to serve ``kind``."""
        registry = self.registry
        serving = registry.serving(kind)
        if name is None:
            if not serving:
                raise ApiError(404, f"no served model can {WHAT[kind]} ({ROUTES[kind][0]}); this server's models: "
                                    f"{self._describe_all()}")
            return registry.get(registry.default if registry.default in serving else serving[0])
        model = self.named(name)
        if kind not in model.kinds:
            others = f"; models that can: {', '.join(serving)}" if serving else ""
            raise ApiError(400, f"model {name!r} (a {model.config.model_type} {model.task} model) cannot "
                                f"{WHAT[kind]}: it serves {self._routes_of(model)}{others}")
        return model

    def named(self, name: str | None) -> ServedModel:
        """The model called ``name`` (None: the default); 404 for a name not served."""
        try:
            return self.registry.get(name)
        except UnknownModel as exc:
            raise ApiError(404, str(exc)) from exc

    def routes_of(self, model: ServedModel) -> list[str]:
        routes = [route for kind in sorted(model.kinds) for route in ROUTES[kind]] + ["/tokenize"]
        if self.registry.search is not None and self.registry.search.model == model.name:
            routes.append("/search")
        return routes

    def _routes_of(self, model: ServedModel) -> str:
        return ", ".join(self.routes_of(model))

    def _describe_all(self) -> str:
        return "; ".join(f"{name} ({self._routes_of(self.registry.get(name))})" for name in self.registry.names())

    async def run(self, request: Request, model: ServedModel, kind: str, payloads: Sequence[Any],
                  costs: Sequence[int]) -> list[Any]:
        """Queue the work and wait for it, at most ``request_timeout`` seconds; a client that disconnects, or a
        timeout, cancels what is still queued."""
        batcher = self.batchers[(model.name, WORK[kind])]
        work = asyncio.ensure_future(batcher.submit(payloads, costs))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, gone}, timeout=self.settings.request_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if work in done:
            return work.result()
        work.cancel()
        if gone in done:
            raise ClientGone()
        raise ApiError(504, f"the request did not finish within {self.settings.request_timeout:g} s "
                            "(--request-timeout); its queued work was dropped: retry, or send fewer inputs")

    async def tokenizing(self, function: Callable[[], Any]) -> Any:
        """Run ``function`` (tokenising with the served models' own tokenizers) on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, function)

    async def in_worker(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function`` on the model thread (work that is not batched, such as an index scan)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def client_gone_response() -> Response:
    """Nobody reads it; 499 (nginx's "client closed request") is what the metrics count."""
    return Response(status_code=499)
