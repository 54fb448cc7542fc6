"""How much can unpadded training gain over transformers' Trainer with length-grouped batches? (issue 22, point 5)

Both trainers run the same model on the same examples; what unpadding removes is the work the grouped Trainer
spends on padding. This script counts it. For each task of bench/finetune.py it draws the grouped Trainer's own
batches for one epoch (``Trainer.get_train_dataloader()`` with ``train_sampling_strategy="group_by_length"``, seed
42, the features and collator of bench/finetune.py) and counts, from the model's config, the floating-point
operations of one training step (forward and backward, 3x the forward):

- the linear layers: 2 x (their weights) per token, forward;
- attention's two products (scores and the weighted sum): 4 x length^2 x hidden per sequence and layer, forward;

once over padded batches (what the Trainer computes: every sequence at its batch's longest length) and once over
the sequences' own lengths (what unpadded training computes). Their ratio is the most that removing padding can
buy, if both trainers computed at the same rate: the bound on encoderkit's fp32 speed-up that no unpadding, fusion
or kernel choice crosses at equal arithmetic. Embedding lookups, LayerNorm, softmax, GELU, the head, the loss and
the optimizer are not counted (they add time to both sides and lower the bound further).

With bench/results/finetune.json's full-epoch runs on this CPU (the grouped Trainer and encoderkit in one
interleaved run), the script also reports each trainer's achieved rate: the counted operations it performed per
second of training, against ``torch.mm``'s rate on this CPU at a (4096 x 384) @ (384 x 1536) product.

    flock -x /tmp/bench.lock python bench/unpadding_bound.py [--tasks sst2,conll,squad]

Writes bench/results/unpadding_bound.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from common import RESULTS, machine, write_result
from smoke import matmul_peak

TARGET = 1.5  # issue 22's speed-up over the grouped Trainer


def linear_weights(config: Any) -> int:
    """Weights of the encoder's linear layers (query, key, value, output, the two FFN products), all layers."""
    hidden, inner = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * inner)


def step_flops(lengths: list[int], padded_to: int | None, config: Any) -> float:
    """Forward and backward operations of one batch: at each sequence's length, or at ``padded_to`` for all."""
    per_token = 2 * linear_weights(config)
    total = 0.0
    for length in lengths:
        n = padded_to or length
        total += per_token * n + config.num_hidden_layers * 4 * n * n * config.hidden_size
    return 3 * total


def count(task: str, work: Path) -> dict[str, Any]:
    from finetune import hf_trainer, prepare

    setup = prepare(task, work, group_by_length=True)
    trainer, _, _ = hf_trainer(task, setup, "group_by_length", work / "hf")
    config = trainer.model.config
    real_tokens = padded_tokens = 0
    real_flops = padded_flops = 0.0
    batches = 0
    for batch in trainer.get_train_dataloader():
        lengths = batch["attention_mask"].sum(1).tolist()
        width = batch["attention_mask"].shape[1]
        real_tokens += sum(lengths)
        padded_tokens += width * len(lengths)
        real_flops += step_flops(lengths, None, config)
        padded_flops += step_flops(lengths, width, config)
        batches += 1
    return {"task": task, "batches": batches, "real_tokens": real_tokens, "padded_tokens": padded_tokens,
            "padding_share": 1 - real_tokens / padded_tokens, "real_tflop": real_flops / 1e12,
            "padded_tflop": padded_flops / 1e12, "bound": padded_flops / real_flops}


def full_epoch_trials(cpu: str) -> list[dict[str, Any]]:
    """bench/finetune.py's one-epoch trials on this CPU (finetune.json), none where it has not run."""
    path = RESULTS / "finetune.json"
    if not path.is_file():
        return []
    trials = json.loads(path.read_text(encoding="utf-8")).get("trials", [])
    return [t for t in trials if t["epochs"] == 1 and t.get("machine", {}).get("cpu") == cpu]


