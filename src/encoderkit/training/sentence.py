"""Training sentence embedders: ``train_embedder`` drives the generic ``Trainer`` with a ``SentenceModel`` and one
of the embedding losses, and saves the result in sentence-transformers' directory format.

How the pieces fit the Trainer:

- MNRL (plain and cached) batches come from ``NoDuplicatesBatcher`` (``fill=True``: full batches, a repeated
  text then masked by the loss's ``duplicates``). The Trainer's "examples" are then the batch numbers of an
  epoch (its batch size is 1) and the collate function looks the batch up for that epoch, so the order is a
  function of (seed, epoch) and a resumed run continues exactly.
- The cached loss (GradCache) runs inside the wrapper's forward: its two passes (embed without activations,
  loss and embedding gradients) happen there, and the returned loss carries a hook that replays the
  mini-batches when the Trainer calls ``backward``; so the Trainer's step hosts it unchanged (no gradient
  accumulation on top of it).
- Several processes (torchrun): ``train_embedder`` joins the process group and the Trainer wraps the model in DDP
  (for the cached loss, whose replay fills each gradient several times, the Trainer averages the gradients
  itself). MNRL's no-duplicates batches are global (processes x batch_size), cut into one slice per process;
  mnrl, cached-mnrl and cosent gather the embeddings of every process with gradients (``losses/_distributed``),
  so loss and gradients equal one process's on the global batch (tested to 1e-5).
- Checkpoints hold the encoder in HF format plus the sentence-transformers files (so ``best/`` and ``final/``
  load in ``SentenceTransformer``); the softmax classifier, which is not part of the embedder, is kept beside
  them in ``loss_head.pt`` for resuming only.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..distributed import world_and_rank
from ..embeddings.data import (
    ANCHOR_POSITIVE,
    LABELLED_PAIR,
    LOSS_SHAPES,
    SCORED_PAIR,
    NoDuplicatesBatcher,
    read_training_file,
)
from ..embeddings import losses as L
from ..embeddings.sentence_model import FEATURE_NAMES, SentenceModel
from ..errors import DataError, InputError
from ..io.st_format import write_sentence_transformer
from .config import TrainingConfig
from .ddp import distributed_run
from .trainer import Trainer

log = logging.getLogger(__name__)

LOSSES = ("mnrl", "cached-mnrl", "cosent", "cosine", "softmax", "triplet", "splade", "maxsim")
LOSS_HEAD_FILE = "loss_head.pt"
GATHERING_LOSSES = ("mnrl", "cached-mnrl", "cosent", "splade", "maxsim")  # their value depends on the other examples of the batch
# What train-embedder trains: one dense vector (SentenceModel), SPLADE sparse vectors (SparseModel), ColBERT token
# vectors (MultiVectorModel); and the losses each kind takes (the first is its default).
KIND_LOSSES = {"dense": ("mnrl", "cached-mnrl", "cosent", "cosine", "softmax", "triplet"), "sparse": ("splade",),
               "multi-vector": ("maxsim",)}
NO_DUPLICATE_BATCHES = ("mnrl", "cached-mnrl", "splade", "maxsim")  # in-batch negatives: batches without repeated texts


def _column_keys(index: int) -> dict[str, str]:
    """Feature names of text column ``index`` in a collated batch: column 0 keeps the plain names (the Trainer
    counts examples and tokens from ``input_ids``/``attention_mask``)."""
    return {name: name if index == 0 else f"{name}_{index}" for name in FEATURE_NAMES}


class EmbedderTraining(nn.Module):
    """The Trainer's model: ``forward(**batch)`` embeds each text column and returns an object with ``.loss``;
    ``save_pretrained`` writes the embedder (HF + sentence-transformers files)."""

    def __init__(self, model: nn.Module, loss: nn.Module, loss_name: str, columns: int) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.loss_name = loss_name
        self.columns = columns
        pooler = getattr(model.encoder, "pooler", None)
        if pooler is not None:  # the embedding never reads the pooler: frozen, so that DDP expects no gradient
            pooler.requires_grad_(False)  # for it (one process skips a parameter without a gradient anyway)

    @property
    def ddp_compatible(self) -> bool:
        """The cached loss fills each parameter's gradient once per replayed mini-batch, which DDP does not allow:
        the Trainer averages the gradients itself then."""
        return self.loss_name != "cached-mnrl"

    def _column(self, batch: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
        return {name: batch[key] for name, key in _column_keys(index).items() if key in batch}

    def forward(self, **batch: torch.Tensor) -> SimpleNamespace:
        columns = [self._column(batch, i) for i in range(self.columns)]
        if self.loss_name == "cached-mnrl":
            loss = self.loss(*columns, duplicates=batch["duplicates"])
        else:
            vectors = [self.model(**column) for column in columns]
            if self.loss_name in ("mnrl", "splade", "maxsim"):
                loss = self.loss(*vectors, duplicates=batch["duplicates"])
            elif self.loss_name in ("cosent", "cosine"):
                loss = self.loss(*vectors, batch["scores"])
            elif self.loss_name == "softmax":
                loss = self.loss(*vectors, batch["labels"])
            else:
                loss = self.loss(*vectors)
        return SimpleNamespace(loss=loss)

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> Path:
        directory = Path(directory)
        if isinstance(self.model, SentenceModel):
            self.model.encoder.save_pretrained(directory, tokenizer=tokenizer or self.model.tokenizer)
            write_sentence_transformer(directory, pooling=self.model.pooling, normalize=self.model.normalize,
                                       max_seq_length=self.model.max_length, dimension=self.model.dimension,
                                       prompts=getattr(self.model, "prompts", None))
        else:  # a sparse or multi-vector model writes its own format
            self.model.save_pretrained(directory, tokenizer=tokenizer or self.model.tokenizer)
        head = {k: v for k, v in self.loss.state_dict().items() if not k.startswith("model.")}
        if head:  # the softmax classifier: not part of the embedder, kept for resuming
            torch.save(head, directory / LOSS_HEAD_FILE)
        return directory

    def load_checkpoint(self, directory: str | Path) -> None:
        from ..modeling.models import load_weights

        directory = Path(directory)
        load_weights(self.model.encoder, directory)
        projection = getattr(self.model, "projection", None)
        if projection is not None:  # a multi-vector model's projection, in 1_Dense/
            from ..embeddings.multi_vector import read_multi_vector_dir

            with torch.no_grad():
                for layer, (weight, bias) in zip(projection, read_multi_vector_dir(directory).layers):
                    layer.weight.copy_(weight)
                    if bias is not None:
                        layer.bias.copy_(bias)
        if (directory / LOSS_HEAD_FILE).is_file():
            head = torch.load(directory / LOSS_HEAD_FILE, map_location="cpu", weights_only=True)
            self.loss.load_state_dict(head, strict=False)


class _ModelEncoder:
    """``encode(texts, batch_size, normalize)`` over a SentenceModel (or a SparseModel: its vocabulary-wide vectors,
    never normalised, as sparse vectors compare by dot product), for the evaluators."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.dot = not isinstance(model, SentenceModel)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, normalize: bool | None = None, **_: Any):
        device = next(self.model.parameters()).device
        parts = []
        for start in range(0, len(texts), batch_size):
            batch = self.model.tokenize(list(texts[start:start + batch_size]))
            features = {k: v.to(device) for k, v in batch.model_inputs().items()}
            vectors = self.model(**features).float()
            if normalize and not self.dot:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
            parts.append(vectors.cpu().numpy())
        return np.concatenate(parts) if parts else np.zeros((0, self.model.dimension), dtype=np.float32)


