"""Fine-tuning speed and quality: encoderkit vs the transformers Trainer, same model, data and hyperparameters.

Tasks (default model all-MiniLM-L6-v2, 1 epoch each, seed 42, batch 32, AdamW lr 5e-5, 10% warm-up then
linear decay, weight decay 0.01, clipping 1.0, eps 1e-8):
- sst2: the benchmarks' 20k SST-2 subset (bench/common.py), 10% carved for validation; max length 128;
- conll: CoNLL-2003 eng.train / eng.testa, IOB2 tags on words' first sub-tokens; max length 128;
- squad: the 5,021 questions of squad_v1.1, 20% of the articles carved for validation; max length 384,
  doc stride 128; batch 16 (TASK_HYPER says why).

Contenders:
- transformers: `Trainer` with its defaults (random batches, fused AdamW) and dynamic padding
  (DataCollatorWithPadding / DataCollatorForTokenClassification), features built the way transformers'
  example scripts build them;
- transformers, length-grouped: the same with `train_sampling_strategy="group_by_length"` (the `group_by_length=True`
  of older releases): what a careful user runs, and issue 22's reference. fp32, `dataloader_num_workers=0` (on two
  cores a loader process only takes a core from the model), no torch.compile;
- transformers, padding masked (SQuAD only, an ablation, not in the default set): the Trainer with encoderkit's
  span loss, padding masked out of the start/end softmax; everything else as the default contender;
- encoderkit: `encoderkit finetune`'s recipe with length-grouped batches (the recipe's default for SST-2 and CoNLL),
  unpadded training, its linear layers' products (forward and both gradients) in fp32 on oneDNN (MKL on Intel CPUs,
  where it is the faster one)
  (modeling/training_linear.py), dropout masks drawn and applied by the native library (modeling/dropout.py), and
  for SST-2's classifier on [CLS] a last layer that computes one row a sequence past its attention;
- encoderkit, random batches: no length grouping (the batches transformers' default draws, and the recipe's default
  for QA), unpadded; attention runs on groups of similar length inside each batch;
- encoderkit bf16 autocast: length-grouped; only where the CPU has native bf16 (otherwise recorded as skipped).

Each contender is a process of its own (its own main thread, random stream and thread pool), and they run
in turns of ``--chunk`` optimizer steps, handed over through pipes, until each has finished its epoch: only
one computes at a time, and machine-speed drift hits all alike. transformers' Trainer trains on its
process's main thread; a callback hands the turn back after each chunk. (An earlier version ran the Trainer
in a thread of the benchmark's process, where the contenders shared torch's random stream and so drew one
another's dropout masks.) Training time excludes evaluation. Every final model is scored by the same code (encoderkit's evaluators:
accuracy, seqeval-style entity F1, official SQuAD EM/F1); transformers' models are loaded into encoderkit
for that (outputs equal within 1e-5, tested).

A run of part of an epoch (``--epochs 0.1``: its own, shorter schedule) is kept under "trials" in the results and
rendered as issue 22's table: bounded timing runs, a few seeds each.

    python bench/finetune.py [--tasks sst2,conll,squad] [--chunk 10] [--contenders ...] [--seed 42] [--epochs 0.05]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import smoke_training
from common import (RESULTS, ROOT, SHARED, SST2_SUBSET, machine, require, smoke_size, source_revision, sst2_rows,
                    write_result, write_tsv)
from turns import Contender, TrainerPlayer, serve_player, take_turns, transformers_turns

HYPER = dict(batch_size=32, learning_rate=5e-5, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0,
             adam_eps=1e-8, seed=42, epochs=1)
# SQuAD trains with batch 16 (the BERT paper's other batch size): its one epoch of 4,330 features is 136 steps at
# batch 32, after which the models had barely begun to find spans (F1 15-22 over four seeds, both trainers). 271
# steps at batch 16 reach F1 27-39. The seed still moves F1 by several points (BENCHMARKS.md's seed spread).
TASK_HYPER = {"squad": dict(batch_size=16)}


def hyper(task: str) -> dict[str, Any]:
    """The hyperparameters a task trains with on both sides."""
    return {**HYPER, **TASK_HYPER.get(task, {})}
CONTENDERS = ("transformers", "transformers-grouped", "encoderkit", "encoderkit-random", "encoderkit-bf16")
ABLATIONS = ("transformers-masked",)  # run only when named in --contenders
KNOWN = CONTENDERS + ABLATIONS


# ---------------------------------------------------------------------------------------------
# One process a contender: each trains on its own main thread with its own random stream and thread pool,
# and the parent hands the turns over through a pipe (only one contender computes at a time).
# ---------------------------------------------------------------------------------------------
def _contender_main(conn, task: str, name: str, seed: int, threads: int, epochs: float) -> None:
    import logging

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setup = prepare(task, work / "ek", group_by_length=name != "encoderkit-random", seed=seed,
                        bf16=name == "encoderkit-bf16", epochs=epochs)
        info = {"train_examples": len(setup.train_examples), "train_features": len(setup.train_features),
                "valid_examples": len(setup.valid_examples), "steps": setup.trainer.config.max_steps,
                "main_metric": setup.kind.main_metric}
        if name.startswith("encoderkit"):
            player = TrainerPlayer(setup.trainer)
            conn.send(("ready", info))
            serve_player(conn, player)
            quality = setup.evaluate(player.trainer.model.eval(), dtype="fp32")
        else:
            sampling = "group_by_length" if name.endswith("grouped") else "random"
            trainer, count, tokenizer = hf_trainer(task, setup, sampling, work / name,
                                                   masked=name.endswith("masked"))
            conn.send(("ready", info))
            turns = transformers_turns(trainer, conn)
            turns.wait()
            trainer.train()
            turns.finish(min(trainer.state.global_step * trainer.args.per_device_train_batch_size,
                             round(count * epochs)))
            conn.recv()  # evaluate
            quality = transformers_quality(setup, trainer.model.eval(), tokenizer, work / (name + "-out"))
        conn.send(("quality", quality))


# ---------------------------------------------------------------------------------------------
# transformers' side: features as its example scripts build them
# ---------------------------------------------------------------------------------------------
def hf_features(task: str, setup, tokenizer) -> tuple[list[dict], Any]:
    import transformers

    examples = setup.train_examples
    if task == "sst2":
        labels = setup.model.config.labels
        encoded = tokenizer([e.text for e in examples], truncation=True, max_length=setup.recipe.max_length)
        rows = [{"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels.index(e.label)}
                for ids, types, mask, e in zip(encoded["input_ids"], encoded["token_type_ids"],
                                               encoded["attention_mask"], examples)]
        return rows, transformers.DataCollatorWithPadding(tokenizer)
    if task == "conll":
        labels = setup.model.config.labels
        encoded = tokenizer([s.tokens for s in examples], is_split_into_words=True, truncation=True,
                            max_length=setup.recipe.max_length)
        rows = []
        for index, sentence in enumerate(examples):
            previous, tags = None, []
            for word in encoded.word_ids(index):
                tags.append(-100 if word is None or word == previous else labels.index(sentence.tags[word]))
                previous = word
            rows.append({"input_ids": encoded["input_ids"][index], "token_type_ids": encoded["token_type_ids"][index],
                         "attention_mask": encoded["attention_mask"][index], "labels": tags})
        return rows, transformers.DataCollatorForTokenClassification(tokenizer)
    # squad: run_qa.py's prepare_train_features, with dynamic padding instead of padding to max_length
    encoded = tokenizer([e.question.lstrip() for e in examples], [e.context for e in examples],
                        truncation="only_second", max_length=setup.recipe.max_length, stride=setup.recipe.doc_stride,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
    rows = []
    for index, offsets in enumerate(encoded["offset_mapping"]):
        example = examples[encoded["overflow_to_sample_mapping"][index]]
        sequence_ids = encoded.sequence_ids(index)
        start_char = example.answer_starts[0]
        end_char = start_char + len(example.answers[0])
        context = [i for i, s in enumerate(sequence_ids) if s == 1]
        start = end = 0
        if offsets[context[0]][0] <= start_char and offsets[context[-1]][1] >= end_char:
            start = next(i for i in context if offsets[i][1] > start_char)
            end = next(i for i in reversed(context) if offsets[i][0] < end_char)
        rows.append({"input_ids": encoded["input_ids"][index], "token_type_ids": encoded["token_type_ids"][index],
                     "attention_mask": encoded["attention_mask"][index], "start_positions": start,
                     "end_positions": end})
    return rows, transformers.DataCollatorWithPadding(tokenizer)


def masked_span_loss(trainer, model, inputs, return_outputs=False, num_items_in_batch=None):
    """``Trainer.compute_loss`` with encoderkit's QA loss: padding is no start/end candidate."""
    from encoderkit.modeling.models import qa_loss

    starts, ends = inputs.pop("start_positions"), inputs.pop("end_positions")
    outputs = model(**inputs)
    loss = qa_loss(outputs.start_logits, outputs.end_logits, starts, ends, inputs["attention_mask"])
    return (loss, outputs) if return_outputs else loss


