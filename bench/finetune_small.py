"""Fine-tuning quality at small budgets (issue 40): encoderkit's recipe against transformers' Trainer, seed by seed.

What a user with a few thousand labelled sentences runs: all-MiniLM-L6-v2, 1 epoch, AdamW lr 5e-5, batch 32, 10%
warm-up then linear decay, weight decay 0.01, clipping 1.0.
- sst2: the first N rows of ../shared/data/sst2/train.tsv (N = --budgets), max length 64, scored on a fixed
  held-out set: the file's last 2,000 rows (GLUE's dev set is not in ../shared; its SOURCE.md says to cut one), which
  no budget trains on.
- conll: the first N sentences of CoNLL-2003 eng.train, max length 128, scored on eng.testa (entity F1).

Both trainers get the same rows and the held-out set as their validation file (nothing is carved from the
training rows); both final models are scored by the same code (encoderkit's evaluators; the Trainer's model is
loaded into encoderkit, equal within 1e-5, tested). Each seed seeds both sides. Reported per budget: every seed,
the means, the paired difference (encoderkit minus Trainer) and its 95% interval (Student's t, n - 1 degrees of
freedom), and each goal as met or not met: SST-2 mean at least the Trainer's minus 0.25 points at every budget,
CoNLL entity F1 at least the Trainer's minus 0.5.

Variants switch one default off at a time (the ablation): encoderkit-random (random batches instead of
length-grouped ones), encoderkit-torch-kernels (the PyTorch ops instead of the native training kernels: dropout
drawn by torch, attention and LayerNorm passes), encoderkit-dense-adamw (torch's AdamW over the whole word table
instead of the rows a step touched), encoderkit-torch (all three CPU-only parts off at once, and dropout masks from
torch's generator instead of the native Philox one: what the recipe computes on a GPU), encoderkit-carved (no
validation file: the recipe carves 10% of the rows, as `encoderkit finetune` does when none is given); and
encoderkit-mega8 changes one: length groups sorted within mega-batches of 8 batches instead of 50, so that a batch
mixes more lengths. transformers-ek-order is the Trainer reading the rows in encoderkit's order for the seed, from
encoderkit's initial classifier: beside encoderkit, only the dropout masks differ (each section then also gives
encoderkit minus it, seed by seed). encoderkit-trainer-order is the reverse: encoderkit reading the rows in the order
the Trainer read them at the same seed (noted by its collator in the Trainer's run), from the Trainer's initial
classifier, in random batches at every budget; beside the Trainer only the dropout masks differ, and encoderkit minus
it is what encoderkit's own order and head drew at that seed.

``--device cuda`` runs both sides on a GPU (fp32, TF32 off): the check of which differences are CPU-only. ``--model``
takes a directory whose weights may be fp16 (carried to a borrowed machine in half the bytes; widened to fp32
before either side reads them), ``--shared`` a copy of ../shared's data.

    flock -x /tmp/bench.lock python bench/finetune_small.py [--task sst2] [--budgets 2000,4000,16000] [--seeds 5]
        [--contenders transformers,encoderkit,encoderkit-random] [--device cuda] [--model DIR] [--shared DIR]
        [--extend] [--result NAME] [--smoke]

``--extend`` runs only the seeds a budget's earlier section lacks (up to ``--seeds``), for the contenders it has, and
adds them to it: the section keeps its first run's provenance and lists each extension's (commit, date, seeds). A
contender the section lacks, named with all of its own, runs at every seed and is added the same way.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

import common
import smoke_training
from common import RESULTS, require, widened, write_result, write_tsv

HYPER = dict(batch_size=32, learning_rate=5e-5, warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0,
             adam_eps=1e-8)
MAX_LENGTH = {"sst2": 64, "conll": 128}
HELD_OUT = 2000  # SST-2: the file's last rows, the held-out set
# the first 5 are the goal's; more give a tighter interval (``--extend`` adds them to a budget measured before)
SEEDS = (42, 7, 1234, 2024, 99, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
         25, 26)
CONTENDERS = ("transformers", "encoderkit")
VARIANTS = ("encoderkit-random", "encoderkit-torch-kernels", "encoderkit-dense-adamw", "encoderkit-torch",
            "encoderkit-carved", "encoderkit-mega8", "transformers-ek-order", "encoderkit-trainer-order")
GOAL_SEEDS = 5  # the goal is stated over the first 5 seeds
GOALS = {"sst2": 0.25, "conll": 0.5}  # points below the Trainer's mean that still meet the goal
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045}  # Student's t, 97.5th percentile, by degrees of freedom


def sst2_data(work: Path, budget: int, smoke: bool) -> tuple[Path, Path]:
    lines = require(common.SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [tuple(part.strip() for part in line.split("\t")) for line in lines]
    held_out = rows[-(64 if smoke else HELD_OUT):]
    if budget > len(rows) - HELD_OUT:
        raise SystemExit(f"a budget of {budget:,} rows overlaps the held-out set: at most {len(rows) - HELD_OUT:,}")
    return write_tsv(work / f"train-{budget}.tsv", rows[:budget]), write_tsv(work / "held-out.tsv", held_out)


def conll_data(work: Path, budget: int, smoke: bool) -> tuple[Path, Path]:
    def sentences(path: Path) -> list[str]:
        blocks = path.read_text(encoding="utf-8").split("\n\n")
        return [b.strip("\n") for b in blocks if b.strip() and not b.strip().startswith("-DOCSTART-")]

    train = sentences(require(common.SHARED / "data" / "conll2003" / "eng.train"))[:budget]
    valid = sentences(require(common.SHARED / "data" / "conll2003" / "eng.testa"))[:64 if smoke else None]
    (work / f"train-{budget}.conll").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (work / "held-out.conll").write_text("\n\n".join(valid) + "\n", encoding="utf-8")
    return work / f"train-{budget}.conll", work / "held-out.conll"


def setup_for(task: str, train: Path, valid: Path, work: Path, seed: int, contender: str, model: Path, device: str):
    from encoderkit.training.finetune import Recipe, prepare_finetune, task_kind

    random_batches = contender in ("encoderkit-random", "encoderkit-trainer-order")
    recipe = Recipe(**HYPER, epochs=1, seed=seed, max_length=MAX_LENGTH[task], show_progress=False,
                    save_steps=10**9, group_by_length=False if random_batches else None, device=device)
    kind = task_kind("classify" if task == "sst2" else "ner")
    carved = contender == "encoderkit-carved"
    return prepare_finetune(kind, train, work / "ek", valid=None if carved else valid, model=model,
                            recipe=recipe), carved


@contextlib.contextmanager
def switched_off(contender: str) -> Iterator[None]:
    """The one default a variant switches off, for the length of its run."""
    if contender == "encoderkit-torch-kernels":
        from encoderkit.modeling.dropout import training_kernels

        with training_kernels(False):
            yield
    elif contender == "encoderkit-dense-adamw":
        from encoderkit.training import trainer

        saved = trainer.EmbeddingRows.rows
        trainer.EmbeddingRows.rows = lambda self: {}  # no table's rows named: torch's AdamW steps every row
        try:
            yield
        finally:
            trainer.EmbeddingRows.rows = saved
    elif contender == "encoderkit-torch":  # every CPU-only part off: torch's dropout, ops and AdamW
        from encoderkit.modeling import attention, dropout
        from encoderkit.training import trainer

        saved = dropout.own_masks, attention.own_masks, trainer.EmbeddingRows.rows
        dropout.own_masks = attention.own_masks = lambda device, p: False
        trainer.EmbeddingRows.rows = lambda self: {}
        try:
            with dropout.training_kernels(False):
                yield
        finally:
            dropout.own_masks, attention.own_masks, trainer.EmbeddingRows.rows = saved
    elif contender == "encoderkit-mega8":  # length groups sorted within 8 batches, not 50: mixed lengths
        from encoderkit.training import trainer

        saved = trainer.length_grouped
        trainer.length_grouped = lambda *args, **kwargs: saved(*args, **{**kwargs, "mega_batches": 8})
        try:
            yield
        finally:
            trainer.length_grouped = saved
    else:
        yield


class NotingCollator:
    """The Trainer's collator, noting the rows of each batch it builds: the order the Trainer read them in. The
    rows carry their index as ``row``, taken off here before the real collator sees them."""

    def __init__(self, collator: Any) -> None:
        self.collator, self.rows = collator, []

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        self.rows.extend(feature["row"] for feature in features)
        return self.collator([{k: v for k, v in feature.items() if k != "row"} for feature in features])


def run_one(task: str, contender: str, train: Path, valid: Path, seed: int, model: Path,
            device: str, trainer_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """One contender's epoch at one seed: its held-out metric and how long it trained. A Trainer's run also returns
    the order it read the rows in and its initial classifier (``order``, ``head``), which encoderkit-trainer-order
    takes as ``trainer_run``."""
    from finetune import hf_trainer, transformers_quality

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setup, carved = setup_for(task, train, valid, work, seed, contender, model, device)
        head = setup.model.classifier if task == "sst2" else setup.model.token_classifier
        noted: dict[str, Any] = {}
        started = time.perf_counter()
        if contender.startswith("transformers"):
            ours = contender == "transformers-ek-order"  # encoderkit's order and initial classifier
            trainer, _, tokenizer = hf_trainer(task, setup, "sequential" if ours else "random", work / "hf",
                                               order=setup.trainer._order(0) if ours else None, model=model,
                                               use_cpu=device == "cpu", remove_unused_columns=False)
            if ours:
                trainer.model.classifier.load_state_dict(head.out.state_dict())
            else:  # note the Trainer's own order; what it computes is unchanged
                trainer.train_dataset = [{**row, "row": i} for i, row in enumerate(trainer.train_dataset)]
                trainer.data_collator = NotingCollator(trainer.data_collator)
                noted.update(order=trainer.data_collator.rows,  # filled in as the Trainer reads the rows
                             head={k: v.clone() for k, v in trainer.model.classifier.state_dict().items()})
            trainer.train()
            seconds = time.perf_counter() - started
            quality = transformers_quality(setup, trainer.model.eval(), tokenizer, work / "hf-out")
        else:
            if contender == "encoderkit-trainer-order":
                order = np.asarray(trainer_run["order"])  # once: the trainer asks for its order every batch
                if sorted(order.tolist()) != list(range(len(setup.train_examples))):
                    raise SystemExit(f"the Trainer read {len(order)} rows, not each of the "
                                     f"{len(setup.train_examples)} once: no order to give encoderkit")
                setup.trainer._order = lambda epoch: order
                head.out.load_state_dict(trainer_run["head"])
            with switched_off(contender):
                setup.trainer.train(resume=False)
            seconds = time.perf_counter() - started
            if carved:  # score on the same held-out set as every other contender
                setup.valid_examples = setup.kind.read(valid)
            quality = setup.evaluate(setup.model.eval(), dtype="fp32")
        return {"metric": 100 * quality[setup.kind.main_metric], "seconds": seconds,
                "train_examples": len(setup.train_examples), **noted}


def repeated_trainer_run(task: str, train: Path, valid: Path, seed: int, model: Path, device: str,
                         runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The Trainer's order at a seed measured before (a contender added by ``--extend``): its run again, which must
    score what it scored then (the runs are deterministic), or the order would not be the one it read."""
    result = run_one(task, "transformers", train, valid, seed, model, device)
    before = next(r["metric"] for r in runs["transformers"] if r["seed"] == seed)
    if abs(result["metric"] - before) > 1e-9:
        raise SystemExit(f"the Trainer at seed {seed} scored {result['metric']:.4f} again, {before:.4f} before: its "
                         "order now is not the one it read then (another library version or CPU?); run the "
                         "budget anew instead of --extend")
    print(f"{task} seed {seed}: the Trainer's order noted by a run again ({result['metric']:.2f}, as before)",
          flush=True)
    return result


