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
@click.option("--length-grouping/--no-length-grouping", default=None,
              help="batches of similar length, or plain random ones [default: length-grouped, random for qa]")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True,
              help="bf16 = bf16 autocast (faster where the CPU has bf16 units; BENCHMARKS.md compares)")
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--restart", is_flag=True, help="ignore the checkpoints of an interrupted run in --out")
def finetune(task, train_files, valid_files, model, out_dir, epochs, batch_size, lr, warmup_ratio, weight_decay,
             max_length, doc_stride, text_column, pair_column, label_columns, multi_label_separator, multilabel_heads,
             crf, early_stopping, length_grouping, dtype, seed, restart) -> None:
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
                    early_stopping_patience=early_stopping, group_by_length=length_grouping,
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


@scan.command("provenance")
@click.argument("model_dir")
@click.option("--manifest", "manifest", default=None,
              help="manifest to verify against (or to write); default MODEL_DIR/encoderkit-manifest.json when present")
@click.option("--write-manifest", is_flag=True,
              help="record the directory's SHA-256 manifest now (instead of verifying one)")
@click.option("--out", "out_dir", required=True, help="directory for provenance.json and provenance.md")
@click.option("--strict", is_flag=True, help="exit with code 1 unless the verdict is trusted")
def scan_provenance(model_dir: str, manifest: str | None, write_manifest: bool, out_dir: str, strict: bool) -> int:
    """Audit MODEL_DIR without loading it: manifest hashes, safetensors headers, pickle imports, config vs weights."""
    from .security.provenance import ModelProvenanceChecker

    report = ModelProvenanceChecker(model_dir).check(manifest, write_manifest=write_manifest)
    paths = report.write(out_dir)
    first = f": {report.reasons[0]}" if report.reasons else ""
    more = f" (+{len(report.reasons) - 1} more)" if len(report.reasons) > 1 else ""
    click.echo(f"{report.verdict}{first}{more}; report in {paths['markdown']}")
    return 1 if strict and not report.trusted else 0


@scan.command("consistency")
@click.argument("model_dir")
@click.argument("texts_file")
@click.option("--out", "out_dir", required=True, help="directory for consistency.json, consistency.md and the PNG")
@click.option("--edits", default=",".join(("case", "whitespace", "punctuation", "name", "typo")), show_default=True,
              help="comma-separated meaning-preserving edits to try")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the edits' random choices")
@click.option("--typos", type=int, default=1, show_default=True, help="typos put into each text by the typo edit")
@click.option("--text-field", default=None, help="text column/key of a .tsv/.csv/.jsonl TEXTS_FILE")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True)
def scan_consistency(model_dir: str, texts_file: str, out_dir: str, edits: str, seed: int, typos: int,
                     text_field: str | None, dtype: str) -> None:
    """Check that MODEL_DIR's predictions survive meaning-preserving edits of the texts in TEXTS_FILE."""
    from .security.consistency import BehaviorConsistencyValidator, parse_edits, read_texts

    names = parse_edits(edits)  # a typo in --edits fails before the model loads
    texts = read_texts(texts_file, text_field)
    validator = BehaviorConsistencyValidator.from_pretrained(model_dir, dtype=dtype, typos=typos)
    report = validator.validate(texts, names, seed=seed, model_name=model_dir)
    paths = report.write(out_dir)
    rates = ", ".join(f"{e.edit} {'n/a' if e.consistency_rate is None else f'{100 * e.consistency_rate:.1f}%'}"
                      for e in report.edits)
    click.echo(f"{len(texts)} texts; consistency: {rates}; {report.failures} failing case(s); "
               f"report in {paths['markdown']}")


@scan.command("attack")
@click.argument("model_dir")
@click.argument("texts_file")
@click.option("--out", "out_dir", required=True, help="directory for attack.json and attack.md")
@click.option("--method", type=click.Choice(["substitute", "insert"]), default="substitute", show_default=True,
              help="greedy substitution by embedding neighbours, or greedy insertion of neighbour words")
@click.option("--budget", type=int, default=500, show_default=True, help="classifier queries allowed per text")
@click.option("--max-rate", type=float, default=0.25, show_default=True,
              help="most words an attack may change, as a share of the text's words")
