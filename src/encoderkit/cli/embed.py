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
@click.argument("model", required=False)
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
@click.option("--kind", type=click.Choice(["exact", "bm25", "sparse", "multi-vector", "hybrid"]), default="exact",
              show_default=True, help="exact: cosine search with MODEL; bm25 (no MODEL); sparse: MODEL is a SPLADE "
                                      "model; multi-vector: MODEL is a ColBERT model; hybrid: MODEL (dense) fused "
                                      "with --with")
@click.option("--with", "second", type=click.Choice(["bm25", "sparse"]), default="bm25", show_default=True,
              help="hybrid: the retriever fused with the dense MODEL")
@click.option("--sparse-model", default=None, help="hybrid --with sparse: the SPLADE model")
@click.option("--fusion", type=click.Choice(["rrf", "weighted"]), default="rrf", show_default=True,
              help="hybrid: reciprocal-rank fusion or a weighted sum of min-max normalised scores")
@click.option("--k-rrf", type=float, default=60.0, show_default=True, help="hybrid: RRF's constant")
@click.option("--weights", default=None, help="hybrid: the dense and the other part's weights, e.g. 0.5,1 [1,1]")
def eval_retrieval(model: str | None, queries_path: str, corpus_path: str, qrels_path: str, batch_size: int,
                   dtype: str, truncate_dim: int | None, rerank_model: str | None, candidates: int,
                   query_prompt: str | None, query_prompt_name: str | None, document_prompt: str | None,
                   document_prompt_name: str | None, as_json: bool, kind: str, second: str, sparse_model: str | None,
                   fusion: str, k_rrf: float, weights: str | None) -> None:
    """nDCG@10, MRR@10, Recall@1/10/100 and MAP@100 (as sentence-transformers' InformationRetrievalEvaluator
    computes them) of exact cosine search with MODEL, with --rerank of the search reranked by a cross-encoder; or
    with --kind, of a bm25, sparse, multi-vector or hybrid index of the corpus."""
    from ..embeddings.evaluation import evaluate_retrieval, read_qrels, read_texts_tsv
    from ..tasks.embed import Embedder

    if batch_size <= 0:
        raise InputError(f"--batch-size must be positive, found {batch_size}")
    # the files are read and checked before the model is loaded: bad input fails fast
    queries = read_texts_tsv(queries_path, "queries")
    corpus = read_texts_tsv(corpus_path, "documents")
    qrels = read_qrels(qrels_path, queries=queries, corpus=corpus)
    if kind != "exact":
        _eval_retrieval_kind(kind, model, queries, corpus, qrels, batch_size=batch_size, second=second,
                             sparse_model=sparse_model, fusion=fusion, k_rrf=k_rrf, weights=weights, as_json=as_json,
                             dense_only={"--dtype": None if dtype == "fp32" else dtype, "--truncate-dim": truncate_dim,
                                         "--rerank": rerank_model, "--query-prompt": query_prompt,
                                         "--query-prompt-name": query_prompt_name,
                                         "--document-prompt": document_prompt,
                                         "--document-prompt-name": document_prompt_name})
        return
    model = model or "default"
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
    _print_metrics(metrics, qrels, corpus, as_json)


def _print_metrics(metrics: dict, qrels: dict, corpus: dict, as_json: bool) -> None:
    counts = {"queries": sum(1 for relevant in qrels.values() if any(g > 0 for g in relevant.values())),
              "corpus": len(corpus)}
    if as_json:
        click.echo(json.dumps({**metrics, **counts}, indent=2))
        return
    for name, value in metrics.items():
        click.echo(f"{name}: {value:.4f}")