def _multi_vector_retrieval(model: nn.Module, queries: dict[str, str], corpus: dict[str, str],
                            qrels: dict[str, dict[str, float]]) -> dict[str, float]:
    """Retrieval metrics of a MultiVectorModel: every query scored against every document by MaxSim."""
    from ..embeddings.evaluation import retrieval_metrics
    from ..embeddings.multi_vector import maxsim

    def encode(texts: list[str], is_query: bool) -> list[np.ndarray]:
        out = []
        with torch.no_grad():
            for start in range(0, len(texts), 64):
                batch = model.tokenize(texts[start:start + 64], is_query)
                device = next(model.parameters()).device
                vectors, mask = model(**{k: v.to(device) for k, v in batch.items()}, is_query=is_query)
                out.extend(v[m].float().cpu().numpy() for v, m in zip(vectors, mask))
        return out

    query_ids, doc_ids = list(queries), list(corpus)
    scores = maxsim(encode([queries[q] for q in query_ids], True), encode([corpus[d] for d in doc_ids], False))
    return retrieval_metrics({q: dict(zip(doc_ids, row.tolist())) for q, row in zip(query_ids, scores)}, qrels)


def _validation(valid: str | Path, loss: str, labels: dict[str, int] | None) -> tuple[str, Any]:
    """(metric name, evaluate function of the SentenceModel) for a validation file."""
    from ..embeddings.evaluation import evaluate_retrieval, sts_spearman, triplet_accuracy

    data = read_training_file(valid, labels=labels)
    if data.shape == SCORED_PAIR:
        pairs = [(e.sentence1, e.sentence2, e.score) for e in data.examples]
        return "spearman", lambda model: {"spearman": sts_spearman(_ModelEncoder(model), pairs, batch_size=64)}
    if data.shape == ANCHOR_POSITIVE:
        if data.negative_columns:
            triplets = [(e.anchor, e.positive, e.negatives[0]) for e in data.examples]
            return "triplet_accuracy", lambda model: {"triplet_accuracy": triplet_accuracy(
                _ModelEncoder(model), *zip(*triplets), batch_size=64)}
        corpus: dict[str, str] = {}
        queries: dict[str, str] = {}
        qrels: dict[str, dict[str, float]] = {}
        for e in data.examples:
            doc = corpus.setdefault(e.positive, f"d{len(corpus)}")
            qid = queries.setdefault(e.anchor, f"q{len(queries)}")
            qrels.setdefault(qid, {})[doc] = 1.0
        query_texts = {qid: text for text, qid in queries.items()}
        corpus_texts = {doc: text for text, doc in corpus.items()}

        def retrieval(model: nn.Module) -> dict[str, float]:
            if hasattr(model, "projection"):
                metrics = _multi_vector_retrieval(model, query_texts, corpus_texts, qrels)
                return {k.replace("@", "_at_"): v for k, v in metrics.items()}
            encoder = _ModelEncoder(model)  # sparse: vocabulary-wide rows, so the corpus is scored in small chunks
            metrics = evaluate_retrieval(encoder, query_texts, corpus_texts, qrels, batch_size=64,
                                         corpus_chunk_size=512 if encoder.dot else 16384)
            return {k.replace("@", "_at_"): v for k, v in metrics.items()}

        return "ndcg_at_10", retrieval
    raise InputError(f"validation file {valid}: labelled pairs ({data.shape}) have no embedding metric here; "
                     "give scored pairs (sentence1, sentence2, score) or anchor/positive[/negative] pairs")