@click.option("--neighbours", type=int, default=20, show_default=True, help="embedding neighbours tried per word")
@click.option("--insert-words", default="", help="extra comma-separated words to try inserting (--method insert)")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True,
              help=DTYPE_HELP)
def scan_attack(model_dir: str, texts_file: str, out_dir: str, method: str, budget: int, max_rate: float,
                neighbours: int, insert_words: str, dtype: str) -> None:
    """Attack the classifier in MODEL_DIR on TEXTS_FILE (TSV lines `text<TAB>label`; optional header)."""
    from .security.attacks import WordAttack, read_labelled_texts
    from .tasks.classify import Classifier

    texts, labels = read_labelled_texts(texts_file)
    attack = WordAttack(Classifier.from_pretrained(model_dir, dtype=dtype), method=method, query_budget=budget,
                        max_perturbed_rate=max_rate, neighbours=neighbours,
                        insert_candidates=[w.strip() for w in insert_words.split(",") if w.strip()])
    result = attack.attack(texts, labels)
    paths = result.write(out_dir)
    click.echo(f"attack success rate {result.success_rate:.3f} ({result.successes} of {result.attacked} correctly "
               f"classified texts), mean perturbed-word rate {result.mean_perturbed_rate:.3f}, mean queries "
               f"{result.mean_queries:.1f}; report in {paths['markdown']}")


@scan.command("shift")
@click.argument("model_dir")
@click.option("--out", "out_dir", required=True, help="directory for shift.json, shift.md and shift_histogram.png")
@click.option("--original", "original_path", help="pair mode: original texts, one per line")
@click.option("--modified", "modified_path", help="pair mode: modified texts, one per line, aligned with --original")
@click.option("--texts", "texts_path", help="single-text mode: texts to score, one per line (needs --reference)")
@click.option("--reference", "reference_path", help="single-text mode: training-distribution texts, one per line")
@click.option("--calibrate", "calibrate_path",
              help="benign data for the threshold: TSV lines `original<TAB>modified` (pair mode) or one text per "
                   "line (single-text mode)")
@click.option("--fpr", type=float, default=0.05, show_default=True, help="target false-positive rate of the threshold")
@click.option("--representation", type=click.Choice(["cls", "mean", "pooled", "logits", "probabilities", "embedding"]),
              default="cls", show_default=True, help="what the shift is measured on")
@click.option("--top-k", type=int, default=5, show_default=True, help="most responsible words per text (0: none)")
@click.option("--neighbours", type=int, default=10, show_default=True,
              help="single-text mode: reference neighbours each score averages over")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True,
              help=DTYPE_HELP)
def scan_shift(model_dir: str, out_dir: str, original_path: str | None, modified_path: str | None,
               texts_path: str | None, reference_path: str | None, calibrate_path: str | None, fpr: float,
               representation: str, top_k: int, neighbours: int, dtype: str) -> None:
    """Embedding shift of modified texts vs their originals (pair mode) or of texts vs reference texts."""
    from .errors import InputError
    from .security.shift import EmbeddingShiftDetector, read_lines, read_pairs
    from .tasks.classify import Classifier

    pair_mode = original_path is not None or modified_path is not None
    if pair_mode == (texts_path is not None or reference_path is not None):
        raise InputError("give either --original and --modified (pair mode) or --texts and --reference "
                         "(single-text mode)")
    if pair_mode and not (original_path and modified_path):
        raise InputError("pair mode needs both --original and --modified")
    if not pair_mode and not (texts_path and reference_path):
        raise InputError("single-text mode needs both --texts and --reference")
    if top_k < 0:
        raise InputError(f"--top-k must be 0 or more, found {top_k}")
    detector = EmbeddingShiftDetector(Classifier.from_pretrained(model_dir, dtype=dtype),
                                      representation=representation, neighbours=neighbours)
    if pair_mode:
        originals, modifieds = read_lines(original_path, "--original"), read_lines(modified_path, "--modified")
        if len(originals) != len(modifieds):
            raise InputError(f"--original has {len(originals)} texts but --modified has {len(modifieds)}; "
                             "give one modified text per original, line by line")
        if calibrate_path:
            detector.calibrate(*read_pairs(calibrate_path), false_positive_rate=fpr)
        report = detector.compare(originals, modifieds, top_k=top_k)
    else:
        detector.fit_reference(read_lines(reference_path, "--reference"))
        if calibrate_path:
            detector.calibrate_single(read_lines(calibrate_path, "--calibrate"), false_positive_rate=fpr)
        report = detector.score(read_lines(texts_path, "--texts"), top_k=top_k)
    paths = report.write(out_dir)
    flagged = (f"{report.flagged} of {report.count} flagged above {report.threshold:.4g}" if report.calibration
               else f"{report.count} scored (no --calibrate: nothing flagged)")
    click.echo(f"{report.mode} shift ({representation}): mean {report.mean_score:.4f}; {flagged}; "
               f"report in {paths['markdown']}")


