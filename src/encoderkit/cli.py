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


DTYPE_HELP = "fp32 (exact), bf16 (faster, slightly less exact), auto (bf16 where the CPU runs it natively)"


@cli.command()
@click.argument("input_path", metavar="INPUT")
@click.option("--out", "out_path", required=True, help="output .npy (float32, one row per record); ids go to OUT.ids.txt")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True, help=DTYPE_HELP)
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl", "csv", "tsv"]), default=None,
              help="input format (default: from the file extension; otherwise one text per line)")
@click.option("--text-field", default=None, help="JSONL key / CSV column holding the text")
@click.option("--id-field", default=None, help="JSONL key / CSV column holding the id (default: record number)")
@click.option("--max-length", type=int, default=None, help="tokens per text (default: the model's)")
@click.option("--long-text", type=click.Choice(["truncate", "window"]), default="truncate", show_default=True,
              help="texts beyond max-length: truncate (with a warning) or embed overlapping windows and average")
@click.option("--chunk-size", type=int, default=4096, show_default=True, help="records per written chunk")
@click.option("--restart", is_flag=True, help="ignore the progress of an interrupted run and start over")
def embed(input_path: str, out_path: str, model: str | None, dtype: str, fmt: str | None, text_field: str | None,
          id_field: str | None, max_length: int | None, long_text: str, chunk_size: int, restart: bool) -> None:
    """Embed a text/JSONL/CSV file into a float32 .npy (input order) plus ids, streamed and resumable."""
    from .tasks.embed import embed_file

    result = embed_file(input_path, out_path, model=model, fmt=fmt, text_field=text_field, id_field=id_field,
                        chunk_size=chunk_size, resume=not restart, dtype=dtype, max_length=max_length,
                        long_text=long_text)
    resumed = f" (resumed after {result.resumed_from:,})" if result.resumed_from else ""
    click.echo(f"wrote {result.rows:,} x {result.dimension} float32 embeddings to {result.path}{resumed}; "
               f"ids in {result.ids_path}")


@cli.command("eval-sts")
@click.argument("path")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True, help=DTYPE_HELP)
def eval_sts(path: str, model: str | None, dtype: str) -> None:
    """Spearman and Pearson correlation of cosine similarity with the gold scores of an STS-B file."""
    from .tasks.embed import Embedder
    from .tasks.sts import evaluate_sts

    result = evaluate_sts(path, Embedder.from_pretrained(model, dtype=dtype))
    click.echo(f"pairs: {result.pairs}")
    click.echo(f"spearman: {result.spearman:.6f}")
    click.echo(f"pearson: {result.pearson:.6f}")


@cli.command()
@click.argument("vectors_path", metavar="VECTORS")
@click.option("--out", "out_dir", required=True, help="directory to save the index to")
@click.option("--ids", "ids_path", default=None, help="ids file, one per line (default: VECTORS.ids.txt if present)")
@click.option("--kind", type=click.Choice(["exact", "hnsw", "sq8"]), default="exact", show_default=True)
@click.option("--metric", type=click.Choice(["cosine", "ip"]), default="cosine", show_default=True)
@click.option("--model", default=None, help="model to embed queries with at search time (default: the default model)")
@click.option("--texts", "texts_path", default=None, help="the embedded input file, to show texts in results")
def index(vectors_path: str, out_dir: str, ids_path: str | None, kind: str, metric: str, model: str | None,
          texts_path: str | None) -> None:
    """Build a search index from an embeddings .npy (as written by `encoderkit embed`)."""
    from .jobs import build_index_job

    built = build_index_job(vectors_path, out_dir, ids_path=ids_path, kind=kind, metric=metric, model=model,
                            texts_path=texts_path)
    click.echo(f"indexed {len(built):,} vectors ({built.kind}, {built.metric}) -> {out_dir}")