def _eval_retrieval_kind(kind: str, model: str | None, queries: dict, corpus: dict, qrels: dict, *, batch_size: int,
                         second: str, sparse_model: str | None, fusion: str, k_rrf: float, weights: str | None,
                         as_json: bool, dense_only: dict) -> None:
    """eval-retrieval --kind bm25|sparse|multi-vector|hybrid."""
    from ..extras import require
    from ..retrieval.texts import evaluate_kind

    for option, value in dense_only.items():
        if value is not None:
            raise InputError(f"{option} is for --kind exact, not {kind}")
    if kind == "bm25" and model is not None:
        raise InputError("--kind bm25 scores the texts themselves: leave MODEL out")
    if kind in ("sparse", "multi-vector") and model is None:
        raise InputError(f"--kind {kind} needs MODEL: a {'SPLADE' if kind == 'sparse' else 'ColBERT'} model")
    if kind != "hybrid" and (sparse_model or weights):
        raise InputError("--sparse-model and --weights are for --kind hybrid")
    if kind == "hybrid" and second == "sparse" and sparse_model is None:
        raise InputError("--kind hybrid --with sparse needs --sparse-model (a SPLADE model)")
    if kind == "bm25" or (kind == "hybrid" and second == "bm25"):
        require("bm25", f"encoderkit eval-retrieval --kind {kind}")
    if kind == "multi-vector":
        require("ann", "encoderkit eval-retrieval --kind multi-vector")
    parsed = None
    if weights is not None:
        try:
            parsed = [float(w) for w in weights.split(",")]
        except ValueError:
            parsed = []
        if len(parsed) != 2:
            raise InputError(f"--weights takes two numbers, the dense part's and the other's (e.g. 0.5,1), found "
                             f"{weights!r}")
    metrics = evaluate_kind(kind, queries, corpus, qrels, model=None if model == "default" else model,
                            second=second, second_model=sparse_model, fusion=fusion, k_rrf=k_rrf, weights=parsed,
                            batch_size=batch_size)
    _print_metrics(metrics, qrels, corpus, as_json)


# options of the retrieval kinds: (the kinds they apply to, the setting's name in the index)
RETRIEVAL_OPTIONS = {
    "k1": (("bm25",), "k1"), "b": (("bm25",), "b"), "bm25_method": (("bm25",), "method"),
    "stopwords": (("bm25",), "stopwords"),
    "fusion": (("hybrid",), "fusion"), "k_rrf": (("hybrid",), "k_rrf"), "depth": (("hybrid",), "depth"),
    "token_candidates": (("multi-vector",), "token_candidates"), "rerank_depth": (("multi-vector",), "rerank_depth"),
    "codec": (("multi-vector",), "codec"), "store_dtype": (("multi-vector",), "dtype"),
    "ivf_min_tokens": (("multi-vector",), "ivf_min_tokens"),
    "nlist": (("ivfpq", "multi-vector"), "nlist"), "nprobe": (("ivfpq", "multi-vector"), "nprobe"),
    "train_sample": (("ivfpq", "int8", "multi-vector"), "train_sample"),
    "seed": (("ivfpq", "int8", "multi-vector"), "seed"),
}
INDEX_KINDS = ["exact", "hnsw", "sq8", "ivfpq", "int8", "binary", "bm25", "sparse", "multi-vector", "hybrid"]


def _pairs(values: tuple[str, ...], option: str, convert=str) -> dict:
    """NAME=VALUE options as a dict."""
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise InputError(f"{option} takes NAME=VALUE, found {value!r}")
        if name in out:
            raise InputError(f"{option} names {name!r} twice")
        try:
            out[name] = convert(rest)
        except ValueError as exc:
            raise InputError(f"{option} {value!r}: {rest!r} is not a number") from exc
    return out


@click.command()
@click.argument("vectors_path", metavar="INPUT", required=False)
@out_option("directory to save the index to")
@click.option("--ids", "ids_path", default=None, help="ids file, one per line (default: VECTORS.ids.txt if present)")
@click.option("--kind", type=click.Choice(INDEX_KINDS), default="exact",
              show_default=True, help="exact, hnsw, sq8: in memory; ivfpq (IVF lists of product-quantized codes), "
                                      "int8, binary (sign bits): streamed builds, memory-mapped at search. INPUT is "
                                      "an embeddings .npy or a directory of Parquet shards for these; bm25, sparse "
                                      "(SPLADE, --model), multi-vector (ColBERT, --model): INPUT is a file of texts; "
                                      "hybrid: no INPUT, two or more --part")
