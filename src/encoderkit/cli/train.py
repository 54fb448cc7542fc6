"""Training from scratch: `train-tokenizer` and `pretrain`."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from .options import (
    documents_option,
    TRAIN_DTYPES,
    dtype_option,
    max_length_option,
    out_option,
    restart_option,
    seed_option,
)


@click.command("train-tokenizer")
@click.argument("files", nargs=-1, required=True)
@out_option("directory to write the tokenizer to")
@click.option("--kind", type=click.Choice(["wordpiece", "bpe"]), default="wordpiece", show_default=True)
@click.option("--vocab-size", type=int, default=30522, show_default=True)
@click.option("--min-frequency", type=int, default=2, show_default=True)
@click.option("--lowercase/--cased", default=True, show_default=True, help="WordPiece only")
@max_length_option(512, help="model_max_length to record")
def train_tokenizer_cmd(files: tuple[str, ...], out_dir: str, kind: str, vocab_size: int, min_frequency: int,
                        lowercase: bool, max_length: int) -> None:
    """Train a WordPiece or byte-level BPE tokenizer on text files."""
    from ..tokenizer_training import train_tokenizer

    tokenizer = train_tokenizer(list(files), kind=kind, vocab_size=vocab_size, min_frequency=min_frequency,
                                lowercase=lowercase, model_max_length=max_length,
                                show_progress=sys.stderr.isatty())
    tokenizer.save(out_dir)
    click.echo(f"trained a {kind} tokenizer with {tokenizer.vocab_size:,} tokens -> {out_dir}")


@click.command()
@click.option("--corpus", required=True, help="training text (documents separated by blank lines)")
@out_option("output directory (checkpoints, metrics, loss.png, final/)")
@click.option("--objective", type=click.Choice(["mlm", "mlm-nsp", "mlm-sop", "electra", "distill"]), default="mlm",
              show_default=True,
              help="electra: generator + discriminator (loss MLM + 50 RTD); distill: --teacher needed")
@click.option("--teacher", default=None, help="distill: the teacher model directory (with an MLM head)")
@click.option("--generator-config", default=None, help="electra: generator shape (default: 1/4 of the discriminator)")
@click.option("--config", "model_config", default="minilm-l6-h384", show_default=True,
              help="a preset (see `encoderkit models`), a config.json, or a model directory to continue from")
@click.option("--tokenizer", default=None, help="tokenizer directory (default: the model's, or the default model's)")
@click.option("--valid", default=None, help="validation text for loss and masked-token accuracy")
@max_length_option(128)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--grad-accumulation", type=int, default=1, show_default=True)
@click.option("--steps", type=int, required=True, help="optimizer steps")
@click.option("--lr", type=float, default=5e-4, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.06, show_default=True)
@click.option("--schedule", type=click.Choice(["linear", "cosine", "constant"]), default="linear", show_default=True)
@click.option("--mask-rate", type=float, default=None,
              help="share of tokens masked; default: the family's (0.30 for ModernBERT, as in its paper; else 0.15)")
@click.option("--mask-fraction", type=float, default=None,
              help="of the selected tokens, the share replaced by the mask token (default 0.8, BERT's)")
@click.option("--random-fraction", type=float, default=None,
              help="of the selected tokens, the share replaced by a random token (default 0.1); the rest stay as "
                   "they are. --mask-fraction 0 --random-fraction 0: every selected token is read back unmasked, "
                   "what a SPLADE head does (README: Retrieval beyond one dense vector)")
@click.option("--train", "trained", type=click.Choice(["all", "head"]), default="all", show_default=True,
              help="head: train only the MLM head of the --config model directory, its encoder kept as it is "
                   "(give an embedder an MLM head for SPLADE)")
@click.option("--whole-word", is_flag=True, help="mask whole words")
@click.option("--static-masking", is_flag=True, help="BERT's fixed masks instead of new masks each epoch")
@documents_option()
@dtype_option("auto", help="bf16 = bf16 autocast; auto = bf16 where the CPU has native bf16 units (its loss curve "
                           "matches fp32's: BENCHMARKS.md), else fp32", choices=TRAIN_DTYPES)
@click.option("--save-every", type=int, default=500, show_default=True)
@click.option("--eval-every", type=int, default=500, show_default=True)
@seed_option(0)
@restart_option("ignore existing checkpoints in --out")
def pretrain(corpus, out_dir, objective, teacher, generator_config, model_config, tokenizer, valid, max_length,
             batch_size, grad_accumulation, steps, lr, warmup_ratio, schedule, mask_rate, mask_fraction,
             random_fraction, trained, whole_word, static_masking, documents, dtype, save_every, eval_every, seed,
             restart) -> None:
    """Pre-train or continue pre-training (MLM, MLM+NSP, MLM+SOP, ELECTRA, distillation); resumes automatically."""
    import torch

    from ..precision import resolve_dtype
    from ..training.pretrain import pretrain as run_pretrain

    bf16 = resolve_dtype(dtype) == torch.bfloat16
    masking = dict(rate=mask_rate, whole_word=whole_word, dynamic=not static_masking)
    masking.update({k: v for k, v in (("mask_fraction", mask_fraction), ("random_fraction", random_fraction))
                    if v is not None})

    result = run_pretrain(
        corpus, out_dir, objective=objective, config=model_config, tokenizer=tokenizer, valid=valid,
        max_length=max_length, masking=masking, train=trained,
        document_mode=documents, resume=not restart, teacher=teacher, generator_config=generator_config,
        max_steps=steps, batch_size=batch_size, grad_accumulation=grad_accumulation, learning_rate=lr,
        warmup_ratio=warmup_ratio, schedule=schedule, bf16=bf16, save_every=save_every, eval_every=eval_every,
        seed=seed)
    final = ", ".join(f"{k} {v:.4f}" for k, v in result["final"].items())
    only = " (the MLM head only)" if trained == "head" else ""
    click.echo(f"trained {result['step']} steps{only} on {result['examples']:,} sequences, "
               f"{result['masking']['rate']:.0%} of tokens masked; {final or 'no validation set'}")
    click.echo(f"final model: {Path(out_dir) / 'final'}")
