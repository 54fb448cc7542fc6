"""`train-embedder`: fine-tune an encoder into a sentence embedder (sentence-transformers' directory format)."""
from __future__ import annotations

import click

from ..errors import InputError
from .options import max_length_option, model_option, out_option, restart_option, seed_option

LOSS_HELP = ("dense: mnrl (default) | cached-mnrl | cosent | cosine | softmax | triplet; "
             "sparse: splade (default); multi-vector: maxsim (default)")


def parse_dims(text: str | None) -> list[int] | None:
    """'384,256,128,64' -> [384, 256, 128, 64]."""
    if not text:
        return None
    try:
        dims = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--matryoshka takes comma-separated positive integers, found {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise InputError(f"--matryoshka takes comma-separated positive integers, found {text!r}")
    return dims


@click.command("train-embedder")
@model_option("the model to fine-tune: a directory or name (default: the default model)")
@click.option("--train", "train_file", required=True, help="TSV/CSV/JSONL: anchor,positive[,negative...] | "
              "sentence1,sentence2,score | premise,hypothesis,label")
@click.option("--kind", type=click.Choice(["dense", "sparse", "multi-vector"]), default="dense", show_default=True,
              help="dense: one vector (pooled); sparse: SPLADE term weights from the MLM head (the model needs one); "
                   "multi-vector: ColBERT token vectors scored by MaxSim (PyLate's format)")
@click.option("--dimension", type=int, default=128, show_default=True,
              help="multi-vector: the width of the token vectors (a new projection when the model has none)")
@click.option("--loss", default=None, help=LOSS_HELP)
@click.option("--query-regularizer-weight", type=float, default=5e-5, show_default=True,
              help="splade: weight of the queries' FLOPS regulariser (higher: sparser query vectors)")
@click.option("--document-regularizer-weight", type=float, default=3e-5, show_default=True,
              help="splade: weight of the documents' FLOPS regulariser")
@click.option("--start-active-terms", type=int, default=None,
              help="splade: shift the MLM head's bias once, before training, so that the training documents start "
                   "with this many non-zero terms on average (for a head trained with `pretrain --train head`; "
                   "README: Retrieval beyond one dense vector)")
@click.option("--query-prompt", default=None, help='text put before every anchor while training (e.g. "query: "), '
              'saved as the model\'s "query" prompt')
@click.option("--document-prompt", default=None, help="text put before the other columns while training, saved as "
              'the model\'s "document" prompt')
@click.option("--matryoshka", default=None, help="Matryoshka dimensions, e.g. 384,256,128,64")
@click.option("--valid", default=None, help="validation file: scored pairs (Spearman), anchor/positive pairs "
              "(nDCG@10 over the positives) or triplets (accuracy); the best checkpoint is kept in best/")
@click.option("--epochs", type=float, default=1, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--mini-batch-size", type=int, default=32, show_default=True, help="cached-mnrl: texts per pass")
@click.option("--lr", type=float, default=2e-5, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.1, show_default=True)
@click.option("--eval-every", type=int, default=0, show_default=True, help="steps (0: at the end only)")
@click.option("--save-every", type=int, default=0, show_default=True, help="steps (0: at the end only)")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: the GPU (under torchrun, each process its LOCAL_RANK's GPU, over NCCL)")
@out_option("output directory (checkpoints, metrics.jsonl, loss.png, best/, final/)")
@seed_option(42)
@max_length_option()
@restart_option("ignore the checkpoints of an interrupted run in --out")
def train_embedder_cmd(model: str | None, train_file: str, kind: str, dimension: int, loss: str | None,
                       query_regularizer_weight: float, document_regularizer_weight: float,
                       start_active_terms: int | None, query_prompt: str | None, document_prompt: str | None,
                       matryoshka: str | None, valid: str | None,
                       epochs: float, batch_size: int, mini_batch_size: int, lr: float, warmup_ratio: float,
                       eval_every: int, save_every: int, device: str, out_dir: str, seed: int,
                       max_length: int | None, restart: bool) -> None:
    """Fine-tune a model into a sentence embedder with an SBERT loss (--kind sparse: a SPLADE encoder; --kind
    multi-vector: a ColBERT model)."""
    import sys

    from ..training.sentence import KIND_LOSSES, EmbedderRecipe, train_embedder

    recipe = EmbedderRecipe(loss=loss or KIND_LOSSES[kind][0], kind=kind, multi_vector_dimension=dimension,
                            query_regularizer_weight=query_regularizer_weight,
                            document_regularizer_weight=document_regularizer_weight,
                            start_active_terms=start_active_terms, query_prompt=query_prompt,
                            document_prompt=document_prompt, epochs=epochs, batch_size=batch_size, learning_rate=lr,
                            warmup_ratio=warmup_ratio,
                            matryoshka_dims=parse_dims(matryoshka), valid=valid, seed=seed, max_length=max_length,
                            mini_batch_size=mini_batch_size, eval_every=eval_every, save_every=save_every,
                            device=device, show_progress=sys.stderr.isatty())
    result = train_embedder(model, train_file, out_dir, recipe, resume=not restart)
    if result.metric and result.best_metric is not None:
        click.echo(f"best {result.metric}: {result.best_metric:.4f} at step {result.best_step}")
    click.echo(f"final model: {result.final_dir}")