def paired(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """Mean of the per-seed differences and its 95% interval (Student's t with n - 1 degrees of freedom)."""
    differences = [a - b for a, b in zip(ours, theirs)]
    n = len(differences)
    mean = statistics.fmean(differences)
    half = T_975.get(n - 1, 1.96) * statistics.stdev(differences) / math.sqrt(n) if n > 1 else float("nan")
    return {"mean": mean, "low": mean - half, "high": mean + half}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("sst2", "conll"), default="sst2")
    parser.add_argument("--budgets", default=None, help="training rows (default: 2000,4000,16000 for sst2, 2000 "
                                                        "for conll)")
    parser.add_argument("--seeds", type=int, default=5, help=f"how many of the seeds, 1 to {len(SEEDS)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"of {', '.join(CONTENDERS + VARIANTS)}")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where both sides train")
    parser.add_argument("--model", type=Path, default=None, help="the all-MiniLM-L6-v2 directory (default: the "
                                                                  "installed default model); fp16 weights are widened")
    parser.add_argument("--shared", type=Path, default=common.SHARED, help="the folder holding data/")
    parser.add_argument("--extend", action="store_true", help="add seeds to each budget's earlier section (its "
                                                                "contenders; up to --seeds in all)")
    parser.add_argument("--result", default=None, help="the file under bench/results/ (default: finetune_small_"
                                                         "TASK[_DEVICE]): a run on another CPU beside the kept one")
    parser.add_argument("--smoke", action="store_true", help="64 rows, one seed, nothing written (a test)")
    args = parser.parse_args()
    # The runner's smoke run (common.SMOKE) shrinks the same way, on a tiny random BERT, and writes its result to
    # the runner's folder.
    smoke = args.smoke or common.SMOKE
    common.SHARED = args.shared
    if args.device == "cpu":
        torch.set_num_threads(2)
    else:  # fp32 products on the GPU, as on the CPU
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    contenders = sorted(args.contenders.split(","), key=lambda c: c != "transformers")  # the Trainer first
    unknown = set(contenders) - set(CONTENDERS + VARIANTS)
    if unknown or "transformers" not in contenders:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; 'transformers' is the reference and must run")
    budgets = [64] if smoke else [int(b) for b in (args.budgets or ("2000,4000,16000" if args.task == "sst2"
                                                                          else "2000")).split(",")]
    if not 1 <= args.seeds <= len(SEEDS):
        raise SystemExit(f"--seeds takes 1 to {len(SEEDS)}, found {args.seeds}")
    seeds = SEEDS[:1 if smoke else args.seeds]
    name = args.result or f"finetune_small_{args.task}" + ("" if args.device == "cpu" else f"_{args.device}")
    earlier_sections = earlier_by_budget(RESULTS / f"{name}.json")
    if args.extend and not smoke:
        extendable(earlier_sections, budgets, contenders, seeds)
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        from encoderkit import default_model_path

        model = widened(args.model or smoke_training.tiny_model() or default_model_path(), Path(tmp))
        for budget in budgets:
            train, valid = (sst2_data if args.task == "sst2" else conll_data)(Path(tmp), budget, smoke)
            before = earlier_sections.get(budget) if args.extend and not smoke else None
            runs: dict[str, list[dict[str, Any]]] = earlier_runs(before) if before else {c: [] for c in contenders}
            done = before["seeds"] if before else []
            new_seeds = list(seeds[len(done):])
            added = [c for c in contenders if c not in runs]  # new to an earlier section: they run at its seeds too
            runs.update({c: [] for c in added})
            for seed in done + new_seeds:
                trainer_run = None  # the Trainer's run at this seed: its order for encoderkit-trainer-order
                for contender in (added if seed in done else contenders):  # in turn, seed by seed
                    if contender == "encoderkit-trainer-order" and trainer_run is None:
                        trainer_run = repeated_trainer_run(args.task, train, valid, seed, model, args.device, runs)
                    result = run_one(args.task, contender, train, valid, seed, model, args.device, trainer_run)
                    if contender == "transformers":
                        trainer_run = result
                    runs[contender].append({"seed": seed, **{k: result[k] for k in ("metric", "seconds",
                                                                                      "train_examples")}})
                    print(f"{args.task} {budget:,} seed {seed}: {contender:26s} {result['metric']:.2f} "
                          f"({result['seconds']:.0f} s)", flush=True)
            section = summarise(args.task, budget, runs)
            if before:  # the first run's provenance, and this one's among the extensions
                extension = {"provenance": common.provenance(), "seeds": new_seeds}
                if added:
                    extension["contenders"] = added
                section.update(provenance=before["provenance"], seeds=done + new_seeds,
                               extensions=before.get("extensions", []) + [extension])
            else:
                section.update(provenance=common.provenance(), seeds=new_seeds)
            sections.append(section)
    goals = [goal for section in sections for goal in section["goals"]]
    for goal in goals:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'NOT MET'}")
    if args.smoke:
        print("smoke run: nothing written")
        return
    # a rerun of some budgets keeps the others, each with its own provenance (never re-stamped)
    kept = [section for budget, section in earlier_sections.items() if budget not in budgets]
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    write_result(name, {"task": args.task, "device": args.device, "gpu": gpu, "hyperparameters": {**HYPER, "epochs": 1, "max_length": MAX_LENGTH[args.task]},
                        "seeds": list(seeds), "sections": sorted(kept + sections, key=lambda s: s["budget"]),
                        "goals": goals}, benchmark="finetune_small")