@scan.command("backdoor")
@click.argument("model_dir")
@click.argument("texts_file")
@click.option("--out", "out_dir", required=True, help="directory for backdoor.json, backdoor.md and the PNG")
@click.option("--top-k", type=int, default=10, show_default=True,
              help="single words per target class verified on the clean texts (after the vocabulary screen)")
@click.option("--threshold", type=float, default=None,
              help="flip rate from which the model is called backdoored [default: 0.9, fixed a priori]")
@click.option("--verify-texts", type=int, default=200, show_default=True,
              help="clean texts per target class each candidate is inserted into")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the text sampling and positions")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="auto", show_default=True,
              help=DTYPE_HELP)
def scan_backdoor(model_dir: str, texts_file: str, out_dir: str, top_k: int, threshold: float | None,
                  verify_texts: int, seed: int, dtype: str) -> int:
    """Search the classifier in MODEL_DIR for trigger words that force a class, using clean TEXTS_FILE
    (one text per line, or a .tsv/.csv/.jsonl with a text column)."""
    from .security.backdoor import DEFAULT_THRESHOLD, BackdoorTriggerScanner, read_texts

    texts = read_texts(texts_file)  # a missing file fails before the model loads
    scanner = BackdoorTriggerScanner.from_pretrained(
        model_dir, dtype=dtype, top_k=top_k, verify_texts=verify_texts, seed=seed,
        threshold=DEFAULT_THRESHOLD if threshold is None else threshold)
    report = scanner.scan(texts)
    paths = report.write(out_dir)
    best = report.candidates[0]
    click.echo(f"{report.verdict}: score {report.score:.3f} (threshold {report.threshold:g}); best candidate "
               f"{best.text!r} -> {best.target} flips {best.flipped} of {best.trials} texts; report in "
               f"{paths['markdown']}")
    return 0


@scan.command("confidence")
@click.argument("model_dir")
@click.option("--texts", "texts_path", required=True,
              help="in-distribution texts: one per line, or CSV/TSV (header with text and optional label) or JSONL")
@click.option("--labels", "labels_path", help="gold labels, one per line in the order of --texts (enables ECE)")
@click.option("--fit", "fit_path", help="training texts for the Mahalanobis scores (same formats; labels used "
              "when present, else predictions), or the mahalanobis_fit.npz of an earlier run")
@click.option("--ood", "ood_path", help="out-of-distribution texts (same formats; labels ignored): AUROC, FPR@95")
@click.option("--out", "out_dir", required=True, help="directory for confidence.json/.md, PNGs and scores")
@click.option("--features", default=None, help="Mahalanobis features, comma-separated: cls, mean, pooled "
              "[default: all the model has]")
@click.option("--bins", type=int, default=15, show_default=True, help="equal-width calibration bins")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="energy temperature T")
@click.option("--shrinkage", default="auto", show_default=True,
              help="covariance shrinkage: auto (Ledoit-Wolf) or a number in [0, 1]")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True)
