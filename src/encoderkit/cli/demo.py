"""`encoderkit demo`: the default model, embeddings and search, then a fine-tuned intent classifier."""
from __future__ import annotations

import click

from .options import model_option, out_option


@click.command()
@model_option()
@out_option("where the demo's fine-tuned classifier is written", required=False,
            default="demo-output/helpdesk-classifier", show_default=True)
@click.option("--no-finetune", is_flag=True, help="only the embedding and search part")
def demo(model: str | None, out_dir: str, no_finetune: bool) -> None:
    """The default model: what it is, embeddings and nearest neighbours, then a fine-tuned intent classifier."""
    from ..jobs import run_demo, run_finetune_demo

    run_demo(model, echo=click.echo)
    if not no_finetune:
        run_finetune_demo(model, out_dir, echo=click.echo)
