"""encoderkit's native training kernels against the PyTorch ops they replace (issue 22, point 7).

The kernels (tests/modeling/test_training_kernels.py tests their numbers): one group's attention as one autograd function
(modeling.attention's ``_TrainingAttention``: the scale, the padding mask, softmax and the dropout of the probabilities
in one native pass each way, around the products) and a post-norm layer's LayerNorm(residual + dropout(y))
(modeling.dropout's ``add_norm``). What they replace: the same steps as PyTorch ops, the dropout masks drawn by
encoderkit's own native dropout (modeling.dropout), which is what ran before.

Three measurements, each in interleaved rounds (medians), 2 threads unless ``--threads``:
- the kernels alone, forward and backward, at the shapes of bench/finetune.py's tasks (all-MiniLM-L6-v2: 12 heads of
  32, width 384; dropout 0.1): attention groups of SST-2 (32 sequences of 12 tokens), CoNLL (24 of 38) and SQuAD (6 of
  384), LayerNorm over a batch's tokens (336, 764 and 2,378 rows);
- encoderkit's whole training step (bench/finetune_profile.py's, the same grouped batches) with the kernels and with
  them turned off, alternating batch by batch;
- the optimizer's part of the step with the word table's rows apart (the gradient norm and ``ek_adamw_rows`` read
  the rows a step can change) and without (torch's fused AdamW over every parameter);
- what the step's linear layers' products reach on this CPU (GFLOP/s of torch's fp32 products at the MLP's shapes for
  a batch's tokens, forward, input gradient and weight gradient) against a square 2048 product: how close to the
  machine's speed the largest part of the step already runs.

    python bench/training_kernels.py [--tasks sst2,conll,squad] [--batches 8] [--rounds 5]
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from common import smoke_size, write_result

HEADS, DIM, WIDTH, P = 12, 32, 384, 0.1
ATTENTION_GROUPS = {"sst2": (32, 12), "conll": (24, 38), "squad": (6, 384)}  # (sequences, length)
NORM_ROWS = {"sst2": 336, "conll": 764, "squad": 2378}


def interleaved(functions: dict[Any, Callable[[], None]], rounds: int, calls: int) -> dict[Any, float]:
    """Median seconds a call of each function, over ``rounds`` interleaved rounds of ``calls`` calls (one in a smoke
    run)."""
    calls = smoke_size(calls, 1)
    for function in functions.values():
        function()
    seconds: dict[Any, list[float]] = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            started = time.perf_counter()
            for _ in range(calls):
                function()
            seconds[name].append((time.perf_counter() - started) / calls)
    return {name: statistics.median(values) for name, values in seconds.items()}


def attention_ops(task: str, rounds: int) -> dict[str, Any]:
    from encoderkit.modeling.attention import _TrainingAttention
    from encoderkit.modeling.dropout import draw_mask, dropout

    count, length = ATTENTION_GROUPS[task]
    grid = torch.randn(count, length, 3 * HEADS * DIM, requires_grad=True)
    valid = torch.full((count,), length)
    scale = 1 / math.sqrt(DIM)

    def kernel() -> None:
        _TrainingAttention.apply(grid, valid, HEADS, scale, draw_mask(P)).sum().backward()

    def torch_ops() -> None:  # SelfAttention.attend_grid's explicit path, as it ran before
        q, k, v = grid.view(count, length, 3, HEADS, DIM).permute(2, 0, 3, 1, 4).unbind(0)
        probs = (torch.matmul(q, k.transpose(-1, -2)) * scale).softmax(dim=-1)
        torch.matmul(dropout(probs, P), v).transpose(1, 2).reshape(count, length, HEADS * DIM).sum().backward()

    calls = max(1, int(20_000 / (count * length * length / 100)))
    times = interleaved({"kernel": kernel, "torch ops": torch_ops}, rounds, min(calls, 50))
    return {"kernel": "attention (forward and backward)", "shape": f"{count} x {length} tokens, {HEADS} heads of {DIM}",
            "seconds": times}


def norm_ops(task: str, rounds: int) -> dict[str, Any]:
    from encoderkit.modeling.dropout import Dropout, add_norm

    rows = NORM_ROWS[task]
    norm, drop = nn.LayerNorm(WIDTH, eps=1e-12), Dropout(P)
    residual = torch.randn(rows, WIDTH, requires_grad=True)
    y = torch.randn(rows, WIDTH, requires_grad=True)
    times = interleaved({"kernel": lambda: add_norm(residual, y, drop, norm).sum().backward(),
                         "torch ops": lambda: norm(residual + drop(y)).sum().backward()}, rounds, 50)
    return {"kernel": "LayerNorm(residual + dropout(y)) (forward and backward)", "shape": f"{rows} x {WIDTH}",
            "seconds": times}


def products(tasks: list[str], rounds: int) -> list[dict[str, Any]]:
    """GFLOP/s of the MLP's products (tokens x 384 -> 1536) at each task's tokens a batch, and of a square 2048."""
    side = smoke_size(2048, 256)
    shapes: dict[str, tuple[int, int, int]] = {f"square {side} x {side} x {side}": (side, side, side)}
    for task in tasks:
        shapes[f"{task}: {NORM_ROWS[task]} tokens x {WIDTH} -> {4 * WIDTH}"] = (NORM_ROWS[task], WIDTH, 4 * WIDTH)
    functions, flops = {}, {}
    for name, (rows, inner, outer) in shapes.items():
        x, weight, grad = torch.randn(rows, inner), torch.randn(outer, inner), torch.randn(rows, outer)
        parts = {"forward": lambda x=x, w=weight: x @ w.t()} if inner == outer == rows else {
            "forward": lambda x=x, w=weight: x @ w.t(), "input gradient": lambda g=grad, w=weight: g @ w,
            "weight gradient": lambda g=grad, x=x: g.t() @ x}
        for part, function in parts.items():
            functions[(name, part)] = function
            flops[(name, part)] = 2 * rows * inner * outer
    times = interleaved(functions, rounds, 5)
    return [{"shape": name, "product": part, "gflops": flops[(name, part)] / times[(name, part)] / 1e9}
            for name, part in functions]


def update(task: str, rounds: int) -> dict[str, Any]:
    """The optimizer's part of a step (gradient norm with the clipping scale, then AdamW) as Trainer.train_step takes
    it, the word table's rows apart (``EmbeddingRows.rows``: the norm and ``ek_adamw_rows`` read the rows a step can
    change), against the same without rows (the norm of every gradient, torch's fused AdamW over every parameter).
    Two copies of the model in one state: the word table's m and v non-zero on the rows looked up by the epoch's
    first batches, up to the epoch's mean share of rows ever looked up (a row's share of the epoch, averaged); the
    gradients those of one batch's rows (the table) and random (the rest). Interleaved calls."""
    import copy

    import finetune as bench

    from encoderkit.training.optim import clip_gradients, make_optimizer, optimizer_step

    with tempfile.TemporaryDirectory(prefix="training-kernels-") as scratch:
        trainer = bench.prepare(task, Path(scratch), group_by_length=True).trainer
        steps = len(trainer.train_data) // trainer.config.batch_size
        word = trainer.model.encoder.embeddings.word.weight
        seen, shares, batches = torch.zeros(word.shape[0], dtype=torch.bool), [], []
        for _ in range(steps):
            batch = trainer._next_micro_batch()
            ids = torch.unique(batch["input_ids"][batch["attention_mask"].bool()])
            batches.append(ids)
            seen[ids] = True
            shares.append(float(seen.float().mean()))
        mean_share = statistics.mean(shares)
        upto = next(i for i, share in enumerate(shares) if share >= mean_share)
        active = torch.unique(torch.cat(batches[:upto + 1]))
        touched = batches[min(upto + 1, len(batches) - 1)]  # a short epoch (a smoke run) reaches the mean at its end
        models = [trainer.model, copy.deepcopy(trainer.model)]
        generator = torch.Generator().manual_seed(0)
        grads = {name: torch.randn(p.shape, generator=generator) * 1e-3 for name, p in models[0].named_parameters()}
        first = dict(grads)
        first["encoder.embeddings.word.weight"] = torch.zeros_like(word)
        first["encoder.embeddings.word.weight"][active] = torch.randn(len(active), word.shape[1]) * 1e-3
        table = torch.zeros_like(word)
        table[touched] = torch.randn(len(touched), word.shape[1]) * 1e-3
        grads["encoder.embeddings.word.weight"] = table
        optimizers = []
        for model in models:
            optimizer = make_optimizer(model, trainer.config)
            for name, p in model.named_parameters():
                p.grad = first[name].clone()
            optimizer.step()  # the state: m and v of the table non-zero on the active rows alone
            for name, p in model.named_parameters():
                p.grad = grads[name].clone()
            optimizers.append(optimizer)
        rows = {id(models[0].encoder.embeddings.word.weight): touched}

        def with_rows() -> None:
            clip_gradients(models[0].parameters(), 1.0, optimizers[0], rows)
            optimizer_step(optimizers[0], rows)

        def without() -> None:
            clip_gradients(models[1].parameters(), 1.0, optimizers[1])
            optimizer_step(optimizers[1])

        times = interleaved({"with rows": with_rows, "without": without}, rounds, 20)
    return {"task": task, "active_share": len(active) / word.shape[0], "touched_rows": len(touched),
            "parameters": sum(p.numel() for p in models[0].parameters()), "table": word.numel(), "seconds": times}