def scan_confidence(model_dir: str, texts_path: str, labels_path: str | None, fit_path: str | None,
                    ood_path: str | None, out_dir: str, features: str | None, bins: int, temperature: float,
                    shrinkage: str, dtype: str) -> None:
    """Confidence, calibration (ECE, reliability diagram) and OOD scores (MSP, energy, Mahalanobis)."""
    from pathlib import Path

    from .security.confidence import ClassifierConfidenceAnalyzer, read_texts

    chosen = None if features is None else [f.strip() for f in features.split(",") if f.strip()]
    analyzer = ClassifierConfidenceAnalyzer.from_pretrained(model_dir, dtype=dtype, features=chosen, bins=bins,
                                                            temperature=temperature, shrinkage=shrinkage)
    texts, labels = read_texts(texts_path, labels_path)
    ood_texts = read_texts(ood_path)[0] if ood_path else None
    saved_fit = None
    if fit_path and Path(fit_path).suffix.lower() == ".npz":
        analyzer.load(fit_path)
    elif fit_path:
        analyzer.fit(*read_texts(fit_path))
        saved_fit = analyzer.save(Path(out_dir) / "mahalanobis_fit.npz")
    report = analyzer.analyze(texts, labels, ood_texts=ood_texts, model=model_dir)
    report.write(out_dir)
    parts = [f"{report.num_texts} texts", f"mean confidence {report.mean_confidence:.3f}"]
    if report.ece is not None:
        parts.append(f"accuracy {report.accuracy:.3f}, ECE {report.ece:.4f}")
    if report.best_score is not None:
        best = report.metrics(report.best_score)
        parts.append(f"best OOD score {best.score}: AUROC {best.auroc:.3f}, FPR@95 {best.fpr_at_95_tpr:.3f}")
    click.echo(f"wrote {out_dir}/confidence.md ({'; '.join(parts)})")
    if saved_fit is not None:
        click.echo(f"saved the Mahalanobis fit to {saved_fit} (pass it to --fit to score later without refitting)")


@scan.command("membership")
@click.argument("model_dir")
@click.option("--members", "members_file", required=True, help="texts known to be in the training data")
@click.option("--non-members", "non_members_file", required=True, help="texts known not to be in it")
@click.option("--reference", default=None,
              help="a reference MLM with the same tokenizer (e.g. the model MODEL_DIR was trained from): adds the "
                   "calibrated score, target - reference")
@click.option("--score", "kind", type=click.Choice(["loss", "pll"]), default="loss", show_default=True,
              help="loss: MLM loss under fixed seeded masks; pll: pseudo-log-likelihood (one pass per token)")
@click.option("--documents", type=click.Choice(["blank-line", "line"]), default="blank-line", show_default=True,
              help="how the text files hold texts: documents separated by blank lines, or one text per line")
@click.option("--max-length", type=int, default=128, show_default=True,
              help="window length: longer texts are scored in consecutive windows")
@click.option("--max-windows", type=int, default=None, help="score at most this many windows per text")
@click.option("--draws", type=int, default=4, show_default=True, help="loss: mask draws per window")
@click.option("--mask-rate", type=float, default=0.15, show_default=True, help="loss: share of tokens masked")
@click.option("--pll-max-tokens", type=int, default=128, show_default=True, help="pll: tokens scored per text")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the masks")
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True,
              help=DTYPE_HELP)
@click.option("--out", "out_dir", required=True, help="directory for membership.json, membership.md and PNGs")
def scan_membership(model_dir: str, members_file: str, non_members_file: str, reference: str | None, kind: str,
                    documents: str, max_length: int, max_windows: int | None, draws: int, mask_rate: float,
                    pll_max_tokens: int, seed: int, dtype: str, out_dir: str) -> None:
    """Membership inference against the MLM in MODEL_DIR: AUC and TPR at 1% FPR of members vs non-members."""
    from .security.membership import MembershipInference, read_texts

    members, non_members = read_texts(members_file, documents), read_texts(non_members_file, documents)
    attack = MembershipInference.from_pretrained(
        model_dir, reference, dtype=dtype, max_length=max_length, max_windows=max_windows, draws=draws,
        mask_rate=mask_rate, pll_max_tokens=pll_max_tokens, seed=seed)
    report = attack.evaluate(members, non_members, kind)
    paths = report.write(out_dir)
    calibrated = (f"; calibrated AUC {report.calibrated_auc:.4f}, TPR@1%FPR {report.calibrated_tpr_at_1pct_fpr:.4f}"
                  if report.calibrated_auc is not None else "")
    click.echo(f"{kind} score: AUC {report.auc:.4f}, TPR@1%FPR {report.tpr_at_1pct_fpr:.4f}{calibrated} "
               f"({len(members)} members, {len(non_members)} non-members); report in {paths['markdown']}")


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
