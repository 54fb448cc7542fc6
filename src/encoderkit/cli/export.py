"""`export`: a model directory in another runtime's format (ONNX)."""
from __future__ import annotations

import json

import click

from .options import json_option, out_option


@click.command("export")
@click.argument("model_dir", metavar="MODEL")
@click.option("--format", "format_name", default="onnx", show_default=True,
              help="the format to write (onnx: ONNX Runtime, sentence-transformers' backend=\"onnx\")")
@click.option("--int8", is_flag=True,
              help="also write onnx/model_qint8.onnx: int8 weights (per output channel), activations quantised "
                   "on the fly")
@out_option("the directory to write: the model's config and tokenizer (and sentence-transformers) files, "
            "and onnx/model.onnx")
@click.option("--overwrite", is_flag=True, help="replace --out if it exists and is not empty")
@click.option("--task", default=None,
              help="the head to export (base, masked-lm, sequence-classification, ...); default: the one "
                   "config.json names")
@json_option()
def export(model_dir: str, format_name: str, int8: bool, out_dir: str, overwrite: bool, task: str | None,
           as_json: bool) -> None:
    """Export MODEL (a model directory, or "default") with dynamic batch and sequence-length axes."""
    from ..export import export_model
    from ..extras import require

    if format_name == "onnx":
        require("onnx", "encoderkit export --format onnx")
    result = export_model(model_dir, out_dir, format=format_name, int8=int8, overwrite=overwrite, task=task)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(f"exported the {result.task} model to {result.model_path}")
    if result.int8_path is not None:
        click.echo(f"int8 copy: {result.int8_path}")
    click.echo(f"inputs: {', '.join(result.inputs)}; outputs: {', '.join(result.outputs)}")
    click.echo(f"checked with ONNX Runtime: largest difference from encoderkit {result.max_difference:.2g}")
