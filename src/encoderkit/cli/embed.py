"""Embeddings and search: `embed`, `index`, `search`, `eval-sts`, `eval-retrieval`, `mine-negatives`."""
from __future__ import annotations

import json

import click

from ..errors import InputError
from .options import (
    device_option,
    dtype_option,
    json_option,
    max_length_option,
    model_option,
    one_prompt,
    out_option,
    restart_option,
    top_k_option,
    truncate_dim_option,
)


@click.command()
@click.argument("input_path", metavar="INPUT")
@out_option("output: a .npy (float32, one row per record; ids in OUT.ids.txt), or with --engine ray a directory of "
            "Parquet shards (id, embedding) and manifest.json", dest="out_path")
@model_option()
@dtype_option()
@device_option()
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl", "csv", "tsv"]), default=None,
              help="input format (default: from the file extension; otherwise one text per line)")
@click.option("--text-field", default=None, help="JSONL key / CSV or Parquet column holding the text")
@click.option("--id-field", default=None,
              help="JSONL key / CSV or Parquet column holding the id (default: an `id` field, else the record number)")
@max_length_option(help="tokens per text (default: the model's)")
@click.option("--long-text", type=click.Choice(["truncate", "window"]), default="truncate", show_default=True,
              help="texts beyond max-length: truncate (with a warning) or embed overlapping windows and average")
@click.option("--chunk-size", type=int, default=4096, show_default=True,
              help="records per written chunk (--engine ray: per shard, the unit of work and of resumption)")
@truncate_dim_option()
@click.option("--prompt", default=None,
              help='text put before every record, as the model expects it (e.g. "passage: ", "search_document: ")')
@click.option("--prompt-name", default=None,
              help="a prompt the model names in its config_sentence_transformers.json (e.g. query, document); "
                   "default: the model's default prompt, if it has one")
@restart_option("ignore the progress of an interrupted run and start over (--engine ray: delete its shards)")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: this process; ray: a pool of Ray actors over JSONL/Parquet/text files (a file, a directory "
                   "or a glob); needs encoderkit[ray]")
@click.option("--address", default=None,
              help="--engine ray: a running cluster (auto, HOST:PORT, ray://HOST:PORT); default: start a local one")
@click.option("--workers", type=int, default=None, help="--engine ray: actors, each with one model [default: 2]")
@click.option("--threads-per-worker", type=int, default=None, help="--engine ray: torch threads per actor [default: 1]")
def embed(input_path: str, out_path: str, model: str | None, dtype: str, device: str, fmt: str | None,
          text_field: str | None,
          id_field: str | None, max_length: int | None, long_text: str, chunk_size: int, truncate_dim: int | None,
          prompt: str | None, prompt_name: str | None, restart: bool, engine: str, address: str | None,
          workers: int | None, threads_per_worker: int | None) -> None:
    """Embed records, streamed and resumable: a text/JSONL/CSV file into a float32 .npy (input order) plus ids,
    or with --engine ray, JSONL/Parquet/text shards into Parquet shards on a Ray cluster."""
    one_prompt(prompt, prompt_name)
    if prompt_name is not None:
        from ..tasks.embed import named_prompt

        prompt = named_prompt(model, prompt_name)
    embedder_options = dict(dtype=dtype, max_length=max_length, long_text=long_text, truncate_dim=truncate_dim,
                            prompt=prompt)
    if engine == "ray":
        from ..extras import require

        require("ray", "encoderkit embed --engine ray")  # before the cluster starts or a model loads
        from ..embeddings.distributed import embed_with_ray

        if device != "cpu":
            raise InputError("--device is for --engine local; the Ray engine's actors compute on their CPUs")
        if fmt is not None:
            raise InputError("--format is for --engine local; the Ray engine reads .jsonl, .parquet and text files "
                             "by their extension")
        done = embed_with_ray(input_path, out_path, model=model, text_field=text_field, id_field=id_field,
                              shard_size=chunk_size, workers=2 if workers is None else workers,
                              threads_per_worker=1 if threads_per_worker is None else threads_per_worker,
                              address=address, restart=restart, **embedder_options)
        resumed = f" ({done.shards_skipped} written before)" if done.shards_skipped else ""
        click.echo(f"wrote {done.rows:,} x {done.dimension} float32 embeddings in {done.shards} Parquet shards"
                   f"{resumed} to {done.out_dir} ({done.seconds:,.1f} s)")
        return
    for option, value in (("--address", address), ("--workers", workers), ("--threads-per-worker", threads_per_worker)):
        if value is not None:
            raise InputError(f"{option} is an option of --engine ray")
    from ..tasks.embed import embed_file

    # lanes: embed_file's default, two where torch has two threads or more (the command is the process's one
    # Python thread)
    result = embed_file(input_path, out_path, model=model, fmt=fmt, text_field=text_field, id_field=id_field,
                        chunk_size=chunk_size, resume=not restart, device=device, **embedder_options)
    resumed = f" (resumed after {result.resumed_from:,})" if result.resumed_from else ""
    click.echo(f"wrote {result.rows:,} x {result.dimension} float32 embeddings to {result.path}{resumed}; "
               f"ids in {result.ids_path}")