@click.option("--metric", type=click.Choice(["cosine", "ip"]), default="cosine", show_default=True)
@model_option("model to embed queries with at search time (default: the default model); sparse, multi-vector: "
              "the SPLADE / ColBERT model that encodes documents and queries")
@click.option("--texts", "texts_path", default=None, help="the embedded input file, to show texts in results")
@truncate_dim_option("index the first N dimensions of each vector (VECTORS full, or embedded with --truncate-dim N); "
                     "search then cuts its queries the same way")
@click.option("--nlist", type=int, default=None, help="ivfpq, multi-vector: inverted lists (default: a power of two "
                                                        "near 4 sqrt(n), with at least 39 training vectors each)")
@click.option("--pq-m", type=int, default=None, help="ivfpq: PQ sub-quantizers, i.e. bytes per vector (default: "
                                                     "dimension / 8); must divide the dimension")
@click.option("--opq", is_flag=True, help="ivfpq: learn an OPQ rotation before PQ (slower to train)")
@click.option("--nprobe", type=int, default=None, help="ivfpq, multi-vector: lists scanned per query, the default "
                                                       "for search [32]")
@click.option("--rescore-multiplier", type=int, default=None,
              help="ivfpq/int8/binary: retrieve k x N candidates and rescore them with the float vectors, kept "
                   "memory-mapped beside the index [int8, binary: 4; ivfpq: 0, no float vectors kept]")
@click.option("--train-sample", type=int, default=None,
              help="ivfpq/int8/multi-vector: vectors sampled across the input to train on (IVF lists, PQ "
                   "codebooks, int8 ranges) [100000]")
@click.option("--seed", type=int, default=None, help="ivfpq/int8/multi-vector: seed of the training sample [0]")
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl", "csv", "tsv"]), default=None,
              help="bm25/sparse/multi-vector: the texts' format (default: from the extension; else one per line)")
@click.option("--text-field", default=None, help="bm25/sparse/multi-vector: JSONL key / CSV column of the text")
@click.option("--id-field", default=None,
              help="bm25/sparse/multi-vector: JSONL key / CSV column of the id (default: `id`, else the record number)")
@click.option("--k1", type=float, default=None, help="bm25: term-frequency saturation [1.5]")
@click.option("--b", type=float, default=None, help="bm25: document-length normalisation, 0 to 1 [0.75]")
@click.option("--bm25-method", type=click.Choice(["lucene", "robertson", "atire", "bm25l", "bm25+"]), default=None,
              help="bm25: bm25s's variant [lucene]")
@click.option("--stopwords", default=None, help="bm25: stopword list, en (bm25s's English) or none, or another "
                                                "language code bm25s knows [en]")
@click.option("--part", "parts", multiple=True, metavar="NAME=DIR",
              help="hybrid: a saved index of the same documents (repeat: two or more), copied into the hybrid one")
@click.option("--fusion", type=click.Choice(["rrf", "weighted"]), default=None,
              help="hybrid: reciprocal-rank fusion, or a weighted sum of min-max normalised scores [rrf]")
@click.option("--k-rrf", type=float, default=None, help="hybrid: RRF's constant, score = sum of w / (k + rank) [60]")
@click.option("--weight", "weights", multiple=True, metavar="NAME=W", help="hybrid: a part's weight [1 each]")
@click.option("--depth", type=int, default=None, help="hybrid: hits taken from each part before fusing [100]")
@click.option("--token-candidates", type=int, default=None,
              help="multi-vector: nearest token vectors fetched per query token [128]")
@click.option("--rerank-depth", type=int, default=None,
              help="multi-vector: candidate documents re-scored exactly by MaxSim, at most [1000]")
@click.option("--codec", type=click.Choice(["flat", "sq8"]), default=None,
              help="multi-vector: the IVF's codes of the token vectors [sq8]")
@click.option("--store-dtype", type=click.Choice(["float32", "float16"]), default=None,
              help="multi-vector: how the token vectors re-scored by MaxSim are stored [float32]")
@click.option("--ivf-min-tokens", type=int, default=None,
              help="multi-vector: below this many token vectors, no IVF: exact MaxSim over every document [100000]")
