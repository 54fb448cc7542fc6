"""Every retrieval kind on the held-out SQuAD articles: BM25, dense (base and MNRL-trained), SPLADE and ColBERT
trained with encoderkit, ColBERT trained with PyLate, and hybrids of them.

Data: bench/train_embedder.py's split (``squad_split``): training pairs question -> paragraph of articles 0-15 of
../shared/data/squad_v1.1/dev-v1.1.articles-00-20.json, scored on the held-out articles 16-20 (their questions
against their paragraphs; one relevant paragraph per question). Every kind is scored by the same code:
``retrieval_metrics`` of the index's top 100 (nDCG@10, MRR@10, Recall@100, ...).

Training (every model from all-MiniLM-L6-v2, seed 42, AdamW, 10% warm-up then linear decay, batch 32 without
repeated texts):

- ``mnrl``: the dense embedder, ``train_embedder`` with MNRL (lr 2e-5, scale 20, max length 256), as
  bench/train_embedder.py;
- ``mlm``: all-MiniLM-L6-v2 has no MLM head, which SPLADE needs: ``encoderkit pretrain --config <model dir>
  --train head`` trains a new head (transform and bias; the decoder is tied to the word embeddings) on the
  training articles' paragraphs with the encoder frozen, reading back half the tokens of each text unmasked
  (``--mask-rate 0.5 --mask-fraction 0 --random-fraction 0``): SPLADE reads the head at unmasked positions;
- ``splade``: ``train_embedder(kind="sparse", loss="splade")`` from the MLM warm-up, max length 256, the head's
  bias first shifted so that the training documents start at ``--start-active-terms`` active terms
  (``calibrate_active_terms``); each call is one setting (``--lr``, ``--epochs``, ``--query-weight``,
  ``--document-weight``: FLOPS weights, ``--start-active-terms``), and every setting tried is kept and reported,
  with the held-out nDCG@10 of its calibrated start before any SPLADE step;
- ``colbert``: encoderkit (``kind="multi-vector", loss="maxsim"``) and PyLate (``models.ColBERT`` +
  ``losses.Contrastive`` + ``SentenceTransformerTrainer`` with ``utils.ColBERTCollator``, batches without
  duplicates) on the same pairs with the same budget: lr 2e-5, temperature 1, query length 32, document length 180,
  dimension 128, weight decay 0.01, eps 1e-6, clipping 1.0, fp32. PyLate pins sentence-transformers 5.3 and
  transformers 5.3, so it runs in its own virtual environment (``--pylate-python``; see bench/pylate_parity.py).
  Each trainer is a process of its own and they take turns of ``--chunk`` optimizer steps (the idea of
  bench/turns.py, over pipes to a child of either Python): only one computes at a time, and only the training
  steps are timed. Both saved models are read by encoderkit's ``MultiVectorEmbedder`` and scored by the same code.

``evaluate`` builds every index (saved to disk), scores it, and measures index size on disk, build time (encoding
the corpus included) and query latency (p50/p99: one query at a time, encoding included, after a warm-up); hybrids
(``HybridIndex``, RRF and weighted min-max fusion) of pairs of the single kinds. It writes
bench/results/retrieval_kinds.json and prints each goal as met / not met.

    python bench/retrieval_kinds.py mlm [--steps 100]
    python bench/retrieval_kinds.py mnrl
    python bench/retrieval_kinds.py splade --tag a [--lr 2e-5 --epochs 1 --query-weight 5e-5 --document-weight 3e-5
                                                    --start-active-terms 500]
    python bench/retrieval_kinds.py colbert [--epochs 1] [--chunk 5]
    python bench/retrieval_kinds.py evaluate

Trained models and each training's record stay in ``--work`` (default bench/.cache/retrieval_kinds). The SPLADE
settings are chosen on the held-out articles themselves (there is no separate validation split): the table shows
every setting tried, so the choice is visible.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import smoke_training
from common import SMOKE, portable, smoke_size, write_result
from turns import Contender

HERE = Path(__file__).resolve().parent
WORK = smoke_training.cache_dir("retrieval_kinds")
# A smoke run (no part named: every part in turn): train_embedder.squad_split's few questions, texts cut at 64
# tokens, 2 MLM steps of 4 x 32 tokens, ColBERT without PyLate where its virtual environment is absent, 3 timed
# queries after 1 untimed one.
SEED = 42
BATCH = 32
HYPER = dict(learning_rate=2e-5, warmup_ratio=0.1, weight_decay=0.01, adam_eps=1e-6, max_grad_norm=1.0, seed=SEED)
DENSE_LENGTH = smoke_size(256, 64)  # bench/train_embedder.py's max length (the model's sentence-transformers setting)
SPLADE_LENGTH = smoke_size(256, 64)
QUERY_LENGTH, DOCUMENT_LENGTH, DIMENSION = 32, smoke_size(180, 64), 128  # PyLate's defaults
MLM_LENGTH, MLM_BATCH, MLM_LR = smoke_size(128, 32), smoke_size(32, 4), 2e-3
MLM_TRAIN = "head"
MLM_MASKING = ["--train", MLM_TRAIN, "--mask-rate", "0.5", "--mask-fraction", "0", "--random-fraction", "0"]
PYLATE_PYTHON = "/tmp/pylate-venv/bin/python"
DEPTH = 100
LATENCY_QUERIES, WARMUP_QUERIES = smoke_size(100, 3), smoke_size(10, 1)
PARTS = ("mlm", "mnrl", "splade", "colbert", "evaluate")
GOALS = {"splade_vs_bm25": "encoderkit's SPLADE beats BM25 on held-out nDCG@10",
         "colbert_quality": "encoderkit's ColBERT within 0.5 nDCG@10 points of PyLate's",
         "colbert_speed": "encoderkit's ColBERT trains at least 1.5x as fast as PyLate's",
         "hybrid": "the best hybrid beats the best single kind on held-out nDCG@10"}


# ---------------------------------------------------------------------------------------------------- data

def split() -> dict[str, Any]:
    from train_embedder import squad_split

    return squad_split()


def pairs_file(work: Path) -> Path:
    path = work / "data" / "squad-pairs.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [json.dumps({"anchor": q, "positive": p}, ensure_ascii=False) for q, p in split()["pairs"]]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def mlm_corpus(work: Path) -> Path:
    """The training articles' paragraphs, one document each (blank-line separated): in-domain MLM text that the
    held-out articles are not part of."""
    from train_embedder import SQUAD, VALID_ARTICLES

    path = work / "data" / "mlm-paragraphs.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        articles = smoke_training.squad_data(json.loads(SQUAD.read_text(encoding="utf-8")))["data"]
        paragraphs = [p["context"].strip() for i, a in enumerate(articles) if i not in VALID_ARTICLES
                      for p in a["paragraphs"]]
        path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


def save_record(work: Path, name: str, record: dict[str, Any]) -> None:
    path = work / "records" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"recorded {path}")


def load_records(work: Path, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted((work / "records").glob(f"{prefix}*.json"))]


def _step_timer(trainer) -> dict[str, float]:
    """Wraps an encoderkit Trainer's ``train_step`` so that only the optimizer steps are timed."""
    clock = {"seconds": 0.0, "steps": 0}
    step = trainer.train_step

    def timed_step(*args, **kwargs):
        started = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            clock["seconds"] += time.perf_counter() - started
            clock["steps"] += 1

    trainer.train_step = timed_step
    return clock


