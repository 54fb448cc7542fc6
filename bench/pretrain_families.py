"""Pre-training comparison per wall-clock: modernbert-tiny vs a BERT of equal parameter count (issue 19).

Corpus: ../shared/data/wikitext2_raw/wiki.test.raw, the WikiText-2 (raw) *test* split, one row per line. Its
last ``--valid-fraction`` of lines (default 10%) is the validation text, the rest the training text, so the
validation loss is not a held-out WikiText-2 number (see SOURCE.md beside the file). The two parts are written
to a temporary folder outside the repository for the tokenizer.

Both models: the default model's WordPiece tokenizer (the vocabulary sets both embedding tables), sequences of
128 tokens (full-sentence packing, full sequences only), batch 32, AdamW lr 5e-4 (100 warm-up steps, then
constant), weight decay 0.01 (not on biases/norms), clipping 1.0, the same data order, bf16 autocast where the
CPU has native bf16 (``--dtype``). Contenders:

- modernbert-tiny: ``encoderkit.preset("modernbert-tiny")`` (6 layers, hidden 256, 4 heads, GeGLU MLP 384,
  128-token local window, global attention every third layer), trained at its family's masking rate, 30%;
- BERT: hidden 256, 4 heads, ``--bert-layers`` x ``--bert-intermediate`` (default 4 x 1024, BERT-Mini's shape),
  within 2% of modernbert-tiny's parameters, trained at BERT's 15%.

They run in turns of ``--chunk`` steps until each has used ``--budget-minutes`` of its own time, so machine
drift hits both alike. Every ``--eval-every`` seconds of own training time (evaluation not counted) and at the
end, both are scored on the same validation sequences with the same fixed masks, at 15% and at 30%.

    python bench/pretrain_families.py [--budget-minutes 8] [--chunk 10] [--eval-every 30]
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import smoke_training
from common import RESULTS, SHARED, SMOKE, require, save_loss_plot, smoke_size, write_result

# A smoke run: sequences of 32 tokens, batch 4, the first 300 lines of the corpus, one turn of 2 steps each.
SEQ, BATCH, LR, WARMUP, WEIGHT_DECAY = smoke_size(128, 32), smoke_size(32, 4), 5e-4, 100, 0.01
EVAL_RATES = (0.15, 0.30)
CORPUS = Path("data") / "wikitext2_raw" / "wiki.test.raw"


def split_corpus(path: Path, out: Path, valid_fraction: float) -> dict[str, Any]:
    """The non-empty lines of ``path``: the first part to out/train.txt, the last ``valid_fraction`` to
    out/valid.txt (written with LF line ends)."""
    from encoderkit.data.readers import read_lines

    lines = [line for line in read_lines(path) if line.strip()]
    cut = len(lines) - math.ceil(valid_fraction * len(lines))
    (out / "train.txt").write_text("\n".join(lines[:cut]) + "\n", encoding="utf-8")
    (out / "valid.txt").write_text("\n".join(lines[cut:]) + "\n", encoding="utf-8")
    return {"lines": len(lines), "train_lines": cut, "valid_lines": len(lines) - cut}


def bert_config(layers: int, intermediate: int) -> dict[str, Any]:
    return {"model_type": "bert", "hidden_size": 256, "num_hidden_layers": layers, "num_attention_heads": 4,
            "intermediate_size": intermediate, "max_position_embeddings": 512}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-minutes", type=float, default=8.0, help="own training time of each model")
    parser.add_argument("--chunk", type=int, default=10, help="steps per turn")
    parser.add_argument("--eval-every", type=float, default=30.0, help="seconds of own training time")
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--bert-layers", type=int, default=4)
    parser.add_argument("--bert-intermediate", type=int, default=1024)
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto")
    args = parser.parse_args()
    torch.set_num_threads(2)

    from encoderkit.precision import resolve_dtype
    from encoderkit.training.pretrain import mlm_evaluator

    bf16 = resolve_dtype(args.dtype) == torch.bfloat16
    work = Path(tempfile.mkdtemp(prefix="bench-pretrain-families-"))
    corpus = smoke_training.head(require(SHARED / CORPUS), work / "smoke", 300)
    split = split_corpus(corpus, work, args.valid_fraction)
    setups = prepare_setups(work, args.bert_layers, args.bert_intermediate)
    first = next(iter(setups.values()))
    train_count, valid_count = len(first.train_examples), len(first.valid_examples)
    print(f"{split['train_lines']:,} training lines -> {train_count:,} sequences of {SEQ}; "
          f"{split['valid_lines']:,} validation lines -> {valid_count} sequences")

    # The same fixed validation masks for both, at each rate (the tokenizer and vocabulary are shared).
    evaluators = {rate: mlm_evaluator(dataclasses.replace(first, masker=_with_rate(first.masker, rate)))
                  for rate in EVAL_RATES}
    trainers, parameters, gap = make_trainers(setups, work, bf16)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        model.eval()
        try:
            with torch.no_grad():  # fp32, whatever the training dtype
                return {f"{key}_{round(100 * rate)}": value for rate, fn in evaluators.items()
                        for key, value in fn(model).items()}
        finally:
            model.train()

    # A smoke run's budget ends after each model's first turn.
    budget = 1e-9 if SMOKE else args.budget_minutes * 60
    started = time.perf_counter()
    race = take_turns(trainers, evaluate, budget, smoke_size(args.chunk, 2), args.eval_every)
    wall = time.perf_counter() - started
    rows = [summary_row(name, setup, parameters[name], race, train_count) for name, setup in setups.items()]
    plot = _plot(rows, RESULTS / "pretrain_families_loss.png")
    command = "python bench/pretrain_families.py" + "".join(
        f" --{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f" --{k.replace('_', '-')} {v}"
        for k, v in vars(args).items() if v != parser.get_default(k))
    write_result("pretrain_families", {
        "command": command, "budget_minutes": args.budget_minutes, "chunk": args.chunk, "eval_every_s": args.eval_every,
        "wall_seconds": wall, "corpus": str(CORPUS), **split, "valid_fraction": args.valid_fraction,
        "training_sequences": train_count, "validation_sequences": valid_count, "sequence_length": SEQ,
        "batch_size": BATCH, "learning_rate": LR, "warmup_steps": WARMUP, "weight_decay": WEIGHT_DECAY,
        "dtype": "bf16 autocast" if bf16 else "fp32", "eval_rates": list(EVAL_RATES),
        "vocab_size": first.tokenizer.vocab_size, "parameter_gap": gap,
        "plot": str(plot.relative_to(RESULTS.parent.parent)), "rows": rows})


def prepare_setups(work: Path, bert_layers: int, bert_intermediate: int) -> dict[str, Any]:
    """Each contender's model, tokenizer, masker and full-length sequences of work/train.txt and work/valid.txt;
    both must see the same validation text."""
    from encoderkit.training.pretrain import prepare

    contenders = {"modernbert-tiny": "modernbert-tiny", "BERT (equal parameters)":
                      bert_config(bert_layers, bert_intermediate)}
    setups = {name: prepare(work / "train.txt", objective="mlm", config=config, valid=work / "valid.txt",
                            max_length=SEQ, seed=0, cache_dir=work / "cache")
              for name, config in contenders.items()}
    for setup in setups.values():
        setup.train_examples = [e for e in setup.train_examples if len(e["input_ids"]) == SEQ]
        setup.valid_examples = [e for e in setup.valid_examples if len(e["input_ids"]) == SEQ]
    first, *others = setups.values()
    assert all([e["input_ids"].tolist() for e in s.valid_examples] == [e["input_ids"].tolist()
               for e in first.valid_examples] for s in others), "the contenders must see the same validation text"
    return setups


def make_trainers(setups: dict[str, Any], work: Path, bf16: bool) -> tuple[dict[str, Any], dict[str, Any], float]:
    """A Trainer per contender (begun), their parameter counts, and the gap between them (at most 2%)."""
    from encoderkit.training import Trainer, TrainingConfig
    from encoderkit.zoo import count_parameters

    parameters, trainers = {}, {}
    for name, setup in setups.items():
        config = setup.model.config
        # distinct parameters (tied weights once): the encoder alone, and the trained model with its MLM head
        parameters[name] = {"base": count_parameters(config, "base"), "masked_lm": setup.model.num_parameters(),
                            "embedding": config.vocab_size * config.embedding_dim}
        settings = TrainingConfig(output_dir=str(work / f"run-{len(trainers)}"), max_steps=10**6, batch_size=BATCH,
                                  learning_rate=LR, weight_decay=WEIGHT_DECAY, warmup_steps=WARMUP,
                                  schedule="constant", max_grad_norm=1.0, bf16=bf16, show_progress=False,
                                  save_final=False, seed=0)
        pad = setup.tokenizer.pad_token_id
        trainers[name] = Trainer(setup.model, settings, setup.train_examples,
                                 lambda b, e, masker=setup.masker, pad=pad: masker.collate(b, e, pad_token_id=pad),
                                 forward_kwargs={"sparse": True}, tokenizer=setup.tokenizer)
        trainers[name].begin(resume=False)
    counts = [p["masked_lm"] for p in parameters.values()]
    gap = max(counts) / min(counts) - 1
    print(" | ".join(f"{n}: {p['masked_lm']:,} parameters with the MLM head" for n, p in parameters.items())
          + f" (gap {100 * gap:.2f}%)")
    if gap > 0.02:
        sys.exit("the BERT shape is not within 2% of modernbert-tiny's parameters: change --bert-layers/--bert-intermediate")
    return trainers, parameters, gap


def take_turns(trainers: dict[str, Any], evaluate, budget: float, chunk: int, eval_every: float) -> dict[str, dict]:
    """Turns of ``chunk`` steps until each model has used ``budget`` seconds of its own training time, evaluated
    at the start, every ``eval_every`` seconds of its own time and at the end. Per model: seconds used, steps,
    tokens, the training curve and the evaluations."""
    used = {name: 0.0 for name in trainers}
    steps = {name: 0 for name in trainers}
    tokens = {name: 0 for name in trainers}
    curves: dict[str, list[tuple[int, float, float]]] = {name: [] for name in trainers}
    evals: dict[str, list[dict[str, float]]] = {name: [{"step": 0, "seconds": 0.0, **evaluate(t.model)}]
                                                for name, t in trainers.items()}
    last_report = time.perf_counter()
    while any(used[n] < budget for n in trainers):
        for name, trainer in trainers.items():
            if used[name] >= budget:
                continue
            start = time.perf_counter()
            records = [trainer.train_step() for _ in range(chunk)]
            used[name] += time.perf_counter() - start
            steps[name] += chunk
            tokens[name] += sum(r["tokens"] for r in records)
            curves[name].append((steps[name], used[name], float(np.mean([r["loss"] for r in records]))))
            if used[name] >= budget or used[name] - evals[name][-1]["seconds"] >= eval_every:
                evals[name].append({"step": steps[name], "seconds": used[name], **evaluate(trainer.model)})
        if time.perf_counter() - last_report > 60:
            last_report = time.perf_counter()
            print(" | ".join(f"{n}: {steps[n]} steps, {used[n] / 60:.1f} min, train loss {curves[n][-1][2]:.3f}, "
                             f"valid@15 {evals[n][-1]['loss_15']:.3f}" for n in trainers), flush=True)
    return {"used": used, "steps": steps, "tokens": tokens, "curves": curves, "evals": evals}


def summary_row(name: str, setup, parameters: dict[str, int], race: dict[str, dict], train_count: int) -> dict:
    """One contender's row of the result: its shape, its run and its final and best validation scores."""
    config, evals = setup.model.config, race["evals"][name]
    final, best = evals[-1], min(evals, key=lambda e: e["loss_15"])
    steps, used, tokens = race["steps"][name], race["used"][name], race["tokens"][name]
    print(f"{name:28s} {steps:5d} steps {tokens:>11,} tokens  valid@15 loss {final['loss_15']:.4f} "
          f"acc {final['accuracy_15']:.4f}  valid@30 loss {final['loss_30']:.4f} acc {final['accuracy_30']:.4f}")
    return {
        "contender": name, "model_type": config.model_type, "layers": config.num_hidden_layers,
        "hidden": config.hidden_size, "heads": config.num_attention_heads,
        "intermediate": config.intermediate_size, "shape": _shape(config), "parameters": parameters,
        "train_mask_rate": setup.masker.config.rate, "steps": steps, "seconds": used,
        "tokens_seen": tokens, "epochs": steps * BATCH / train_count, "tokens_per_second": tokens / used,
        **{f"valid_{k}": v for k, v in final.items() if k not in ("step", "seconds")},
        "best_valid_loss_15": best["loss_15"], "best_at_step": best["step"], "best_at_seconds": best["seconds"],
        "evaluations": evals, "train_curve": race["curves"][name]}