@click.command("eval-sts")
@click.argument("path")
@model_option()
@dtype_option()
@device_option()
@truncate_dim_option("evaluate the first N dimensions of each embedding")
def eval_sts(path: str, model: str | None, dtype: str, device: str, truncate_dim: int | None) -> None:
    """Spearman and Pearson correlation of cosine similarity with the gold scores of an STS-B file."""
    from ..tasks.embed import Embedder
    from ..tasks.sts import evaluate_sts

    result = evaluate_sts(path, Embedder.from_pretrained(model, dtype=dtype, truncate_dim=truncate_dim,
                                                             device=device))
    click.echo(f"pairs: {result.pairs}")
    click.echo(f"spearman: {result.spearman:.6f}")
    click.echo(f"pearson: {result.pearson:.6f}")


@click.command("eval-retrieval")
@click.argument("model")
@click.option("--queries", "queries_path", required=True, help="queries: id<TAB>text (a header line is optional)")
@click.option("--corpus", "corpus_path", required=True, help="documents: id<TAB>text (a header line is optional)")
@click.option("--qrels", "qrels_path", required=True,
              help="relevant documents: query_id<TAB>doc_id[<TAB>grade] (a header line is optional)")
@click.option("--batch-size", type=int, default=64, show_default=True, help="texts per forward pass (at most)")
@dtype_option()
@truncate_dim_option("evaluate the first N dimensions of each embedding")
@click.option("--rerank", "rerank_model", default=None,
              help="a cross-encoder (encoderkit train-reranker) that re-orders each query's top --candidates")
@click.option("--candidates", type=int, default=20, show_default=True, help="with --rerank: hits to re-order")
@click.option("--query-prompt", default=None, help='text put before every query (e.g. "query: ")')
@click.option("--query-prompt-name", default=None, help="the model's prompt for queries, by name (e.g. query)")
@click.option("--document-prompt", default=None, help='text put before every document (e.g. "passage: ")')
@click.option("--document-prompt-name", default=None, help="the model's prompt for documents, by name")
@json_option()
def eval_retrieval(model: str, queries_path: str, corpus_path: str, qrels_path: str, batch_size: int, dtype: str,
                   truncate_dim: int | None, rerank_model: str | None, candidates: int, query_prompt: str | None,
                   query_prompt_name: str | None, document_prompt: str | None, document_prompt_name: str | None,
                   as_json: bool) -> None:
    """nDCG@10, MRR@10, Recall@1/10/100 and MAP@100 of exact cosine search with MODEL (as sentence-transformers'
    InformationRetrievalEvaluator computes them); with --rerank, of the search reranked by a cross-encoder."""
    from ..embeddings.evaluation import evaluate_retrieval, read_qrels, read_texts_tsv
    from ..tasks.embed import Embedder

    if batch_size <= 0:
        raise InputError(f"--batch-size must be positive, found {batch_size}")
    # the files are read and checked before the model is loaded: bad input fails fast
    queries = read_texts_tsv(queries_path, "queries")
    corpus = read_texts_tsv(corpus_path, "documents")
    qrels = read_qrels(qrels_path, queries=queries, corpus=corpus)
    if candidates < 1:
        raise InputError(f"--candidates must be at least 1, found {candidates}")
    one_prompt(query_prompt, query_prompt_name, "query-prompt")
    one_prompt(document_prompt, document_prompt_name, "document-prompt")
    embedder = Embedder.from_pretrained(None if model == "default" else model, dtype=dtype, truncate_dim=truncate_dim)
    for name in (query_prompt_name, document_prompt_name):
        if name is not None:
            embedder.prompt_of(None, name)  # an unknown name fails here, before any text is embedded
    reranker = None
    if rerank_model is not None:
        from ..tasks.rerank import Reranker

        reranker = Reranker.from_pretrained(rerank_model, dtype=dtype)
    metrics = evaluate_retrieval(embedder, queries, corpus, qrels, batch_size=batch_size, reranker=reranker,
                                 rerank_top=candidates, query_prompt=query_prompt, query_prompt_name=query_prompt_name,
                                 document_prompt=document_prompt, document_prompt_name=document_prompt_name)
    counts = {"queries": sum(1 for relevant in qrels.values() if any(g > 0 for g in relevant.values())),
              "corpus": len(corpus)}
    if as_json:
        click.echo(json.dumps({**metrics, **counts}, indent=2))
        return
    for name, value in metrics.items():
        click.echo(f"{name}: {value:.4f}")