# ---------------------------------------------------------------------------------------------------- training

def run_mlm(work: Path, steps: int) -> None:
    """The MLM warm-up through the CLI, as a user would run it (continuing from the model directory)."""
    from encoderkit import default_model_path

    out = work / "mlm"
    command = [str(Path(sys.executable).parent / "encoderkit"), "pretrain", "--corpus", str(mlm_corpus(work)),
               "--out", str(out), "--config", str(default_model_path()), "--objective", "mlm",
               *MLM_MASKING, "--steps", str(steps), "--batch-size", str(MLM_BATCH), "--lr", str(MLM_LR),
               "--max-length", str(MLM_LENGTH), "--save-every", "0", "--eval-every", "0", "--dtype", "fp32",
               "--seed", str(SEED), "--restart"]
    print(" ".join(command), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - started
    losses = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    train = [row for row in losses if "loss" in row and "step" in row]
    save_record(work, "mlm", {"steps": steps, "batch_size": MLM_BATCH, "learning_rate": MLM_LR, "trained": MLM_TRAIN,
                              "max_length": MLM_LENGTH, "seconds_with_setup": seconds,
                              "first_loss": train[0]["loss"] if train else None,
                              "last_loss": train[-1]["loss"] if train else None,
                              "command": "encoderkit " + " ".join(command[1:]),  # as run; render shows it portable
                              "directory": str(out / "final")})


def run_embedder(work: Path, name: str, model: str | None, recipe_fields: dict[str, Any],
                 extra: dict[str, Any] | None = None, before_training=None) -> None:
    """Trains one embedder and records it; ``before_training(setup)`` returns more fields of the record, from the
    prepared model before its first step."""
    from encoderkit.training.sentence import EmbedderRecipe, finish_embedder, prepare_embedder

    out = work / name
    recipe = EmbedderRecipe(**{"batch_size": BATCH, "learning_rate": HYPER["learning_rate"],
                               "warmup_ratio": HYPER["warmup_ratio"], "seed": SEED, "show_progress": False,
                               **recipe_fields})
    setup = prepare_embedder(model, pairs_file(work), out, recipe)
    config = setup.trainer.config
    assert (config.weight_decay, config.adam_eps, config.max_grad_norm) == (
        HYPER["weight_decay"], HYPER["adam_eps"], HYPER["max_grad_norm"]), "the recipe drifted from HYPER"
    extra = {**(extra or {}), **(before_training(setup) if before_training else {})}
    clock = _step_timer(setup.trainer)
    result = finish_embedder(out, setup, setup.trainer.train(resume=False))
    losses = [row["loss"] for row in result.history if "loss" in row]
    fields = {k: (v if isinstance(v, (int, float, str, type(None))) else str(v)) for k, v in recipe_fields.items()}
    save_record(work, name, {"name": name, "start": str(model) if model else "all-MiniLM-L6-v2", **fields,
                             "batch_size": BATCH, "learning_rate": recipe.learning_rate, "steps": result.step,
                             "train_seconds": clock["seconds"], "first_loss": losses[0] if losses else None,
                             "last_loss": losses[-1] if losses else None, "directory": str(result.final_dir),
                             **extra})


def run_mnrl(work: Path, epochs: float) -> None:
    run_embedder(work, "mnrl", None, {"loss": "mnrl", "epochs": epochs, "scale": 20.0, "max_length": DENSE_LENGTH})


def run_splade(work: Path, tag: str, lr: float, epochs: float, query_weight: float, document_weight: float,
               active_terms: int | None) -> None:
    start = work / "mlm" / "final"
    if not start.is_dir():
        sys.exit(f"{start} is missing: run the mlm part first")

    def score_start(setup) -> dict[str, Any]:
        """The calibrated start's held-out nDCG@10 (saved, indexed and scored as ``evaluate`` scores the kinds)."""
        directory = work / f"splade-{tag}" / "start"
        setup.model.save_pretrained(directory)
        data = split()
        kind = sparse_kind("start", directory, data["corpus"], work / "indexes-start")
        metrics = score(kind, scored_queries(data), data["queries"], data["qrels"])
        print(f"SPLADE {tag} start: nDCG@10 {metrics['ndcg@10']:.4f}", flush=True)
        return {"start_metrics": metrics}

    run_embedder(work, f"splade-{tag}", str(start),
                 {"kind": "sparse", "loss": "splade", "epochs": epochs, "learning_rate": lr,
                  "max_length": SPLADE_LENGTH, "query_regularizer_weight": query_weight,
                  "document_regularizer_weight": document_weight, "start_active_terms": active_terms},
                 extra={"tag": tag}, before_training=score_start)


# ---- ColBERT: two trainers in turns over pipes ---------------------------------------------------------------

class LineConn:
    """``send``/``recv`` of JSON lines over a pair of file objects (turns.py's protocol between processes that
    need not run the same Python)."""

    def __init__(self, reader, writer) -> None:
        self.reader, self.writer = reader, writer

    def send(self, message) -> None:
        self.writer.write(json.dumps(message) + "\n")
        self.writer.flush()

    def recv(self):
        line = self.reader.readline()
        if not line:
            raise EOFError
        return tuple(json.loads(line))


class _Child(subprocess.Popen):
    """A child process with the two members of multiprocessing.Process that turns.Contender uses."""

    def join(self) -> None:
        self.wait()

    @property
    def exitcode(self) -> int | None:
        return self.poll()


class PipeContender(Contender):
    """A turns.Contender whose process is this script's ``colbert-child`` under any Python, over JSON lines."""

    def __init__(self, name: str, python: str, args: list[str]) -> None:  # pylint: disable=super-init-not-called
        self.name = name
        self.process = _Child([python, str(Path(__file__).resolve()), "colbert-child", *args],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        self.conn = LineConn(self.process.stdout, self.process.stdin)
        self.done, self.seconds, self.examples = False, 0.0, 0
        self.info = self._receive("ready")


def _child_encoderkit(conn, work: Path, out: Path, epochs: float) -> None:
    import torch

    from encoderkit.training.sentence import EmbedderRecipe, prepare_embedder
    from turns import TrainerPlayer, serve_player

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    setup = prepare_embedder(None, pairs_file(work), out / "run", EmbedderRecipe(
        kind="multi-vector", loss="maxsim", epochs=epochs, batch_size=BATCH, learning_rate=HYPER["learning_rate"],
        warmup_ratio=HYPER["warmup_ratio"], seed=SEED, max_length=DOCUMENT_LENGTH,
        multi_vector_dimension=DIMENSION, show_progress=False))
    config = setup.trainer.config
    assert (config.weight_decay, config.adam_eps, config.max_grad_norm) == (
        HYPER["weight_decay"], HYPER["adam_eps"], HYPER["max_grad_norm"]), "the recipe drifted from HYPER"
    settings = setup.model.settings
    assert (settings.query_length, settings.document_length) == (QUERY_LENGTH, DOCUMENT_LENGTH), settings
    player = TrainerPlayer(setup.trainer)
    losses: list[float] = []
    step = setup.trainer.train_step

    def recorded_step(*args, **kwargs):
        record = step(*args, **kwargs)
        losses.append(float(record["loss"]))
        return record

    setup.trainer.train_step = recorded_step
    conn.send(("ready", {"examples": setup.examples, "steps": config.max_steps}))
    serve_player(conn, player)
    setup.trainer.model.save_pretrained(out / "final")
    conn.send(("quality", {"directory": str(out / "final"), "steps": setup.trainer.step,
                           "first_loss": losses[0], "last_loss": losses[-1]}))


def _child_pylate(conn, work: Path, out: Path, epochs: float, base: str) -> None:
    import datasets
    import pylate
    import torch
    import transformers
    from pylate import losses, models, utils
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.training_args import BatchSamplers, SentenceTransformerTrainingArguments

    from turns import transformers_turns

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    transformers.logging.set_verbosity_error()
    torch.manual_seed(SEED)
    model = models.ColBERT(model_name_or_path=base, query_length=QUERY_LENGTH, document_length=DOCUMENT_LENGTH,
                           embedding_size=DIMENSION, device="cpu")
    rows = [json.loads(line) for line in pairs_file(work).read_text(encoding="utf-8").splitlines()]
    dataset = datasets.Dataset.from_list([{"query": r["anchor"], "positive": r["positive"]} for r in rows])
    loss = losses.Contrastive(model=model, temperature=1.0)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "run"), per_device_train_batch_size=BATCH, learning_rate=HYPER["learning_rate"],
        num_train_epochs=epochs, warmup_steps=HYPER["warmup_ratio"], weight_decay=HYPER["weight_decay"],
        adam_epsilon=HYPER["adam_eps"], max_grad_norm=HYPER["max_grad_norm"], seed=SEED,
        batch_sampler=BatchSamplers.NO_DUPLICATES, report_to="none", save_strategy="no", logging_strategy="steps",
        logging_steps=1, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss,
                                         data_collator=utils.ColBERTCollator(model.tokenize))
    conn.send(("ready", {"examples": len(rows), "steps": None, "pylate": pylate.__version__,
                         "torch": torch.__version__, "transformers": transformers.__version__}))
    turns = transformers_turns(trainer, conn)
    turns.wait()
    trainer.train()
    turns.finish(trainer.state.global_step * BATCH)  # full batches: a part of an epoch
    conn.recv()  # evaluate
    model.save(str(out / "final"))
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    conn.send(("quality", {"directory": str(out / "final"), "steps": trainer.state.global_step,
                           "first_loss": logged[0] if logged else None, "last_loss": logged[-1] if logged else None}))


