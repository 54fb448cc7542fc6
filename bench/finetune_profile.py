"""Where a fine-tuning step's time goes: encoderkit's training step against transformers' Trainer's (issue 22).

Both take the same batches: bench/finetune.py's features in encoderkit's length-grouped batches (the 31st and on of
the epoch: the first ones of a grouped order hold its longest examples), padded to their longest as both collators
pad. transformers' step is the Trainer's: the model's forward and backward, ``clip_grad_norm_`` (1.0), the optimizer
``Trainer.create_optimizer`` makes (fused AdamW, its decay groups), ``zero_grad``. encoderkit's is
``Trainer.train_step``'s: the word table's kept gradient attached (``EmbeddingRows``), forward, backward,
``clip_gradients`` (its scale folded into the fused AdamW's kernel), step, ``zero_grad``. Each phase is timed with
``perf_counter`` in interleaved rounds (medians of the rounds' per-step means); then as many profiled rounds each,
interleaved, whose operations' own times are sorted into kinds (medians of the rounds), an operation inside a
dropout, the optimizer, the gradient norm or the embedding's gradient counting for that kind; the own time of
encoderkit's training kernels (modeling.attention's ``_TrainingAttention``, modeling.dropout's ``_AddDropoutNorm``:
softmax, LayerNorm and the dropout they apply, in one native pass) counts as elementwise and normalisation. "Outside
any operation": the step's time the profiler saw in no PyTorch operation (Python, dispatch, the native library's
calls outside an autograd function: the gradient norm).

    python bench/finetune_profile.py [--tasks sst2,conll,squad] [--batches 20] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch

from common import smoke_size, write_result

PHASES = ("forward", "backward", "clip", "optimizer")
SKIPPED = smoke_size(30, 0)  # batches at the start of the epoch left out
KINDS = ("linear layers' products", "attention's products", "optimizer", "gradient norm and clipping",
         "embedding gradient", "dropout", "elementwise and normalisation", "copies and layout", "other operations",
         "outside any operation")
# An operation inside one of these counts for its kind, whatever it is itself (the zero fill of the embedding's
# gradient, the optimizer's step counter, ...).
CONTAINERS = {
    "aten::embedding_dense_backward": "embedding gradient", "aten::embedding_backward": "embedding gradient",
    "aten::_fused_adamw_": "optimizer", "aten::_fused_adam_": "optimizer", "aten::_foreach_add_": "optimizer",
    "aten::_foreach_norm": "gradient norm and clipping", "aten::_foreach_mul_": "gradient norm and clipping",
    "aten::linalg_vector_norm": "gradient norm and clipping",
    "encoderkit::adamw_rows": "optimizer", "encoderkit::gradient_norm": "gradient norm and clipping",
    "_Dropout": "dropout", "_DropoutBackward": "dropout", "_Masked": "dropout", "_MaskedBackward": "dropout",
    "aten::native_dropout": "dropout", "aten::bernoulli_": "dropout",
}
OWN = {
    "linear layers' products": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise", "aten::_addmm_activation"),
    "attention's products": ("aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "elementwise and normalisation": ("aten::gelu", "aten::gelu_backward", "aten::_softmax",
                                      "aten::_softmax_backward_data", "aten::native_layer_norm",
                                      "aten::native_layer_norm_backward", "aten::add", "aten::add_", "aten::mul",
                                      "aten::mul_", "aten::div", "aten::div_", "aten::sum", "aten::tanh",
                                      "aten::tanh_backward", "aten::where", "aten::masked_fill",
                                      "aten::masked_fill_", "aten::_log_softmax", "aten::_log_softmax_backward_data",
                                      "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::sub", "aten::neg",
                                      "aten::exp", "aten::eq", "aten::ne", "aten::lt", "aten::gt", "aten::ge",
                                      "aten::all", "aten::any", "aten::threshold_backward", "aten::relu",
                                      # encoderkit's training kernels: their own time is the native pass (attention's
                                      # softmax, padding mask and dropout; LayerNorm with its residual add and
                                      # dropout), the products and copies inside count as theirs
                                      "_TrainingAttention", "_TrainingAttentionBackward", "_AddDropoutNorm",
                                      "_AddDropoutNormBackward"),
    "copies and layout": ("aten::copy_", "aten::clone", "aten::cat", "aten::stack", "aten::_to_copy",
                          "aten::fill_", "aten::zero_", "aten::index_select", "aten::index_copy",
                          "aten::index_add_", "aten::index", "aten::gather", "aten::embedding",
                          "aten::index_put_", "aten::_index_put_impl_", "aten::empty", "aten::empty_strided"),
}
OWN_KIND = {name: kind for kind, names in OWN.items() for name in names}


def _kind(event) -> str:
    parent = event
    while parent is not None:
        kind = CONTAINERS.get(parent.name)
        if kind is not None:
            return kind
        parent = parent.cpu_parent
    return OWN_KIND.get(event.name, "other operations")


class Contender:
    """One side's step, phase by phase."""

    def __init__(self, name: str, forward: Callable[[dict], torch.Tensor], clip: Callable[[], None],
                 step: Callable[[], None], zero: Callable[[], None]) -> None:
        self.name, self._forward, self._clip, self._step, self._zero = name, forward, clip, step, zero
        self.seconds = {phase: [] for phase in PHASES}  # per round: mean seconds a step

    def run(self, batches: list[dict], record: bool = True) -> None:
        totals = dict.fromkeys(PHASES, 0.0)
        for batch in batches:
            started = time.perf_counter()
            loss = self._forward(batch)
            forward = time.perf_counter()
            loss.backward()
            backward = time.perf_counter()
            self._clip()
            clipped = time.perf_counter()
            self._step()
            self._zero()
            done = time.perf_counter()
            for phase, seconds in zip(PHASES, (forward - started, backward - forward, clipped - backward,
                                               done - clipped)):
                totals[phase] += seconds
        if record:
            for phase in PHASES:
                self.seconds[phase].append(totals[phase] / len(batches))

    def profile(self, batches: list[dict]) -> dict[str, float]:
        from torch.profiler import ProfilerActivity, profile

        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            self.run(batches, record=False)
        wall = time.perf_counter() - started
        kinds: dict[str, float] = defaultdict(float)
        for event in prof.events():
            kinds[_kind(event)] += event.self_cpu_time_total / 1e6
        # Self times of the ops sum CPU time on the calling thread; the rest of the wall time was outside any op.
        kinds["outside any operation"] = max(0.0, wall - sum(kinds.values()))
        return {kind: kinds.get(kind, 0.0) / len(batches) for kind in KINDS}


