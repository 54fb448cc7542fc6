"""Training sentence embedders and a reranker: encoderkit vs sentence-transformers' SentenceTransformerTrainer.

Both sides start from all-MiniLM-L6-v2 (the default model) with the same data, hyperparameters and epochs:
1 epoch, seed 42, AdamW lr 2e-5, 10% warm-up then linear decay, weight decay 0.01, eps 1e-6, clipping 1.0,
fp32, max sequence length 256 (the model's sentence-transformers setting), mean pooling + normalisation as saved.

Parts (``--parts``):
- ``mnrl``: multiple-negatives ranking (scale 20, batch 32, batches without repeated texts: ST's
  ``BatchSamplers.NO_DUPLICATES``, encoderkit's ``NoDuplicatesBatcher``) on SQuAD question -> paragraph pairs of
  articles 0-15 of ../shared/data/squad_v1.1 (articles 16-20 held out). Scored on the held-out articles: their
  questions against their paragraphs (nDCG@10, MRR@10, Recall@1/10/100, MAP@100), for the base model and each
  trainer's model.
- ``cosent``: CoSENT (scale 20, batch 16) on STS-B train (scores / 5), scored by Spearman on STS-B dev.
- ``memory``: peak RSS of one training step (a fresh process each) for MNRL at batch 32 and 128 and cached MNRL
  (GradCache, mini-batches of 32) at batch 32 and 512, on the SQuAD pairs.
- ``reranker``: a cross-encoder trained from all-MiniLM-L6-v2 on the SQuAD training pairs plus hard negatives
  mined with the base embedder (``train_reranker(negatives=N)``), reranking the bi-encoder's top 20 on the
  held-out articles, against the bi-encoder alone (base and fine-tuned).

Timing: each trainer is a process of its own, and they take turns of ``--chunk`` optimizer steps (bench/turns.py):
only one computes at a time, so machine-speed drift hits both alike. Training time excludes set-up and
evaluation. Every model is scored by the same code (encoderkit's evaluators, equal to sentence-transformers'
evaluators within 1e-4, tested) from its saved directory.

    python bench/train_embedder.py [--parts mnrl,cosent,memory,reranker] [--chunk 5] [--epochs 1] [--threads 2]

Needs the ``bench`` extra (sentence-transformers' trainer reads a datasets.Dataset):
``pip install -e '.[bench]'``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import smoke_training
from common import RESULTS, SHARED, SMOKE, require, smoke_size, write_result
from turns import Contender, TrainerPlayer, serve_player, take_turns, transformers_turns

# A smoke run: texts cut at 64 tokens, 2 questions of one paragraph an article, 32 STS-B rows, small batches for
# the memory part, and the reranker trained from a tiny random BERT (smoke_training).
HYPER = dict(epochs=1.0, learning_rate=2e-5, warmup_ratio=0.1, weight_decay=0.01, adam_eps=1e-6, max_grad_norm=1.0,
             seed=42, scale=20.0, max_length=smoke_size(256, 64))
BATCH = {"mnrl": 32, "cosent": 16}
VALID_ARTICLES = range(16, 21)  # Amazon_rainforest ... Black_Death: 715 questions, 126 paragraphs
RERANK_TOP = 20
RERANK_NEGATIVES = 1
RERANK_MAX_LENGTH = smoke_size(256, 64)
# The cross-encoder starts from a bi-encoder's weights with a new head: at lr 2e-5 for one epoch (511 steps) its
# training BCE stayed at 0.68-0.69 (chance: 0.693) and reranking hurt. BERT's fine-tuning rate and two epochs:
RERANK_LEARNING_RATE = 5e-5
RERANK_EPOCHS = 2.0
SQUAD = SHARED / "data" / "squad_v1.1" / "dev-v1.1.articles-00-20.json"
STSB = SHARED / "data" / "stsb"


# ---------------------------------------------------------------------------------------------------- data

def squad_split() -> dict[str, Any]:
    """Training pairs (question, paragraph) of the training articles; queries, corpus and qrels of the held-out
    articles (each question's one relevant document is its paragraph)."""
    articles = smoke_training.squad_data(json.loads(require(SQUAD).read_text(encoding="utf-8")))["data"]
    pairs, queries, corpus, qrels = [], {}, {}, {}
    for number, article in enumerate(articles):
        for p_number, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"].strip()
            doc = f"a{number}-p{p_number}"
            if number in VALID_ARTICLES:
                corpus[doc] = context
            for qa in paragraph["qas"]:
                question = qa["question"].strip()
                if number in VALID_ARTICLES:
                    queries[qa["id"]] = question
                    qrels[qa["id"]] = {doc: 1.0}
                else:
                    pairs.append((question, context))
    return {"pairs": pairs, "queries": queries, "corpus": corpus, "qrels": qrels,
            "train_articles": [a["title"] for i, a in enumerate(articles) if i not in VALID_ARTICLES],
            "valid_articles": [a["title"] for i, a in enumerate(articles) if i in VALID_ARTICLES]}


def stsb_rows(split: str) -> list[tuple[str, str, float]]:
    """(sentence1, sentence2, score / 5) of an STS-B csv (tab-separated; score in the 5th field)."""
    rows = []
    for line in require(STSB / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 7:
            rows.append((fields[5].strip(), fields[6].strip(), float(fields[4]) / 5.0))
    return rows[:smoke_size(len(rows), 32)]


def write_jsonl(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(dict(zip(columns, row)), ensure_ascii=False) + "\n")
    return path


def training_file(part: str, work: Path) -> Path:
    if part in ("mnrl", "cached-mnrl"):
        return write_jsonl(work / "squad-pairs.jsonl", ("anchor", "positive"), squad_split()["pairs"])
    return write_jsonl(work / "stsb-train.jsonl", ("sentence1", "sentence2", "score"), stsb_rows("train"))


# ---------------------------------------------------------------------------------------------------- contenders

def _encoderkit_main(conn, part: str, work: Path, out: Path, threads: int, epochs: float) -> None:
    import logging

    from encoderkit.training.sentence import EmbedderRecipe, prepare_embedder

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    setup = prepare_embedder(None, training_file(part, work), out / "run", EmbedderRecipe(
        loss=part, epochs=epochs, batch_size=BATCH[part], learning_rate=HYPER["learning_rate"],
        warmup_ratio=HYPER["warmup_ratio"], seed=HYPER["seed"], scale=HYPER["scale"], max_length=HYPER["max_length"],
        show_progress=False))
    config = setup.trainer.config
    assert (config.weight_decay, config.adam_eps, config.max_grad_norm) == (
        HYPER["weight_decay"], HYPER["adam_eps"], HYPER["max_grad_norm"]), "the recipe drifted from HYPER"
    player = TrainerPlayer(setup.trainer)
    conn.send(("ready", {"examples": setup.examples, "steps": config.max_steps}))
    serve_player(conn, player)
    setup.trainer.model.save_pretrained(out / "final")
    conn.send(("quality", {"directory": str(out / "final"), "steps": setup.trainer.step}))


def _st_main(conn, part: str, work: Path, out: Path, threads: int, epochs: float) -> None:
    import logging

    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.training_args import BatchSamplers, SentenceTransformerTrainingArguments

    from encoderkit import default_model_path

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(HYPER["seed"])
    model = SentenceTransformer(str(default_model_path()), device="cpu")
    model.max_seq_length = HYPER["max_length"]
    rows = [json.loads(line) for line in training_file(part, work).read_text(encoding="utf-8").splitlines()]
    dataset = datasets.Dataset.from_list(rows)
    if part == "mnrl":
        loss = losses.MultipleNegativesRankingLoss(model, scale=HYPER["scale"])
        sampler = BatchSamplers.NO_DUPLICATES
    else:
        loss = losses.CoSENTLoss(model, scale=HYPER["scale"])
        sampler = BatchSamplers.BATCH_SAMPLER
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "run"), per_device_train_batch_size=BATCH[part], learning_rate=HYPER["learning_rate"],
        num_train_epochs=epochs, warmup_steps=HYPER["warmup_ratio"], weight_decay=HYPER["weight_decay"],
        adam_epsilon=HYPER["adam_eps"], max_grad_norm=HYPER["max_grad_norm"], seed=HYPER["seed"],
        batch_sampler=sampler, report_to="none", save_strategy="no", logging_strategy="no", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    conn.send(("ready", {"examples": len(rows), "steps": None}))
    turns = transformers_turns(trainer, conn)
    turns.wait()
    trainer.train()
    turns.finish(min(trainer.state.global_step * BATCH[part], round(len(rows) * epochs)))
    conn.recv()  # evaluate
    model.save(str(out / "final"))
    conn.send(("quality", {"directory": str(out / "final"), "steps": trainer.state.global_step}))


def score_embedder(part: str, directory: str | None) -> dict[str, float]:
    """The same evaluation for every model: retrieval on the held-out SQuAD articles, or STS-B dev Spearman."""
    from encoderkit import Embedder
    from encoderkit.embeddings.evaluation import evaluate_retrieval, sts_spearman

    embedder = Embedder.from_pretrained(directory, dtype="fp32")
    if part == "mnrl":
        split = squad_split()
        return evaluate_retrieval(embedder, split["queries"], split["corpus"], split["qrels"], batch_size=64)
    return {"spearman": sts_spearman(embedder, stsb_rows("dev"), batch_size=64)}


def run_trainers(part: str, work: Path, chunk: int, threads: int, epochs: float) -> dict[str, Any]:
    """Both trainers in turns, then every model scored. A smoke run where sentence-transformers' trainer cannot run
    (no ``datasets``) trains encoderkit alone, and the comparison is left out."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    contenders = (("sentence-transformers", _st_main), ("encoderkit", _encoderkit_main))
    absent = smoke_training.missing("datasets", "sentence_transformers") if SMOKE else None
    if absent:
        smoke_training.skip(f"{part}: sentence-transformers' trainer", absent)
        contenders = contenders[1:]
    players = [Contender(context, name, main, part, work, work / name, threads, epochs) for name, main in contenders]
    info = players[-1].info
    print(f"{part}: {info['examples']:,} training examples, {info['steps']} encoderkit steps; turns of {chunk} steps")
    take_turns(players, chunk)
    rows = [{"model": "base (all-MiniLM-L6-v2)", "metrics": score_embedder(part, None)}]
    print(f"  {rows[0]['model']:24s} {_shown(rows[0]['metrics'])}", flush=True)
    for player in players:
        trained = player.quality()
        metrics = score_embedder(part, trained["directory"])
        rows.append({"model": player.name, "train_seconds": player.seconds, "steps": trained["steps"],
                     "examples_per_second": player.examples / player.seconds, "metrics": metrics})
        print(f"  {player.name:24s} {player.seconds:7.1f} s  {player.examples / player.seconds:6.1f} ex/s  "
              f"{_shown(metrics)}", flush=True)
    main = "ndcg@10" if part == "mnrl" else "spearman"
    result = {"loss": part, "batch_size": BATCH[part], "examples": info["examples"], "rows": rows, "main_metric": main}
    if absent:
        return {**result, "skipped": absent}
    st, ek = rows[1], rows[2]
    return {**result, "speedup": ek["examples_per_second"] / st["examples_per_second"],
            "quality_difference_points": 100 * (ek["metrics"][main] - st["metrics"][main])}


def _shown(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


# ---------------------------------------------------------------------------------------------------- memory

# (loss, batch): cached MNRL at the large batch is held against MNRL at the small one; a smoke run's batches are a
# few pairs, its mini-batches 2.
MEMORY_RUNS = (("mnrl", smoke_size(32, 4)), ("mnrl", smoke_size(128, 8)), ("cached-mnrl", smoke_size(32, 4)),
               ("cached-mnrl", smoke_size(512, 16)))
MINI_BATCH = smoke_size(32, 2)
MEMORY_LIMIT_MIB = 1024


def _one_step(loss: str, batch: int, train: str, out: str, threads: int) -> None:
    """One training step in this (fresh) process; its last line of output: its own peak RSS in KiB (VmHWM)."""
    from encoderkit.training.sentence import EmbedderRecipe, train_embedder

    torch.set_num_threads(threads)
    recipe = EmbedderRecipe(loss=loss, batch_size=batch, mini_batch_size=MINI_BATCH, max_steps=1,
                            max_length=HYPER["max_length"], show_progress=False)
    train_embedder(None, train, out, recipe, resume=False)
    status = Path("/proc/self/status").read_text(encoding="utf-8")
    print(int(status.split("VmHWM:")[1].split()[0]), flush=True)


def peak_rss(loss: str, batch: int, train: Path, out: Path, threads: int) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of a process that trains one step. The child reports its own VmHWM: a child's
    ru_maxrss (``os.wait4``) starts from its parent's high-water mark, carried across fork and exec."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import train_embedder as b; "
            f"b._one_step({loss!r}, {batch}, {str(train)!r}, {str(out)!r}, {threads})")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONWARNINGS": "ignore"},
                          stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {loss} batch {batch} step failed (exit {done.returncode})")
    return int(done.stdout.strip().splitlines()[-1]) / 1024, time.perf_counter() - started


def run_memory(work: Path, threads: int) -> dict[str, Any]:
    train = training_file("mnrl", work)
    rows = []
    for loss, batch in MEMORY_RUNS:
        rss, seconds = peak_rss(loss, batch, train, work / f"mem-{loss}-{batch}", threads)
        mini = MINI_BATCH if loss == "cached-mnrl" else None
        rows.append({"loss": loss, "batch_size": batch, "mini_batch_size": mini,
                     "peak_rss_mib": rss, "seconds": seconds})
        print(f"  {loss:12s} batch {batch:4d}: peak RSS {rss:8.0f} MiB ({seconds:.0f} s for one step with set-up)",
              flush=True)
    by = {(r["loss"], r["batch_size"]): r["peak_rss_mib"] for r in rows}
    cached, plain = MEMORY_RUNS[3], MEMORY_RUNS[0]
    return {"rows": rows, "cached_512_minus_mnrl_32_mib": by[cached] - by[plain], "limit_mib": MEMORY_LIMIT_MIB,
            "rss": "VmHWM"}


# ---------------------------------------------------------------------------------------------------- reranker

class ScoreCache:
    """A reranker whose logits are computed once per (query, passage): the bi-encoders' top 20 mostly overlap."""

    def __init__(self, reranker) -> None:
        self.reranker, self.values = reranker, {}

    def logits(self, queries: list[str], passages: list[str]):
        import numpy as np

        missing = [pair for pair in dict.fromkeys(zip(queries, passages)) if pair not in self.values]
        if missing:
            computed = self.reranker.logits([q for q, _ in missing], [p for _, p in missing])[:, 0]
            self.values.update(zip(missing, computed.tolist()))
        return np.array([[self.values[pair]] for pair in zip(queries, passages)], dtype=np.float32)


def run_reranker(work: Path, threads: int, epochs: float, embedders: dict[str, str | None]) -> dict[str, Any]:
    from encoderkit import Embedder
    from encoderkit.embeddings.evaluation import evaluate_retrieval
    from encoderkit.tasks.rerank import Reranker
    from encoderkit.training.reranker import train_reranker

    split = squad_split()
    train = write_jsonl(work / "squad-rerank.jsonl", ("query", "passage", "label"),
                        [(q, p, 1) for q, p in split["pairs"]])
    started = time.perf_counter()
    result = train_reranker(smoke_training.tiny_model(), train, work / "reranker", epochs=RERANK_EPOCHS * epochs,
                            negatives=RERANK_NEGATIVES, learning_rate=RERANK_LEARNING_RATE,
                            embedder=Embedder.from_pretrained(None), max_length=RERANK_MAX_LENGTH,
                            seed=HYPER["seed"], show_progress=False, resume=False, valid_fraction=0.05)
    seconds = time.perf_counter() - started
    print(f"  reranker: {result.train_examples:,} pairs, {result.steps} steps, {seconds:.0f} s; {result.metrics}",
          flush=True)
    reranker = ScoreCache(Reranker.from_pretrained(result.out_dir, max_length=RERANK_MAX_LENGTH, dtype="fp32"))
    rows = []
    for name, directory in embedders.items():
        embedder = Embedder.from_pretrained(directory, dtype="fp32")
        alone = evaluate_retrieval(embedder, split["queries"], split["corpus"], split["qrels"], batch_size=64)
        reranked = evaluate_retrieval(embedder, split["queries"], split["corpus"], split["qrels"], batch_size=64,
                                      reranker=reranker, rerank_top=RERANK_TOP)
        rows.append({"bi_encoder": name, "alone": alone, "reranked": reranked})
        print(f"  {name:26s} alone    {_shown(alone)}\n  {'':26s} reranked {_shown(reranked)}", flush=True)
    return {"train_pairs": result.train_examples, "steps": result.steps, "train_seconds": seconds,
            "negatives_per_positive": RERANK_NEGATIVES, "max_length": RERANK_MAX_LENGTH, "rerank_top": RERANK_TOP,
            "learning_rate": RERANK_LEARNING_RATE, "epochs": RERANK_EPOCHS * epochs,
            "validation": result.metrics, "rows": rows}


# ---------------------------------------------------------------------------------------------------- goals

def goals(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of the parts a result holds, what was measured and whether it was met: computed from the parts'
    numbers, so a result written before results kept their goals gets its verdicts too."""
    found = []

    def add(goal: str, measured: str, met: bool) -> None:
        found.append({"goal": goal, "measured": measured, "met": bool(met)})

    speed = {"mnrl": ("at least 1.5x as fast as", lambda x: x >= 1.5), "cosent": ("faster than", lambda x: x > 1.0)}
    for part, metric, points in (("mnrl", "nDCG@10", 0.5), ("cosent", "Spearman", 0.3)):
        p = r.get(part) or {}
        if p.get("speedup") is None:  # a smoke run without sentence-transformers' trainer
            continue
        wording, met = speed[part]
        add(f"{part}: encoderkit trains {wording} sentence-transformers", f"{p['speedup']:.2f}x", met(p["speedup"]))
        add(f"{part}: encoderkit's {metric} at most {points} points below sentence-transformers'",
            f"{p['quality_difference_points']:+.2f} points", p["quality_difference_points"] >= -points)
    mem = r.get("memory")
    if mem:
        diff = mem["cached_512_minus_mnrl_32_mib"]
        add(f"memory: cached MNRL at batch 512 at most +{mem['limit_mib']:,} MiB over MNRL at batch 32",
            f"{diff:+,.0f} MiB", diff <= mem["limit_mib"])
    return found


# ---------------------------------------------------------------------------------------------------- report

def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(r) + " |" for r in rows]


def render(r: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (bench/report.py calls it)."""
    flags = ", ".join(f"{flag} {'yes' if present else 'no'}" for flag, present in r["machine"]["cpu_flags"].items())
    h, squad = r["hyperparameters"], r["squad"]
    lines = ["## Training embedders and a reranker: encoderkit vs SentenceTransformerTrainer (`bench/train_embedder.py`)",
             "", f"CPU flags: {flags}; torch threads: {r['threads']}. Both trainers start from all-MiniLM-L6-v2 with "
             f"the same data and hyperparameters: {h['epochs']:g} epoch, seed {h['seed']}, AdamW lr {h['learning_rate']:g}, "
             f"{h['warmup_ratio']:.0%} warm-up then linear decay, weight decay {h['weight_decay']}, eps {h['adam_eps']:g}, "
             f"clipping {h['max_grad_norm']}, fp32, max length {h['max_length']}, scale {h['scale']:g}. Each trainer is a "
             f"process of its own and they take turns of {r['chunk']} optimizer steps (bench/turns.py); training time "
             "excludes set-up and evaluation. Every model is scored by the same code from its saved directory.", ""]
    if "mnrl" in r:
        m = r["mnrl"]
        lines += [f"### MNRL on SQuAD question -> paragraph (batch {m['batch_size']}, batches without repeated texts)", "",
                  f"Training: {squad['train_pairs']:,} pairs of articles {squad['train_articles'][0]} ... "
                  f"{squad['train_articles'][-1]} ({len(squad['train_articles'])} articles). Validation: the "
                  f"{squad['valid_queries']:,} questions of the held-out articles {', '.join(squad['valid_articles'])} "
                  f"against their {squad['valid_corpus']} paragraphs.", ""]
        rows = [[row["model"], f"{row['metrics']['ndcg@10']:.4f}", f"{row['metrics']['mrr@10']:.4f}",
                 f"{row['metrics']['recall@1']:.4f}", f"{row['metrics']['recall@10']:.4f}",
                 f"{row['metrics']['map@100']:.4f}", f"{row['train_seconds']:,.0f}" if "train_seconds" in row else "",
                 f"{row['examples_per_second']:.2f}" if "examples_per_second" in row else ""] for row in m["rows"]]
        lines += _table(["model", "nDCG@10", "MRR@10", "Recall@1", "Recall@10", "MAP@100", "train s", "pairs/s"], rows)
        if "speedup" in m:
            lines += ["", f"encoderkit vs sentence-transformers: **{m['speedup']:.2f}x** the training speed; nDCG@10 "
                          f"{m['quality_difference_points']:+.2f} points (goal: >= -0.5 and >= 1.5x).", ""]
    for trial in r.get("trials", []):
        for part in ("mnrl", "cosent"):
            if part in trial:
                t = trial[part]
                st, ek = t["rows"][1], t["rows"][2]
                lines += [f"Timing check ({trial['date']}, {trial['epochs']:g} epoch of {part}, the same turns): "
                          f"sentence-transformers {st['train_seconds']:,.0f} s, encoderkit {ek['train_seconds']:,.0f} s, "
                          f"**{t['speedup']:.2f}x**; {t['main_metric']} {t['quality_difference_points']:+.2f} points.", ""]
    if "cosent" in r:
        c = r["cosent"]
        lines += [f"### CoSENT on STS-B train (batch {c['batch_size']}, scores / 5), Spearman on STS-B dev", ""]
        rows = [[row["model"], f"{100 * row['metrics']['spearman']:.2f}",
                 f"{row['train_seconds']:,.0f}" if "train_seconds" in row else "",
                 f"{row['examples_per_second']:.1f}" if "examples_per_second" in row else ""] for row in c["rows"]]
        lines += _table(["model", "Spearman x 100", "train s", "pairs/s"], rows)
        if "speedup" in c:
            lines += ["", f"encoderkit vs sentence-transformers: **{c['speedup']:.2f}x** the training speed; Spearman "
                          f"{c['quality_difference_points']:+.2f} points (goal: >= -0.3 and faster).", ""]
    if "memory" in r:
        mem = r["memory"]
        lines += ["### Memory of cached MNRL (GradCache)", "",
                  "Peak RSS of a fresh process that loads the model and trains one step on the SQuAD pairs "
                  + ("(the process's own VmHWM)." if mem.get("rss") == "VmHWM" else "(`os.wait4`'s ru_maxrss)."),
                  ""]
        rows = [[row["loss"], str(row["batch_size"]), str(row["mini_batch_size"] or ""), f"{row['peak_rss_mib']:,.0f}",
                 f"{row['seconds']:.0f}"] for row in mem["rows"]]
        lines += _table(["loss", "batch", "mini-batch", "peak RSS MiB", "s (with set-up)"], rows)
        diff = mem["cached_512_minus_mnrl_32_mib"]
        lines += ["", f"Cached MNRL at batch 512 minus MNRL at batch 32: **{diff:+,.0f} MiB** (goal: at most "
                      f"+{mem['limit_mib']:,} MiB).", ""]
    if "reranker" in r:
        rr = r["reranker"]
        lines += ["### A cross-encoder reranking the bi-encoder's top 20 (held-out SQuAD articles)", "",
                  f"Trained from all-MiniLM-L6-v2 on the {squad['train_pairs']:,} training pairs plus "
                  f"{rr['negatives_per_positive']} hard negative per question mined with the base embedder "
                  f"({rr['train_pairs']:,} pairs with 5% carved for validation, {rr.get('epochs', 1):g} epochs at lr "
                  f"{rr.get('learning_rate', 2e-5):g}, {rr['steps']} steps, "
                  f"{rr['train_seconds']:,.0f} s, max length {rr['max_length']}); the bi-encoder's top "
                  f"{rr['rerank_top']} re-ordered by its logits.", ""]
        rows = []
        for row in rr["rows"]:
            for label, metrics in (("alone", row["alone"]), ("reranked", row["reranked"])):
                rows.append([row["bi_encoder"], label, f"{metrics['ndcg@10']:.4f}", f"{metrics['mrr@10']:.4f}",
                             f"{metrics['recall@1']:.4f}", f"{metrics['recall@10']:.4f}"])
        lines += _table(["bi-encoder", "", "nDCG@10", "MRR@10", "Recall@1", "Recall@10"], rows) + [""]
    verdicts = goals(r)
    if verdicts:
        lines += ["### Goals", ""] + [f"- {g['goal']}: {g['measured']}, **{'met' if g['met'] else 'not met'}**"
                                      for g in verdicts] + [""]
    return lines


# ---------------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="mnrl,cosent,memory,reranker")
    parser.add_argument("--chunk", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=HYPER["epochs"],
                        help="a trial run of part of an epoch (e.g. 0.05); only full runs are written")
    parser.add_argument("--work", default=None, help="keep the trained models here (default: a temporary directory)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    unknown = set(parts) - {"mnrl", "cosent", "memory", "reranker"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    split = squad_split()
    result: dict[str, Any] = {"hyperparameters": HYPER, "batch_sizes": BATCH, "epochs": args.epochs,
                              "chunk": args.chunk, "threads": args.threads,
                              "squad": {"train_articles": split["train_articles"],
                                        "valid_articles": split["valid_articles"],
                                        "train_pairs": len(split["pairs"]), "valid_queries": len(split["queries"]),
                                        "valid_corpus": len(split["corpus"])}}
    previous = RESULTS / "train_embedder.json"
    if previous.is_file():  # parts not rerun keep their last results
        old = json.loads(previous.read_text(encoding="utf-8"))
        result.update({k: old[k] for k in ("mnrl", "cosent", "memory", "reranker") if k in old and k not in parts})
        result["trials"] = old.get("trials", [])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for part in ("mnrl", "cosent"):
            if part in parts:
                result[part] = run_trainers(part, work / part, args.chunk, args.threads, args.epochs)
        if "memory" in parts:
            print("memory: one training step per process")
            result["memory"] = run_memory(work / "memory", args.threads)
        if "reranker" in parts:
            print("reranker")
            embedders = {"base (all-MiniLM-L6-v2)": None}
            tuned = work / "mnrl" / "encoderkit" / "final"
            if tuned.is_dir():
                embedders["encoderkit MNRL"] = str(tuned)
            result["reranker"] = run_reranker(work / "reranker", args.threads, args.epochs, embedders)
    result["goals"] = goals(result)
    for goal in result["goals"]:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'NOT MET'}")
    if args.epochs == HYPER["epochs"]:
        write_result("train_embedder", result)
    else:
        print(json.dumps(result, indent=2, default=str))
        record_trial(result, parts)


def record_trial(trial: dict[str, Any], parts: list[str], date: str | None = None) -> None:
    """A run of part of an epoch (a timing check) is kept beside the full results, under "trials": the trainer
    comparisons it ran (``parts``), not the results it carried over from the file."""
    path = RESULTS / "train_embedder.json"
    if not path.is_file():
        return
    from common import machine

    full = json.loads(path.read_text(encoding="utf-8"))
    entry = {"date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), "epochs": trial["epochs"],
             **{part: trial[part] for part in ("mnrl", "cosent") if part in parts}}
    full.setdefault("trials", []).append(entry)
    path.write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
