"""The `encoderkit` group and its one error boundary.

Errors the user can fix are EncoderkitErrors: printed as one line, exit code 2. A command may return an int:
the exit code (``scan provenance`` returns 1 for a model that is not trusted).
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import click

from ..errors import EncoderkitError
from .attention import attention
from .demo import demo
from .embed import embed, eval_retrieval, eval_sts, index, mine_negatives, search
from .export import export
from .models import info, models
from .rerank import rerank, train_reranker_cmd
from .scan import scan
from .sentence import train_embedder_cmd
from .serve import serve
from .tasks import classify, evaluate, fill_mask, finetune, ner, predict, qa
from .train import pretrain, train_tokenizer_cmd


def run_guarded(invoke: Callable[[], Any]) -> int:
    """Runs a command line, turning encoderkit errors into one line and exit code 2; returns the exit code."""
    try:
        result = invoke()
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


class EncoderkitGroup(click.Group):
    """The top-level group: every way in (main(), the console script, click's CliRunner) passes run_guarded."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        code = run_guarded(lambda: super(EncoderkitGroup, self).main(
            args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra))
        if standalone_mode:
            sys.exit(code)
        return code


@click.group(cls=EncoderkitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="more log output (-v info, -vv debug)")
@click.version_option(package_name="encoderkit")
def cli(verbose: int) -> None:
    """encoderkit: encoder-only transformers (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, ALBERT, ELECTRA,
    MPNet, ModernBERT, DeBERTa-v2/v3, NomicBERT, GTE, EuroBERT, jina-embeddings-v3)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


for _command in (info, models, demo, embed, eval_sts, eval_retrieval, mine_negatives, index, search, train_tokenizer_cmd, pretrain,
                 finetune, evaluate, predict, classify, ner, qa, fill_mask, attention, scan,
                 train_embedder_cmd, train_reranker_cmd, rerank, serve, export):
    cli.add_command(_command)
del _command


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command, turning encoderkit errors into one line and exit code 2."""
    return cli.main(args=argv, prog_name="encoderkit", standalone_mode=False)
