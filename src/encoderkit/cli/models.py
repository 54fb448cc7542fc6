"""Describing models: `info` (one model) and `models` (the zoo)."""
from __future__ import annotations

import json

import click

from .options import json_option


@click.command()
@click.argument("model", required=False)
@json_option("print JSON instead of a table")
def info(model: str | None, as_json: bool) -> None:
    """Describe a model: family, shape, parameters, head, pooling, tokenizer."""
    from ..jobs import model_info

    facts = model_info(model)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    print_table([(key, str(value)) for key, value in facts.items()], headers=("field", "value"))


@click.command()
@click.option("--recommend", is_flag=True, help="suggest a family for a task and a constraint")
@click.option("--task", type=click.Choice(["classification", "ner", "qa", "embedding", "pretraining"]),
              default="classification", show_default=True)
@click.option("--constraint", type=click.Choice(["latency", "memory", "quality", "budget"]), default="latency",
              show_default=True, help="what matters most (budget = pre-training compute)")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="the longest input, in tokens (implies --recommend); over 512 needs ModernBERT's 8,192-token "
                   "context")
@click.option("--multilingual", is_flag=True, help="text in several languages (implies --recommend): the XLM-R family")
def models(recommend: bool, task: str, constraint: str, max_tokens: int | None, multilingual: bool) -> None:
    """List the model zoo (published shapes, parameters computed from their configs)."""
    from ..zoo import count_parameters, recommend as pick, zoo

    if recommend or max_tokens is not None or multilingual:
        choice = pick(task, constraint, max_tokens=max_tokens, multilingual=multilingual)
        from ..config import preset

        params = count_parameters(preset(choice.preset))
        inputs = f" with inputs of up to {max_tokens:,} tokens" if max_tokens is not None else ""
        inputs += " in several languages" if multilingual else ""
        click.echo(f"recommended for {task} under a {constraint} constraint{inputs}: {choice.preset} "
                   f"({preset(choice.preset).model_type}, {params / 1e6:.1f}M parameters)")
        click.echo(f"why: {choice.reason}")
        return
    rows = []
    for entry in zoo():
        c = entry.config
        rows.append((entry.name, c.model_type, str(c.num_hidden_layers), str(c.hidden_size),
                     str(c.num_attention_heads), str(c.embedding_dim), str(c.vocab_size),
                     f"{entry.parameters / 1e6:.1f}M", f"{entry.backbone_parameters / 1e6:.1f}M"))
    # backbone: without the token embeddings, as DeBERTa-v3's model cards count ("22M backbone + 48M embedding")
    print_table(rows, headers=("preset", "family", "layers", "hidden", "heads", "embedding", "vocab", "params",
                               "backbone"))


def print_table(rows: list[tuple[str, ...]], headers: tuple[str, ...]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    click.echo("  ".join("-" * w for w in widths))
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
