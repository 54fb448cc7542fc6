"""Helpers for the server's tests: tiny models of every head, the app in-process (httpx's ASGI transport, the
app's lifespan run around it), a gate that holds the model thread, and a raw ASGI call that can hang up."""
from __future__ import annotations

import asyncio
import json
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from helpers import tiny_bert_dir

NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def tiny_models(root: Path, tokenizer_source: Path) -> dict[str, Path]:
    """One tiny random model per head, with the MiniLM tokenizer: name -> directory."""
    specs = {
        "rerank": dict(task="sequence-classification", id2label={0: "LABEL_0"}),
        "sentiment": dict(task="sequence-classification", id2label={0: "negative", 1: "neutral", 2: "positive"}),
        "ner": dict(task="token-classification", id2label=NER_LABELS),
        "qa": dict(task="question-answering"),
        "mlm": dict(task="masked-lm"),
    }
    dirs = {name: tiny_bert_dir(root / name, tokenizer_source, **spec) for name, spec in specs.items()}
    config_path = dirs["qa"] / "config.json"  # windows of 128 tokens need a stride below the default 128
    config = json.loads(config_path.read_text())
    config["encoderkit"] = {"doc_stride": 32}
    config_path.write_text(json.dumps(config))
    return dirs


def saved_index(root: Path, minilm_dir: Path, passages: list[str]) -> Path:
    """A search index of ``passages`` (ids doc0, doc1, ...) embedded by the default model, saved under ``root``
    with its texts (for ``ModelRegistry.load(index=)``)."""
    from encoderkit.tasks.embed import Embedder
    from encoderkit.tasks.search import build_index

    corpus = root / "corpus.txt"
    corpus.write_text("".join(t + "\n" for t in passages), encoding="utf-8")
    index = build_index(Embedder.from_pretrained(minilm_dir).encode(passages), [f"doc{i}" for i in range(len(passages))])
    index.info = {"model": str(minilm_dir), "texts": str(corpus)}
    return index.save(root / "index")


@asynccontextmanager
async def client_of(app: Any, headers: dict[str, str] | None = None,
                    raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app, inside the app's lifespan (batchers started, stopped after).
    ``raise_app_exceptions=False``: a request whose error is a 500 gets its response, as a client of the real
    server would (by default the exception is raised in the test, which makes every bug loud)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", headers=headers,
                                     timeout=60) as client:
            yield client


class Gate:
    """Holds a batcher's batches until opened, and records every batch's items.
    ``await gate.entered()`` returns once a batch is waiting on the gate (the model thread is busy)."""

    def __init__(self, batcher: Any) -> None:
        self.batcher = batcher
        self.run = batcher.run
        self.opened = threading.Event()
        self.started = threading.Event()
        self.batches: list[list[Any]] = []
        self.first: httpx.Response | None = None  # see busy_model
        batcher.run = self._run

    def _run(self, items: list[Any]) -> Any:
        self.batches.append(list(items))
        self.started.set()
        self.opened.wait(30)
        return self.run(items)

    async def entered(self) -> None:
        for _ in range(3000):
            if self.started.is_set():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("no batch reached the gate")

    def open(self) -> None:
        """Let the batches run (this one and, without waiting, every later one, still recorded)."""
        self.opened.set()


@asynccontextmanager
async def busy_model(batcher: Any, client: httpx.AsyncClient, first: tuple[str, Any] = ("/embed", {"inputs": "busy"})
                     ) -> AsyncIterator[Gate]:
    """Inside, the model thread holds the batch of request ``first`` at a gate; on the way out the gate opens and
    that request's response is waited for (``gate.first``)."""
    gate = Gate(batcher)
    try:
        held = asyncio.ensure_future(client.post(first[0], json=first[1]))
        await gate.entered()
        yield gate
        gate.open()
        gate.first = await held
    finally:
        gate.open()


async def behind_a_busy_model(batcher: Any, client: httpx.AsyncClient, first: tuple[str, Any],
                              queued: list[tuple[str, Any]], depth: int) -> tuple[list[httpx.Response], list[list]]:
    """The ``queued`` requests, sent while the model is busy with ``first`` and answered once ``depth`` items wait
    in ``batcher``: their responses, and the batches the batcher ran (``first``'s, then theirs)."""
    async with busy_model(batcher, client, first) as gate:
        rest = [asyncio.ensure_future(client.post(path, json=body)) for path, body in queued]
        await wait_for(lambda: batcher.depth == depth, f"{depth} queued items")
    return list(await asyncio.gather(*rest)), gate.batches


async def wait_for(condition: Any, what: str, timeout: float = 30) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def hang_up_call(app: Any, path: str, body: dict[str, Any], hang_up: asyncio.Event) -> list[dict[str, Any]]:
    """POST ``body`` to the app as a raw ASGI call whose client disconnects once ``hang_up`` is set; returns
    the messages the app sent."""
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    sent_body = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": data, "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one series in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        found_name, _, label_text = series.partition("{")
        if found_name != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if part)
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0
