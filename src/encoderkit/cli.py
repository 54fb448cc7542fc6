"""The `encoderkit` command. Each sub-command is a thin shell over one job of the library.

Errors the user can fix are EncoderkitErrors: printed as one line, exit code 2.
"""
from __future__ import annotations

import json
import logging
import sys

import click

from .errors import EncoderkitError

MODEL_HELP = "model directory (HF format or sentence-transformers); default: all-MiniLM-L6-v2"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="more log output (-v info, -vv debug)")
@click.version_option(package_name="encoderkit")
def cli(verbose: int) -> None:
    """encoderkit: encoder-only transformers (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


# ---------------------------------------------------------------------------------------------
@cli.command()
@click.argument("model", required=False)
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
def info(model: str | None, as_json: bool) -> None:
    """Describe a model: family, shape, parameters, head, pooling, tokenizer."""
    from .jobs import model_info

    facts = model_info(model)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    _print_table([(key, str(value)) for key, value in facts.items()], headers=("field", "value"))


@cli.command()
@click.option("--recommend", is_flag=True, help="suggest a family for a task and a constraint")
@click.option("--task", type=click.Choice(["classification", "ner", "qa", "embedding", "pretraining"]),
              default="classification", show_default=True)
@click.option("--constraint", type=click.Choice(["latency", "memory", "quality", "budget"]), default="latency",
              show_default=True, help="what matters most (budget = pre-training compute)")
def models(recommend: bool, task: str, constraint: str) -> None:
    """List the model zoo (published shapes, parameters computed from their configs)."""
    from .zoo import count_parameters, recommend as pick, zoo

    if recommend:
        choice = pick(task, constraint)
        from .config import preset

        params = count_parameters(preset(choice.preset))
        click.echo(f"recommended for {task} under a {constraint} constraint: {choice.preset} "
                   f"({preset(choice.preset).model_type}, {params / 1e6:.1f}M parameters)")
        click.echo(f"why: {choice.reason}")
        return
    rows = []
    for entry in zoo():
        c = entry.config
        rows.append((entry.name, c.model_type, str(c.num_hidden_layers), str(c.hidden_size),
                     str(c.num_attention_heads), str(c.embedding_dim), str(c.vocab_size),
                     f"{entry.parameters / 1e6:.1f}M"))
    _print_table(rows, headers=("preset", "family", "layers", "hidden", "heads", "embedding", "vocab", "params"))


@cli.command("train-tokenizer")
@click.argument("files", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, help="directory to write the tokenizer to")
@click.option("--kind", type=click.Choice(["wordpiece", "bpe"]), default="wordpiece", show_default=True)
@click.option("--vocab-size", type=int, default=30522, show_default=True)
@click.option("--min-frequency", type=int, default=2, show_default=True)
@click.option("--lowercase/--cased", default=True, show_default=True, help="WordPiece only")
@click.option("--max-length", type=int, default=512, show_default=True, help="model_max_length to record")
def train_tokenizer_cmd(files: tuple[str, ...], out_dir: str, kind: str, vocab_size: int, min_frequency: int,
                        lowercase: bool, max_length: int) -> None:
    """Train a WordPiece or byte-level BPE tokenizer on text files."""
    from .tokenizer import train_tokenizer

    tokenizer = train_tokenizer(list(files), kind=kind, vocab_size=vocab_size, min_frequency=min_frequency,
                                lowercase=lowercase, model_max_length=max_length,
                                show_progress=sys.stderr.isatty())
    tokenizer.save(out_dir)
    click.echo(f"trained a {kind} tokenizer with {tokenizer.vocab_size:,} tokens -> {out_dir}")


@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--out", "out_path", required=True, help="output .npy file (float32, one row per input line)")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--max-length", type=int, default=None, help="truncate texts to this many tokens")
def embed(input_path: str, out_path: str, model: str | None, batch_size: int, max_length: int | None) -> None:
    """Embed a text file (one text per line) into a float32 .npy array, in input order."""
    from .tasks.embed import embed_file

    result = embed_file(input_path, out_path, model=model, batch_size=batch_size, max_length=max_length)
    click.echo(f"wrote {result.rows:,} x {result.dimension} float32 embeddings to {result.path}")


@cli.command()
@click.option("--model", default=None, help=MODEL_HELP)
def demo(model: str | None) -> None:
    """Load the default model, show what it is, embed a few sentences and find nearest neighbours."""
    from .jobs import run_demo

    run_demo(model, echo=click.echo)


# ---------------------------------------------------------------------------------------------
def _print_table(rows: list[tuple[str, ...]], headers: tuple[str, ...]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    click.echo("  ".join("-" * w for w in widths))
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command, turning encoderkit errors into one line and exit code 2."""
    try:
        result = cli.main(args=argv, prog_name="encoderkit", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except EncoderkitError as exc:
        click.echo(f"encoderkit: error: {exc}", err=True)
        return 2
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("encoderkit: interrupted", err=True)
        return 130
    except OSError as exc:  # disk full, permission denied ...: still one line
        where = f" ({exc.filename})" if exc.filename else ""
        click.echo(f"encoderkit: error: {exc.strerror or exc}{where}", err=True)
        return 2
    except Exception as exc:  # a bug: one line, the traceback only when asked for
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        click.echo(f"encoderkit: internal error: {type(exc).__name__}: {exc} "
                   "(rerun with -vv for the traceback, and please report it)", err=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