@cli.command()
@click.argument("index_dir", metavar="INDEX")
@click.argument("query")
@click.option("-k", "--top-k", "k", type=int, default=10, show_default=True)
@click.option("--model", default=None, help="model for the query (default: the one recorded in the index)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def search(index_dir: str, query: str, k: int, model: str | None, as_json: bool) -> None:
    """Find the nearest texts to QUERY in a saved index."""
    from .jobs import search_job

    hits = search_job(index_dir, query, k=k, model=model)
    if as_json:
        click.echo(json.dumps(hits, indent=2, ensure_ascii=False))
        return
    for hit in hits:
        text = f"  {hit['text']}" if "text" in hit else ""
        click.echo(f"{hit['rank']:>3}  {hit['score']:.4f}  {hit['id']}{text}")


@cli.command()
@click.option("--corpus", required=True, help="training text (documents separated by blank lines)")
@click.option("--out", "out_dir", required=True, help="output directory (checkpoints, metrics, loss.png, final/)")
@click.option("--objective", type=click.Choice(["mlm", "mlm-nsp", "mlm-sop", "electra", "distill"]), default="mlm",
              show_default=True, help="electra: generator + discriminator (loss MLM + 50 RTD); distill: --teacher needed")
@click.option("--teacher", default=None, help="distill: the teacher model directory (with an MLM head)")
@click.option("--generator-config", default=None, help="electra: generator shape (default: 1/4 of the discriminator)")
@click.option("--config", "model_config", default="minilm-l6-h384", show_default=True,
              help="a preset (see `encoderkit models`), a config.json, or a model directory to continue from")
@click.option("--tokenizer", default=None, help="tokenizer directory (default: the model's, or the default model's)")
@click.option("--valid", default=None, help="validation text for loss and masked-token accuracy")
@click.option("--max-length", type=int, default=128, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--grad-accumulation", type=int, default=1, show_default=True)
@click.option("--steps", type=int, required=True, help="optimizer steps")
@click.option("--lr", type=float, default=5e-4, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.06, show_default=True)
@click.option("--schedule", type=click.Choice(["linear", "cosine", "constant"]), default="linear", show_default=True)
@click.option("--mask-rate", type=float, default=0.15, show_default=True)
@click.option("--whole-word", is_flag=True, help="mask whole words")
@click.option("--static-masking", is_flag=True, help="BERT's fixed masks instead of new masks each epoch")
@click.option("--documents", type=click.Choice(["blank-line", "line"]), default="blank-line", show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="auto", show_default=True,
              help="bf16 = bf16 autocast; auto = bf16 where the CPU has native bf16 units (its loss curve matches "
                   "fp32's: BENCHMARKS.md), else fp32")
@click.option("--save-every", type=int, default=500, show_default=True)
@click.option("--eval-every", type=int, default=500, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--restart", is_flag=True, help="ignore existing checkpoints in --out")
def pretrain(corpus, out_dir, objective, teacher, generator_config, model_config, tokenizer, valid, max_length,
             batch_size, grad_accumulation, steps, lr, warmup_ratio, schedule, mask_rate, whole_word, static_masking,
             documents, dtype, save_every, eval_every, seed, restart) -> None:
    """Pre-train or continue pre-training (MLM, MLM+NSP, MLM+SOP, ELECTRA, distillation); resumes automatically."""
    import torch

    from .data.masking import MaskingConfig
    from .precision import resolve_dtype
    from .training.pretrain import pretrain as run_pretrain

    bf16 = resolve_dtype(dtype) == torch.bfloat16

    result = run_pretrain(
        corpus, out_dir, objective=objective, config=model_config, tokenizer=tokenizer, valid=valid,
        max_length=max_length, masking=MaskingConfig(rate=mask_rate, whole_word=whole_word, dynamic=not static_masking),
        document_mode=documents, resume=not restart, teacher=teacher, generator_config=generator_config, max_steps=steps, batch_size=batch_size,
        grad_accumulation=grad_accumulation, learning_rate=lr, warmup_ratio=warmup_ratio, schedule=schedule,
        bf16=bf16, save_every=save_every, eval_every=eval_every, seed=seed)
    final = ", ".join(f"{k} {v:.4f}" for k, v in result["final"].items())
    click.echo(f"trained {result['step']} steps on {result['examples']:,} sequences; {final or 'no validation set'}; "
               f"model in {out_dir}/final")


@cli.command("fill-mask")
@click.argument("model")
@click.argument("text")
@click.option("-k", "--top-k", type=int, default=5, show_default=True)
def fill_mask(model: str, text: str, top_k: int) -> None:
    """Most probable tokens for the mask token(s) in TEXT, with probabilities."""
    from .tasks.fill_mask import FillMask

    for index, predictions in enumerate(FillMask.from_pretrained(model)(text, top_k=top_k)[0]):
        if index:
            click.echo("")
        for prediction in predictions:
            click.echo(f"{prediction.score:8.4f}  {prediction.token:15s}  {prediction.sequence}")


# ---------------------------------------------------------------------------------------------
# Fine-tuning and task pipelines
TASK_CHOICE = click.Choice(["classify", "pair", "multilabel", "ner", "qa", "multitask"])


def _named(values: tuple[str, ...], what: str) -> dict[str, str]:
    """NAME=VALUE options (multi-task) -> {name: value}."""
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            from .errors import InputError

            raise InputError(f"multi-task {what} must be NAME=VALUE, found {value!r}")
        out[name] = rest
    return out


@cli.command()
@click.option("--task", type=TASK_CHOICE, required=True,
              help="classify: text -> label; pair: text pair -> label; multilabel: text -> labels; ner: CoNLL; "
                   "qa: SQuAD; multitask: several --train NAME=FILE, one head each")
@click.option("--train", "train_files", multiple=True, required=True,
              help="training file (multitask: NAME=FILE, repeated)")
@click.option("--valid", "valid_files", multiple=True, help="validation file (default: 10% of --train, seeded)")
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--out", "out_dir", required=True, help="output directory (HF format; loads in transformers)")
@click.option("--epochs", type=float, default=None, help="default 3 (QA 2)")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=5e-5, show_default=True)
@click.option("--warmup-ratio", type=float, default=0.1, show_default=True)
@click.option("--weight-decay", type=float, default=0.01, show_default=True)
@click.option("--max-length", type=int, default=None, help="tokens per example (default 128, QA 384)")
@click.option("--doc-stride", type=int, default=128, show_default=True, help="QA: window overlap in tokens")
@click.option("--text-column", default=None)
@click.option("--pair-column", default=None)
@click.option("--label-column", "label_columns", multiple=True, help="label column (multitask: NAME=COLUMN)")
@click.option("--multi-label-separator", default=None, help="split a label cell into several labels, e.g. ','")
@click.option("--multilabel-head", "multilabel_heads", multiple=True, help="multitask: heads that are multi-label")
@click.option("--crf", is_flag=True, help="ner: a CRF over the word tags")
@click.option("--early-stopping", type=int, default=None, help="stop after N evaluations without improvement")
@click.option("--no-length-grouping", is_flag=True, help="plain random batches instead of length-grouped ones")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True,
              help="bf16 = bf16 autocast (faster where the CPU has bf16 units; BENCHMARKS.md compares)")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--restart", is_flag=True, help="ignore the checkpoints of an interrupted run in --out")
def finetune(task, train_files, valid_files, model, out_dir, epochs, batch_size, lr, warmup_ratio, weight_decay,
             max_length, doc_stride, text_column, pair_column, label_columns, multi_label_separator, multilabel_heads,
             crf, early_stopping, no_length_grouping, dtype, seed, restart) -> None:
    """Fine-tune a pretrained encoder on labelled data (BERT recipe); rerun the same command to resume."""
    import torch

    from .precision import resolve_dtype
    from .training.finetune import Recipe, finetune as run_finetune

    columns: dict = dict(text_column=text_column, pair_column=pair_column,
                         multi_label_separator=multi_label_separator)
    if task == "multitask":
        train, valid = _named(train_files, "--train"), _named(valid_files, "--valid") or None
        labels = _named(label_columns, "--label-column")
        columns = {"heads": {name: "multilabel" if name in multilabel_heads else "classify" for name in train},
                   "head_columns": {name: {**columns, "label_column": labels.get(name)} for name in train}}
    else:
        if len(train_files) > 1 or len(valid_files) > 1 or len(label_columns) > 1:
            from .errors import InputError

            raise InputError("one --train, --valid and --label-column each, except with --task multitask")
        train, valid = train_files[0], valid_files[0] if valid_files else None
        columns["label_column"] = label_columns[0] if label_columns else None
    recipe = Recipe(epochs=epochs, batch_size=batch_size, learning_rate=lr, warmup_ratio=warmup_ratio,
                    weight_decay=weight_decay, max_length=max_length, doc_stride=doc_stride, crf=crf,
                    early_stopping_patience=early_stopping, group_by_length=not no_length_grouping,
                    bf16=resolve_dtype(dtype) == torch.bfloat16, seed=seed, show_progress=True)
    result = run_finetune(task, train, out_dir, valid=valid, model=model, recipe=recipe, resume=not restart,
                          **columns)
    scores = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
    click.echo(f"fine-tuned on {result.train_examples:,} examples for {result.steps} steps "
               f"({result.examples_per_second:,.1f} examples/s); best model (step {result.best_step}) on "
               f"{result.valid_examples:,} validation examples: {scores}")
    click.echo(f"model in {out_dir} (loads in transformers); curves in {out_dir}/training/loss.png")


@cli.command()
@click.argument("model")
@click.argument("data", nargs=-1, required=True)
@click.option("--text-column", default=None)
@click.option("--pair-column", default=None)
@click.option("--label-column", default=None)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True, help=DTYPE_HELP)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def evaluate(model, data, text_column, pair_column, label_column, dtype, as_json) -> None:
    """Task metrics of a fine-tuned MODEL on labelled DATA (multitask: NAME=FILE for each head)."""
    from .modeling.models import task_settings
    from .training.finetune import evaluate_model

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


