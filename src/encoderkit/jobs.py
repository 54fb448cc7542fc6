"""Jobs behind the CLI that combine a model, its tokenizer and its files: model facts and the demo."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .config import EncoderConfig
from .io.hub import resolve_model
from .modeling.models import hf_architecture, task_from_architectures
from .tokenizer import Tokenizer
from .zoo import count_parameters


def _weights_summary(directory: Path) -> tuple[str, str]:
    """(file names, tensor dtypes) of a checkpoint, read from the safetensors header only."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    dtypes: set[str] = set()
    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():
                    dtypes.add(str(handle.get_slice(key).get_dtype()))
        except Exception:  # reported properly when the weights are loaded
            dtypes.add("unreadable")
    size = sum(p.stat().st_size for p in files)
    return f"{', '.join(p.name for p in files) or 'none'} ({size / 2**20:.1f} MiB)", ", ".join(sorted(dtypes)) or "?"


def model_info(model: str | Path | None) -> dict[str, Any]:
    resolved = resolve_model(model)
    config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    task = task_from_architectures(config)
    files, dtypes = _weights_summary(resolved.weights_dir)
    facts: dict[str, Any] = {
        "path": str(resolved.root),
        "family": config.model_type,
        "architecture": hf_architecture(config, task),
        "task": task,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "embedding_size": config.embedding_dim,
        "activation": config.hidden_act,
        "max_sequence_length": config.max_sequence_length,
        "parameters": count_parameters(config, task),
        "weights": files,
        "weight_dtypes": dtypes,
    }
    if config.num_hidden_groups:
        facts["shared_layer_groups"] = config.num_groups
    if config.id2label:
        facts["labels"] = ", ".join(config.labels)
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    facts.update({"tokenizer": tokenizer.kind, "tokenizer_vocab": tokenizer.vocab_size,
                  "tokenizer_max_length": tokenizer.model_max_length})
    if tokenizer.lowercase is not None:
        facts["lowercase"] = tokenizer.lowercase
    info = resolved.sentence_transformer
    if info is not None:
        facts.update({"pooling": info.pooling, "normalize": info.normalize,
                      "sentence_max_length": info.max_seq_length})
    return facts


DEMO_SENTENCES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a stringed instrument.",
    "The stock market fell sharply after the announcement.",
    "Shares dropped as investors reacted to the news.",
    "A cat sleeps on a sunny windowsill.",
    "The kitten is napping in the sunlight by the window.",
    "How do I reset my password?",
    "I forgot my login credentials and need to change them.",
]


DEMO_DATA = Path(__file__).resolve().parent / "demo_data"
DEMO_QUESTIONS = [
    "I think I paid for the same thing two times",
    "the parcel never showed up at my door",
    "the program freezes when I click save",
    "how can I change my login email",
]


def run_finetune_demo(model: str | Path | None, out_dir: str | Path, echo: Callable[[str], None] = print,
                      epochs: float = 4) -> dict[str, Any]:
    """Fine-tune the model on the shipped help-desk intents (160 examples), evaluate on the 20 held-out
    ones, and classify a few new messages."""
    from .precision import cpu_has_native_bf16
    from .tasks.classify import Classifier
    from .training.finetune import Recipe, finetune

    echo(f"\n== fine-tuning: help-desk intents ({DEMO_DATA / 'helpdesk-train.tsv'}) ==")
    result = finetune("classify", DEMO_DATA / "helpdesk-train.tsv", out_dir, valid=DEMO_DATA / "helpdesk-valid.tsv",
                      model=model, recipe=Recipe(epochs=epochs, batch_size=16, learning_rate=1e-4,
                                                 bf16=cpu_has_native_bf16(), show_progress=False), resume=False)
    echo(f"  {result.train_examples} training examples, {result.steps} steps at {result.examples_per_second:,.0f} "
         f"examples/s; held-out accuracy {result.metrics['accuracy']:.3f}, macro-F1 {result.metrics['macro_f1']:.3f}")
    echo(f"  model saved in {out_dir} (HF format: transformers loads it as BertForSequenceClassification)")
    classifier = Classifier.from_pretrained(out_dir)
    predictions = classifier(DEMO_QUESTIONS)
    for text, prediction in zip(DEMO_QUESTIONS, predictions):
        echo(f"  {prediction.label:10s} {prediction.score:.3f}  {text}")
    return {"metrics": result.metrics, "predictions": [p.label for p in predictions]}