def encoderkit_side(task: str, work: Path, batches_wanted: int) -> tuple[Contender, list[dict], Any]:
    """encoderkit's step on ``batches_wanted`` + 2 grouped batches of ``task`` (the first two for warming up), and
    the benchmark's setup (bench/finetune.py's ``prepare``)."""
    import finetune as bench

    from encoderkit.memory import keep_freed_memory
    from encoderkit.training.optim import clip_gradients, optimizer_step

    setup = bench.prepare(task, work / "ek", group_by_length=True)
    trainer = setup.trainer
    keep_freed_memory()  # as Trainer.begin does
    batches = [trainer._next_micro_batch() for _ in range(SKIPPED + batches_wanted + 2)][SKIPPED:]
    ours = trainer.model.train()
    optimizer = trainer.optimizer

    def forward(batch: dict) -> torch.Tensor:  # as Trainer.train_step: the word table's kept gradient first
        trainer.embedding_rows.attach()
        return trainer.ddp_model(**batch, **trainer.forward_kwargs).loss.float()

    rows: dict = {}

    def clip() -> None:  # as Trainer.train_step: the word table's rows read alone, by the norm and by AdamW
        rows.clear()
        rows.update(trainer.embedding_rows.rows())
        clip_gradients(ours.parameters(), 1.0, optimizer, rows)

    encoderkit = Contender("encoderkit", forward, clip, lambda: optimizer_step(optimizer, rows),
                           lambda: optimizer.zero_grad(set_to_none=True))
    return encoderkit, batches, setup


def contenders(task: str, work: Path, batches_wanted: int) -> tuple[list[Contender], list[dict], dict[str, Any]]:
    import finetune as bench

    encoderkit, batches, setup = encoderkit_side(task, work, batches_wanted)
    hf, _, _ = bench.hf_trainer(task, setup, "group_by_length", work / "hf")
    theirs = hf.model.train()
    hf.create_optimizer()
    their_optimizer = hf.optimizer
    transformers_side = Contender(
        "transformers Trainer", lambda b: theirs(**b).loss,
        lambda: torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0), their_optimizer.step,
        lambda: their_optimizer.zero_grad(set_to_none=True))
    info = {"batches": batches_wanted,
            "real_tokens_per_batch": statistics.mean(int(b["attention_mask"].sum()) for b in batches[2:]),
            "padded_tokens_per_batch": statistics.mean(b["input_ids"].numel() for b in batches[2:]),
            "optimizer": type(their_optimizer).__name__ + (" (fused)" if their_optimizer.defaults.get("fused") else "")}
    return [transformers_side, encoderkit], batches, info