@click.command()
@click.argument("vectors_path", metavar="VECTORS")
@out_option("directory to save the index to")
@click.option("--ids", "ids_path", default=None, help="ids file, one per line (default: VECTORS.ids.txt if present)")
@click.option("--kind", type=click.Choice(["exact", "hnsw", "sq8", "ivfpq", "int8", "binary"]), default="exact",
              show_default=True, help="exact, hnsw, sq8: in memory; ivfpq (IVF lists of product-quantized codes), "
                                      "int8, binary (sign bits): streamed builds, memory-mapped at search")
@click.option("--metric", type=click.Choice(["cosine", "ip"]), default="cosine", show_default=True)
@model_option("model to embed queries with at search time (default: the default model)")
@click.option("--texts", "texts_path", default=None, help="the embedded input file, to show texts in results")
@truncate_dim_option("index the first N dimensions of each vector (VECTORS full, or embedded with --truncate-dim N); "
                     "search then cuts its queries the same way")
@click.option("--nlist", type=int, default=None, help="ivfpq: inverted lists (default: a power of two near 4 sqrt(n), "
                                                        "with at least 39 training vectors each)")
@click.option("--pq-m", type=int, default=None, help="ivfpq: PQ sub-quantizers, i.e. bytes per vector (default: "
                                                     "dimension / 8); must divide the dimension")
@click.option("--opq", is_flag=True, help="ivfpq: learn an OPQ rotation before PQ (slower to train)")
@click.option("--nprobe", type=int, default=None, help="ivfpq: lists scanned per query, the default for search [32]")
@click.option("--rescore-multiplier", type=int, default=None,
              help="ivfpq/int8/binary: retrieve k x N candidates and rescore them with the float vectors, kept "
                   "memory-mapped beside the index [int8, binary: 4; ivfpq: 0, no float vectors kept]")
@click.option("--train-sample", type=int, default=None,
              help="ivfpq/int8: vectors sampled across the input to train on (IVF lists, PQ codebooks, int8 "
                   "ranges) [100000]")
@click.option("--seed", type=int, default=None, help="ivfpq/int8: seed of the training sample [0]")
def index(vectors_path: str, out_dir: str, ids_path: str | None, kind: str, metric: str, model: str | None,
          texts_path: str | None, truncate_dim: int | None, nlist: int | None, pq_m: int | None, opq: bool,
          nprobe: int | None, rescore_multiplier: int | None, train_sample: int | None, seed: int | None) -> None:
    """Build a search index from an embeddings .npy (as written by `encoderkit embed`) or a directory of
    Parquet shards (columns id, embedding, and a manifest.json), streamed in bounded memory."""
    from ..extras import require
    from ..jobs import build_index_job

    if kind != "exact":
        require("ann", f"encoderkit index --kind {kind}")
    params = {name: value for name, value in (("nlist", nlist), ("pq_m", pq_m), ("opq", opq or None),
                                              ("nprobe", nprobe), ("rescore_multiplier", rescore_multiplier),
                                              ("train_sample", train_sample), ("seed", seed)) if value is not None}
    built = build_index_job(vectors_path, out_dir, ids_path=ids_path, kind=kind, metric=metric, model=model,
                            texts_path=texts_path, truncate_dim=truncate_dim, **params)
    click.echo(f"indexed {len(built):,} x {built.dimension} vectors ({built.kind}, {built.metric}) -> {out_dir}")


@click.command()
@click.argument("index_dir", metavar="INDEX")
@click.argument("query")
@top_k_option(10, dest="k")
@model_option("model for the query (default: the one recorded in the index)")
@json_option()
@click.option("--rerank", "rerank_model", default=None,
              help="a cross-encoder (encoderkit train-reranker) that re-scores the index's top --candidates")
@click.option("--candidates", type=int, default=20, show_default=True, help="with --rerank: hits to re-score")
@truncate_dim_option("the index's truncate dimension, which is the default; another one is an error")
@click.option("--nprobe", type=int, default=None, help="ivfpq: lists scanned (default: the index's)")
@click.option("--rescore-multiplier", type=int, default=None,
              help="ivfpq/int8/binary: rescore k x N candidates with the float vectors (default: the index's)")
