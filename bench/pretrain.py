"""Pre-training speed and quality per wall-clock: encoderkit vs a transformers loop, interleaved.

A 4-layer, hidden-256 BERT with the MiniLM vocabulary, sequences of 128 tokens (full-sentence
packing of ../shared/data/mlm_corpus/train.txt), batch 32, AdamW lr 5e-4 (100 warm-up steps, then
constant), weight decay 0.01 (not on biases/LayerNorm), clipping 1.0, one seed, identical initial
weights. Contenders:

- transformers: BertForMaskedLM + DataCollatorForLanguageModeling + AdamW, fp32;
- encoderkit fp32: the Trainer (sparse MLM head: the vocabulary projection only at masked tokens);
- encoderkit bf16: the same with bf16 autocast.

They run in turns of ``--chunk`` steps until each has used ``--budget-minutes`` of its own time, so
machine-speed drift hits all alike. Then each is scored on the same 512 validation sequences with
fixed masks: MLM loss and masked-token top-1 accuracy.

    python bench/pretrain.py [--budget-minutes 7] [--chunk 10]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import smoke_training
from common import RESULTS, SHARED, SMOKE, require, save_loss_plot, smoke_size, write_result

# A smoke run: sequences of 32 tokens, batch 4, a few hundred corpus lines, one turn of 2 steps each.
SEQ, BATCH, LR, WARMUP = smoke_size(128, 32), smoke_size(32, 4), 5e-4, 100
VALID_SEQUENCES = smoke_size(512, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-minutes", type=float, default=7.0)
    parser.add_argument("--chunk", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)

    work = Path(tempfile.mkdtemp(prefix="bench-pretrain-"))
    data = read_data(work)
    steps, models = contenders(data, work)
    # A smoke run's budget ends after each contender's first turn.
    budget = 1e-9 if SMOKE else args.budget_minutes * 60
    used, count, curves = race(steps, budget, smoke_size(args.chunk, 2))
    scores = {"transformers fp32": evaluate(models["transformers fp32"], data["valid_batches"], sparse=False)}
    for name in steps:
        if name != "transformers fp32":
            scores[name] = evaluate(models[name], data["valid_batches"], sparse=True)
    tokens_per_step = BATCH * SEQ
    rows = []
    for name in steps:
        rows.append({"contender": name, "steps": count[name], "seconds": used[name],
                     "tokens_per_second": count[name] * tokens_per_step / used[name],
                     "speedup_vs_transformers": (count[name] / used[name]) / (count["transformers fp32"]
                                                                           / used["transformers fp32"]),
                     **scores[name], "curve": curves[name]})
        print(f"{name:20s} {rows[-1]['tokens_per_second']:8.0f} tokens/s  x{rows[-1]['speedup_vs_transformers']:.2f}  "
              f"valid loss {scores[name]['valid_mlm_loss']:.4f}  accuracy {scores[name]['valid_accuracy']:.4f}")
    plot = _plot(rows, RESULTS / "pretrain_loss.png")
    write_result("pretrain", {"budget_minutes": args.budget_minutes, "sequence_length": SEQ, "batch_size": BATCH,
                              "training_sequences": len(data["train"]), "validation_sequences": len(data["valid"]),
                              "plot": str(plot.relative_to(RESULTS.parent.parent)), "rows": rows})


def read_data(work: Path) -> dict:
    """Full training sequences of ``SEQ`` tokens from mlm_corpus/train.txt, the first ``VALID_SEQUENCES`` of
    valid.txt, the dynamic training masker and the validation batches with fixed masks."""
    from encoderkit import Tokenizer, default_model_path
    from encoderkit.data.corpus import pack_sequences, tokenize_corpus
    from encoderkit.data.masking import Masker, MaskingConfig

    model_dir = default_model_path()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
    data = require(SHARED / "data" / "mlm_corpus")
    corpus = smoke_training.head(data / "train.txt", work, 400)
    train = pack_sequences(tokenize_corpus(corpus, tokenizer), SEQ, cls_id, sep_id)
    train = [e for e in train if len(e["input_ids"]) == SEQ]
    valid = [e for e in pack_sequences(tokenize_corpus(data / "valid.txt", tokenizer), SEQ, cls_id, sep_id)
             if len(e["input_ids"]) == SEQ][:VALID_SEQUENCES]
    specials = [tokenizer.token_id(r) for r in ("cls", "sep", "pad", "mask", "unk")]
    masker = Masker(MaskingConfig(), vocab_size=tokenizer.vocab_size, mask_token_id=tokenizer.mask_token_id,
                    special_token_ids=specials, seed=0)
    fixed = Masker(MaskingConfig(dynamic=False), vocab_size=tokenizer.vocab_size,
                   mask_token_id=tokenizer.mask_token_id, special_token_ids=specials, seed=99)
    valid_batches = [fixed.collate(valid[i:i + 64]) for i in range(0, len(valid), 64)]
    print(f"{len(train):,} training sequences of {SEQ} tokens; {len(valid)} validation sequences")
    return {"model_dir": model_dir, "tokenizer": tokenizer, "train": train, "valid": valid, "masker": masker,
            "valid_batches": valid_batches}


def contenders(data: dict, work: Path) -> tuple[dict, dict]:
    """The three contenders from the same initial weights: their step functions and their models."""
    import transformers

    from encoderkit import load_model
    from encoderkit.training import Trainer, TrainingConfig
    from encoderkit.training.optim import parameter_groups

    train, masker, tokenizer = data["train"], data["masker"], data["tokenizer"]
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=256, num_hidden_layers=4,
                                     num_attention_heads=4, intermediate_size=1024, max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config).save_pretrained(work / "init")

    def constant_after_warmup(step: int) -> float:
        return min(1.0, (step + 1) / WARMUP)

    # transformers' loop
    hf_model = transformers.BertForMaskedLM.from_pretrained(work / "init", attn_implementation="sdpa").train()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(data["model_dir"]))
    collator = transformers.DataCollatorForLanguageModeling(tokenizer=hf_tokenizer, mlm_probability=0.15)
    hf_optimizer = torch.optim.AdamW(parameter_groups(hf_model, 0.01), lr=LR, eps=1e-6)
    hf_schedule = torch.optim.lr_scheduler.LambdaLR(hf_optimizer, constant_after_warmup)
    hf_order = np.random.default_rng([0, 0]).permutation(len(train))
    hf_state = {"position": 0}

    def hf_step() -> float:
        start = hf_state["position"] * BATCH % (len(train) - BATCH)
        hf_state["position"] += 1
        batch = collator([{"input_ids": train[i]["input_ids"].tolist()} for i in hf_order[start:start + BATCH]])
        loss = hf_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf_model.parameters(), 1.0)
        hf_optimizer.step()
        hf_schedule.step()
        hf_optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def encoderkit_trainer(name: str, bf16: bool) -> Trainer:
        model = load_model(work / "init", task="masked-lm")
        settings = TrainingConfig(output_dir=str(work / name), max_steps=10**6, batch_size=BATCH, learning_rate=LR,
                                  warmup_steps=WARMUP, schedule="constant", bf16=bf16, show_progress=False)
        trainer = Trainer(model, settings, train, lambda b, e: masker.collate(b, e), forward_kwargs={"sparse": True})
        model.train()
        return trainer

    ours = {"encoderkit fp32": encoderkit_trainer("fp32", False), "encoderkit bf16": encoderkit_trainer("bf16", True)}
    steps, models = {"transformers fp32": hf_step}, {"transformers fp32": hf_model}
    for name, trainer in ours.items():
        steps[name] = lambda trainer=trainer: trainer.train_step()["loss"]
        models[name] = trainer.model
    return steps, models


def race(steps: dict, budget: float, chunk: int) -> tuple[dict, dict, dict]:
    """Turns of ``chunk`` steps until each contender has used ``budget`` seconds of its own time: (seconds used,
    steps taken, curve of (steps, seconds, mean loss of the turn)) per contender."""
    used = {name: 0.0 for name in steps}
    curves: dict[str, list[tuple[int, float, float]]] = {name: [] for name in steps}
    count = {name: 0 for name in steps}
    last_report = time.perf_counter()
    while any(used[n] < budget for n in steps):
        for name, step in steps.items():
            if used[name] >= budget:
                continue
            start = time.perf_counter()
            chunk_losses = [step() for _ in range(chunk)]
            used[name] += time.perf_counter() - start
            count[name] += chunk
            curves[name].append((count[name], used[name], float(np.mean(chunk_losses))))
        if time.perf_counter() - last_report > 60:
            last_report = time.perf_counter()
            print(" | ".join(f"{n}: {count[n]} steps, {used[n] / 60:.1f} min, loss {curves[n][-1][2]:.3f}"
                             for n in steps), flush=True)
    return used, count, curves


def evaluate(model, valid_batches: list, sparse: bool) -> dict[str, float]:
    """MLM loss and masked-token top-1 accuracy on the fixed-mask validation batches."""
    from encoderkit.data.masking import IGNORE_INDEX

    model.eval()
    loss_sum, correct, total = 0.0, 0, 0
    with torch.no_grad():
        for batch in valid_batches:
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
            labels = batch["labels"]
            targets = labels[labels != IGNORE_INDEX]
            if sparse:
                logits = model(**inputs, labels=labels, sparse=True).logits.float()
            else:
                logits = model(**inputs).logits[labels != IGNORE_INDEX].float()
            loss_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            total += int(targets.numel())
    return {"valid_mlm_loss": loss_sum / total, "valid_accuracy": correct / total}


def _plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    for row in rows:
        curve = np.array(row["curve"])
        axis.plot(curve[:, 1] / 60, curve[:, 2], label=row["contender"], linewidth=1)
    axis.set_xlabel("own wall-clock time (minutes)")
    axis.set_ylabel("training MLM loss (mean of 10 steps)")
    return save_loss_plot(figure, axis, path)


if __name__ == "__main__":
    main()