@dataclass
class EmbedderResult:
    final_dir: Path
    step: int
    best_metric: float | None
    best_step: int | None
    metric: str | None
    history: list[dict[str, Any]]


@dataclass
class EmbedderSetup:
    """A prepared embedder training: the Trainer (``begin``/``train_step`` drive it step by step, ``train`` runs
    it to the end) over the SentenceModel, and the validation metric's name (None without ``valid``)."""
    trainer: Trainer
    model: SentenceModel
    metric: str | None
    examples: int


@dataclass
class EmbedderRecipe:
    """How ``train_embedder`` trains, as finetune's ``Recipe`` does for tasks: the loss and its settings, the
    optimiser's, the data's, and where and how long. Checked when made.

    ``gather_across_processes`` (default: on for the losses that compare examples of a batch with one another: mnrl,
    cached-mnrl, cosent) gathers every process's embeddings into the loss in a distributed run, so the global batch
    of processes x batch_size examples gives the loss, and the gradients, of one process on that whole batch;
    ``batch_size`` is per process."""

    loss: str = "mnrl"
    kind: str = "dense"
    epochs: float = 1
    batch_size: int = 32
    learning_rate: float = 2e-5
    warmup_ratio: float = 0.1
    matryoshka_dims: Sequence[int] | None = None
    valid: str | Path | None = None
    seed: int = 42
    max_length: int | None = None
    mini_batch_size: int = 32
    pooling: str | None = None
    normalize: bool | None = None
    scale: float | None = None  # the loss's scale (inverse temperature); None: 20 for cosine losses, 1 for maxsim
    triplet_margin: float = 5.0
    max_steps: int | None = None
    eval_every: int = 0
    save_every: int = 0
    bf16: bool = False
    device: str = "cpu"
    time_budget_s: float | None = None
    show_progress: bool = True
    gather_across_processes: bool | None = None
    query_regularizer_weight: float = 5e-5  # splade: FLOPS weights (sentence-transformers' SPLADE examples' values)
    document_regularizer_weight: float = 3e-5
    # sparse: shift the MLM head's bias once, before training, so that the training documents' vectors start with
    # this many active terms on average (``calibrate_active_terms``; for a head new to the model). None: as it is.
    start_active_terms: int | None = None
    multi_vector_dimension: int = 128  # multi-vector: the token vectors' width (ColBERT's 128)
    # Prepended to the anchors (query) and to the other columns (document) while training, and written into the
    # model's config_sentence_transformers.json as its "query" and "document" prompts, so that it is used with them.
    query_prompt: str | None = None
    document_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KIND_LOSSES:
            raise InputError(f"unknown kind {self.kind!r}; choose one of {', '.join(KIND_LOSSES)}")
        if self.loss not in LOSSES:
            raise InputError(f"unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        if self.loss not in KIND_LOSSES[self.kind]:
            raise InputError(f"the {self.loss} loss does not train a {self.kind} model; a {self.kind} model takes "
                             f"{', '.join(KIND_LOSSES[self.kind])} (--kind and --loss)")
        if self.kind != "dense" and (self.matryoshka_dims or self.pooling or self.normalize):
            raise InputError(f"--matryoshka, --pooling and --normalize apply to dense embedders, not to --kind "
                             f"{self.kind}")
        if self.gather_across_processes and self.loss not in GATHERING_LOSSES:
            raise InputError(f"the {self.loss} loss compares each example with its own texts only, so there is "
                             f"nothing to gather across processes (it already equals the one-process loss under DDP); "
                             f"gathering applies to {', '.join(GATHERING_LOSSES)}")
        if self.epochs <= 0 or self.batch_size <= 0:
            raise InputError(f"epochs and batch_size must be positive, found {self.epochs} and {self.batch_size}")
        if self.start_active_terms is not None and self.kind != "sparse":
            raise InputError("--start-active-terms sets where a SPLADE model's vectors start: use it with --kind sparse")
        if self.matryoshka_dims and self.loss == "softmax":
            raise InputError("--matryoshka cannot be used with the softmax loss (its classifier reads the full vector)")


def _embedder_model(model_dir: str | Path | None, r: EmbedderRecipe) -> Any:
    """The model ``r.kind`` trains (SentenceModel, SparseModel or MultiVectorModel), with the prompts it trains with
    recorded on it (so that it saves them)."""
    if r.kind == "sparse":
        from ..embeddings.sparse import SparseModel

        model: Any = SparseModel.from_pretrained(model_dir, max_length=r.max_length)
    elif r.kind == "multi-vector":
        from ..embeddings.multi_vector import MultiVectorModel

        lengths = {"document_length": r.max_length} if r.max_length else {}
        model = MultiVectorModel.from_pretrained(model_dir, dimension=r.multi_vector_dimension, seed=r.seed,
                                                 **lengths)
    else:
        model = SentenceModel.from_pretrained(model_dir, pooling=r.pooling, normalize=r.normalize,
                                              max_length=r.max_length)
    trained_prompts = {name: text for name, text in (("query", r.query_prompt), ("document", r.document_prompt))
                       if text}
    if trained_prompts and r.kind == "multi-vector":
        model.settings = model.settings.with_overrides(prompts={**model.settings.prompts, **trained_prompts})
    elif trained_prompts:
        model.prompts = {**getattr(model, "prompts", {}), **trained_prompts}
    if r.matryoshka_dims:
        too_big = [d for d in r.matryoshka_dims if d > model.dimension]
        if too_big:
            raise InputError(f"Matryoshka dims {too_big} exceed the model's dimension {model.dimension}")
    return model


def _loss_module(r: EmbedderRecipe, model: Any, labels: int, gather: bool) -> nn.Module:
    """The loss ``r.loss`` names, with its settings (``labels``: the softmax loss's classes)."""
    cosine_scale = 20.0 if r.scale is None else r.scale

    def wrap(inner: nn.Module) -> nn.Module:
        return L.MatryoshkaLoss(inner, r.matryoshka_dims) if r.matryoshka_dims else inner

    if r.loss == "mnrl":
        return wrap(L.MultipleNegativesRankingLoss(scale=cosine_scale, gather_across_processes=gather))
    if r.loss == "cached-mnrl":
        return L.CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=r.mini_batch_size,
            loss=wrap(L.MultipleNegativesRankingLoss(scale=cosine_scale, gather_across_processes=gather)))
    if r.loss == "cosent":
        return wrap(L.CoSENTLoss(scale=cosine_scale, gather_across_processes=gather))
    if r.loss == "cosine":
        return wrap(L.CosineSimilarityLoss())
    if r.loss == "softmax":
        return L.SoftmaxLoss(model.dimension, labels)
    if r.loss == "maxsim":
        return L.MaxSimMultipleNegativesRankingLoss(scale=1.0 if r.scale is None else r.scale,
                                                    gather_across_processes=gather)
    if r.loss == "splade":
        return L.SpladeLoss(r.query_regularizer_weight, r.document_regularizer_weight, gather_across_processes=gather)
    return wrap(L.TripletLoss(margin=r.triplet_margin))