@click.option("--prompt", default=None, help='text put before the query (e.g. "query: ")')
@click.option("--prompt-name", default=None, help="the model's prompt for the query, by name (e.g. query)")
def search(index_dir: str, query: str, k: int, model: str | None, as_json: bool, rerank_model: str | None,
           candidates: int, truncate_dim: int | None, nprobe: int | None, rescore_multiplier: int | None,
           prompt: str | None, prompt_name: str | None) -> None:
    """Find the nearest texts to QUERY in a saved index (optionally reranked by a cross-encoder); the query is
    cut to the dimension the index was built with (index --truncate-dim)."""
    from ..jobs import search_job

    one_prompt(prompt, prompt_name)
    hits = search_job(index_dir, query, k=k, model=model, rerank=rerank_model, candidates=candidates,
                      truncate_dim=truncate_dim, nprobe=nprobe, rescore_multiplier=rescore_multiplier, prompt=prompt,
                      prompt_name=prompt_name)
    if as_json:
        click.echo(json.dumps(hits, indent=2, ensure_ascii=False))
        return
    for hit in hits:
        text = f"  {hit['text']}" if "text" in hit else ""
        click.echo(f"{hit['rank']:>3}  {hit['score']:.4f}  {hit['id']}{text}")


@click.command("mine-negatives")
@click.argument("model_path", metavar="MODEL")
@click.option("--train", "train_path", required=True,
              help="pairs file: TSV/CSV with a header, or JSONL, with columns anchor, positive")
@click.option("--corpus", "corpus_path", default=None,
              help="more candidate texts: one per line, or a text column of a .tsv/.csv/.jsonl "
                   "(the positives are always candidates)")
@out_option("output .tsv/.csv/.jsonl with columns anchor, positive, negative_1..n", dest="out_path")
@click.option("--num-negatives", type=int, default=3, show_default=True, help="negatives per pair")
@click.option("--margin", type=float, default=0.05, show_default=True,
              help="absolute: keep a candidate only if its score + margin <= the positive's score")
@click.option("--range-min", type=int, default=0, show_default=True, help="skip the nearest N non-positives")
@click.option("--range-max", type=int, default=None,
              help="consider the non-positives ranked up to N (default: range-min + 10 x num-negatives)")
@click.option("--batch-size", type=int, default=64, show_default=True, help="texts per embedding batch")
@dtype_option()
@click.option("--query-prompt", default=None, help='text put before every anchor (e.g. "query: ")')
@click.option("--query-prompt-name", default=None, help="the model's prompt for the anchors, by name")
@click.option("--document-prompt", default=None, help="text put before every positive and corpus text")
@click.option("--document-prompt-name", default=None, help="the model's prompt for positives and corpus, by name")
def mine_negatives(model_path: str, train_path: str, corpus_path: str | None, out_path: str, num_negatives: int,
                   margin: float, range_min: int, range_max: int | None, batch_size: int, dtype: str,
                   query_prompt: str | None, query_prompt_name: str | None, document_prompt: str | None,
                   document_prompt_name: str | None) -> None:
    """Mine hard negatives for (anchor, positive) pairs: the nearest non-positives below the positive's score."""
    from ..data.readers import read_texts
    from ..embeddings.data import ANCHOR_POSITIVE, read_training_file, training_format, write_training_file
    from ..embeddings.mining import mine_hard_negatives
    from ..tasks.embed import Embedder
    from pathlib import Path

    training_format(Path(out_path))  # a bad --out extension fails before any work
    pairs = read_training_file(train_path, shape=ANCHOR_POSITIVE)
    corpus = read_texts(corpus_path, what="--corpus") if corpus_path else None
    one_prompt(query_prompt, query_prompt_name, "query-prompt")
    one_prompt(document_prompt, document_prompt_name, "document-prompt")
    embedder = Embedder.from_pretrained(model_path, dtype=dtype)
    for name in (query_prompt_name, document_prompt_name):
        if name is not None:
            embedder.prompt_of(None, name)  # an unknown name fails before any text is embedded
    mined = mine_hard_negatives(embedder, [e.anchor for e in pairs.examples], [e.positive for e in pairs.examples],
                                corpus, margin=margin, range_min=range_min, range_max=range_max,
                                num_negatives=num_negatives, batch_size=batch_size, show_progress=True,
                                query_prompt=query_prompt, query_prompt_name=query_prompt_name,
                                document_prompt=document_prompt, document_prompt_name=document_prompt_name)
    write_training_file(out_path, mined.examples)
    click.echo(f"{mined.summary(num_negatives)} -> {out_path}")