def run_demo(model: str | Path | None, echo: Callable[[str], None] = print) -> dict[str, Any]:
    from .tasks.embed import Embedder, cosine_similarity

    facts = model_info(model)
    echo("== model ==")
    for key in ("path", "family", "architecture", "layers", "hidden_size", "attention_heads", "parameters",
                "tokenizer", "pooling", "normalize", "sentence_max_length"):
        if key in facts:
            value = f"{facts[key]:,}" if key == "parameters" else facts[key]
            echo(f"  {key:20s} {value}")
    embedder = Embedder.from_pretrained(model)
    vectors = embedder.encode(DEMO_SENTENCES)
    echo(f"\n== embeddings == {vectors.shape[0]} sentences -> {vectors.shape[1]}-dim vectors "
         f"(pooling {embedder.pooling}, normalised {embedder.normalize})")
    echo(f"  first vector, first 6 values: {np.array2string(vectors[0, :6], precision=4)}")
    similarity = cosine_similarity(vectors, vectors)
    np.fill_diagonal(similarity, -np.inf)
    echo("\n== nearest neighbours (cosine) ==")
    neighbours = []
    for index, sentence in enumerate(DEMO_SENTENCES):
        best = int(np.argmax(similarity[index]))
        neighbours.append(best)
        echo(f"  {sentence}\n      -> {DEMO_SENTENCES[best]}  ({similarity[index, best]:.3f})")
    return {"facts": facts, "neighbours": neighbours}


def _open_vectors(vectors_path: Path) -> tuple[Any, np.ndarray | None]:
    """(Parquet shards, None) for a directory, or (None, the memory-mapped (rows, dimension) array) of a .npy."""
    from .embeddings.shards import EmbeddingShards
    from .errors import DataError

    if vectors_path.is_dir():
        return EmbeddingShards.open(vectors_path), None
    if not vectors_path.is_file():
        raise DataError(f"embeddings file not found: {vectors_path}")
    try:
        vectors = np.load(vectors_path, mmap_mode="r")
    except ValueError as exc:
        raise DataError(f"{vectors_path} is not a .npy array: {exc}") from exc
    if vectors.ndim != 2:
        raise DataError(f"{vectors_path} holds an array of shape {vectors.shape}; expected (rows, dimension)")
    return None, vectors


