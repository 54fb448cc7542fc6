"""Fine-tuning and the task pipelines: `finetune`, `evaluate`, `predict`, `classify`, `ner`, `qa`, `fill-mask`."""
from __future__ import annotations

import json

import click

from .options import (
    aggregation_option,
    column_options,
    TRAIN_DTYPES,
    device_option,
    dtype_option,
    json_option,
    max_length_option,
    model_option,
    out_option,
    restart_option,
    seed_option,
    top_k_option,
)

TASK_CHOICE = click.Choice(["classify", "pair", "multilabel", "ner", "qa", "multitask"])


def _named(values: tuple[str, ...], what: str) -> dict[str, str]:
    """NAME=VALUE options (multi-task) -> {name: value}."""
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            from ..errors import InputError

            raise InputError(f"multi-task {what} must be NAME=VALUE, found {value!r}")
        out[name] = rest
    return out


@click.command()
@click.option("--task", type=TASK_CHOICE, required=True,
              help="classify: text -> label; pair: text pair -> label; multilabel: text -> labels; ner: CoNLL; "
                   "qa: SQuAD; multitask: several --train NAME=FILE, one head each")
@click.option("--train", "train_files", multiple=True, required=True,
              help="training file (multitask: NAME=FILE, repeated)")
@click.option("--valid", "valid_files", multiple=True, help="validation file (default: 10% of --train, seeded)")
@model_option()
@out_option("output directory (HF format; loads in transformers)")
@click.option("--epochs", type=float, default=None, help="default 3 (QA 2)")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=5e-5, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.1, show_default=True)
@click.option("--weight-decay", type=float, default=0.01, show_default=True)
@max_length_option(help="tokens per example (default 128, QA 384)")
@click.option("--doc-stride", type=int, default=128, show_default=True, help="QA: window overlap in tokens")
@column_options("text", "pair")
@click.option("--label-column", "label_columns", multiple=True, help="label column (multitask: NAME=COLUMN)")
@click.option("--multi-label-separator", default=None, help="split a label cell into several labels, e.g. ','")
@click.option("--multilabel-head", "multilabel_heads", multiple=True, help="multitask: heads that are multi-label")
@click.option("--crf", is_flag=True, help="ner: a CRF over the word tags")
@click.option("--early-stopping", type=int, default=None, help="stop after N evaluations without improvement")
@click.option("--length-grouping/--no-length-grouping", default=None,
              help="batches of similar length, or plain random ones [default: length-grouped from 250 steps an "
                   "epoch, else random; random for qa]")
@dtype_option(help="bf16 = bf16 autocast (faster where the CPU has bf16 units; BENCHMARKS.md compares)",
              choices=TRAIN_DTYPES)
@device_option("where to train and evaluate: cpu, cuda or cuda:N")
@seed_option(42)
@restart_option("ignore the checkpoints of an interrupted run in --out")
def finetune(task, train_files, valid_files, model, out_dir, epochs, batch_size, lr, warmup_ratio, weight_decay,
             max_length, doc_stride, text_column, pair_column, label_columns, multi_label_separator, multilabel_heads,
             crf, early_stopping, length_grouping, dtype, device, seed, restart) -> None:
    """Fine-tune a pretrained encoder on labelled data (BERT recipe); rerun the same command to resume."""
    import torch

    from ..precision import resolve_device, resolve_dtype
    from ..training.finetune import Recipe, finetune as run_finetune

    columns: dict = dict(text_column=text_column, pair_column=pair_column,
                         multi_label_separator=multi_label_separator)
    if task == "multitask":
        train, valid = _named(train_files, "--train"), _named(valid_files, "--valid") or None
        labels = _named(label_columns, "--label-column")
        columns = {"heads": {name: "multilabel" if name in multilabel_heads else "classify" for name in train},
                   "head_columns": {name: {**columns, "label_column": labels.get(name)} for name in train}}
    else:
        if len(train_files) > 1 or len(valid_files) > 1 or len(label_columns) > 1:
            from ..errors import InputError

            raise InputError("one --train, --valid and --label-column each, except with --task multitask")
        train, valid = train_files[0], valid_files[0] if valid_files else None
        columns["label_column"] = label_columns[0] if label_columns else None
    recipe = Recipe(epochs=epochs, batch_size=batch_size, learning_rate=lr, warmup_ratio=warmup_ratio,
                    weight_decay=weight_decay, max_length=max_length, doc_stride=doc_stride, crf=crf,
                    early_stopping_patience=early_stopping, group_by_length=length_grouping,
                    bf16=resolve_dtype(dtype, resolve_device(device)) == torch.bfloat16, seed=seed, show_progress=True,
                    device=device)
    result = run_finetune(task, train, out_dir, valid=valid, model=model, recipe=recipe, resume=not restart,
                          **columns)
    scores = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
    click.echo(f"fine-tuned on {result.train_examples:,} examples for {result.steps} steps "
               f"({result.examples_per_second:,.1f} examples/s); best model (step {result.best_step}) on "
               f"{result.valid_examples:,} validation examples: {scores}")
    click.echo(f"curves in {out_dir}/training/loss.png; the model loads in transformers")
    click.echo(f"final model: {result.out_dir}")