def measure(task: str, batches_wanted: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="finetune-profile-") as scratch:
        sides, batches, info = contenders(task, Path(scratch), batches_wanted)
        warm, batches = batches[:2], batches[2:]
        for side in sides:
            side.run(warm, record=False)
        for _ in range(rounds):
            for side in sides:
                side.run(batches)
        profiled: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
        for _ in range(rounds):  # interleaved too: the host's drift hits both sides alike
            for side in sides:
                profiled[side.name].append(side.profile(batches))
        profiles = {name: {kind: statistics.median(p[kind] for p in runs) for kind in KINDS}
                    for name, runs in profiled.items()}
    rows = []
    for side in sides:
        phases = {phase: statistics.median(side.seconds[phase]) for phase in PHASES}
        rows.append({"contender": side.name, "phases": phases, "step": sum(phases.values()),
                     "rounds": {phase: side.seconds[phase] for phase in PHASES}, "kinds": profiles[side.name]})
    theirs, ours = rows
    print(f"{task}: {info['real_tokens_per_batch']:.0f} tokens a batch ({info['padded_tokens_per_batch']:.0f} padded); "
          f"step {theirs['step'] * 1e3:.1f} ms (Trainer) against {ours['step'] * 1e3:.1f} (encoderkit): "
          f"{theirs['step'] / ours['step']:.2f}x", flush=True)
    for row in rows:
        print(f"  {row['contender']:22s} " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in row["kinds"].items()))
    return {"task": task, **info, "rounds": rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sst2,conll,squad")
    parser.add_argument("--batches", type=int, default=smoke_size(20, 2))
    parser.add_argument("--rounds", type=int, default=smoke_size(5, 1))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.ERROR)
    tasks = [measure(task, args.batches, args.rounds) for task in args.tasks.split(",")]
    write_result("finetune_profile", {"tasks": tasks, "threads": args.threads,
                                      "command": "python bench/finetune_profile.py " + " ".join(
                                          f"--{k} {v}" for k, v in vars(args).items() if k != "threads")})


def render(r: dict[str, Any]) -> list[str]:
    from report import _machine, _table

    lines = ["## Where a fine-tuning step's time goes (`bench/finetune_profile.py`)", "", _machine(r), "",
             "The same batches through the step of transformers' Trainer (forward, backward, `clip_grad_norm_`, its "
             "fused AdamW, `zero_grad`) and `encoderkit.training.Trainer.train_step`'s, all-MiniLM-L6-v2, fp32, "
             f"{r['threads']} threads. Phases: medians over interleaved rounds, ms a step. Kinds: as many profiled "
             "rounds each, interleaved, medians of the operations' own times sorted by kind (an operation inside the "
             "optimizer, the gradient norm, dropout or the embedding's gradient counts there; the own time of "
             "encoderkit's training kernels, softmax or LayerNorm with the dropout they apply in one native pass, "
             "counts as elementwise and normalisation); \"outside any "
             "operation\" is the rest of the wall time (Python, dispatch, native calls outside autograd: encoderkit's "
             "gradient norm). The profiler's own cost inflates the kinds of the side with more operations. The last "
             "column: the Trainer's step over encoderkit's linear products alone, the speed-up if encoderkit did "
             "nothing else.", ""]
    rows = []
    for task in r["tasks"]:
        theirs, ours = task["rows"]
        for row in task["rows"]:
            kinds = row["kinds"]
            rows.append([task["task"], f"{task['real_tokens_per_batch']:.0f} ({task['padded_tokens_per_batch']:.0f})",
                         row["contender"], f"**{row['step'] * 1e3:.1f}**",
                         " / ".join(f"{row['phases'][p] * 1e3:.1f}" for p in PHASES),
                         f"**{theirs['step'] / row['step']:.2f}x**"]
                        + [f"{kinds[k] * 1e3:.1f}" for k in KINDS]
                        + [f"{theirs['step'] / kinds[KINDS[0]]:.2f}x" if row is ours else ""])
    return lines + _table(["task", "tokens a batch (padded)", "contender", "ms a step", "forward / backward / clip / "
                           "optimizer + zero_grad", "Trainer's step / this one's"] + list(KINDS)
                          + ["Trainer's step / encoderkit's linear products"], rows) + [""]


if __name__ == "__main__":
    main()