def build_index_job(vectors_path: str | Path, out_dir: str | Path, *, ids_path: str | Path | None = None,
                    kind: str = "exact", metric: str = "cosine", model: str | Path | None = None,
                    texts_path: str | Path | None = None, truncate_dim: int | None = None,
                    show_progress: bool = True, **params: Any):
    """Index an embeddings .npy (memory-mapped) with its ids, or a directory of Parquet shards (columns id,
    embedding; see embeddings/shards.py); record the query model and the texts' file.

    The compressed kinds (ivfpq, int8, binary; ``params`` such as nlist, pq_m, nprobe, rescore_multiplier,
    train_sample, seed) are built streaming, in bounded memory, straight into ``out_dir``; the other kinds
    are built in memory.

    ``truncate_dim`` N: the index holds the first N dimensions of each vector (full vectors are cut; vectors
    embedded with ``--truncate-dim N`` are taken as they are) and records N, so that search cuts its queries
    the same way. The vectors' width is checked against the query model here, not at the first search."""
    from .data.readers import read_lines
    from .errors import DataError, InputError
    from .tasks.embed import check_truncate_dim
    from .embeddings.compressed import COMPRESSED_KINDS, ArraySource, build_streaming
    from .tasks.search import KINDS, build_index

    if kind not in KINDS:
        raise InputError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
    vectors_path = Path(vectors_path)
    shards, vectors = _open_vectors(vectors_path)
    width = shards.dimension if shards is not None else vectors.shape[1]
    if model is None and shards is not None and shards.manifest.get("model"):
        model = shards.manifest["model"]
        if isinstance(model, dict):  # the Ray engine records the model's facts: its path among them
            model = model.get("path") or model.get("name")
    resolved = resolve_model(model)
    model_dimension = EncoderConfig.from_json_file(resolved.weights_dir / "config.json").hidden_size
    truncate_dim = check_truncate_dim(truncate_dim, model_dimension)
    if truncate_dim is None and width != model_dimension:
        hint = (f"; if they were embedded with --truncate-dim {width}, pass --truncate-dim {width}"
                if width < model_dimension else "")
        raise InputError(f"{vectors_path} holds {width}-dim vectors but the query model {resolved.root} gives "
                         f"{model_dimension}-dim ones: pass the model that embedded them (--model){hint}")
    if truncate_dim is not None and width not in (truncate_dim, model_dimension):
        raise InputError(f"{vectors_path} holds {width}-dim vectors: --truncate-dim {truncate_dim} takes vectors of "
                         f"the query model's full dimension {model_dimension} or already cut to {truncate_dim}")
    info: dict[str, Any] = {"model": str(resolved.root), "vectors": str(vectors_path.resolve())}
    if truncate_dim is not None:
        info["truncate_dim"] = truncate_dim
    if texts_path is not None:
        info["texts"] = str(Path(texts_path).resolve())
    if shards is not None:
        if ids_path is not None:
            raise InputError("--ids is for a .npy input; Parquet shards carry their ids in their 'id' column")
        source = shards if truncate_dim is None or truncate_dim == width else _TruncatedSource(shards, truncate_dim)
    else:
        default_ids = vectors_path.with_suffix(".ids.txt")
        ids = None
        if ids_path is not None or default_ids.is_file():
            ids = read_lines(ids_path or default_ids)
            if len(ids) != len(vectors):
                raise DataError(f"{ids_path or default_ids} has {len(ids)} ids for {len(vectors)} vectors")
        source = ArraySource(vectors if truncate_dim is None else vectors[:, :truncate_dim], ids)
    if kind in COMPRESSED_KINDS:
        return build_streaming(source, out_dir, kind=kind, metric=metric, info=info, show_progress=show_progress,
                               **params)
    if params:
        raise InputError(f"{', '.join(sorted(params))} apply to the kinds {', '.join(COMPRESSED_KINDS)}, not {kind}")
    if isinstance(source, ArraySource):
        index = build_index(source.vectors, source.ids, kind=kind, metric=metric)
    else:
        index = build_index(np.zeros((0, source.dimension), np.float32), kind=kind, metric=metric)
        for batch_ids, batch in source.iter_batches():
            index.add(batch, [str(i) for i in batch_ids])
    index.info = info
    index.save(out_dir)
    return index


class _TruncatedSource:
    """Shards whose vectors are cut to their first ``dimension`` values as they are read."""

    def __init__(self, shards: Any, dimension: int) -> None:
        self.shards, self.dimension, self.count, self.id_kind = shards, dimension, shards.count, shards.id_kind

    def sample(self, size: int, seed: int = 0) -> np.ndarray:
        return np.ascontiguousarray(self.shards.sample(size, seed)[:, :self.dimension])

    def iter_batches(self, batch_rows: int = 65536):
        for ids, batch in self.shards.iter_batches(batch_rows):
            yield ids, np.ascontiguousarray(batch[:, :self.dimension])