@click.command()
@click.argument("model")
@click.argument("data", nargs=-1, required=True)
@column_options("text", "pair", "label")
@dtype_option()
@json_option()
def evaluate(model, data, text_column, pair_column, label_column, dtype, as_json) -> None:
    """Task metrics of a fine-tuned MODEL on labelled DATA (multitask: NAME=FILE for each head)."""
    from ..training.finetune import evaluate_model

    columns = dict(text_column=text_column, pair_column=pair_column, label_column=label_column)
    if any("=" in d for d in data):
        data_arg = _named(data, "data")
        columns = {"head_columns": {name: columns for name in data_arg}}
    else:
        data_arg = data[0]
    scores = evaluate_model(model, data_arg, dtype=dtype, **columns)
    if as_json:
        click.echo(json.dumps(scores, indent=2))
        return
    for key, value in scores.items():
        click.echo(f"{key}: {value:.6f}")


@click.command()
@click.argument("model")
@click.argument("input_path", metavar="INPUT")
@out_option("JSON Lines output (default: print to stdout)", dest="out_path", required=False, default=None)
@column_options("text", "pair")
@aggregation_option(help="ner")
@top_k_option(1, help="qa: answers per question")
@dtype_option()
def predict(model, input_path, out_path, text_column, pair_column, aggregation, top_k, dtype) -> None:
    """Predict every record of INPUT with a fine-tuned MODEL (classifier, NER or QA), as JSON Lines."""
    from ..tasks.predict import predict_file

    result = predict_file(model, input_path, out_path, dtype=dtype, text_column=text_column, pair_column=pair_column,
                          aggregation=aggregation, top_k=top_k)
    if out_path is None:
        for record in result:
            click.echo(json.dumps(record, ensure_ascii=False))
    else:
        click.echo(f"wrote {result:,} predictions to {out_path}")


@click.command()
@click.argument("model")
@click.argument("texts", nargs=-1, required=True)
@click.option("--pair", default=None, help="second text (pair classification)")
def classify(model, texts, pair) -> None:
    """Labels and probabilities of TEXTS with a fine-tuned classifier."""
    from ..tasks.classify import Classifier

    classifier = Classifier.from_pretrained(model)
    for text, prediction in zip(texts, classifier(list(texts), [pair] * len(texts) if pair else None)):
        heads = prediction if isinstance(prediction, dict) else {"": prediction}
        for head, p in heads.items():
            label = ", ".join(p.label) if isinstance(p.label, list) else p.label
            click.echo(f"{head + ': ' if head else ''}{label}  ({p.score:.4f})  {text}")


@click.command()
@click.argument("model")
@click.argument("texts", nargs=-1, required=True)
@aggregation_option("first")
def ner(model, texts, aggregation) -> None:
    """Named entities in TEXTS: type, text, character span and score."""
    from ..tasks.ner import EntityRecognizer

    recognizer = EntityRecognizer.from_pretrained(model, aggregation=aggregation)
    for text, entities in zip(texts, recognizer(list(texts))):
        click.echo(text)
        for e in entities:
            click.echo(f"  {e.type:8s} {e.text!r:30s} [{e.start}:{e.end}]  {e.score:.4f}")


@click.command()
@click.argument("model")
@click.option("--question", "-q", required=True)
@click.option("--context", "-c", required=True, help="the context text, or @FILE to read it from a file")
@top_k_option(1)
def qa(model, question, context, top_k) -> None:
    """Answers to QUESTION found in CONTEXT (any length: read in overlapping windows)."""
    from pathlib import Path

    from ..tasks.qa import QuestionAnswerer

    if context.startswith("@"):
        from ..errors import InputError

        path = Path(context[1:])
        if not path.is_file():
            raise InputError(f"context file not found: {path}")
        context = path.read_text(encoding="utf-8")
    for answer in QuestionAnswerer.from_pretrained(model)(question, context, top_k=top_k):
        click.echo(f"{answer.score:.4f}  [{answer.start}:{answer.end}]  {answer.text}")


@click.command("fill-mask")
@click.argument("model")
@click.argument("text")
@top_k_option(5)
def fill_mask(model: str, text: str, top_k: int) -> None:
    """Most probable tokens for the mask token(s) in TEXT, with probabilities."""
    from ..tasks.fill_mask import FillMask

    for index, predictions in enumerate(FillMask.from_pretrained(model)(text, top_k=top_k)[0]):
        if index:
            click.echo("")
        for prediction in predictions:
            click.echo(f"{prediction.score:8.4f}  {prediction.token:15s}  {prediction.sequence}")
