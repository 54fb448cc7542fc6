"""Cross-encoder reranking: `train-reranker` and `rerank`."""
from __future__ import annotations

import json

import click

from .options import dtype_option, json_option, top_k_option


@click.command("train-reranker")
@click.option("--model", "model_dir", required=True, help="the encoder (or cross-encoder) directory to start from")
@click.option("--train", "train_path", required=True,
              help="TSV/CSV (with a header) or JSONL of query, passage, label (0/1 or a float in [0, 1])")
@click.option("--out", "out_dir", required=True, help="output directory (a one-logit cross-encoder)")
@click.option("--valid", "valid_path", default=None, help="validation file (default: 10% carved from --train)")
@click.option("--epochs", type=float, default=1.0, show_default=True)
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--learning-rate", type=float, default=2e-5, show_default=True)
@click.option("--max-length", type=int, default=None, help="tokens per (query, passage) pair (default: 128)")
@click.option("--mine-negatives", "negatives", type=int, default=None,
              help="add N hard negatives (label 0) per positive, mined with --embedder from the file's passages")
@click.option("--embedder", default=None, help="embedding model directory for --mine-negatives")
@click.option("--seed", type=int, default=42, show_default=True)
def train_reranker_cmd(model_dir: str, train_path: str, out_dir: str, valid_path: str | None, epochs: float,
                       batch_size: int, learning_rate: float, max_length: int | None, negatives: int | None,
                       embedder: str | None, seed: int) -> None:
    """Train a cross-encoder reranker (BCE on one logit) on query, passage, label rows."""
    from ..errors import InputError
    from ..training.reranker import train_reranker

    if embedder is not None and negatives is None:
        raise InputError("--embedder is only used with --mine-negatives N")
    result = train_reranker(model_dir, train_path, out_dir, epochs=epochs, batch_size=batch_size,
                            learning_rate=learning_rate, negatives=negatives, embedder=embedder,
                            valid_file=valid_path, max_length=max_length, seed=seed)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if k in ("bce", "accuracy"))
    click.echo(f"trained on {result.train_examples} pairs, {result.steps} steps; validation: {shown}")
    click.echo(f"final model: {result.out_dir}")


@click.command()
@click.argument("model_dir", metavar="MODEL")
@click.option("-q", "--query", required=True, help="the query")
@click.option("--candidates", "candidates_path", required=True, help="candidate passages, one per line")
@top_k_option(10)
@click.option("--activation", type=click.Choice(["none", "sigmoid"]), default="none", show_default=True,
              help="score: the raw logit, or its sigmoid (sentence-transformers' CrossEncoder default)")
@json_option()
@dtype_option()
def rerank(model_dir: str, query: str, candidates_path: str, top_k: int, activation: str, as_json: bool,
           dtype: str) -> None:
    """Rank candidate passages for a query with a cross-encoder: rank, score, text."""
    from ..data.readers import read_texts
    from ..errors import InputError
    from ..tasks.rerank import Reranker

    if not query.strip():
        raise InputError("the query is empty")
    if top_k < 1:
        raise InputError(f"-k must be at least 1, found {top_k}")
    candidates = read_texts(candidates_path, what="--candidates")
    ranked = Reranker.from_pretrained(model_dir, dtype=dtype).rank(query, candidates, top_k=top_k, return_text=True,
                                                                   activation=activation)
    if as_json:
        click.echo(json.dumps(ranked, ensure_ascii=False))
        return
    for position, row in enumerate(ranked, 1):
        click.echo(f"{position}\t{row['score']:.4f}\t{row['text']}")