def hf_training_args(out_dir: Path, recipe, sampling: str, log_every_step: bool = False, **overrides: Any):
    """transformers' TrainingArguments with encoderkit's recipe: the same hyperparameters on both sides, on the CPU
    unless ``overrides`` say otherwise (``use_cpu=False, bf16=True``: bench/gpu.py)."""
    import transformers

    options = dict(
        output_dir=str(out_dir), per_device_train_batch_size=recipe.batch_size, learning_rate=recipe.learning_rate,
        num_train_epochs=recipe.epochs, warmup_steps=recipe.warmup_ratio, weight_decay=recipe.weight_decay,
        max_grad_norm=recipe.max_grad_norm, adam_epsilon=recipe.adam_eps, seed=recipe.seed, report_to="none",
        save_strategy="no", logging_strategy="steps" if log_every_step else "no", logging_steps=1, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, train_sampling_strategy=sampling)
    return transformers.TrainingArguments(**{**options, **overrides})


def hf_trainer(task: str, setup, sampling: str, out_dir: Path, masked: bool = False, order=None,
               model_options: dict[str, Any] | None = None, log_every_step: bool = False,
               model: Path | None = None, **arguments: Any):
    """transformers' model, features and Trainer for a task. ``order``: the rows in this order (with
    ``sampling="sequential"``); ``model_options``: config overrides (e.g. dropout); ``model``: the directory
    (default: the default model, a tiny random BERT in a smoke run); ``arguments``: TrainingArguments overrides
    (``hf_training_args``)."""
    import types

    import transformers

    from encoderkit import default_model_path

    path = str(model or smoke_training.tiny_model() or default_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    rows, collator = hf_features(task, setup, tokenizer)
    torch.manual_seed(setup.recipe.seed)
    if task == "squad":
        model = transformers.AutoModelForQuestionAnswering.from_pretrained(path, **(model_options or {}))
    else:
        labels = setup.model.config.labels
        auto = (transformers.AutoModelForSequenceClassification if task == "sst2"
                else transformers.AutoModelForTokenClassification)
        model = auto.from_pretrained(path, num_labels=len(labels), id2label=dict(enumerate(labels)),
                                     label2id={label: i for i, label in enumerate(labels)}, **(model_options or {}))
    args = hf_training_args(out_dir, setup.recipe, sampling, log_every_step, **arguments)
    if order is not None:
        rows = [rows[int(i)] for i in order]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    if masked:
        trainer.compute_loss = types.MethodType(masked_span_loss, trainer)
    return trainer, len(rows), tokenizer


def transformers_quality(setup, model, tokenizer, directory: Path) -> dict[str, float]:
    """Score a transformers model with encoderkit's evaluator (same code for every contender)."""
    from encoderkit import load_model

    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return setup.evaluate(load_model(directory), dtype="fp32")


# ---------------------------------------------------------------------------------------------
def prepare(task: str, work: Path, group_by_length: bool, bf16: bool = False, seed: int = HYPER["seed"],
            epochs: float = HYPER["epochs"], model: Path | None = None, device: str = "cpu",
            rows: list[tuple[str, str]] | None = None):
    """encoderkit's fine-tuning set-up for a task with the benchmark's recipe. ``model``: the directory (default:
    the default model, a tiny random BERT in a smoke run); ``device``: where it trains; ``rows``: SST-2's (text,
    label) rows (default: ``sst2_rows``)."""
    from encoderkit.training.finetune import Recipe, prepare_finetune, task_kind

    model = model or smoke_training.tiny_model()

    data = SHARED / "data"
    h = hyper(task)  # its keys are Recipe's fields, but for the seeds and epochs a run chooses
    recipe = Recipe(**{k: v for k, v in h.items() if k not in ("seed", "epochs")}, epochs=epochs, seed=seed,
                    split_seed=h["seed"], group_by_length=group_by_length, bf16=bf16, show_progress=False, save_steps=10**9,
                    valid_fraction=0.2 if task == "squad" else 0.1, device=device)
    # A smoke run trains on 64 SST-2 rows, 48 CoNLL sentences or 2 questions of one paragraph an article.
    if task == "sst2":
        train = work / "sst2.tsv"
        if not train.exists():
            write_tsv(train, sst2_rows(count=smoke_size(SST2_SUBSET, 64)) if rows is None else rows)
        return prepare_finetune(task_kind("classify"), train, work / "ek", model=model, recipe=recipe)
    if task == "conll":
        train, valid = smoke_training.conll_pair(require(data / "conll2003" / "eng.train"),
                                                 data / "conll2003" / "eng.testa", work / "smoke")
        return prepare_finetune(task_kind("ner"), train, work / "ek", valid=valid, model=model, recipe=recipe)
    squad = smoke_training.squad_file(require(data / "squad_v1.1" / "dev-v1.1.articles-00-20.json"), work / "smoke")
    return prepare_finetune(task_kind("qa"), squad, work / "ek", model=model, recipe=recipe)


def probe_emulated_bf16(task: str, work: Path, steps: int = 3) -> str:
    """Without native bf16 units, bf16 products are emulated: a whole epoch would take hours. Time a few
    steps instead, to report the measured cost next to fp32's."""
    setup = prepare(task, work, group_by_length=True, bf16=True)
    player = TrainerPlayer(setup.trainer)
    player.run(1)  # warm-up
    player.seconds, player.examples = 0.0, 0
    player.run(steps)
    return (f"not run for the epoch: this CPU has no native bf16 (neither avx512_bf16 nor amx_bf16), so bf16 products are "
            f"emulated; {steps} steps of bf16 autocast ran at {player.examples / player.seconds:.1f} examples/s")


def run_task(task: str, contenders: list[str], chunk: int, seed: int = HYPER["seed"],
             threads: int = 2, epochs: float = HYPER["epochs"]) -> dict[str, Any]:
    import multiprocessing

    from encoderkit.precision import cpu_has_native_bf16

    context = multiprocessing.get_context("spawn")
    players, notes = [], {}
    for name in sorted(contenders, key=lambda n: not n.startswith("transformers")):
        if name == "encoderkit-bf16" and not cpu_has_native_bf16():
            with tempfile.TemporaryDirectory() as tmp:
                notes[name] = probe_emulated_bf16(task, Path(tmp))
            continue
        players.append(Contender(context, name, _contender_main, task, name, seed, threads, epochs))  # set-up runs one process at a time
    info = players[0].info
    print(f"{task}: {info['train_examples']:,} training examples ({info['train_features']:,} features), "
          f"{info['valid_examples']:,} validation; {info['steps']} steps per contender; turns of {chunk} steps; "
          "one process a contender")
    take_turns(players, chunk)
    rows = []
    for player in players:  # one at a time too
        quality = player.quality()
        rows.append({"contender": player.name, "train_seconds": player.seconds,
                     "examples_per_second": player.examples / player.seconds, "metrics": quality})
        print(f"  {player.name:22s} {player.examples / player.seconds:8.1f} examples/s  {quality}")
    base = {r["contender"]: r["examples_per_second"] for r in rows}
    for row in rows:
        for other in ("transformers", "transformers-grouped"):
            if other in base:
                row[f"speedup_vs_{other}"] = row["examples_per_second"] / base[other]
    return {"task": task, **info, "hyperparameters": hyper(task), "rows": rows, "notes": notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sst2,conll,squad")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=HYPER["epochs"],
                        help=f"a trial run of part of an epoch (e.g. 0.05); only {HYPER['epochs']}-epoch runs are written")
    parser.add_argument("--trial", action="store_true",
                        help="keep this run under trials (issue 22's table against the grouped Trainer) even for a "
                             "whole epoch, leaving the full-epoch table of every contender as it is")
    parser.add_argument("--seed", type=int, default=HYPER["seed"],
                        help="training seed (head, dropout, batch order); the validation carve keeps seed "
                             f"{HYPER['seed']}. Other seeds' results are kept beside seed {HYPER['seed']}'s and "
                             "summarised as the seed spread; there a run of some contenders keeps the rows of the "
                             "others")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.WARNING)
    unknown = set(args.contenders.split(",")) - set(KNOWN)
    if unknown:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; choose from {', '.join(KNOWN)}")
    if "transformers-masked" in args.contenders.split(",") and args.tasks != "squad":
        raise SystemExit("transformers-masked is an ablation of the SQuAD span loss; run it with --tasks squad")
    for task in args.tasks.split(","):
        started, load_before = time.time(), os.getloadavg()[0]
        result = run_task(task, args.contenders.split(","), args.chunk, args.seed, args.threads, args.epochs)
        if args.epochs != HYPER["epochs"] or args.trial:
            record_trial({**result, "epochs": args.epochs, "seed": args.seed, "chunk": args.chunk,
                          "wall_seconds": time.time() - started,
                          "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
                          "command": "python bench/finetune.py " + " ".join(sys.argv[1:])})
            continue
        result["wall_seconds"], result["seed"] = time.time() - started, args.seed
        result["machine"], result["date"] = machine(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        # Written after every task, merged with the tasks of earlier runs: a long run loses nothing when stopped,
        # and one task can be re-measured alone. Each task keeps the machine and date it was measured on.
        earlier = {}
        path = RESULTS / "finetune.json"
        if path.is_file():
            old = json.loads(path.read_text(encoding="utf-8"))
            # A task's results under other hyperparameters no longer compare: they are dropped, not mixed in.
            earlier = {_key(t): t for t in old.get("tasks", [])
                       if t["task"] != task or t.get("hyperparameters", old["hyperparameters"]) == hyper(task)}
        if _key(result) in earlier and _key(result)[1] != HYPER["seed"]:
            # Another seed's quality runs add up: contenders this run did not train keep their earlier rows
            # (each row keeps the date of its own run; speed-ups compare only contenders of one run).
            ran = {row["contender"] for row in result["rows"]}
            kept = [row for row in earlier[_key(result)]["rows"] if row["contender"] not in ran]
            for row in kept:
                row.setdefault("date", earlier[_key(result)]["date"])
            result["rows"] = kept + [{**row, "date": result["date"]} for row in result["rows"]]
        earlier[_key(result)] = result
        order = ["sst2", "conll", "squad"]
        tasks = sorted(earlier.values(), key=lambda t: (order.index(t["task"]) if t["task"] in order else 99,
                                                        _key(t)[1]))
        write_result("finetune", {"hyperparameters": HYPER, "chunk": args.chunk, "tasks": tasks})


def record_trial(trial: dict[str, Any]) -> None:
    """A bounded run (``--epochs`` below one: the schedule is that of the shorter run, warm-up and decay included)
    is kept under "trials" in finetune.json, beside the full-epoch results: the timing runs of issue 22. Each names
    the code it ran (``source_revision``: the commit, "+dirty" where src/ differs from it). A rerun of the same task,
    seed and epochs on a CPU of the same name with the same code replaces its earlier trial; other CPUs' and other
    code's are kept (before and after a change)."""
    path = RESULTS / "finetune.json"
    if not path.is_file():
        print(f"  (no {path} to keep the trial in)")
        return
    full = json.loads(path.read_text(encoding="utf-8"))
    trial = {**trial, "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "code": source_revision(ROOT / "src")}

    def key(t: dict[str, Any]) -> tuple:
        return t["task"], t["seed"], t["epochs"], t.get("machine", {}).get("cpu"), t.get("code")

    full["trials"] = [t for t in full.get("trials", []) if key(t) != key(trial)] + [trial]
    path.write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
    print(f"  trial kept in {path}")


def _key(task: dict[str, Any]) -> tuple[str, int]:
    return task["task"], task["seed"]


TASK_TITLES = {"sst2": "SST-2 (20k subset, 10% carved for validation; accuracy)",
               "conll": "CoNLL-2003 eng.train -> eng.testa (entity F1)",
               "squad": "SQuAD v1.1, 5,021 questions, 20% of the articles carved for validation (EM / F1)"}


def render(r: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (bench/report.py calls this)."""
    from report import _machine, _table

    h = r["hyperparameters"]
    lines = ["## Fine-tuning speed and quality (`bench/finetune.py`)", "",
             f"all-MiniLM-L6-v2, {h['epochs']} epoch, AdamW lr {h['learning_rate']:g}, "
             f"{100 * h['warmup_ratio']:.0f}% warm-up then linear decay, weight decay {h['weight_decay']:g}, clipping "
             f"{h['max_grad_norm']:g}, seed {h['seed']}; max length 128 (SQuAD 384, stride 128). Contenders train in "
             f"interleaved turns of {r['chunk']} steps, one process a contender; examples/s counts training time only. "
             "Every final model is scored by the same evaluator (transformers' models are loaded into encoderkit, "
             "equal within 1e-5).", ""]
    for task in [t for t in r["tasks"] if _key(t)[1] == h["seed"]]:
        main_metric = task["main_metric"]
        lines += [f"**{TASK_TITLES.get(task['task'], task['task'])}**: {task['train_examples']:,} training examples "
                  f"({task['train_features']:,} features), {task['valid_examples']:,} validation, "
                  f"{task['steps']:,} steps of batch {task.get('hyperparameters', h)['batch_size']}.", "",
                  _machine({**r, **task}), ""]
        scale = 1.0 if task["task"] == "squad" else 100.0  # SQuAD's official scores are already percentages
        rows = []
        order = {name: i for i, name in enumerate(KNOWN)}
        grouped = any("speedup_vs_transformers-grouped" in row for row in task["rows"])
        for row in sorted(task["rows"], key=lambda row: order.get(row["contender"], 99)):
            metrics = ", ".join(f"{k} {scale * v:.2f}" for k, v in row["metrics"].items() if isinstance(v, float))
            speed = row.get("speedup_vs_transformers")
            versus_grouped = row.get("speedup_vs_transformers-grouped")
            rows.append([row["contender"], f"{row['examples_per_second']:,.1f}",
                         "" if speed is None else f"**{speed:.2f}x**",
                         *([] if not grouped else ["" if versus_grouped is None else f"{versus_grouped:.2f}x"]),
                         f"{row['train_seconds']:,.0f}", f"{scale * row['metrics'][main_metric]:.2f}", metrics])
        lines += _table(["contender", "train examples/s", "vs transformers Trainer (default, random batches)",
                         *([] if not grouped else ["vs transformers, group_by_length"]), "train s",
                         f"{main_metric}" + (" x100" if scale != 1.0 else ""), "all metrics" +
                         (" (x100)" if scale != 1.0 else "")], rows)
        for name, note in task.get("notes", {}).items():
            lines += ["", f"{name}: {note}"]
        if any(row["contender"] == "transformers-masked" for t in r["tasks"] if t["task"] == task["task"]
               for row in t["rows"]):
            lines += ["", "transformers-masked is an ablation: transformers' Trainer with encoderkit's span loss, which "
                          "masks padding out of the start/end softmax (transformers' own loss, like BERT's, keeps the "
                          "padding positions among the candidates). Same model, head initialisation, data order and "
                          "dropout draws as the transformers row (each contender is a process with its own random "
                          "stream); only the loss differs. encoderkit's Trainer takes the same steps as "
                          "transformers' (tests/parity/test_trainer.py), so besides encoderkit's length-grouped "
                          "batches this loss choice is the one systematic difference left in the training step. "
                          "Compare it with the transformers row at the same seed."]
        if task["task"] == "squad":
            lines += ["", "One SQuAD epoch of this size is at the mercy of chance: the dropout draws, the new head's "
                          "initial weights and the batch order move a contender's F1 from seed to seed (table below). "
                          "It trains with batch 16 (271 steps): at batch 32 (136 steps) the models had barely begun to "
                          "find spans (F1 15-22); the seed moves F1 by several points at either batch size. "
                          "`bench/finetune_parity.py` takes "
                          "the chance out (dropout 0, the same head, batch order and span loss on both sides) to "
                          "compare the two training codes alone. encoderkit-random is encoderkit's Trainer with random "
                          "batches, as in the default transformers row, and it is what `encoderkit finetune --task qa` "
                          "runs by default: a paragraph's doc-stride windows have equal lengths, so length grouping "
                          "fills a batch with the windows of fewer paragraphs, and length-grouped training scored "
                          "lower for both trainers (transformers-grouped, encoderkit). Its dense layers run on real "
                          "tokens only and its attention on groups of similar length within each batch, so random "
                          "batches cost it no speed here."]
        lines += [""] + _seed_spread(r["tasks"], task["task"], scale)
    full_rates = {(task["task"], task.get("machine", r["machine"])["cpu"]): row["examples_per_second"]
                  for task in r["tasks"] if _key(task)[1] == h["seed"]
                  for row in task["rows"] if row["contender"] == "transformers-grouped"}
    return lines + _render_trials(r.get("trials", []), full_rates)


def _render_trials(trials: list[dict[str, Any]], full_rates: dict[tuple[str, str], float]) -> list[str]:
    """Issue 22's comparison: bounded runs of encoderkit against the length-grouped Trainer, per task and seed."""
    from report import _machine, _table

    if not trials:
        return []
    lines = ["### encoderkit vs transformers' Trainer with group_by_length, bounded runs (issue 22)", "",
             "Part of an epoch each (`--epochs`), its own schedule (10% warm-up, linear decay to 0 at the run's end); "
             "the same interleaved turns, processes and evaluator as above. transformers-grouped is what a careful "
             "user runs: `train_sampling_strategy=\"group_by_length\"`, dynamic padding, fp32, fused AdamW, "
             "`dataloader_num_workers=0`, no torch.compile. encoderkit runs its recipe (length-grouped batches; "
             "random ones for QA, encoderkit-random), unpadded, fp32, its linear layers' products on oneDNN (MKL on "
             "Intel CPUs), freed memory kept for the next step.", "",
             "The trials ran on different CPUs (the column CPU, date); the newest one's:",
             _machine({"benchmark": "finetune", **trials[-1], "provenance": {  # the code the trial ran (its own record)
                 "commit": trials[-1]["code"].split("+")[0], "dirty": "+" in trials[-1]["code"]}}), ""]
    rows = []
    for trial in sorted(trials, key=lambda t: (list(TASK_TITLES).index(t["task"]) if t["task"] in TASK_TITLES else 99,
                                                t["epochs"], t["seed"], t["date"])):
        scale = 1.0 if trial["task"] == "squad" else 100.0
        by_name = {row["contender"]: row for row in trial["rows"]}
        reference = by_name.get("transformers-grouped")
        for row in trial["rows"]:
            if not row["contender"].startswith("encoderkit") or reference is None:
                continue
            metric = trial["main_metric"]
            rows.append([trial["task"], f"{trial['epochs']:g} ({trial['steps']} steps)", str(trial["seed"]),
                         f"{trial['machine']['cpu']}, {trial['date']}", trial.get("code") or "not recorded",
                         row["contender"], f"{reference['examples_per_second']:,.1f}",
                         f"{row['examples_per_second']:,.1f}",
                         f"**{row['examples_per_second'] / reference['examples_per_second']:.2f}x**",
                         f"{scale * reference['metrics'][metric]:.2f}", f"{scale * row['metrics'][metric]:.2f}"])
            full = full_rates.get((trial["task"], trial["machine"]["cpu"]))  # on the same CPU only
            rows[-1].append(f"{100 * reference['examples_per_second'] / full:.0f}%" if full else "")
    lines += _table(["task", "epochs", "seed", "CPU, date", "code", "encoderkit contender",
                     "grouped Trainer examples/s", "encoderkit examples/s", "speed vs grouped Trainer", "Trainer metric",
                     "encoderkit metric", "grouped Trainer's rate / its full-epoch rate above (same CPU)"], rows)
    loads = [f"{t['task']} {t['load_average_1min']['before']:.1f} -> {t['load_average_1min']['after']:.1f}"
             for t in trials if "load_average_1min" in t]
    return lines + ["", "Metrics: SST-2 accuracy x100, CoNLL entity F1 x100, SQuAD F1. The last column compares the "
                        "grouped Trainer's rate in the trial with its full-epoch rate above. It falls below 100% when "
                        "other jobs share the two cores, and also in a short run, whose first steps (allocations, "
                        "the thread pool's start, the warm-up's small steps) weigh more; the load average says which"
                        + (f" (1-minute load average before -> after: {', '.join(loads)})" if loads else
                           " (not recorded for these trials)") + ". A short run's metrics say little of the "
                        "quality of a full epoch.", ""]


def _seed_spread(tasks: list[dict[str, Any]], name: str, scale: float) -> list[str]:
    """The main metric of each contender at every training seed run for a task (same data and validation carve)."""
    from report import _table

    runs = sorted((t for t in tasks if t["task"] == name), key=lambda t: _key(t)[1])
    if len(runs) < 2:
        return []
    seeds = [_key(t)[1] for t in runs]
    main_metric = runs[0]["main_metric"]
    scores = {_key(t)[1]: {row["contender"]: scale * row["metrics"][main_metric] for row in t["rows"]} for t in runs}
    contenders = sorted({c for at_seed in scores.values() for c in at_seed},
                        key=lambda c: KNOWN.index(c) if c in KNOWN else 99)
    rows = []
    for contender in contenders:
        values = {seed: at_seed[contender] for seed, at_seed in scores.items() if contender in at_seed}
        spread = list(values.values())
        summary = f"{statistics.mean(spread):.2f}" + (f" ± {statistics.stdev(spread):.2f}" if len(spread) > 1 else "")
        rows.append([contender, *[f"{values[s]:.2f}" if s in values else "" for s in seeds], summary])
    lines = [f"Seed spread ({main_metric}" + (" x100" if scale != 1.0 else "") + "; training seeds differ, the data "
             "and the validation carve do not; `--seed N`):", "",
             *_table(["contender", *[f"seed {s}" for s in seeds], "mean ± sd"], rows), ""]
    paired = []
    for contender in [c for c in contenders if c.startswith("encoderkit")]:
        for reference in ("transformers", "transformers-grouped"):
            differences = [at_seed[contender] - at_seed[reference] for at_seed in scores.values()
                           if contender in at_seed and reference in at_seed]
            if len(differences) >= 2:
                mean, sd = statistics.mean(differences), statistics.stdev(differences)
                error = sd / len(differences) ** 0.5
                paired.append([f"{contender} − {reference}", str(len(differences)), f"{mean:+.2f}", f"{sd:.2f}",
                               f"{error:.2f}", f"{mean - 2 * error:+.2f} .. {mean + 2 * error:+.2f}"])
    if paired:
        lines += ["Differences at equal seeds (a negative mean: encoderkit scored lower):", "",
                  *_table(["pair", "seeds", "mean", "sd", "standard error", "mean ± 2 standard errors"], paired), ""]
    return lines


if __name__ == "__main__":
    main()