@cli.command()
@click.argument("model")
@click.argument("input_path", metavar="INPUT")
@click.option("--out", "out_path", default=None, help="JSON Lines output (default: print to stdout)")
@click.option("--text-column", default=None)
@click.option("--pair-column", default=None)
@click.option("--aggregation", type=click.Choice(["first", "average", "max"]), default=None, help="ner")
@click.option("-k", "--top-k", "top_k", type=int, default=1, show_default=True, help="qa: answers per question")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True, help=DTYPE_HELP)
def predict(model, input_path, out_path, text_column, pair_column, aggregation, top_k, dtype) -> None:
    """Predict every record of INPUT with a fine-tuned MODEL (classifier, NER or QA), as JSON Lines."""
    from .tasks.predict import predict_file

    result = predict_file(model, input_path, out_path, dtype=dtype, text_column=text_column, pair_column=pair_column,
                          aggregation=aggregation, top_k=top_k)
    if out_path is None:
        for record in result:
            click.echo(json.dumps(record, ensure_ascii=False))
    else:
        click.echo(f"wrote {result:,} predictions to {out_path}")


@cli.command()
@click.argument("model")
@click.argument("texts", nargs=-1, required=True)
@click.option("--pair", default=None, help="second text (pair classification)")
def classify(model, texts, pair) -> None:
    """Labels and probabilities of TEXTS with a fine-tuned classifier."""
    from .tasks.classify import Classifier

    classifier = Classifier.from_pretrained(model)
    for text, prediction in zip(texts, classifier(list(texts), [pair] * len(texts) if pair else None)):
        heads = prediction if isinstance(prediction, dict) else {"": prediction}
        for head, p in heads.items():
            label = ", ".join(p.label) if isinstance(p.label, list) else p.label
            click.echo(f"{head + ': ' if head else ''}{label}  ({p.score:.4f})  {text}")


