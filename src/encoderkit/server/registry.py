"""The models a server holds, loaded once at start-up, each with the pipelines of the endpoints it serves.

A model is chosen by the request's ``model`` field among the names given at start-up, never by a path: nothing
a request sends reaches the file system. What a model serves follows from its head (config.json's
``architectures``): an encoder -> "embed"; a one-logit classifier (a cross-encoder) -> "rerank" and "predict";
a classifier -> "predict"; a token classifier -> "ner"; a span head -> "qa"; a masked-LM head -> "fill-mask".
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..config import EncoderConfig
from ..errors import CheckpointError, InputError
from ..io.hub import DEFAULT_MODEL_NAMES, default_model_path, hub_id, resolve_model
from ..modeling.models import task_from_architectures
from ..threads import on_compute_thread
from ..tokenizer import Tokenizer

log = logging.getLogger(__name__)

KINDS = ("embed", "rerank", "predict", "ner", "qa", "fill-mask", "embed_sparse", "embed_all")
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
FILL_MASK_TOKEN_BUDGET = 4096  # fill-mask runs a padded batch of its own (no engine budget to follow)


@dataclass
class ServedModel:
    """One model: its facts, its pipelines by kind, and a tokenizer of the server's own (the pipelines run on
    a worker thread and keep theirs; this one counts tokens and answers /tokenize on the event loop)."""

    name: str
    path: Path
    config: EncoderConfig
    task: str
    tokenizer: Tokenizer
    pipelines: dict[str, Any] = field(default_factory=dict)
    fill_mask_budget: int = FILL_MASK_TOKEN_BUDGET
    aliases: tuple[str, ...] = ()  # other names requests may use: what the user served it as, "default", ...

    @property
    def kinds(self) -> set[str]:
        return set(self.pipelines)

    def pipeline(self, kind: str) -> Any:
        return self.pipelines[kind]

    def max_length(self, kind: str) -> int:
        """The longest sequence (special tokens included) the ``kind`` pipeline reads in one piece."""
        pipeline = self.pipelines[kind]
        return int(getattr(pipeline, "max_length", None) or self.config.max_sequence_length)

    def token_budget(self, kind: str) -> int:
        """Padded tokens per forward pass (the pipeline's engine budget: --max-batch-tokens, or its default)."""
        return int(getattr(self.pipelines[kind], "token_budget", None) or self.fill_mask_budget)

    def dtype(self) -> str:
        for pipeline in self.pipelines.values():
            if getattr(pipeline, "engine", None) is not None and pipeline.engine.precision.int8:
                return "int8"
            if hasattr(pipeline, "dtype"):
                return str(pipeline.dtype).replace("torch.", "")
        return "float32"

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "name": self.name, "family": self.config.model_type, "task": self.task, "kinds": sorted(self.kinds),
            "dimensions": self.config.hidden_size, "max_input_length": min(self.max_length(k) for k in self.kinds),
            "dtype": self.dtype(), "layers": self.config.num_hidden_layers,
            "attention_heads": self.config.num_attention_heads,
        }
        if "embed" in self.pipelines:
            embedder = self.pipelines["embed"]
            facts.update(pooling=embedder.pooling, normalize=embedder.normalize,
                         max_input_length=embedder.max_length)
        if self.config.id2label and self.kinds & {"predict", "rerank", "ner"}:
            facts["labels"] = list(self.config.labels)
        return facts


# an index kind -> the pipeline kind that encodes its queries (bm25 takes the text itself)
QUERY_PIPELINES = {"sparse": "embed_sparse", "multi-vector": "embed_all"}


@dataclass
class SearchIndex:
    """A saved index of any kind (dense, bm25, sparse, multi-vector, hybrid), its texts when the index recorded
    them, and the served model that encodes the queries of the index (``model``, dense) or of each of its parts
    (``encoders``: part name, "" for a single index -> served model name)."""

    path: Path
    index: Any  # tasks.search.VectorIndex, or an encoderkit.retrieval index
    model: str | None
    texts: list[str] | None = None
    encoders: dict[str, str] = field(default_factory=dict)

    @property
    def parts(self) -> dict[str, Any]:
        return dict(self.index.parts) if self.index.kind == "hybrid" else {"": self.index}

    def encode_query(self, registry: "ModelRegistry", text: str) -> Any:
        """What ``retrieval.search_any`` takes for ``text``: each part's query, encoded by its served model (run on
        the compute thread)."""
        from ..retrieval.base import DENSE_KINDS

        def one(name: str, part: Any) -> Any:
            if part.kind == "bm25":
                return [text]
            served = registry.get(self.encoders[name])
            if part.kind == "sparse":
                return served.pipeline("embed_sparse").encode_query([text])
            if part.kind == "multi-vector":
                return served.pipeline("embed_all").encode([text], is_query=True)
            assert part.kind in DENSE_KINDS
            return served.pipeline("embed").encode([text], truncate_dim=part.info.get("truncate_dim"))

        queries = {name: one(name, part) for name, part in self.parts.items()}
        return queries if self.index.kind == "hybrid" else queries[""]