def step(task: str, batches_wanted: int, rounds: int) -> dict[str, Any]:
    """The step with and without the kernels, alternating batch by batch (which goes first alternates too): the host's
    drift hits both alike. Per round, the mean step of each; the medians of the rounds and of their ratios."""
    from finetune_profile import encoderkit_side

    from encoderkit.modeling.dropout import training_kernels

    names = ("with the kernels", "without")
    with tempfile.TemporaryDirectory(prefix="training-kernels-") as scratch:
        side, batches, _ = encoderkit_side(task, Path(scratch), batches_wanted)
        warm, batches = batches[:2], batches[2:]
        for on in (True, False):
            with training_kernels(on):
                side.run(warm, record=False)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(rounds):
            totals = dict.fromkeys(names, 0.0)
            for index, batch in enumerate(batches):
                for name in (names if (round_ + index) % 2 == 0 else names[::-1]):
                    with training_kernels(name == names[0]):
                        started = time.perf_counter()
                        side.run([batch], record=False)
                        totals[name] += time.perf_counter() - started
            for name in names:
                seconds[name].append(totals[name] / len(batches))
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    ratios = [without / with_ for with_, without in zip(seconds[names[0]], seconds[names[1]])]
    return {"task": task, "tokens_per_batch": tokens, "batches": len(batches),
            "seconds": {name: statistics.median(values) for name, values in seconds.items()},
            "speedup": statistics.median(ratios), "rounds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sst2,conll,squad")
    parser.add_argument("--batches", type=int, default=smoke_size(8, 2))
    parser.add_argument("--rounds", type=int, default=smoke_size(5, 1))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from encoderkit import native

    if native.library() is None:
        raise SystemExit(f"the native library is not built here: {native.status()}")
    tasks = args.tasks.split(",")
    torch.manual_seed(0)
    ops = []
    for task in tasks:
        for measure in (attention_ops, norm_ops):
            row = measure(task, args.rounds)
            ops.append(row)
            times = row["seconds"]
            print(f"{row['kernel']}, {row['shape']}: {times['kernel'] * 1e3:.2f} ms against "
                  f"{times['torch ops'] * 1e3:.2f} ({times['torch ops'] / times['kernel']:.2f}x)", flush=True)
    gemm = products(tasks, args.rounds)
    for row in gemm:
        print(f"{row['shape']}, {row['product']}: {row['gflops']:.1f} GFLOP/s", flush=True)
    updates = []
    for task in tasks:
        row = update(task, args.rounds)
        updates.append(row)
        times = row["seconds"]
        print(f"{task}: optimizer {times['with rows'] * 1e3:.1f} ms with the table's rows, {times['without'] * 1e3:.1f} "
              f"without ({times['without'] / times['with rows']:.2f}x; {100 * row['active_share']:.0f}% of the rows "
              f"active, {row['touched_rows']} looked up)", flush=True)
    steps = []
    for task in tasks:
        row = step(task, args.batches, args.rounds)
        steps.append(row)
        times = row["seconds"]
        print(f"{task}: step {times['with the kernels'] * 1e3:.1f} ms with the kernels, {times['without'] * 1e3:.1f} "
              f"without ({row['speedup']:.2f}x, the median of the rounds' ratios)", flush=True)
    write_result("training_kernels", {"threads": args.threads, "rounds": args.rounds, "dropout": P, "ops": ops,
                                      "products": gemm, "steps": steps, "updates": updates,
                                      "command": "python bench/training_kernels.py " + " ".join(
                                          f"--{k} {v}" for k, v in vars(args).items())})