def index(vectors_path: str | None, out_dir: str, ids_path: str | None, kind: str, metric: str, model: str | None,
          texts_path: str | None, truncate_dim: int | None, nlist: int | None, pq_m: int | None, opq: bool,
          nprobe: int | None, rescore_multiplier: int | None, train_sample: int | None, seed: int | None,
          fmt: str | None, text_field: str | None, id_field: str | None, parts: tuple[str, ...],
          weights: tuple[str, ...], **retrieval: object) -> None:
    """Build a search index. Dense kinds: from an embeddings .npy (as written by `encoderkit embed`) or a directory
    of Parquet shards (columns id, embedding, and a manifest.json), streamed in bounded memory. bm25, sparse,
    multi-vector: from a file of texts. hybrid: from saved indexes of the same documents (--part)."""
    from ..extras import require
    from ..retrieval.base import RETRIEVAL_KINDS

    given = {name: value for name, value in {**retrieval, "nlist": nlist, "nprobe": nprobe,
                                             "train_sample": train_sample, "seed": seed}.items() if value is not None}
    if weights:
        given["weights"] = True
    for name in given:
        kinds = RETRIEVAL_OPTIONS.get(name, (("hybrid",), name))[0]
        dense_option = any(k not in RETRIEVAL_KINDS for k in kinds)  # the dense kinds check their own
        if kind not in kinds and (kind in RETRIEVAL_KINDS or not dense_option):
            raise InputError(f"--{name.replace('_', '-')} applies to --kind {' / '.join(kinds)}, not {kind}")
    if kind in RETRIEVAL_KINDS:
        for option, value in (("--ids", ids_path), ("--texts", texts_path), ("--truncate-dim", truncate_dim),
                              ("--pq-m", pq_m), ("--opq", opq or None), ("--rescore-multiplier", rescore_multiplier),
                              ("--metric", None if metric == "cosine" else metric)):
            if value is not None:
                raise InputError(f"{option} is for the dense kinds, not --kind {kind}")
        if kind == "bm25":
            require("bm25", "encoderkit index --kind bm25")
        if kind == "multi-vector":
            require("ann", "encoderkit index --kind multi-vector")
        from ..jobs import build_retrieval_index_job

        settings = {RETRIEVAL_OPTIONS[name][1]: value for name, value in given.items() if name != "weights"}
        if weights:
            settings["weights"] = _pairs(weights, "--weight", float)
        built = build_retrieval_index_job(kind, vectors_path, out_dir, model=model, fmt=fmt, text_field=text_field,
                                          id_field=id_field, parts=_pairs(parts, "--part") if parts else None,
                                          **settings)
        click.echo(f"indexed {len(built):,} documents ({kind}) -> {out_dir}")
        return
    for option, value in (("--format", fmt), ("--text-field", text_field), ("--id-field", id_field),
                          ("--part", parts or None)):
        if value is not None:
            raise InputError(f"{option} is for --kind bm25, sparse, multi-vector or hybrid, not {kind}")
    if vectors_path is None:
        raise InputError(f"--kind {kind} needs INPUT: an embeddings .npy or a directory of Parquet shards")
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
@click.option("--nprobe", type=int, default=None, help="ivfpq, multi-vector: lists scanned (default: the index's)")
@click.option("--rescore-multiplier", type=int, default=None,
              help="ivfpq/int8/binary: rescore k x N candidates with the float vectors (default: the index's)")
@click.option("--prompt", default=None, help='text put before the query (e.g. "query: ")')
@click.option("--prompt-name", default=None, help="the model's prompt for the query, by name (e.g. query)")
def search(index_dir: str, query: str, k: int, model: str | None, as_json: bool, rerank_model: str | None,
           candidates: int, truncate_dim: int | None, nprobe: int | None, rescore_multiplier: int | None,
           prompt: str | None, prompt_name: str | None) -> None:
    """Find the nearest texts to QUERY in a saved index of any kind (optionally reranked by a cross-encoder). A
    dense index's query is cut to the dimension it was built with (index --truncate-dim); sparse, multi-vector and
    hybrid indexes encode the query with the model(s) they record; BM25 needs none."""
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