def achieved(row: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest of ``trials`` (``full_epoch_trials``) on ``row``'s task: the grouped Trainer's and encoderkit's
    seconds, speed-up and achieved GFLOP/s (None where that run lacks either)."""
    runs = [t for t in trials if t["task"] == row["task"]]
    if not runs:
        return None
    run = max(runs, key=lambda t: t["date"])
    seconds = {r["contender"]: r["train_seconds"] for r in run["rows"]}
    if not {"transformers-grouped", "encoderkit"} <= set(seconds):
        return None
    trainer, ours = seconds["transformers-grouped"], seconds["encoderkit"]
    return {"date": run["date"], "trainer_seconds": trainer, "encoderkit_seconds": ours,
            "measured_speedup": trainer / ours,
            "trainer_gflops": 1e3 * row["padded_tflop"] / trainer, "encoderkit_gflops": 1e3 * row["real_tflop"] / ours,
            "encoderkit_gflops_for_1_5x": 1e3 * row["real_tflop"] / (trainer / TARGET)}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sst2,conll,squad")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trials = full_epoch_trials(machine()["cpu"])
    peak = matmul_peak(torch.float32)
    rows = []
    with tempfile.TemporaryDirectory(prefix="unpadding-") as scratch:
        for task in args.tasks.split(","):
            row = count(task, Path(scratch) / task)
            row["run"] = achieved(row, trials)
            rows.append(row)
            line = (f"{task:6s} padding {100 * row['padding_share']:5.1f}% of the grouped Trainer's tokens; bound on "
                    f"unpadding's speed-up {row['bound']:.3f}x")
            if row["run"]:
                run = row["run"]
                line += (f"; measured {run['measured_speedup']:.2f}x; achieved GFLOP/s: Trainer "
                         f"{run['trainer_gflops']:.0f}, encoderkit {run['encoderkit_gflops']:.0f}, encoderkit at {TARGET}x "
                         f"{run['encoderkit_gflops_for_1_5x']:.0f} (torch.mm {peak:.0f})")
            print(line, flush=True)
    write_result("unpadding_bound", {"matmul_gflops_fp32": peak, "threads": args.threads, "rows": rows,
                                     "command": "python bench/unpadding_bound.py --tasks " + args.tasks})


def render(r: dict[str, Any]) -> list[str]:
    from report import _machine, _table

    lines = ["## What unpadding can buy against the grouped Trainer (`bench/unpadding_bound.py`)", "", _machine(r), "",
             "The grouped Trainer's own batches for one epoch (`train_sampling_strategy=\"group_by_length\"`, seed 42, "
             "bench/finetune.py's features), and the operations of the linear layers and attention's two products, "
             "forward and backward, counted at the padded width and at each sequence's length. Their ratio is the "
             "largest speed-up removing padding can give at equal arithmetic. Achieved GFLOP/s: the counted "
             "operations each trainer performed (padded for the Trainer, real for encoderkit) per second of training "
             "in bench/finetune.py's newest full-epoch run on this CPU (optimizer, embeddings, norms and the rest "
             f"included in the seconds). torch.mm's fp32 rate here: {r['matmul_gflops_fp32']:.0f} GFLOP/s. The last "
             f"column is the rate encoderkit would need for {TARGET}x the Trainer's speed, and its share of torch.mm's "
             "rate at one large product.", ""]
    rows = []
    for row in r["rows"]:
        run = row.get("run") or {}
        rows.append([row["task"], f"{row['batches']:,}", f"{row['real_tokens']:,}", f"{row['padded_tokens']:,}",
                     f"{100 * row['padding_share']:.1f}%", f"**{row['bound']:.3f}x**",
                     f"{run['measured_speedup']:.2f}x" if run else "", f"{run['trainer_gflops']:.0f}" if run else "",
                     f"{run['encoderkit_gflops']:.0f}" if run else "",
                     f"{run['encoderkit_gflops_for_1_5x']:.0f} "
                     f"({100 * run['encoderkit_gflops_for_1_5x'] / r['matmul_gflops_fp32']:.0f}%)" if run else ""])
    return lines + _table(["task", "batches", "real tokens", "tokens the Trainer computes", "padding share",
                           "bound on unpadding's speed-up", "measured speed-up (finetune.py)",
                           "Trainer GFLOP/s", "encoderkit GFLOP/s", f"encoderkit GFLOP/s needed for {TARGET}x"],
                  rows) + [""]


if __name__ == "__main__":
    main()