@cli.command()
@click.argument("model")
@click.argument("texts", nargs=-1, required=True)
@click.option("--aggregation", type=click.Choice(["first", "average", "max"]), default="first", show_default=True)
def ner(model, texts, aggregation) -> None:
    """Named entities in TEXTS: type, text, character span and score."""
    from .tasks.ner import EntityRecognizer

    recognizer = EntityRecognizer.from_pretrained(model, aggregation=aggregation)
    for text, entities in zip(texts, recognizer(list(texts))):
        click.echo(text)
        for e in entities:
            click.echo(f"  {e.type:8s} {e.text!r:30s} [{e.start}:{e.end}]  {e.score:.4f}")


@cli.command()
@click.argument("model")
@click.option("--question", "-q", required=True)
@click.option("--context", "-c", required=True, help="the context text, or @FILE to read it from a file")
@click.option("-k", "--top-k", "top_k", type=int, default=1, show_default=True)
def qa(model, question, context, top_k) -> None:
    """Answers to QUESTION found in CONTEXT (any length: read in overlapping windows)."""
    from pathlib import Path

    from .tasks.qa import QuestionAnswerer

    if context.startswith("@"):
        from .errors import InputError

        path = Path(context[1:])
        if not path.is_file():
            raise InputError(f"context file not found: {path}")
        context = path.read_text(encoding="utf-8")
    for answer in QuestionAnswerer.from_pretrained(model)(question, context, top_k=top_k):
        click.echo(f"{answer.score:.4f}  [{answer.start}:{answer.end}]  {answer.text}")