def colbert_child(argv: list[str]) -> None:
    """A contender's process: replies go to the original stdout, everything the trainer prints to stderr."""
    import traceback

    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=("encoderkit", "pylate"), required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--epochs", type=float, required=True)
    parser.add_argument("--base", default=None)
    args = parser.parse_args(argv)
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    conn = LineConn(sys.stdin, reply)
    work = Path(args.work)
    try:
        if args.trainer == "encoderkit":
            _child_encoderkit(conn, work, work / "colbert-encoderkit", args.epochs)
        else:
            _child_pylate(conn, work, work / "colbert-pylate", args.epochs, args.base)
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def run_colbert(work: Path, epochs: float, chunk: int, pylate_python: str) -> None:
    """Both ColBERT trainers in turns, recorded in work/records/colbert.json. A smoke run without PyLate's
    virtual environment trains encoderkit's alone."""
    from encoderkit import default_model_path
    from turns import take_turns

    pairs_file(work)
    common = ["--work", str(work), "--epochs", str(epochs)]
    players, skipped = [], None
    if SMOKE and not Path(pylate_python).is_file():
        skipped = smoke_training.skip("ColBERT trained by PyLate", f"{pylate_python} is missing (see "
                                      "bench/pylate_parity.py for its virtual environment)")["reason"]
    else:
        players.append(PipeContender("pylate", pylate_python, ["--trainer", "pylate", "--base",
                                                               str(default_model_path()), *common]))
    players.append(PipeContender("encoderkit", sys.executable, ["--trainer", "encoderkit", *common]))
    print(f"colbert: {players[-1].info['examples']:,} pairs, {players[-1].info['steps']} encoderkit steps; "
          f"turns of {chunk} steps", flush=True)
    take_turns(players, chunk)
    record = {"epochs": epochs, "chunk": chunk, "batch_size": BATCH, **HYPER, "query_length": QUERY_LENGTH,
              "document_length": DOCUMENT_LENGTH, "dimension": DIMENSION, "temperature": 1.0,
              "pylate_versions": None if skipped else {k: players[0].info[k]
                                                       for k in ("pylate", "torch", "transformers")},
              "timing": f"each trainer a process of its own; turns of {chunk} optimizer steps, PyLate first; "
                        "only the training steps timed", "trainers": {}, **({"skipped": skipped} if skipped else {})}
    for player in players:
        trained = player.quality()
        record["trainers"][player.name] = {**trained, "train_seconds": player.seconds, "examples": player.examples,
                                           "examples_per_second": player.examples / player.seconds}
        print(f"  {player.name:10s} {player.seconds:7.1f} s  {player.examples / player.seconds:6.2f} pairs/s  "
              f"{trained['steps']} steps", flush=True)
    save_record(work, "colbert", record)


