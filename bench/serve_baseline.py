"""The baseline of bench/serve_load.py: the embedding server a user writes by hand with FastAPI and
sentence-transformers. ``POST /embed {"inputs": str | [str]}`` answers ``[[float]]`` from
``SentenceTransformer.encode`` (normalised by the model's own Normalize module); no batching across requests, no
limits, no metrics. The handler is a plain ``def``, so FastAPI runs each request on its thread pool.

    python bench/serve_baseline.py MODEL_DIR --port 8081 [--host 127.0.0.1]
"""
from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    uvicorn.run(create_app(args.model_dir), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
