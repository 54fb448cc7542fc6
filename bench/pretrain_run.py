"""A pre-training run under a wall-clock budget, scored against the unigram-frequency baseline.

Trains the benchmark model shape (4 layers, hidden 256, MiniLM vocabulary, 128 tokens, batch 32) on
../shared/data/mlm_corpus/train.txt for ``--minutes`` of training time, then measures masked-token
top-1 accuracy on valid.txt (fixed masks) next to the accuracy of always predicting the most frequent
training token.

    python bench/pretrain_run.py [--minutes 20] [--bf16]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

import smoke_training
from common import RESULTS, SHARED, require, smoke_size, write_result

# A smoke run: 3 steps of batch 4 at 32 tokens on a few hundred lines of the corpus.
SEQ, BATCH = smoke_size(128, 32), smoke_size(32, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(2)

    from encoderkit import Tokenizer, default_model_path
    from encoderkit.data.corpus import pack_sequences, tokenize_corpus
    from encoderkit.data.masking import IGNORE_INDEX, Masker, MaskingConfig
    from encoderkit.training.pretrain import fixed_mask_batches, pretrain

    data = require(SHARED / "data" / "mlm_corpus")
    out = Path(args.out or tempfile.mkdtemp(prefix="pretrain-run-"))
    train_text = smoke_training.head(data / "train.txt", out / "smoke", 400)
    valid_text = smoke_training.head(data / "valid.txt", out / "smoke", 100)
    shape = {"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 1024}
    steps_estimate = int(args.minutes * 60 * (6000 if args.bf16 else 4000) / (32 * 128))  # sets the LR schedule
    result = pretrain(train_text, out, config=shape, valid=valid_text, max_length=SEQ,
                      max_steps=smoke_size(steps_estimate, 3), batch_size=BATCH, learning_rate=5e-4, warmup_ratio=0.05,
                      bf16=args.bf16, save_every=500, eval_every=500, time_budget_s=args.minutes * 60)
    final = result["final"]

    # The unigram baseline on the same fixed validation masks the evaluator uses (the run's cached tokens).
    tokenizer = Tokenizer.from_pretrained(default_model_path())
    cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
    specials = [tokenizer.token_id(r) for r in ("cls", "sep", "pad", "mask", "unk")]
    train_ids = tokenize_corpus(train_text, tokenizer, cache_dir=out / "cache").ids
    counts = np.bincount(train_ids, minlength=tokenizer.vocab_size)
    counts[specials] = 0
    most_frequent = int(counts.argmax())
    valid = pack_sequences(tokenize_corpus(valid_text, tokenizer, cache_dir=out / "cache"), SEQ, cls_id, sep_id)
    masker = Masker(MaskingConfig(), vocab_size=tokenizer.vocab_size, mask_token_id=tokenizer.mask_token_id,
                    special_token_ids=specials)
    targets = torch.cat([b["labels"][b["labels"] != IGNORE_INDEX]
                         for b in fixed_mask_batches(masker, valid, tokenizer.pad_token_id)])
    baseline = float((targets == most_frequent).float().mean())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in records)
    print(f"{steps} steps in {args.minutes:g} minutes: masked-token accuracy {final['eval_accuracy']:.4f} "
          f"(unigram baseline {baseline:.4f}, always {tokenizer.convert_ids_to_tokens([most_frequent])[0]!r}), "
          f"validation MLM loss {final['eval_loss']:.3f}")
    if (out / "loss.png").exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        (out / "loss.png").replace(RESULTS / "pretrain_run_loss.png")
    write_result("pretrain_run", {
        "minutes": args.minutes, "bf16": args.bf16, "steps": steps, "valid_accuracy": final["eval_accuracy"],
        "valid_mlm_loss": final["eval_loss"], "unigram_baseline_accuracy": baseline,
        "unigram_token": tokenizer.convert_ids_to_tokens([most_frequent])[0], "plot": "bench/results/pretrain_run_loss.png",
        "tokens_per_second": [r["tokens_per_s"] for r in records if "tokens_per_s" in r][-1],
    })


if __name__ == "__main__":
    main()
