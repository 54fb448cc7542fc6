"""Deterministic parity of a whole fine-tuning epoch: encoderkit vs transformers' Trainer on SQuAD, or on SST-2.

bench/finetune.py compares the two the way users run them, with dropout on: then every contender draws its own
dropout masks, head initialisation and batch order, and one SQuAD epoch of the 4k-question benchmark lands
several F1 points apart depending on those draws. This script takes the chance out, to show what is left
when it is gone:

- dropout 0 in both models (hidden and attention probabilities);
- the same initial QA head (encoderkit's, copied into transformers' ``qa_outputs``);
- the same batch order (encoderkit's seeded random order; transformers' Trainer reads the rows in that order
  with ``train_sampling_strategy="sequential"``);
- the same span loss (encoderkit's, padding masked; transformers' own keeps padding among the candidates,
  which is the ``transformers-masked`` ablation of bench/finetune.py);
- everything else as bench/finetune.py: the same features, AdamW, warm-up, decay, clipping, batch size
  (bench/finetune.py's SQuAD batch), 1 epoch.

It prints both loss curves side by side and both final SQuAD scores (the same evaluator), and writes
bench/results/finetune_parity.json. Each side runs in a process of its own.

``--task sst2`` checks the classification path (the pooler, the [CLS]-only last layer, the classifier) the same way,
in bench/finetune_small.py's setting (issue 40): its first 4,000 rows, scored on its held-out rows, seed 42, its
recipe; the Trainer gets encoderkit's initial classifier and order. It writes finetune_parity_sst2.json.

    python bench/finetune_parity.py [--task squad|sst2] [--dropout 0.0] [--threads 2] [--epochs 0.05]
"""
from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

import torch

import common


SST2_ROWS, SST2_SEED = 4000, 42  # issue 40's budget; bench/finetune_small.py's first seed


def _setup(task: str, work: Path, epochs: float):  # epochs: squad's trials
    """encoderkit's set-up of the task's epoch, and the model directory both sides start from (None: bench/finetune.py's
    default)."""
    import finetune as bench

    if task == "squad":
        return bench.prepare("squad", work / "ek", group_by_length=False, epochs=epochs), None
    import finetune_small
    import smoke_training
    from encoderkit import default_model_path

    model = smoke_training.tiny_model() or Path(default_model_path())
    train, valid = finetune_small.sst2_data(work, SST2_ROWS, common.SMOKE)
    setup, _ = finetune_small.setup_for("sst2", train, valid, work, SST2_SEED, "encoderkit", model, "cpu")
    return setup, model


def _side(task: str, kind: str, dropout: float, epochs: float, threads: int, queue) -> None:
    import finetune as bench

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        setup, model = _setup(task, work, epochs)
        order = setup.trainer._order(0)
        if kind == "encoderkit":
            from encoderkit.modeling.attention import SelfAttention

            for module in setup.model.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = dropout
                if isinstance(module, SelfAttention):
                    module.dropout_p = dropout
            trainer = setup.trainer
            started = time.perf_counter()
            trainer.begin(resume=False)
            losses = [trainer.train_step()["loss"] for _ in range(trainer.config.max_steps)]
            seconds = time.perf_counter() - started
            quality = setup.evaluate(trainer.model.eval(), dtype="fp32")
        else:
            import transformers

            options = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
            if task == "squad":
                trainer, _, tokenizer = bench.hf_trainer("squad", setup, "sequential", work / "hf", masked=True,
                                                         order=order, log_every_step=True, model_options=options)
                trainer.model.qa_outputs.load_state_dict(setup.model.span_head.out.state_dict())
            else:
                trainer, _, tokenizer = bench.hf_trainer("sst2", setup, "sequential", work / "hf", order=order,
                                                         log_every_step=True, model_options=options, model=model)
                trainer.model.classifier.load_state_dict(setup.model.classifier.out.state_dict())
            losses = []

            class Losses(transformers.TrainerCallback):
                def on_log(self, args, state, control, logs=None, **kwargs):
                    if logs and "loss" in logs:
                        losses.append(float(logs["loss"]))

            trainer.add_callback(Losses())
            started = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - started
            quality = bench.transformers_quality(setup, trainer.model.eval(), tokenizer, work / "hf-out")
    queue.put({"side": kind, "losses": losses, "seconds": seconds, "metrics": quality,
               "batch_size": setup.recipe.batch_size})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=("squad", "sst2"), default="squad")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=1.0, help="part of an epoch for a trial (not written)")
    args = parser.parse_args()
    if args.task == "sst2" and args.epochs != 1.0:
        raise SystemExit("--epochs (a trial's part of an epoch) is for squad; sst2's epoch is 125 steps")
    context = multiprocessing.get_context("spawn")
    results = {}
    for kind in ("encoderkit", "transformers"):  # one after the other: the sides share nothing
        queue = context.Queue()
        process = context.Process(target=_side, args=(args.task, kind, args.dropout, args.epochs, args.threads,
                                                      queue))
        process.start()
        results[kind] = queue.get()
        process.join()
        print(f"{kind:12s} {results[kind]['metrics']}  ({results[kind]['seconds']:,.0f} s)", flush=True)
    ek, hf = results["encoderkit"]["losses"], results["transformers"]["losses"]
    for step in range(0, min(len(ek), len(hf)), 10):
        print(f"  step {step + 1:4d}  loss encoderkit {ek[step]:.4f}  transformers {hf[step]:.4f}")
    largest = max(abs(a - b) for a, b in zip(ek, hf))
    print(f"largest loss difference over {len(ek)} steps: {largest:.2e}")
    if args.epochs == 1.0:
        name = "finetune_parity" + ("" if args.task == "squad" else f"_{args.task}")
        common.write_result(name, {"task": args.task, "dropout": args.dropout,
                            "batch_size": results["encoderkit"]["batch_size"], "sides": results,
                            "largest_loss_difference": largest}, benchmark="finetune_parity")


def render(r: dict) -> list[str]:
    """The BENCHMARKS.md section (bench/report.py calls this)."""
    from report import _table

    squad = r.get("task", "squad") == "squad"
    metrics, headers, percent = ((("exact_match", "f1"), ("exact match", "F1"), 1) if squad  # SQuAD's: percentages
                                 else (("accuracy",), ("accuracy",), 100))
    rows = [[side, *(f"{percent * v['metrics'][m]:.2f}" for m in metrics),
             f"{v['seconds']:,.0f}", f"{v['losses'][0]:.4f} -> {v['losses'][-1]:.4f}"]
            for side, v in r["sides"].items()]
    what = (f"One SQuAD epoch of bench/finetune.py's benchmark (batch {r.get('batch_size', 32)}) with dropout "
            f"{r['dropout']:g}, the same initial head, batch order and span loss on both sides." if squad else
            f"One epoch of SST-2's first {SST2_ROWS:,} rows in bench/finetune_small.py's setting (seed {SST2_SEED}, "
            f"batch {r.get('batch_size', 32)}), dropout {r['dropout']:g}, the same initial classifier and batch order "
            "on both sides; accuracy on its held-out rows.")
    return [f"## Fine-tuning parity with the chance taken out{'' if squad else ': SST-2'} "
            "(`bench/finetune_parity.py`)", "", what, "",
            *_table(["side", *headers, "train s",
                     "loss, first -> last step"], rows), "",
            f"Largest difference between the two loss curves: {r['largest_loss_difference']:.2e} "
            f"over {len(next(iter(r['sides'].values()))['losses'])} steps.", ""]


if __name__ == "__main__":
    main()