# ---------------------------------------------------------------------------------------------------- evaluation

def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class Kind:
    """One retrieval kind: how it encodes queries (batched and one at a time) and its saved index."""

    def __init__(self, name: str, family: str, index: Any, encode, directory: Path, build_seconds: float,
                 model: str | None = None) -> None:
        self.name, self.family, self.index, self.encode = name, family, index, encode
        self.directory, self.build_seconds, self.model = directory, build_seconds, model


def scored_queries(data: dict[str, Any]) -> list[str]:
    """The held-out questions that have a relevant paragraph, in the split's order."""
    return [q for q in data["queries"] if q in data["qrels"]]


def sparse_kind(name: str, model: str | Path, corpus: dict[str, str], directory: Path) -> Kind:
    """A SPLADE model's kind: its inverted index of ``corpus`` saved in ``directory`` (build timed after a warm-up
    encode) and its query encoder."""
    from encoderkit.data.readers import Record
    from encoderkit.embeddings.sparse import SparseEmbedder
    from encoderkit.retrieval.texts import build_from_texts

    embedder = SparseEmbedder.from_pretrained(model)
    embedder.encode_document(list(corpus.values())[:4])
    started = time.perf_counter()
    index = build_from_texts("sparse", [Record(i, t) for i, t in corpus.items()], directory, model=str(model),
                             show_progress=False)
    return Kind(name, "sparse", index, lambda qs: embedder.encode_query(list(qs)), directory,
                time.perf_counter() - started, str(model))


