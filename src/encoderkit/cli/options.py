"""Options that several commands share, each defined once; a factory where the commands differ in a default
or a help text."""
from __future__ import annotations

from typing import Any, Callable

import click

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

MODEL_HELP = ("model directory (HF format or sentence-transformers) or hub id ORG/NAME (from the Hugging Face cache, "
              "else downloaded); default: all-MiniLM-L6-v2")
REVISION_KEY = "encoderkit.revision"
DTYPE_HELP = ("fp32 (exact), bf16 (faster, slightly less exact), int8 (int8 linear layers: fastest, least exact; "
              "warns when a model loses too much), auto (bf16 where the CPU runs it natively; never int8)")
DTYPES = ("fp32", "bf16", "int8", "auto")  # inference; training commands pass TRAIN_DTYPES
TRAIN_DTYPES = ("fp32", "bf16", "auto")


def dtype_option(default: str = "fp32", *, help: str | None = DTYPE_HELP,
                 choices: tuple[str, ...] = DTYPES) -> Decorator:
    """--dtype: fp32 for most commands; pre-training and the backdoor scan default to auto. Commands that train
    pass ``choices=TRAIN_DTYPES`` (int8 is for inference only)."""
    return click.option("--dtype", type=click.Choice(list(choices)), default=default, show_default=True, help=help)


def device_option(help: str = "where the model computes: cpu, cuda or cuda:N (a GPU needs a CUDA build of torch)"
                  ) -> Decorator:
    """--device: the CPU by default; checked by ``precision.resolve_device`` (a GPU torch cannot see is one error
    line)."""
    return click.option("--device", default="cpu", show_default=True, help=help)


def model_option(help: str = MODEL_HELP) -> Decorator:
    """--model: a model directory or hub id, None meaning the default model; with --revision (a branch, tag or
    commit of a hub id), handed on as ``ORG/NAME@REVISION``, which ``hub.resolve_model`` reads."""
    def remember(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value:
            ctx.meta[REVISION_KEY] = value

    def attach(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        revision = ctx.meta.get(REVISION_KEY)
        if revision is None:
            return value
        if value is None or "@" in value:
            raise click.BadParameter("--revision picks a revision of a hub model: give --model ORG/NAME (without "
                                     "@REVISION) with it", param_hint="'--revision'")
        return f"{value}@{revision}"

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        function = click.option("--model", default=None, help=help, callback=attach)(function)
        return click.option("--revision", default=None, is_eager=True, expose_value=False, callback=remember,
                            help="branch, tag or commit of a hub model (--model ORG/NAME); default: main")(function)

    return decorate


def one_prompt(text: str | None, name: str | None, option: str = "prompt") -> None:
    """--OPTION (the text) and --OPTION-name (the model's name for one) exclude each other."""
    if text is not None and name is not None:
        from ..errors import InputError

        raise InputError(f"give --{option} (the text) or --{option}-name (the model's name for one), not both")


def seed_option(default: int = 0, *, help: str | None = None) -> Decorator:
    return click.option("--seed", type=int, default=default, show_default=True, help=help)


def max_length_option(default: int | None = None, *, help: str | None = None) -> Decorator:
    """--max-length in tokens; a default of None (the model's or the task's) is not shown."""
    return click.option("--max-length", type=int, default=default, show_default=default is not None, help=help)


def restart_option(help: str) -> Decorator:
    """--restart: start over instead of resuming an interrupted run."""
    return click.option("--restart", is_flag=True, help=help)


def out_option(help: str, *, dest: str = "out_dir", required: bool = True, **kwargs: Any) -> Decorator:
    """--out: the directory (dest out_dir) or file (dest out_path) a command writes to."""
    return click.option("--out", dest, required=required, help=help, **kwargs)


def truncate_dim_option(help: str = "keep the first N dimensions of each embedding (a Matryoshka-trained model "
                                           "keeps most of its quality in them)") -> Decorator:
    """--truncate-dim N: the first N dimensions of each vector, as sentence-transformers' truncate_dim. Checked
    (1 to the model's dimension) where the model is known, so a bad value is one encoderkit error line."""
    return click.option("--truncate-dim", type=int, default=None, metavar="N", help=help)


def json_option(help: str = "print JSON") -> Decorator:
    return click.option("--json", "as_json", is_flag=True, help=help)


def top_k_option(default: int, *, dest: str = "top_k", short: bool = True, help: str | None = None) -> Decorator:
    """--top-k (with -k unless short is False)."""
    names = ("-k", "--top-k") if short else ("--top-k",)
    return click.option(*names, dest, type=int, default=default, show_default=True, help=help)


def column_options(*names: str) -> Decorator:
    """--text-column, --pair-column, --label-column: the columns of a CSV/TSV/JSONL file."""
    def apply(function: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            function = click.option(f"--{name}-column", default=None)(function)
        return function

    return apply


def aggregation_option(default: str | None = None, *, help: str | None = None) -> Decorator:
    """--aggregation of the sub-word tags of a word (NER)."""
    return click.option("--aggregation", type=click.Choice(["first", "average", "max"]), default=default,
                        show_default=default is not None, help=help)


def documents_option(help: str | None = None) -> Decorator:
    """--documents: how a text file is split into documents."""
    return click.option("--documents", type=click.Choice(["blank-line", "line"]), default="blank-line",
                        show_default=True, help=help)


def mask_rate_option(help: str | None = None) -> Decorator:
    return click.option("--mask-rate", type=float, default=0.15, show_default=True, help=help)


model_dir_argument = click.argument("model_dir")