def earlier_by_budget(path: Path) -> dict[int, dict[str, Any]]:
    """The sections of an earlier result by budget, each with its provenance and seeds (older results kept them at
    the top level only)."""
    if not path.exists():
        return {}
    before = json.loads(path.read_text())
    sections = {}
    for section in before["sections"]:
        section.setdefault("provenance", before["provenance"])
        section.setdefault("seeds", before["seeds"])
        sections[section["budget"]] = section
    return sections


def earlier_runs(section: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A section's runs by contender, as ``summarise`` takes them: each seed's metric, and the row's mean training
    time for each seed (so that the mean over old and new seeds weighs each seed once)."""
    return {row["contender"]: [{"seed": seed, "metric": metric, "seconds": row["seconds"],
                                "train_examples": row["train_examples"]}
                               for seed, metric in zip(section["seeds"], row["metrics"])]
            for row in section["rows"]}


def extendable(sections: dict[int, dict[str, Any]], budgets: list[int], contenders: list[str],
               seeds: tuple[int, ...]) -> None:
    """Refuse an ``--extend`` that cannot add to every budget's section: a budget not measured before, contenders
    that leave out some of its own, or neither seeds it lacks nor a contender it lacks."""
    for budget in budgets:
        section = sections.get(budget)
        if section is None:
            raise SystemExit(f"--extend: no earlier section for {budget:,} rows; run it without --extend first")
        own = [row["contender"] for row in section["rows"]]
        if not set(own) <= set(contenders):
            raise SystemExit(f"--extend: the {budget:,}-row section has the contenders {','.join(own)}; pass "
                             f"--contenders {','.join(own)} (and any to add)")
        if list(seeds[:len(section["seeds"])]) != section["seeds"] or len(seeds) < len(section["seeds"]):
            raise SystemExit(f"--extend: the {budget:,}-row section has seeds {section['seeds']}; --seeds must "
                             f"be at least {len(section['seeds'])}")
        if len(seeds) == len(section["seeds"]) and set(contenders) == set(own):
            raise SystemExit(f"--extend: the {budget:,}-row section has these seeds and contenders already; pass "
                             f"more --seeds or a contender to add")


def summarise(task: str, budget: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    reference = [r["metric"] for r in runs["transformers"]]
    rows, goals = [], []
    for contender, results in runs.items():
        metrics = [r["metric"] for r in results]
        row = {"contender": contender, "metrics": metrics, "mean": statistics.fmean(metrics),
               "seconds": statistics.fmean(r["seconds"] for r in results),
               "train_examples": results[0]["train_examples"]}
        if contender != "transformers":
            row["paired_difference"] = paired(metrics, reference)
        rows.append(row)
        print(f"  {task} {budget:,} {contender:26s} mean {row['mean']:.2f}" + (
            f"  paired {row['paired_difference']['mean']:+.2f} [{row['paired_difference']['low']:+.2f}, "
            f"{row['paired_difference']['high']:+.2f}]" if "paired_difference" in row else ""))
    by_name = {r["contender"]: r for r in rows}
    # Beside encoderkit, the Trainer in encoderkit's order differs only in its dropout masks; encoderkit in the
    # Trainer's order differs only in the order and initial head drawn for the seed.
    comparisons = [{"contenders": ["encoderkit", other], **paired(by_name["encoderkit"]["metrics"],
                                                                  by_name[other]["metrics"])}
                   for other in ("transformers-ek-order", "encoderkit-trainer-order")
                   if "encoderkit" in by_name and other in by_name]
    if "encoderkit" in by_name:  # the goal is over the first 5 seeds; more seeds give a tighter estimate beside it
        first = GOAL_SEEDS
        ours = statistics.fmean(by_name["encoderkit"]["metrics"][:first])
        theirs = statistics.fmean(reference[:first])
        allowed = GOALS[task]
        measured = f"{ours:.2f} against {theirs:.2f} ({ours - theirs:+.2f} points, over {min(first, len(reference))} seeds)"
        met = ours >= theirs - allowed
        if len(reference) > first:  # more seeds: met only where their mean meets it too
            difference = by_name["encoderkit"]["paired_difference"]
            measured += (f"; over all {len(reference)} seeds {difference['mean']:+.2f} [{difference['low']:+.2f}, "
                         f"{difference['high']:+.2f}]")
            met = met and difference["mean"] >= -allowed
        goals.append({"goal": f"{task} at {budget:,}: encoderkit's mean at least the Trainer's minus {allowed} points",
                      "met": met, "measured": measured})
    return {"budget": budget, "rows": rows, "goals": goals, "comparisons": comparisons}


if __name__ == "__main__":
    sys.exit(main())