def search_job(index_dir: str | Path, query: str, *, k: int = 10, model: str | Path | None = None,
               rerank: str | Path | None = None, candidates: int = 20, truncate_dim: int | None = None,
               nprobe: int | None = None, rescore_multiplier: int | None = None, prompt: str | None = None,
               prompt_name: str | None = None) -> list[dict]:
    """The k nearest texts of a saved index of any kind (dense, bm25, sparse, multi-vector, hybrid). With
    ``rerank`` (a cross-encoder directory), the index's top ``candidates`` are re-scored by the reranker and its
    top k returned: each hit keeps its retrieval score as "retrieval_score", and "score" is the reranker's logit.
    Dense indexes: the query is cut to the truncate dimension the index was built with; ``truncate_dim``, if
    given, must be that one. ``nprobe`` (ivfpq, multi-vector) and ``rescore_multiplier`` (ivfpq, int8, binary)
    override the values the index was built with. ``prompt`` / ``prompt_name``: the query's prompt for a dense
    model, as the text or the model's name for it (neither: the model's default). The other kinds encode the
    query with the model they record; a different ``model`` is refused."""
    from .data.readers import iter_records
    from .errors import InputError
    from .retrieval.base import RETRIEVAL_KINDS, read_meta

    if rerank is not None and candidates < k:
        raise InputError(f"--candidates ({candidates}) must be at least -k ({k}): the reranker reorders the index's "
                         "top candidates")
    fetch = candidates if rerank is not None else k
    if read_meta(index_dir)["kind"] in RETRIEVAL_KINDS:
        index, result = _search_retrieval_index(index_dir, query, fetch, model=model, truncate_dim=truncate_dim,
                                                nprobe=nprobe, rescore_multiplier=rescore_multiplier, prompt=prompt,
                                                prompt_name=prompt_name)
    else:
        index, result = _search_dense_index(index_dir, query, fetch, model=model, truncate_dim=truncate_dim,
                                            nprobe=nprobe, rescore_multiplier=rescore_multiplier, prompt=prompt,
                                            prompt_name=prompt_name)
    hits = [{"rank": rank + 1, "score": float(score), "id": index.ids[row], "row": int(row)}
            for rank, (score, row) in enumerate(zip(result.scores[0], result.indices[0])) if row >= 0]
    texts_path = index.info.get("texts")
    if texts_path and Path(texts_path).is_file():  # one streamed pass to fetch the k texts
        wanted = {hit["row"]: hit for hit in hits}
        for row, record in enumerate(iter_records(texts_path, fmt=index.info.get("texts_format"),
                                                  text_field=index.info.get("text_field"), field_option=None)):
            if row in wanted:
                wanted[row]["text"] = record.text
    if rerank is None:
        return hits
    if any("text" not in hit for hit in hits):
        raise InputError(f"reranking needs the indexed texts, and {index_dir} has none: build the index with --texts")
    from .tasks.rerank import Reranker

    ranked = Reranker.from_pretrained(rerank).rank(query, [hit["text"] for hit in hits], top_k=k)
    return [{**hits[entry["index"]], "rank": rank + 1, "retrieval_score": hits[entry["index"]]["score"],
             "score": entry["score"]} for rank, entry in enumerate(ranked)]


def _search_dense_index(index_dir: str | Path, query: str, fetch: int, *, model: str | Path | None,
                        truncate_dim: int | None, nprobe: int | None, rescore_multiplier: int | None,
                        prompt: str | None, prompt_name: str | None):
    from .errors import InputError
    from .tasks.search import VectorIndex

    index = VectorIndex.load(index_dir)
    for name, value in (("nprobe", nprobe), ("rescore_multiplier", rescore_multiplier)):
        if value is not None:
            if not hasattr(index, name) or (name == "nprobe" and index.kind != "ivfpq"):
                raise InputError(f"--{name.replace('_', '-')} applies to "
                                 f"{'ivfpq and multi-vector' if name == 'nprobe' else 'ivfpq, int8 and binary'} "
                                 f"indexes; {index_dir} is {index.kind}")
            setattr(index, name, value)
    embedder = _dense_query_embedder(index, index_dir, model, truncate_dim)
    return index, index.search(embedder.encode([query], prompt=prompt, prompt_name=prompt_name), fetch)


def _dense_query_embedder(index: Any, index_dir: str | Path, model: str | Path | None, truncate_dim: int | None):
    """The Embedder of a dense index's queries: its recorded model (or ``model``), cut to its truncate dimension."""
    from .errors import InputError
    from .tasks.embed import Embedder

    built_with = index.info.get("truncate_dim")
    if truncate_dim is not None and truncate_dim != built_with:
        how = f"built with --truncate-dim {built_with}" if built_with else "built without --truncate-dim"
        raise InputError(f"--truncate-dim {truncate_dim} does not match the index {index_dir}, {how}: its queries are "
                         "cut the way its vectors were (leave --truncate-dim out)")
    embedder = Embedder.from_pretrained(model or index.info.get("model"))
    if built_with is not None:
        if built_with > embedder.dimension:
            raise InputError(f"the index {index_dir} was built with --truncate-dim {built_with}, but the model gives "
                             f"{embedder.dimension}-dim vectors; pass the model the index was built with (--model)")
        embedder.truncate_dim = built_with
    if embedder.dimension != index.dimension:
        raise InputError(f"the model gives {embedder.dimension}-dim vectors but the index holds "
                         f"{index.dimension}-dim ones; pass the model the index was built with (--model)")
    return embedder