class ModelRegistry:
    """The served models by name (the first is the default) and the search index, if any."""

    def __init__(self, models: Sequence[ServedModel], search: SearchIndex | None = None) -> None:
        if not models:
            raise InputError("serve at least one model")
        self._models = {m.name: m for m in models}
        if len(self._models) != len(models):
            raise InputError(f"model names must be unique, found {[m.name for m in models]}")
        # an alias never shadows a served name, and the first model to claim one keeps it
        self._aliases: dict[str, str] = {}
        for model in models:
            for alias in model.aliases:
                if alias not in self._models:
                    self._aliases.setdefault(alias, model.name)
        self.search = search

    # ----- the contract the web studio relies on ---------------------------------------------
    def names(self) -> list[str]:
        return list(self._models)

    @property
    def default(self) -> str:
        return next(iter(self._models))

    def path(self, name: str) -> Path:
        return self.get(name).path

    @property
    def index_path(self) -> Path | None:
        return self.search.path if self.search else None

    def kinds(self, name: str) -> set[str]:
        return self.get(name).kinds

    # ----- lookups ------------------------------------------------------------------------------
    def get(self, name: str | None = None) -> ServedModel:
        """The model called ``name`` (None: the default); an unknown name raises ``UnknownModel``."""
        if name is None:
            return self._models[self.default]
        name = self._aliases.get(name, name)
        if name not in self._models:
            raise UnknownModel(f"no model named {name!r} is served; choose one of: {', '.join(self._models)}")
        return self._models[name]

    def serving(self, kind: str) -> list[str]:
        """The names of the models that serve ``kind``, in start-up order."""
        return [name for name, model in self._models.items() if kind in model.pipelines]

    # ----- loading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, models: Sequence[tuple[str | None, str | Path | None]], *, index: str | Path | None = None,
             dtype: str = "fp32", allow_pickle: bool = False, token_budget: int | None = None) -> "ModelRegistry":
        """Load ``models`` ((name or None, directory or None for the default model), ...) and the index.
        ``token_budget``: padded tokens per forward pass (None: each pipeline's default). Loaded on the compute
        thread the server runs them on (``encoderkit.threads``)."""
        served = on_compute_thread(lambda: [load_served_model(path, name, dtype=dtype, allow_pickle=allow_pickle,
                                                              token_budget=token_budget) for name, path in models])
        registry = cls(served)
        if index is not None:
            registry.search = load_search_index(Path(index), registry)
        return registry


class UnknownModel(InputError):
    """A request named a model the server does not hold."""


def model_name(path: str | Path | None, resolved_root: Path) -> str:
    """The name a model is served under when none is given: the default model's, or its directory's name."""
    if path is None or str(path).lower() in DEFAULT_MODEL_NAMES:
        return DEFAULT_MODEL_NAME
    hub = hub_id(path)
    if hub is not None:  # a hub id: served under it, without the revision
        return hub["repo"]
    try:
        if resolved_root.resolve() == default_model_path().resolve():
            return DEFAULT_MODEL_NAME
    except CheckpointError:  # the default model is not installed: this is another one
        pass
    return resolved_root.resolve().name


def load_served_model(path: str | Path | None, name: str | None = None, *, dtype: str = "fp32",
                      allow_pickle: bool = False, token_budget: int | None = None) -> ServedModel:
    """Load a model directory with the pipelines of every endpoint its head serves."""
    resolved = resolve_model(path)
    name = name or model_name(path, resolved.root)
    # other names a request may use: a hub id with its revision, and the default model's names; never a path (the
    # server's files are not request names)
    aliases = {str(path)} if hub_id(path) else set()
    if name == DEFAULT_MODEL_NAME:
        aliases |= {"default", "sentence-transformers/all-MiniLM-L6-v2"}
    config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    task = task_from_architectures(config)
    root = resolved.root
    try:
        pipelines = _pipelines(root, task, config, dtype=dtype, allow_pickle=allow_pickle, token_budget=token_budget)
    except InputError as exc:
        raise InputError(f"cannot serve {root} as {name!r}: {exc}") from exc
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    log.info("serving %s (%s %s) as %r: %s", root, config.model_type, task, name, ", ".join(sorted(pipelines)))
    return ServedModel(name, root, config, task, tokenizer, pipelines,
                       fill_mask_budget=token_budget or FILL_MASK_TOKEN_BUDGET,
                       aliases=tuple(sorted(aliases - {name})))