def render(r: dict[str, Any]) -> list[str]:
    from report import _machine, _table

    lines = ["## encoderkit's native training kernels (`bench/training_kernels.py`)", "", _machine(r), "",
             f"Forward and backward, {r['threads']} threads, dropout {r['dropout']}, medians of {r['rounds']} "
             "interleaved rounds. \"torch ops\": the same steps as PyTorch operations with encoderkit's own native "
             "dropout, what ran before the kernels. The step: encoderkit's fine-tuning step "
             "(bench/finetune_profile.py's, all-MiniLM-L6-v2, the same grouped batches) with the kernels and with "
             "them turned off, alternating batch by batch; ms a step: medians of the rounds' means.", ""]
    rows = [[row["kernel"], row["shape"], f"{row['seconds']['kernel'] * 1e3:.2f}",
             f"{row['seconds']['torch ops'] * 1e3:.2f}",
             f"**{row['seconds']['torch ops'] / row['seconds']['kernel']:.2f}x**"] for row in r["ops"]]
    lines += _table(["kernel", "shape", "kernel, ms", "torch ops, ms", "speed-up"], rows) + [""]
    rows = [[row["task"], f"{row['tokens_per_batch']:.0f}", f"{row['seconds']['with the kernels'] * 1e3:.1f}",
             f"{row['seconds']['without'] * 1e3:.1f}",
             f"**{row['speedup']:.2f}x**"] for row in r["steps"]]
    lines += _table(["task", "tokens a batch", "step with the kernels, ms", "without, ms",
                     "speed-up (median of the rounds' ratios)"], rows) + [""]
    if r.get("updates"):
        lines += ["The optimizer's part of the step (the gradient norm with the clipping scale, then AdamW) with the "
                  "word table's rows apart (the norm and the native AdamW read the rows a step can change) and "
                  "without (the norm of every gradient, torch's fused AdamW over every parameter): two copies of the "
                  "model in one state, the table's m and v non-zero on the rows the epoch's first batches looked up, "
                  "up to the epoch's mean share of rows ever looked up; one batch's rows as the gradient.", ""]
        rows = [[row["task"], f"{100 * row['active_share']:.0f}%", str(row["touched_rows"]),
                 f"{row['seconds']['with rows'] * 1e3:.1f}", f"{row['seconds']['without'] * 1e3:.1f}",
                 f"**{row['seconds']['without'] / row['seconds']['with rows']:.2f}x**"] for row in r["updates"]]
        lines += _table(["task", "rows active", "rows looked up", "with rows, ms", "without, ms", "speed-up"],
                        rows) + [""]
    if r.get("products"):
        lines += ["The linear layers' products (torch's fp32, the same run): GFLOP/s at the MLP's shapes against a "
                  "square product.", ""]
        lines += _table(["shape", "product", "GFLOP/s"], [[row["shape"], row["product"], f"{row['gflops']:.1f}"]
                                                          for row in r["products"]]) + [""]
    return lines


if __name__ == "__main__":
    main()