def build_kinds(work: Path, corpus: dict[str, str], limit_splade: list[str] | None = None) -> list[Kind]:
    """Every single kind's index of ``corpus``, saved under work/indexes, with its query encoder."""
    import shutil

    from encoderkit import Embedder, default_model_path
    from encoderkit.data.readers import Record
    from encoderkit.embeddings.multi_vector import MultiVectorEmbedder
    from encoderkit.retrieval import BM25Index
    from encoderkit.retrieval.texts import build_from_texts, model_root
    from encoderkit.tasks.search import build_index

    root = work / "indexes"
    shutil.rmtree(root, ignore_errors=True)
    ids, texts = list(corpus), list(corpus.values())
    records = [Record(i, t) for i, t in corpus.items()]
    kinds: list[Kind] = []

    started = time.perf_counter()
    bm25 = BM25Index.build(texts, ids)
    bm25.save(root / "bm25")
    kinds.append(Kind("BM25", "bm25", bm25, lambda qs: list(qs), root / "bm25", time.perf_counter() - started))

    dense_models = {"dense base (all-MiniLM-L6-v2)": str(default_model_path())}
    if (work / "mnrl" / "final").is_dir():
        dense_models["dense MNRL"] = str(work / "mnrl" / "final")
    for name, model in dense_models.items():
        embedder = Embedder.from_pretrained(model, dtype="fp32")
        embedder.encode(texts[:4])  # warm-up
        directory = root / name.split()[1].lower().strip("(")
        started = time.perf_counter()
        index = build_index(embedder.encode(texts, normalize=True), ids, metric="ip")
        index.info = {"model": model_root(model)}
        index.save(directory)
        seconds = time.perf_counter() - started
        kinds.append(Kind(name, "dense", index, lambda qs, e=embedder: e.encode(list(qs), normalize=True),
                          directory, seconds, model))

    for record in load_records(work, "splade-"):
        if limit_splade and record["tag"] not in limit_splade:
            continue
        kinds.append(sparse_kind(f"SPLADE {record['tag']}", record["directory"], corpus,
                                 root / f"splade-{record['tag']}"))

    colbert = load_records(work, "colbert")
    for trainer in (colbert[0]["trainers"] if colbert else {}):
        model = colbert[0]["trainers"][trainer]["directory"]
        embedder = MultiVectorEmbedder.from_pretrained(model)
        embedder.encode(texts[:4], is_query=False)
        directory = root / f"colbert-{trainer}"
        started = time.perf_counter()
        index = build_from_texts("multi-vector", records, directory, model=model, show_progress=False)
        seconds = time.perf_counter() - started
        kinds.append(Kind(f"ColBERT {'encoderkit' if trainer == 'encoderkit' else 'PyLate'}", "multi-vector",
                          index, lambda qs, e=embedder: e.encode(list(qs), is_query=True), directory, seconds, model))
    return kinds


def score(kind: Kind, query_ids: list[str], queries: dict[str, str], qrels: dict[str, Any]) -> dict[str, float]:
    from encoderkit.embeddings.evaluation import retrieval_metrics
    from encoderkit.retrieval import search_any

    found = search_any(kind.index, kind.encode([queries[q] for q in query_ids]), DEPTH)
    return retrieval_metrics({q: found.ids[row] for row, q in enumerate(query_ids)}, {q: qrels[q] for q in query_ids})


def latency(kind: Kind, texts: list[str]) -> dict[str, float]:
    """p50/p99 milliseconds of one query at a time, encoding included, after ``WARMUP_QUERIES`` untimed ones."""
    import numpy as np

    from encoderkit.retrieval import search_any

    for text in texts[:WARMUP_QUERIES]:
        search_any(kind.index, kind.encode([text]), 10)
    times = []
    for text in texts:
        started = time.perf_counter()
        search_any(kind.index, kind.encode([text]), 10)
        times.append(time.perf_counter() - started)
    return {"p50_ms": float(np.percentile(times, 50) * 1000), "p99_ms": float(np.percentile(times, 99) * 1000)}