def _pipelines(root: Path, task: str, config: EncoderConfig, **options: Any) -> dict[str, Any]:
    """The pipelines of every endpoint a model directory serves: an encoder embeds (and gives its token states at
    /embed_all); a SPLADE SparseEncoder or any masked-LM gives sparse vectors (/embed_sparse, as
    text-embeddings-inference's ``--pooling splade``) and fills masks; a multi-vector (PyLate) model gives its
    token vectors at /embed_all; the heads serve their tasks."""
    from ..embeddings.multi_vector import MultiVectorEmbedder
    from ..embeddings.sparse import SparseEmbedder
    from ..io.st_format import is_multi_vector_dir, is_sparse_encoder
    from ..tasks.classify import Classifier
    from ..tasks.embed import Embedder
    from ..tasks.fill_mask import FillMask
    from ..tasks.ner import EntityRecognizer
    from ..tasks.qa import QuestionAnswerer
    from ..tasks.rerank import Reranker

    pipelines: dict[str, Any] = {}
    if is_multi_vector_dir(root):
        pipelines["embed_all"] = MultiVectorEmbedder.from_pretrained(root, **options)
    elif task == "base":
        pipelines["embed"] = pipelines["embed_all"] = Embedder.from_pretrained(root, **options)
    elif task == "sequence-classification":
        if config.num_labels == 1:
            pipelines["rerank"] = pipelines["predict"] = Reranker.from_pretrained(root, show_progress=False, **options)
        else:
            pipelines["predict"] = Classifier.from_pretrained(root, show_progress=False, **options)
    elif task == "token-classification":
        pipelines["ner"] = EntityRecognizer.from_pretrained(root, show_progress=False, **options)
    elif task == "question-answering":
        pipelines["qa"] = QuestionAnswerer.from_pretrained(root, show_progress=False, **options)
    elif task in ("masked-lm", "pretraining") or is_sparse_encoder(root):
        pipelines["fill-mask"] = FillMask.from_pretrained(root, allow_pickle=options["allow_pickle"])
        pipelines["embed_sparse"] = SparseEmbedder.from_pretrained(root, **options)
    else:
        raise InputError(f"{root} is a {task} model, which no endpoint serves; serve an encoder (embed), a "
                         "classifier or cross-encoder (predict, rerank), a token classifier (ner), a QA model (qa) "
                         "or a masked-LM (fill-mask)")
    return pipelines


def load_search_index(directory: Path, registry: ModelRegistry) -> SearchIndex:
    """A saved index of any kind, with the served model that encodes the queries of the index or of each of its
    parts: the one it was built with if it is served, else the first served model of the kind and dimension."""
    from ..data.readers import iter_records
    from ..retrieval.base import DENSE_KINDS, index_model, load_index

    index = load_index(directory)
    found = SearchIndex(directory, index, None)
    for name, part in found.parts.items():
        if part.kind == "bm25":
            continue
        kind = "embed" if part.kind in DENSE_KINDS else QUERY_PIPELINES[part.kind]
        served = registry.serving(kind)
        built_with = index_model(part)
        same = [n for n in served if built_with and registry.path(n).resolve() == Path(built_with).resolve()]
        fitting = [n for n in served if _encodes(registry.get(n).pipeline(kind), part)]
        if not (same or fitting):
            where = f"part {name!r} of the hybrid index {directory}" if name else f"the index {directory}"
            raise InputError(f"{where} is a {part.kind} index of {part.dimension}-dim vectors built with "
                             f"{built_with or 'an unknown model'}, and no served model encodes its queries (served "
                             f"for {kind}: {', '.join(served) or 'none'}); serve the model it was built with")
        found.encoders[name] = (same or fitting)[0]
    found.model = found.encoders.get("")
    texts_path = index.info.get("texts")
    if texts_path and Path(texts_path).is_file():
        texts = [record.text for record in iter_records(texts_path)]
        if len(texts) != len(index):
            log.warning("%s holds %d texts for %d indexed vectors; search results will carry no text",
                        texts_path, len(texts), len(index))
        else:
            found.texts = texts
    return found


def _encodes(pipeline: Any, part: Any) -> bool:
    """Whether ``pipeline`` gives the queries ``part`` holds: its kind of vectors, of its dimension."""
    if part.kind == "multi-vector":
        return hasattr(pipeline, "maxsim") and pipeline.dimension == part.dimension
    if part.kind == "sparse":
        return pipeline.dimension == part.dimension
    return not hasattr(pipeline, "maxsim") and pipeline.model.config.hidden_size == part.dimension


__all__ = ["DEFAULT_MODEL_NAME", "KINDS", "ModelRegistry", "SearchIndex", "ServedModel", "UnknownModel",
           "load_served_model"]