def _search_retrieval_index(index_dir: str | Path, query: str, fetch: int, *, model: str | Path | None,
                            truncate_dim: int | None, nprobe: int | None, rescore_multiplier: int | None,
                            prompt: str | None, prompt_name: str | None):
    """search_job for the bm25, sparse, multi-vector and hybrid kinds: the query encoded by the recorded model(s)."""
    from .errors import InputError
    from .retrieval.base import check_model, load_index
    from .retrieval.texts import encode_queries, model_root

    index = load_index(index_dir)
    kind = index.kind
    for option, value, applies in (("--nprobe", nprobe, ("multi-vector",)), ("--truncate-dim", truncate_dim, ()),
                                   ("--rescore-multiplier", rescore_multiplier, ()),
                                   ("--prompt", prompt, ("hybrid",)), ("--prompt-name", prompt_name, ("hybrid",))):
        if value is not None and kind not in applies:
            raise InputError(f"{option} does not apply to a {kind} index ({index_dir})")
    if nprobe is not None:
        if nprobe < 1:
            raise InputError(f"--nprobe must be at least 1, found {nprobe}")
        index.settings.nprobe = nprobe
    if model is not None:
        if kind in ("bm25", "hybrid"):
            why = ("BM25 scores the texts themselves" if kind == "bm25"
                   else "each part encodes with the model it records")
            raise InputError(f"--model does not apply to a {kind} index ({why}); leave it out")
        check_model(index.info.get("model"), model_root(model), where=str(index_dir))
    queries = encode_queries(index, [query], prompt=prompt, prompt_name=prompt_name,
                             dense_embedder=lambda part: _dense_query_embedder(part, index_dir, None, None))
    return index, index.search(queries, fetch)


def build_retrieval_index_job(kind: str, input_path: str | Path | None, out_dir: str | Path, *,
                              model: str | Path | None = None, fmt: str | None = None, text_field: str | None = None,
                              id_field: str | None = None, parts: dict[str, str] | None = None,
                              show_progress: bool = True, **settings: Any):
    """`encoderkit index --kind bm25|sparse|multi-vector|hybrid`. bm25, sparse, multi-vector: from a file of texts
    (text, JSONL, CSV, TSV; ids from ``id_field`` or the record numbers), encoded by ``model`` for sparse and
    multi-vector; hybrid: from saved indexes of the same documents (``parts``: name -> directory), copied into
    ``out_dir``/parts. ``settings``: the kind's (BM25Index, SparseIndexBuilder, MultiVectorSettings, HybridIndex)."""
    from .data.readers import iter_records
    from .errors import DataError, InputError
    from .retrieval.base import load_index
    from .retrieval.hybrid import HybridIndex
    from .retrieval.texts import build_from_texts

    if kind == "hybrid":
        if input_path is not None or model is not None or text_field or id_field:
            raise InputError("a hybrid index is built from saved indexes (--part NAME=DIR); INPUT, --model, "
                             "--text-field and --id-field belong to its parts' builds")
        if not parts or len(parts) < 2:
            raise InputError("--kind hybrid needs two or more --part NAME=DIR: saved indexes of the same documents "
                             "(e.g. a dense one and a bm25 one)")
        loaded = {name: load_index(directory) for name, directory in parts.items()}
        source = next((part.info for part in loaded.values() if part.info.get("texts")), {})
        info = {key: source[key] for key in ("texts", "texts_format", "text_field") if key in source}
        hybrid = HybridIndex(loaded, info=info, **settings)
        hybrid.save(out_dir)
        return hybrid
    if parts:
        raise InputError("--part is for --kind hybrid")
    if input_path is None:
        raise InputError(f"--kind {kind} needs INPUT: a file of texts (one per line, or JSONL/CSV/TSV)")
    if not Path(input_path).is_file():
        raise DataError(f"texts file not found: {input_path}")
    records = iter_records(input_path, fmt=fmt, text_field=text_field, id_field=id_field)
    info = {"texts": str(Path(input_path).resolve()),
            **{key: value for key, value in (("texts_format", fmt), ("text_field", text_field)) if value}}
    return build_from_texts(kind, records, out_dir, model=model, info=info, show_progress=show_progress, **settings)