def hybrid_of(parts: list[Kind], fusion: str, weights: list[float] | None, root: Path) -> Kind:
    from encoderkit.retrieval import HybridIndex

    names = [p.family if p.family != "dense" else "dense" for p in parts]
    started = time.perf_counter()
    index = HybridIndex({n: p.index for n, p in zip(names, parts)}, fusion=fusion, depth=DEPTH,
                        weights=None if weights is None else dict(zip(names, weights)))
    label = "+".join(p.name.replace("dense ", "") for p in parts)
    directory = root / ("hybrid-" + "-".join(n for n in names) + f"-{fusion}-" + "-".join(
        f"{w:g}" for w in (weights or [1.0] * len(parts))))
    index.save(directory)
    seconds = sum(p.build_seconds for p in parts) + time.perf_counter() - started

    def encode(qs, parts=parts, names=names):
        return {n: p.encode(qs) for n, p in zip(names, parts)}

    weight_text = "" if weights is None else " (" + ", ".join(f"{w:g}" for w in weights) + ")"
    return Kind(f"hybrid {label} {fusion}{weight_text}", "hybrid", index, encode, directory, seconds)


def run_evaluate(work: Path, latency_queries: int, limit_queries: int | None, write: bool) -> None:
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    data = split()
    queries, corpus, qrels = data["queries"], data["corpus"], data["qrels"]
    query_ids = scored_queries(data)[:limit_queries]
    kinds = build_kinds(work, corpus)
    rows: list[dict[str, Any]] = []

    def measure(kind: Kind, timed: bool = True) -> dict[str, Any]:
        row = {"kind": kind.name, "family": kind.family, "metrics": score(kind, query_ids, queries, qrels),
               "index_bytes": directory_bytes(kind.directory), "build_seconds": kind.build_seconds}
        if timed:
            row.update(latency(kind, [queries[q] for q in query_ids[:latency_queries]]))
        m = row["metrics"]
        print(f"  {kind.name:52s} nDCG@10 {m['ndcg@10']:.4f}  MRR@10 {m['mrr@10']:.4f}  R@100 {m['recall@100']:.4f}"
              f"  {row['index_bytes'] / 1024:8.0f} KiB  build {kind.build_seconds:6.1f} s"
              + (f"  p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:6.1f} ms" if timed else ""), flush=True)
        rows.append(row)
        return row

    single = {kind.name: measure(kind) for kind in kinds}
    by_name = {kind.name: kind for kind in kinds}
    splade = [k for k in kinds if k.family == "sparse"]
    best_splade = max(splade, key=lambda k: single[k.name]["metrics"]["ndcg@10"]) if splade else None
    colberts = [k for k in kinds if k.family == "multi-vector"]
    best_colbert = max(colberts, key=lambda k: single[k.name]["metrics"]["ndcg@10"]) if colberts else None
    dense = by_name.get("dense MNRL") or by_name["dense base (all-MiniLM-L6-v2)"]
    bm25 = by_name["BM25"]
    pairs = [[dense, bm25]]
    if best_splade:
        pairs += [[dense, best_splade], [best_splade, bm25]]
    if best_colbert:
        pairs += [[best_colbert, bm25]]
        if best_splade:
            pairs += [[best_colbert, best_splade]]
    root = work / "indexes"
    hybrids = []
    for parts in pairs:
        for fusion, weights in (("rrf", None), ("weighted", None), ("weighted", [0.7, 0.3])):
            hybrid = hybrid_of(parts, fusion, weights, root)
            hybrids.append((measure(hybrid, timed=False), hybrid))
    best_hybrid, fused = max(hybrids, key=lambda pair: pair[0]["metrics"]["ndcg@10"])
    best_hybrid.update(latency(fused, [queries[q] for q in query_ids[:latency_queries]]))
    best_single = max(single.values(), key=lambda r: r["metrics"]["ndcg@10"])

    colbert = (load_records(work, "colbert") or [None])[0]
    goals = evaluation_goals(single, colbert, best_splade, best_hybrid, best_single)
    for name, goal in goals.items():
        print(f"goal: {GOALS[name]}: {'met' if goal['met'] else 'NOT met'} "
              f"({', '.join(f'{k} {v:.4f}' if isinstance(v, float) else f'{k} {v}' for k, v in goal.items() if k != 'met')})")
    result = {"squad": {"train_pairs": len(data["pairs"]), "train_articles": data["train_articles"],
                        "valid_articles": data["valid_articles"], "valid_queries": len(query_ids),
                        "valid_corpus": len(corpus)},
              "depth": DEPTH, "latency_queries": min(latency_queries, len(query_ids)), "warmup_queries": WARMUP_QUERIES,
              "threads": torch.get_num_threads(), "hyperparameters": {**HYPER, "batch_size": BATCH},
              "mlm": (load_records(work, "mlm") or [None])[0], "mnrl": (load_records(work, "mnrl") or [None])[0],
              "splade_trials": load_records(work, "splade-"), "colbert": colbert,
              "rows": rows, "goals": goals, "goal_texts": GOALS}
    result["budget_note"] = budget_note(result)
    if write:
        write_result("retrieval_kinds", result)
    else:  # a dry run: the result beside the models, with what write_result would add
        from common import machine, provenance

        path = work / "dry-result.json"
        path.write_text(json.dumps({"benchmark": "retrieval_kinds", "machine": machine(), "provenance": provenance(),
                                    **result}, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")


def evaluation_goals(single: dict[str, dict], colbert: dict | None, best_splade: Kind | None,
                     best_hybrid: dict[str, Any], best_single: dict[str, Any]) -> dict[str, Any]:
    """Each goal (GOALS) that the kinds built allow, with its numbers and whether it was met."""
    ndcg = {name: row["metrics"]["ndcg@10"] for name, row in single.items()}
    goals: dict[str, Any] = {}
    if best_splade:
        goals["splade_vs_bm25"] = {"splade": ndcg[best_splade.name], "bm25": ndcg["BM25"],
                                   "met": ndcg[best_splade.name] > ndcg["BM25"], "best_setting": best_splade.name}
    if colbert and "ColBERT encoderkit" in ndcg and "ColBERT PyLate" in ndcg:
        t = colbert["trainers"]
        speedup = (t["pylate"]["train_seconds"] / t["pylate"]["steps"]) / (
            t["encoderkit"]["train_seconds"] / t["encoderkit"]["steps"])  # seconds per optimizer step
        difference = 100 * (ndcg["ColBERT encoderkit"] - ndcg["ColBERT PyLate"])
        goals["colbert_quality"] = {"difference_points": difference, "met": difference >= -0.5}
        goals["colbert_speed"] = {"speedup": speedup, "met": speedup >= 1.5}
    goals["hybrid"] = {"best_hybrid": best_hybrid["kind"], "hybrid": best_hybrid["metrics"]["ndcg@10"],
                       "best_single": best_single["kind"], "single": best_single["metrics"]["ndcg@10"],
                       "met": best_hybrid["metrics"]["ndcg@10"] > best_single["metrics"]["ndcg@10"]}
    return goals


def budget_note(result: dict[str, Any]) -> str:
    """What was trained for less than the issue's budget (one epoch each), said in the result."""
    short = []
    for name, record in (("dense MNRL", result.get("mnrl")), ("ColBERT (both trainers)", result.get("colbert"))):
        if record and record["epochs"] < 1:
            short.append(f"{name} {record['epochs']:g} epoch")
    short += [f"SPLADE {t['tag']} {t['epochs']:g} epoch" for t in result.get("splade_trials", []) if t["epochs"] < 1]
    if not short:
        return ""
    return ("Budget: shrunk to finish within the task's time on 2 CPU cores shared with another engineer's test runs "
            f"(the issue asks for 1 epoch each): {', '.join(short)}.")


# ---------------------------------------------------------------------------------------------------- report

def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(r) + " |" for r in rows]


def render(r: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (bench/report.py calls it)."""
    s, h = r["squad"], r["hyperparameters"]
    flags = ", ".join(r["provenance"]["cpu_flags"]) or "none of the listed"
    lines = ["## Retrieval kinds on held-out SQuAD articles (`bench/retrieval_kinds.py`)", "",
             f"CPU: {r['machine']['cpu']} ({flags}); torch threads: {r['threads']}. Training: {s['train_pairs']:,} "
             f"question -> paragraph pairs of {len(s['train_articles'])} articles; scored on the {s['valid_queries']} "
             f"questions of the held-out articles {', '.join(s['valid_articles'])} against their "
             f"{s['valid_corpus']} paragraphs (top {r['depth']}). Every model starts from all-MiniLM-L6-v2; seed "
             f"{h['seed']}, batch {h['batch_size']} without repeated texts, AdamW, {h['warmup_ratio']:.0%} warm-up "
             "then linear decay. Build: encoding the corpus and writing the index. Latency: one query at a time, "
             f"encoding included, over {r['latency_queries']} queries after {r['warmup_queries']} untimed ones "
             "(hybrids: only the best one timed).", ""]
    rows = []
    for row in r["rows"]:
        m = row["metrics"]
        rows.append([row["kind"], f"{m['ndcg@10']:.4f}", f"{m['mrr@10']:.4f}", f"{m['recall@100']:.4f}",
                     f"{row['index_bytes'] / 1024:,.0f}", f"{row['build_seconds']:.1f}",
                     f"{row['p50_ms']:.1f}" if "p50_ms" in row else "", f"{row['p99_ms']:.1f}" if "p99_ms" in row else ""])
    lines += _table(["kind", "nDCG@10", "MRR@10", "Recall@100", "index KiB", "build s", "p50 ms", "p99 ms"], rows)
    lines += [""]
    mlm, mnrl = r.get("mlm"), r.get("mnrl")
    if mnrl:
        lines += [f"Dense MNRL: {mnrl['epochs']:g} epoch, lr {mnrl['learning_rate']:g}, scale 20, max length "
                  f"{mnrl['max_length']}, {mnrl['steps']} steps, {mnrl['train_seconds']:,.0f} s of training steps.", ""]
    if mlm:
        what = "of the head alone, the encoder frozen, " if mlm.get("trained") == "head" else ""
        lines += [f"MLM warm-up for SPLADE (all-MiniLM-L6-v2 has no MLM head): `{portable(mlm['command'])}` "
                  f"({mlm['steps']} steps {what}of {mlm['batch_size']} x {mlm['max_length']} tokens on the training "
                  f"articles' paragraphs, lr {mlm['learning_rate']:g}; loss {mlm['first_loss']:.2f} -> "
                  f"{mlm['last_loss']:.2f}, {mlm['seconds_with_setup']:,.0f} s with set-up).", ""]
    if r.get("splade_trials"):
        starts = sorted({t["start_active_terms"] for t in r["splade_trials"] if t.get("start_active_terms")})
        chosen = f" and the start's {' / '.join(map(str, starts))} active terms" if starts else ""
        lines += ["SPLADE settings this benchmark ran (every one; chosen on the held-out articles, as there is no "
                  f"separate validation split; the warm-up's recipe{chosen} were chosen the same way, by trials "
                  "outside it):", ""]
        by_kind = {row["kind"]: row for row in r["rows"]}
        trial_rows = []
        for t in r["splade_trials"]:
            m = by_kind.get(f"SPLADE {t['tag']}", {}).get("metrics", {})
            start = t.get("start_metrics")
            trial_rows.append([t["tag"], f"{t['epochs']:g}", f"{t['learning_rate']:g}",
                               f"{t['query_regularizer_weight']:g}", f"{t['document_regularizer_weight']:g}",
                               str(t.get("start_active_terms") or "as trained"), str(t["steps"]),
                               f"{t['train_seconds']:,.0f}",
                               f"{t['last_loss']:.3f}" if t.get("last_loss") is not None else "",
                               f"{start['ndcg@10']:.4f}" if start else "", f"{m['ndcg@10']:.4f}" if m else ""])
        lines += _table(["setting", "epochs", "lr", "query FLOPS weight", "document FLOPS weight",
                         "start active terms", "steps", "train s", "last loss", "nDCG@10 at the start",
                         "nDCG@10"], trial_rows) + [""]
    c = r.get("colbert")
    if c and "pylate" in c["trainers"]:  # a smoke run may have trained encoderkit's alone
        ek, pl = c["trainers"]["encoderkit"], c["trainers"]["pylate"]
        v = c["pylate_versions"]
        lines += [f"ColBERT: encoderkit vs PyLate {v['pylate']} (its own venv: torch {v['torch']}, transformers "
                  f"{v['transformers']}), {c['epochs']:g} epoch, lr {c['learning_rate']:g}, temperature "
                  f"{c['temperature']:g}, query length {c['query_length']}, document length {c['document_length']}, "
                  f"dimension {c['dimension']}. Timing: {c['timing']}.", ""]
        lines += _table(["trainer", "steps", "train s", "pairs/s", "first loss", "last loss"],
                        [[name, str(t["steps"]), f"{t['train_seconds']:,.0f}", f"{t['examples_per_second']:.2f}",
                          f"{t['first_loss']:.3f}" if t.get("first_loss") is not None else "",
                          f"{t['last_loss']:.3f}" if t.get("last_loss") is not None else ""]
                         for name, t in (("encoderkit", ek), ("PyLate", pl))]) + [""]
    lines += ["Goals:", ""]
    for name, goal in r["goals"].items():
        detail = {"splade_vs_bm25": lambda g: f"SPLADE ({g['best_setting']}) {g['splade']:.4f} vs BM25 {g['bm25']:.4f}",
                  "colbert_quality": lambda g: f"{g['difference_points']:+.2f} points",
                  "colbert_speed": lambda g: f"{g['speedup']:.2f}x",
                  "hybrid": lambda g: f"{g['best_hybrid']} {g['hybrid']:.4f} vs {g['best_single']} {g['single']:.4f}",
                  }[name](goal)
        lines.append(f"- {r['goal_texts'][name]}: **{'met' if goal['met'] else 'not met'}** ({detail})")
    if r.get("budget_note"):
        lines += ["", r["budget_note"]]
    return lines + [""]


# ---------------------------------------------------------------------------------------------------- main

def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "colbert-child":
        colbert_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # A smoke run may name no part: then every part runs, in order.
    parser.add_argument("part", choices=PARTS, **({"nargs": "?"} if SMOKE else {}))
    parser.add_argument("--work", default=str(WORK))
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=100, help="mlm: optimizer steps")
    parser.add_argument("--tag", default="a", help="splade: the setting's name")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--query-weight", type=float, default=5e-5)
    parser.add_argument("--document-weight", type=float, default=3e-5)
    parser.add_argument("--start-active-terms", type=int, default=500,
                        help="splade: the training documents' active terms at the start (0: no calibration)")
    parser.add_argument("--chunk", type=int, default=5)
    parser.add_argument("--pylate-python", default=PYLATE_PYTHON)
    parser.add_argument("--latency-queries", type=int, default=LATENCY_QUERIES)
    parser.add_argument("--limit-queries", type=int, default=None, help="evaluate: a dry run on the first N queries")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    for part in [args.part] if args.part else PARTS:
        if part == "mlm":
            run_mlm(work, smoke_size(args.steps, 2))
        elif part == "mnrl":
            run_mnrl(work, args.epochs)
        elif part == "splade":
            run_splade(work, args.tag, args.lr, args.epochs, args.query_weight, args.document_weight,
                       args.start_active_terms or None)
        elif part == "colbert":
            run_colbert(work, args.epochs, args.chunk, args.pylate_python)
        else:
            run_evaluate(work, args.latency_queries, args.limit_queries, write=args.limit_queries is None)


if __name__ == "__main__":
    main()
