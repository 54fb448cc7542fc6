"""`encoderkit serve`: the models over HTTP (text-embeddings-inference and OpenAI compatible routes)."""
from __future__ import annotations

import click

from ..server.settings import (DEFAULT_MAX_CLIENT_BATCH_SIZE, DEFAULT_MAX_CONCURRENT_REQUESTS, DEFAULT_PAYLOAD_LIMIT,
                               DEFAULT_REQUEST_TIMEOUT)
from .options import dtype_option


def _named_model(value: str) -> tuple[str | None, str]:
    """NAME=DIR -> (NAME, DIR); DIR alone -> (None, DIR): the name is then the directory's."""
    name, sep, path = value.partition("=")
    if sep and name and path and "/" not in name:
        return name, path
    return None, value


@click.command()
@click.argument("model", metavar="MODEL")
@click.option("--model", "extra_models", multiple=True, metavar="NAME=DIR",
              help="another model to serve, chosen by the requests' \"model\" field (repeatable)")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (loopback by default)")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--index", "index_dir", default=None, help="a saved index (`encoderkit index`) for POST /search")
@click.option("--max-batch-tokens", type=int, default=None,
              help="padded tokens per batch (sequences x the longest); default: the engine's budget for the dtype")
@click.option("--max-concurrent-requests", type=int, default=DEFAULT_MAX_CONCURRENT_REQUESTS, show_default=True,
              help="inference requests in flight; beyond it, 429 with Retry-After")
@click.option("--max-client-batch-size", type=int, default=DEFAULT_MAX_CLIENT_BATCH_SIZE, show_default=True,
              help="inputs per request; beyond it, 413")
@click.option("--payload-limit", type=int, default=DEFAULT_PAYLOAD_LIMIT, show_default=True,
              help="request body bytes; beyond, 413")
@click.option("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, show_default=True,
              help="seconds a request may wait for its results; then 504")
@click.option("--api-key", envvar="ENCODERKIT_API_KEY", default=None, show_envvar=True,
              help="require 'Authorization: Bearer KEY' on every route but /health")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="an origin browsers may call from (repeatable; none by default)")
@click.option("--allow-pickle", is_flag=True,
              help="load pytorch_model.bin (weights only) where a model has no safetensors file")
@click.option("--steady-memory", is_flag=True,
              help="return large freed blocks to the system (glibc): resident memory stays near 870 MiB instead of a "
                   "2 GiB plateau for MiniLM, at about 30% less throughput (bench/serve_load.py)")
@dtype_option()
def serve(model: str, extra_models: tuple[str, ...], host: str, port: int, index_dir: str | None,
          max_batch_tokens: int | None, max_concurrent_requests: int, max_client_batch_size: int, payload_limit: int,
          request_timeout: float, api_key: str | None, cors_origins: tuple[str, ...], allow_pickle: bool,
          steady_memory: bool, dtype: str) -> int:
    """Serve MODEL (a directory, NAME=DIR, or "default") and the --model ones over HTTP: /embed,
    /v1/embeddings, /rerank, /predict, /ner, /qa, /fill-mask, /tokenize, /search, /info, /metrics, /docs."""
    from ..errors import InputError
    from ..extras import require

    require("serve", "encoderkit serve")  # before a model is loaded
    from ..server.run import serve as run_server
    from ..server import ModelRegistry, ServerSettings

    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise InputError(f"--max-batch-tokens must be at least 1, found {max_batch_tokens}")
    settings = ServerSettings(max_concurrent_requests=max_concurrent_requests,
                              max_client_batch_size=max_client_batch_size, payload_limit=payload_limit,
                              request_timeout=request_timeout, api_key=api_key or None,
                              cors_origins=tuple(cors_origins))
    models = [_named_model(model)] + [_named_model(value) for value in extra_models]
    registry = ModelRegistry.load(models, index=index_dir, dtype=dtype, allow_pickle=allow_pickle,
                                  token_budget=max_batch_tokens)
    for name in registry.names():
        click.echo(f"{name}: {', '.join(sorted(registry.kinds(name)))}", err=True)
    click.echo(f"serving on http://{host}:{port} (docs: /docs)", err=True)
    return run_server(registry, settings, host=host, port=port, steady_memory=steady_memory)
