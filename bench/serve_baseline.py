"""The baseline of bench/serve_load.py: the embedding server a user writes by hand with FastAPI and
sentence-transformers. ``POST /embed {"inputs": str | [str]}`` answers ``[[float]]`` from
``SentenceTransformer.encode`` (normalised by the model's own Normalize module); no batching across requests, no
limits, no metrics. The handler is a plain ``def``, so FastAPI runs each request on its thread pool.

    python bench/serve_baseline.py MODEL_DIR --port 8081 [--host 127.0.0.1]

A smoke run (``common.SMOKE``) without a model directory serves nothing: it asks the app for two vectors of the
default model in process and checks their shape.
"""
from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

from common import SMOKE


class EmbedRequest(BaseModel):
    inputs: str | list[str]


def create_app(model_dir: str) -> FastAPI:
    model = SentenceTransformer(model_dir, device="cpu")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> list[list[float]]:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        return model.encode(texts, batch_size=32).tolist()

    return app


def smoke(model_dir: str | None) -> None:
    """A smoke run: the app (on the default model unless one is named) asked for its health and two vectors in
    process, without a port. It writes no result: this server is no benchmark (bench/registry.py), but what
    bench/serve_load.py measures against, and serve_load's smoke run serves with it."""
    from fastapi.testclient import TestClient

    from encoderkit import default_model_path

    texts = ["a smoke run of the baseline server", "two texts"]
    with TestClient(create_app(model_dir or str(default_model_path()))) as client:
        health = client.get("/health")
        answer = client.post("/embed", json={"inputs": texts})
    vectors = answer.json()
    if health.status_code != 200 or answer.status_code != 200 or len(vectors) != len(texts):
        raise SystemExit(f"the baseline answered {health.status_code} and {answer.status_code}: {answer.text[:300]}")
    print(f"smoke: the baseline answered {len(vectors)} vectors of {len(vectors[0])} for {len(texts)} texts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", **({"nargs": "?"} if SMOKE else {}))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    if SMOKE and args.model_dir is None:  # bench/serve_load.py's smoke run starts it on a model, to serve
        smoke(args.model_dir)
        return
    uvicorn.run(create_app(args.model_dir), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