def _shape(config) -> str:
    text = f"{config.num_hidden_layers} layers x {config.hidden_size}, {config.num_attention_heads} heads"
    if config.model_type != "modernbert":
        return f"{text}, GELU FFN {config.intermediate_size}, absolute positions"
    full = [str(i) for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    return (f"{text}, GeGLU MLP {config.intermediate_size}, RoPE, {config.local_attention}-token local window "
            f"(global in layers {', '.join(full)})")


def _with_rate(masker, rate: float):
    """A copy of ``masker`` (same vocabulary and special tokens) that selects ``rate`` of the tokens."""
    copy = masker.fixed(masker.seed)
    copy.config = dataclasses.replace(copy.config, rate=rate)
    return copy


def _plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    for row, color in zip(rows, ("tab:blue", "tab:orange")):
        points = row["evaluations"]
        minutes = [p["seconds"] / 60 for p in points]
        axis.plot(minutes, [p["loss_15"] for p in points], color=color, marker=".",
                  label=f"{row['contender']} (trained at {100 * row['train_mask_rate']:.0f}%): 15% masks")
        axis.plot(minutes, [p["loss_30"] for p in points], color=color, linestyle="--", linewidth=1,
                  label="    the same, 30% masks")
    axis.set_xlabel("own training time (minutes)")
    axis.set_ylabel("validation MLM loss (fixed masks)")
    return save_loss_plot(figure, axis, path, legend_size=8)


if __name__ == "__main__":
    main()