@dataclass
class _Batching:
    """What the Trainer iterates over: its items, its batch size, the collate function and the steps an epoch."""
    items: Sequence[Any]
    batch_size: int
    collate: Any
    steps_per_epoch: int
    drop_last: bool


def _batching(r: EmbedderRecipe, model: Any, data: Any, columns: int, world: int, gather: bool,
              train_file: str | Path) -> _Batching:
    """MNRL-like losses (in-batch negatives): global no-duplicate batches of processes x batch_size, process p
    training on slice p of each (the Trainer hands process p item position * processes + p, so no text repeats
    across processes either), with text ids for the duplicates mask. The others: plain batches of examples."""
    examples = data.examples

    def tokenize_columns(rows: list[Any]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for index in range(columns):
            prompt = (r.query_prompt if index == 0 else r.document_prompt) or ""
            texts = [prompt + e.texts[index] for e in rows]
            batch = model.tokenize(texts, index == 0) if r.kind == "multi-vector" else \
                model.tokenize(texts).model_inputs()
            keys = _column_keys(index)
            out.update({keys[name]: value for name, value in batch.items()})
        return out

    if r.loss in NO_DUPLICATE_BATCHES:
        batcher = NoDuplicatesBatcher(examples, r.batch_size * world, seed=r.seed, fill=True, drop_last=False)
        cache: dict[int, list[list[int]]] = {}

        def batches_of(epoch: int) -> list[list[int]]:
            if epoch not in cache:
                cache.clear()
                cache[epoch] = _even_batches(batcher.batches(epoch), world)
            return cache[epoch]

        if not batches_of(0):
            raise DataError(f"{train_file}: {len(examples)} examples cannot give each of {world} processes one")

        def collate_global(items: list[int], epoch: int) -> dict[str, torch.Tensor]:
            (item,) = items
            global_batch = [examples[i] for i in batches_of(epoch)[item // world]]
            size = len(global_batch) // world
            local = slice(item % world * size, (item % world + 1) * size)
            batch = tokenize_columns(global_batch[local])
            # text ids numbered over the whole global batch: equal on every process for one text
            ids = L.text_ids([[e.texts[c] for e in global_batch] for c in range(columns)])
            batch["duplicates"] = ids[:, local]
            return batch

        return _Batching(list(range(len(batches_of(0)) * world)), 1, collate_global, len(batches_of(0)), False)

    def collate(rows: list[Any], epoch: int) -> dict[str, torch.Tensor]:
        batch = tokenize_columns(rows)
        if data.shape == SCORED_PAIR:
            batch["scores"] = torch.tensor([e.score for e in rows], dtype=torch.float32)
        elif data.shape == LABELLED_PAIR:
            batch["labels"] = torch.tensor([e.label for e in rows], dtype=torch.long)
        return batch

    # The gathering CoSENT needs one batch size on every process: the last incomplete global batch is dropped.
    global_batch_size = r.batch_size * world
    steps = len(examples) // global_batch_size if gather else -(-len(examples) // global_batch_size)
    if steps == 0:
        raise DataError(f"{train_file}: {len(examples)} examples do not fill one batch of {r.batch_size} on each "
                        f"of {world} processes; lower --batch-size")
    return _Batching(examples, r.batch_size, collate, steps, gather)


CALIBRATION_TEXTS = 256  # documents that --start-active-terms calibrates on


def _start_sparse_vectors(model: Any, data: Any, r: EmbedderRecipe) -> None:
    """``calibrate_active_terms`` on up to CALIBRATION_TEXTS of the training documents (a seeded sample of the
    distinct positives and negatives, with the document prompt that training puts before them)."""
    import random

    from ..embeddings.sparse import calibrate_active_terms

    documents = sorted({text for example in data.examples for text in example.texts[1:]})
    sample = random.Random(r.seed).sample(documents, min(CALIBRATION_TEXTS, len(documents)))
    done = calibrate_active_terms(model, [(r.document_prompt or "") + text for text in sample], r.start_active_terms)
    log.info("MLM head bias shifted by %.3f: %d training documents average %.0f active terms (%.0f before)",
             -done["shift"], len(sample), done["active_after"], done["active_before"])


def prepare_embedder(model_dir: str | Path | None, train_file: str | Path, out_dir: str | Path,
                     recipe: EmbedderRecipe | None = None) -> EmbedderSetup:
    """Read the data, load the model and build the loss and the Trainer of ``train_embedder``, without training."""
    r = recipe or EmbedderRecipe()
    world = world_and_rank()[0]
    gather = (r.loss in GATHERING_LOSSES if r.gather_across_processes is None else r.gather_across_processes) and \
        world > 1
    data = read_training_file(train_file, loss=r.loss)
    if r.loss == "softmax" and len(data.labels or {}) < 2:
        raise DataError(f"{train_file}: the softmax loss classifies pairs into at least 2 labels, and the file has "
                        f"one ({', '.join(data.label_names)}); add pairs of another label or use another loss")
    if r.loss == "triplet" and not data.negative_columns:
        raise DataError(f"{train_file}: the triplet loss needs a negative column (anchor, positive, negative)")
    model = _embedder_model(model_dir, r)
    if r.start_active_terms is not None:
        _start_sparse_vectors(model, data, r)
    loss_module = _loss_module(r, model, len(data.labels or {}), gather)
    columns = (3 if r.loss == "triplet" else 2 + len(data.negative_columns)) if data.shape == ANCHOR_POSITIVE else 2
    batching = _batching(r, model, data, columns, world, gather, train_file)
    total_steps = r.max_steps or max(1, math.ceil(r.epochs * batching.steps_per_epoch))
    evaluate = None
    metric = None
    if r.valid is not None:
        metric, evaluate = _validation(r.valid, r.loss, data.labels)
    config = TrainingConfig(output_dir=str(out_dir), max_steps=total_steps, batch_size=batching.batch_size,
                            learning_rate=r.learning_rate, warmup_ratio=r.warmup_ratio, eval_every=r.eval_every,
                            save_every=r.save_every, seed=r.seed, bf16=r.bf16, device=r.device,
                            drop_last=batching.drop_last, time_budget_s=r.time_budget_s,
                            show_progress=r.show_progress, metric_for_best=metric,
                            # in-batch negatives' batches come shuffled, and slice p of one goes to process p
                            shuffle=r.loss not in NO_DUPLICATE_BATCHES, save_final=True)
    wrapper = EmbedderTraining(model, loss_module, r.loss, columns)
    trainer = Trainer(wrapper, config, batching.items, batching.collate,
                      evaluate=(lambda m: evaluate(m.model)) if evaluate else None, tokenizer=model.tokenizer)
    return EmbedderSetup(trainer=trainer, model=model, metric=metric, examples=len(data.examples))


def train_embedder(model_dir: str | Path | None, train_file: str | Path, out_dir: str | Path,
                   recipe: EmbedderRecipe | None = None, *, resume: bool = True) -> EmbedderResult:
    """Fine-tune ``model_dir`` (any family encoderkit loads; None: the default model) into a sentence embedder
    on ``train_file`` with ``loss``; checkpoints, metrics.jsonl, loss.png, best/ (by the validation metric when
    ``valid`` is given) and final/ go under ``out_dir``; final/ is a sentence-transformers directory. Rerunning
    with the same out_dir resumes from its last checkpoint (``resume=False`` starts over). ``recipe``: the loss and
    how to train (``EmbedderRecipe``; default: MNRL, 1 epoch)."""
    recipe = recipe or EmbedderRecipe()
    with distributed_run(recipe.device):  # under torchrun: one process group, DDP, gathering
        setup = prepare_embedder(model_dir, train_file, out_dir, recipe)
        result = setup.trainer.train(resume=resume)
        return finish_embedder(out_dir, setup, result)


def _even_batches(batches: list[list[int]], processes: int) -> list[list[int]]:
    """Each global batch cut to a multiple of the process count (only the epoch's last one can be short): the
    processes then hold batches of one size, which gathering needs. At most processes - 1 examples of an epoch are
    left out (another each epoch, as the order is reshuffled), and a last batch of fewer examples than processes."""
    if processes == 1:
        return batches
    even = [batch[:len(batch) // processes * processes] for batch in batches]
    left_out = sum(len(b) for b in batches) - sum(len(b) for b in even)
    if left_out:
        log.info("%d example(s) of this epoch left out, so that the last batch splits evenly over %d processes",
                 left_out, processes)
    return [batch for batch in even if batch]


def finish_embedder(out_dir: str | Path, setup: EmbedderSetup, result: dict[str, Any]) -> EmbedderResult:
    """Drop the softmax classifier (kept for resuming only) from final/ and best/, and sum the run up."""
    final_dir = Path(out_dir) / "final"
    for directory in (final_dir, Path(out_dir) / "best"):
        (directory / LOSS_HEAD_FILE).unlink(missing_ok=True)
    return EmbedderResult(final_dir=final_dir, step=result["step"], best_metric=result["best_metric"],
                          best_step=result["best_step"], metric=setup.metric, history=result["history"])


__all__ = ["EmbedderRecipe", "EmbedderResult", "EmbedderSetup", "EmbedderTraining", "KIND_LOSSES", "LOSSES",
           "finish_embedder", "prepare_embedder",
           "train_embedder"]