@cli.command()
@click.option("--model", default=None, help=MODEL_HELP)
@click.option("--out", "out_dir", default="demo-output/helpdesk-classifier", show_default=True,
              help="where the demo's fine-tuned classifier is written")
@click.option("--no-finetune", is_flag=True, help="only the embedding and search part")
def demo(model: str | None, out_dir: str, no_finetune: bool) -> None:
    """The default model: what it is, embeddings and nearest neighbours, then a fine-tuned intent classifier."""
    from .jobs import run_demo, run_finetune_demo

    run_demo(model, echo=click.echo)
    if not no_finetune:
        run_finetune_demo(model, out_dir, echo=click.echo)


# ---------------------------------------------------------------------------------------------
# Attention maps: `encoderkit attention MODEL "text" --layer L --head H --out map.png` (encoderkit.analysis).
@cli.command()
@click.argument("model")
@click.argument("text")
@click.option("--pair", default=None, help="a second text: the input is the pair (TEXT, PAIR)")
@click.option("--layer", type=int, required=True, help="layer to draw, numbered from 0")
@click.option("--head", type=int, default=None, help="head to draw, numbered from 0 (needed unless --grid)")
@click.option("--out", "out_path", required=True, help="the PNG to write")
@click.option("--grid", is_flag=True,
              help="draw every head of --layer as small multiples (--head, if given, is framed)")
@click.option("--mask", type=click.Choice(["bidirectional", "causal", "compare"]), default="bidirectional",
              show_default=True, help="the model's own mask, a causal (left-to-right) one, or both side by side")
@click.option("--stats", "stats_path", default=None,
              help="also write per-head statistics of this input as JSON (attention shares to [CLS], [SEP], itself, "
                   "its neighbours; entropy)")
@click.option("--max-labels", type=int, default=60, show_default=True,
              help="longer inputs label every k-th token so the axes stay readable")
def attention(model: str, text: str, pair: str | None, layer: int, head: int | None, out_path: str, grid: bool,
              mask: str, stats_path: str | None, max_labels: int) -> None:
    """Draw the attention probabilities of one head (or all heads of a layer) for TEXT as a PNG."""
    from pathlib import Path

    from .analysis import AttentionAnalyzer
    from .errors import InputError

    out = Path(out_path)
    if out.suffix.lower() != ".png":
        raise InputError(f"--out must name a .png file, found {out_path!r}")
    if head is None and not grid:
        raise InputError("give --head H (numbered from 0), or --grid to draw every head of the layer")
    if grid and mask == "compare":
        raise InputError("--mask compare draws one head under both masks; give --head instead of --grid")
    if max_labels <= 0:
        raise InputError(f"--max-labels must be positive, found {max_labels}")
    analyzer = AttentionAnalyzer.from_pretrained(model)
    analyzer.check_layer_head(layer, head)  # before running the model: a bad index fails fast
    out.parent.mkdir(parents=True, exist_ok=True)
    maps = None
    if mask == "compare":
        comparison = analyzer.compare_masks(text, pair, layer=layer, head=head)
        comparison.plot(out, max_labels=max_labels)
        summary = (f"{len(comparison.tokens)} tokens; final-layer cosine bidirectional vs causal: first token "
                   f"{comparison.first_token_cosine:.4f}, mean-pooled {comparison.mean_pooled_cosine:.4f}")
    else:
        maps = analyzer.attend(text, pair, mask=mask)
        if grid:
            maps.grid(out, layer, highlight_head=head)
        else:
            maps.heatmap(layer, head, out, max_labels=max_labels)
        summary = f"{maps.length} tokens, {mask} mask"
    what = f"layer {layer}, all {analyzer.num_heads} heads" if grid else f"layer {layer}, head {head}"
    click.echo(f"wrote {out} ({what}; {summary})")
    if stats_path:
        maps = maps if maps is not None else analyzer.attend(text, pair)
        stats_file = Path(stats_path)
        stats_file.parent.mkdir(parents=True, exist_ok=True)
        stats_file.write_text(maps.statistics().to_json() + "\n", encoding="utf-8")
        click.echo(f"wrote head statistics to {stats_file}")


# ---------------------------------------------------------------------------------------------
# Inspection and audits: `encoderkit scan <engine> ...` writes <engine>.json, <engine>.md and PNGs to --out.
@cli.group()
def scan() -> None:
    """Audit a model or its inputs: provenance, membership, backdoors, OOD, shift, consistency."""


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
