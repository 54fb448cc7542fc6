"""Fine-tuning: a pretrained encoder plus labelled data becomes a task model, with the BERT paper's recipe.

Task kinds: ``classify`` (single texts), ``pair`` (text pairs), ``multilabel`` (sigmoid per label),
``ner`` (CoNLL files; tags on each word's first sub-token, optional CRF), ``qa`` (SQuAD v1.1, doc-stride
windows) and ``multitask`` (one encoder, one classification head per named data set, trained jointly).

The recipe (``Recipe``): AdamW, lr 5e-5 (the paper searched 2e-5..5e-5), 10% linear warm-up then
linear decay, weight decay 0.01 but none on biases and LayerNorm, clipping at 1.0, 3 epochs (2 for QA),
evaluation after every epoch, the best model by the task metric kept, optional early stopping;
dynamic padding and length-grouped batches (random batches for QA). The output directory is an HF
directory (config.json, model.safetensors, tokenizer files) that transformers loads as the matching
*ForSequenceClassification / *ForTokenClassification / *ForQuestionAnswering, plus ``eval_results.json`` and ``training/``
(checkpoints, metrics.jsonl, loss.png). Rerunning the same command resumes an interrupted run.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .. import metrics
from ..config import EncoderConfig
from ..data.features import (check_known_labels, check_label_types, classification_features, collate, label_list,
                             ner_features, qa_features)
from ..distributed import world_and_rank
from ..data.tasks import (ClassificationExample, QAExample, TaggedSentence, iob1_to_iob2, read_classification,
                          read_conll, read_squad, split_validation)
from ..errors import DataError, InputError
from ..precision import resolve_device
from ..modeling.models import HeadSpec
from ..tokenizer import Tokenizer
from .config import TrainingConfig
from .ddp import distributed_run
from .trainer import Trainer

log = logging.getLogger(__name__)

TASK_KINDS = ("classify", "pair", "multilabel", "ner", "qa", "multitask")
# Length-grouped batches by default only from this many steps an epoch (8,000 examples at batch 32): at 63 steps they
# cost SST-2 accuracy, at 500 they did not (bench/finetune_small.py); between the two the evidence is mixed, so the
# default stays random there. Full-epoch runs of real datasets are far above it and keep grouping's speed.
GROUPED_FROM_STEPS = 250


@dataclass
class Recipe:
    """Fine-tuning hyperparameters; the defaults follow Devlin et al. (2019), appendix A.3."""

    epochs: float | None = None  # None: 3, or 2 for QA
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    max_length: int | None = None  # None: 128, or 384 for QA
    doc_stride: int = 128  # QA: overlap of consecutive context windows, in tokens
    max_answer_length: int = 30  # QA: longest answer, in tokens
    max_question_tokens: int = 64
    crf: bool = False  # NER: a CRF over the words' tags
    label_all_subtokens: bool = False  # NER: label every sub-token, not only each word's first
    # None: length-grouped batches (less padding) where an epoch has at least GROUPED_FROM_STEPS steps, except for QA:
    # random batches. Grouped batches each hold one narrow band of lengths; over a few dozen steps that costs
    # accuracy (bench/finetune_small.py: SST-2 at 2,000 rows, 63 steps, 0.9 points below transformers' Trainer over
    # 15 seeds) and saves little time. A SQuAD paragraph's doc-stride windows have equal lengths, so length grouping
    # puts them in the same batch (22.6 paragraphs per 32 features against 31.2 at random), and QA's F1 came out
    # lower for both trainers (bench/finetune.py's seed spread); the unpadded attention groups make random batches
    # as fast here.
    group_by_length: bool | None = None
    early_stopping_patience: int | None = None
    eval_steps: int | None = None  # None: after every epoch
    save_steps: int = 500
    valid_fraction: float = 0.1  # carved from the training data (seeded) when no validation file is given
    bf16: bool = False  # bf16 autocast
    seed: int = 42
    split_seed: int | None = None  # seed of the carved validation split (None: ``seed``); fix it to vary only training
    show_progress: bool = True
    device: str = "cpu"  # "cuda" / "cuda:N": training and evaluation on that GPU

    def __post_init__(self) -> None:
        if self.epochs is not None and self.epochs <= 0:
            raise InputError(f"epochs must be positive, found {self.epochs}")
        if self.batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {self.batch_size}")
        self.device = str(resolve_device(self.device))


@dataclass
class FinetuneResult:
    out_dir: Path
    task: str
    metrics: dict[str, float]  # the kept (best) model's validation metrics
    best_step: int | None
    steps: int
    train_examples: int
    valid_examples: int
    examples_per_second: float
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)


# ---------------------------------------------------------------------------------------------
# Task kinds
# ---------------------------------------------------------------------------------------------
class TaskKind:
    """How one kind of task reads data, chooses labels, builds features and evaluates a model."""

    name = ""
    model_task = ""
    main_metric = ""
    greater_is_better = True  # the main metric's direction (a loss, such as the reranker's BCE, is lower-better)

    def summary(self) -> dict[str, Any]:
        """What the kind adds to eval_results.json."""
        return {}
    default_max_length = 128
    default_epochs = 3.0
    default_group_by_length = True

    def __init__(self, **columns: Any) -> None:
        self.columns = columns

    def read(self, path: Any, *, labelled: bool = True) -> list:
        raise NotImplementedError

    def split(self, examples: list, fraction: float, seed: int) -> tuple[list, list]:
        return split_validation(examples, fraction, seed)

    def labels(self, examples: list) -> Any:
        return None

    def check_valid(self, examples: list, labels: Any, source: Any) -> None:
        pass

    def settings(self, recipe: Recipe, labels: Any) -> dict[str, Any]:
        return {}

    def features(self, tokenizer: Tokenizer, examples: list, labels: Any, recipe: Recipe, training: bool) -> list[dict]:
        raise NotImplementedError

    def configure(self, config: EncoderConfig, labels: Any) -> EncoderConfig:
        return config.with_labels(list(labels))

    def pipeline(self, model: torch.nn.Module, tokenizer: Tokenizer, dtype: str) -> Any:
        raise NotImplementedError

    def evaluate(self, pipeline: Any, examples: list) -> dict[str, float]:
        raise NotImplementedError


class ClassificationKind(TaskKind):
    model_task = "sequence-classification"

    def __init__(self, name: str, **columns: Any) -> None:
        super().__init__(**columns)
        self.name = name
        self.multi_label = name == "multilabel"
        self.main_metric = "micro_f1" if self.multi_label else "accuracy"

    def read(self, path: Any, *, labelled: bool = True) -> list[ClassificationExample]:
        examples = read_classification(path, text_column=self.columns.get("text_column"),
                                       pair_column=self.columns.get("pair_column"),
                                       label_column=self.columns.get("label_column"),
                                       multi_label_separator=self.columns.get("multi_label_separator"),
                                       require_label=labelled)
        if self.name == "pair" and examples[0].pair is None:
            raise DataError(f"{path}: --task pair needs a second text column (text_pair, sentence2, text_b, "
                            "hypothesis, or name it with --pair-column)")
        if labelled:
            check_label_types(examples, str(path))
            if self.multi_label:
                for example in examples:
                    if not isinstance(example.label, list):
                        example.label = [example.label]
            elif isinstance(examples[0].label, list):
                raise DataError(f"{path}:{examples[0].line}: this file has label lists; use --task multilabel")
        return examples

    def labels(self, examples: list[ClassificationExample]) -> list[str]:
        labels = label_list([e.label for e in examples])
        if not self.multi_label and len(labels) < 2:
            raise DataError(f"the training data has only one label ({labels[0]!r}); a classifier needs at least two")
        return labels

    def check_valid(self, examples: list, labels: list[str], source: Any) -> None:
        check_known_labels(examples, labels, str(source))

    def configure(self, config: EncoderConfig, labels: list[str]) -> EncoderConfig:
        config = config.with_labels(labels)
        config.problem_type = "multi_label_classification" if self.multi_label else "single_label_classification"
        return config

    def features(self, tokenizer, examples, labels, recipe, training) -> list[dict]:
        return classification_features(tokenizer, examples, labels, max_length=recipe.max_length,
                                       multi_label=self.multi_label)

    def pipeline(self, model, tokenizer, dtype):
        from ..tasks.classify import Classifier

        return Classifier(model, tokenizer, dtype=dtype)

    def evaluate(self, pipeline, examples: list[ClassificationExample]) -> dict[str, float]:
        logits = pipeline.logits([e.text for e in examples], [e.pair or "" for e in examples]
                                 if examples[0].pair is not None else None)
        return classification_metrics(logits, [e.label for e in examples], pipeline.config.labels, self.multi_label)


def classification_metrics(logits: np.ndarray, gold: Sequence[Any], labels: Sequence[str],
                           multi_label: bool) -> dict[str, float]:
    index = {name: i for i, name in enumerate(labels)}
    if multi_label:
        truth = np.zeros(logits.shape, dtype=bool)
        for row, values in enumerate(gold):
            truth[row, [index[v] for v in values]] = True
        predicted = logits >= 0.0  # sigmoid >= 0.5
        return {"micro_f1": metrics.micro_f1_multilabel(truth, predicted),
                "macro_f1": float(np.mean([metrics.binary_f1(truth[:, j], predicted[:, j])
                                           for j in range(len(labels))])),
                "subset_accuracy": float(np.mean((truth == predicted).all(axis=1)))}
    truth = [index[g] for g in gold]
    predicted = logits.argmax(axis=1).tolist()
    return {"accuracy": metrics.accuracy(truth, predicted), "macro_f1": metrics.macro_f1(truth, predicted)}


class NerKind(TaskKind):
    name = "ner"
    model_task = "token-classification"
    main_metric = "f1"

    def read(self, path: Any, *, labelled: bool = True) -> list[TaggedSentence]:
        sentences = read_conll(path)
        if not any(t[:2] in ("E-", "S-") for s in sentences for t in s.tags):  # IOBES stays as it is
            for sentence in sentences:  # IOB1 (CoNLL-2003) -> IOB2; IOB2 is unchanged
                sentence.tags = iob1_to_iob2(sentence.tags)
        return sentences

    def split(self, examples, fraction, seed):
        return split_validation(examples, fraction, seed, groups=[s.document for s in examples])

    def labels(self, examples: list[TaggedSentence]) -> list[str]:
        tags = {t for s in examples for t in s.tags}
        # O first, then by entity type and B- before I-: a stable, readable order
        return sorted(tags, key=lambda t: (t != "O", t[2:], t[:2]))

    def check_valid(self, examples, labels, source) -> None:
        known = set(labels)
        for sentence in examples:
            for offset, tag in enumerate(sentence.tags):
                if tag not in known:
                    raise DataError(f"{source}:{sentence.line + offset}: tag {tag!r} does not occur in the training "
                                    f"data (known tags: {', '.join(labels)})")

    def settings(self, recipe, labels) -> dict[str, Any]:
        return {"crf": recipe.crf}

    def features(self, tokenizer, examples, labels, recipe, training) -> list[dict]:
        return ner_features(tokenizer, examples, labels, max_length=recipe.max_length,
                            label_all_subtokens=recipe.label_all_subtokens and not recipe.crf)

    def pipeline(self, model, tokenizer, dtype):
        from ..tasks.ner import EntityRecognizer

        return EntityRecognizer(model, tokenizer, dtype=dtype)

    def evaluate(self, pipeline, examples: list[TaggedSentence]) -> dict[str, float]:
        predicted = pipeline.tag_words([s.tokens for s in examples])
        return metrics.entity_scores([s.tags for s in examples], [p.tags for p in predicted])


class QaKind(TaskKind):
    name = "qa"
    model_task = "question-answering"
    main_metric = "f1"
    default_max_length = 384
    default_epochs = 2.0
    default_group_by_length = False  # see Recipe.group_by_length

    def read(self, path: Any, *, labelled: bool = True) -> list[QAExample]:
        return read_squad(path)

    def split(self, examples, fraction, seed):
        return split_validation(examples, fraction, seed, groups=[e.title for e in examples])

    def configure(self, config, labels):
        return config

    def settings(self, recipe, labels) -> dict[str, Any]:
        return {"doc_stride": recipe.doc_stride, "max_answer_length": recipe.max_answer_length}

    def features(self, tokenizer, examples, labels, recipe, training) -> list[dict]:
        return qa_features(tokenizer, examples, max_length=recipe.max_length, stride=recipe.doc_stride,
                           max_question_tokens=recipe.max_question_tokens, with_answers=training)

    def pipeline(self, model, tokenizer, dtype):
        from ..tasks.qa import QuestionAnswerer

        return QuestionAnswerer(model, tokenizer, dtype=dtype)

    def evaluate(self, pipeline, examples: list[QAExample]) -> dict[str, float]:
        answers = pipeline.answer(examples)
        predictions = {e.id: (found[0].text if found else "") for e, found in zip(examples, answers)}
        return metrics.squad_scores(predictions, {e.id: e.answers for e in examples})


class MultiTaskKind(TaskKind):
    """Several classification data sets, one head each; examples carry their head's index."""

    name = "multitask"
    model_task = "multitask"
    main_metric = "mean"

    def __init__(self, heads: dict[str, ClassificationKind]) -> None:
        super().__init__()
        if len(heads) < 2:
            raise InputError("multi-task fine-tuning needs at least two named training files (NAME=FILE)")
        self.heads = heads

    def read(self, paths: dict[str, Any], *, labelled: bool = True) -> list[tuple[int, ClassificationExample]]:
        if not isinstance(paths, dict) or set(paths) != set(self.heads):
            raise InputError(f"give one file per head: {', '.join(self.heads)}")
        return [(index, example) for index, name in enumerate(self.heads)
                for example in self.heads[name].read(paths[name], labelled=labelled)]

    def split(self, examples, fraction, seed):
        train, valid = [], []
        for index in range(len(self.heads)):
            part = [e for e in examples if e[0] == index]
            a, b = split_validation(part, fraction, seed)
            train += a
            valid += b
        return train, valid

    def labels(self, examples) -> dict[str, HeadSpec]:
        specs = {}
        for index, (name, kind) in enumerate(self.heads.items()):
            rows = [e for i, e in examples if i == index]
            if not rows:
                raise DataError(f"no training examples for head {name!r}")
            specs[name] = HeadSpec(tuple(kind.labels(rows)), kind.multi_label)
        return specs

    def check_valid(self, examples, labels, source) -> None:
        for index, name in enumerate(self.heads):
            check_known_labels([e for i, e in examples if i == index], list(labels[name].labels),
                               str(source.get(name, name) if isinstance(source, dict) else source))

    def configure(self, config, labels):
        return config

    def settings(self, recipe, labels) -> dict[str, Any]:
        return {"heads": {name: spec.to_dict() for name, spec in labels.items()}}

    def features(self, tokenizer, examples, labels, recipe, training) -> list[dict]:
        width = max(len(s.labels) if s.multi_label else 1 for s in labels.values())
        features = []
        for index, (name, spec) in enumerate(labels.items()):
            rows = [e for i, e in examples if i == index]
            for feature in classification_features(tokenizer, rows, list(spec.labels), max_length=recipe.max_length,
                                                   multi_label=spec.multi_label):
                target = feature.pop("labels", None)
                if target is not None:
                    row = [0.0] * width
                    if spec.multi_label:
                        row[:len(target)] = target
                    else:
                        row[0] = float(target)
                    feature["labels"] = row
                feature["task_ids"] = index
                features.append(feature)
        return features

    def pipeline(self, model, tokenizer, dtype):
        from ..tasks.classify import Classifier

        return Classifier(model, tokenizer, dtype=dtype)

    def evaluate(self, pipeline, examples) -> dict[str, float]:
        result: dict[str, float] = {}
        for index, (name, kind) in enumerate(self.heads.items()):
            rows = [e for i, e in examples if i == index]
            if not rows:
                continue
            logits = pipeline.logits([e.text for e in rows], [e.pair or "" for e in rows]
                                     if rows[0].pair is not None else None)[name]
            spec = pipeline.model.head_specs[name]
            for key, value in classification_metrics(logits, [e.label for e in rows], spec.labels,
                                                     spec.multi_label).items():
                result[f"{name}_{key}"] = value
            result[f"{name}_main"] = result[f"{name}_{kind.main_metric}"]
        result["mean"] = float(np.mean([v for k, v in result.items() if k.endswith("_main")]))
        return result


def task_kind(task: str, **columns: Any) -> TaskKind:
    """The TaskKind for a task name; for ``multitask``, ``heads`` maps head names to classify/multilabel."""
    if task in ("classify", "pair", "multilabel"):
        return ClassificationKind(task, **columns)
    if task == "ner":
        return NerKind()
    if task == "qa":
        return QaKind()
    if task == "multitask":
        heads = columns.get("heads") or {}
        per_head_columns = columns.get("head_columns") or {}
        return MultiTaskKind({name: ClassificationKind(kind, **per_head_columns.get(name, {}))
                              for name, kind in heads.items()})
    raise InputError(f"unknown task {task!r}; choose one of {', '.join(TASK_KINDS)}")


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------
def finetune(task: str | TaskKind, train: Any, out_dir: str | Path, *, valid: Any = None,
             model: str | Path | None = None, recipe: Recipe | None = None, resume: bool = True,
             **columns: Any) -> FinetuneResult:
    """Fine-tune ``model`` (default: all-MiniLM-L6-v2) on ``train`` and write the best model to ``out_dir``.

    ``columns``: text_column, pair_column, label_column, multi_label_separator (classification); for
    multitask, ``heads={name: "classify"|"multilabel"}`` and ``train``/``valid`` as {name: path}.
    """
    with distributed_run():
        return _finetune(task if isinstance(task, TaskKind) else task_kind(task, **columns), train, Path(out_dir),
                         valid=valid, model=model, recipe=recipe or Recipe(), resume=resume)


@dataclass
class FinetuneSetup:
    """Everything a fine-tuning run needs, ready to train: ``finetune`` runs it; a benchmark can drive
    ``trainer.train_step()`` itself."""

    kind: TaskKind
    recipe: Recipe
    model: torch.nn.Module
    tokenizer: Tokenizer
    train_examples: list
    valid_examples: list
    train_features: list[dict]
    trainer: Trainer
    out_dir: Path

    def evaluate(self, model: torch.nn.Module | None = None, dtype: str | None = None) -> dict[str, float]:
        """The task metrics of ``model`` (default: the one being trained) on the validation examples."""
        dtype = dtype or ("bf16" if self.recipe.bf16 else "fp32")
        return self.kind.evaluate(self.kind.pipeline(model or self.model, self.tokenizer, dtype), self.valid_examples)


def prepare_finetune(kind: TaskKind, train: Any, out_dir: str | Path, *, valid: Any = None,
                     model: str | Path | None = None, recipe: Recipe | None = None) -> FinetuneSetup:
    """Read and check the data, build the features and the task model, and set up the Trainer."""
    from ..modeling.models import load_model
    from ..io.hub import resolve_model

    out_dir = Path(out_dir)
    recipe = dataclasses.replace(recipe or Recipe())
    recipe.epochs = recipe.epochs or kind.default_epochs
    resolved = resolve_model(model)
    base_config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    recipe.max_length = min(recipe.max_length or kind.default_max_length, base_config.max_sequence_length)

    train_examples = kind.read(train)
    if valid is not None:
        valid_examples = kind.read(valid)
    else:
        split_seed = recipe.seed if recipe.split_seed is None else recipe.split_seed
        train_examples, valid_examples = kind.split(train_examples, recipe.valid_fraction, split_seed)
        if not train_examples:  # a tiny file whose one group (document, query) became the validation set
            where = train if isinstance(train, (str, Path)) else "the training data"
            raise DataError(f"{where}: too few examples to carve a validation set from ({len(valid_examples)} "
                            "went to it, none are left to train on); add examples or give a validation file")
        log.info("no validation file: %d examples carved from the training data (seed %d)", len(valid_examples),
                 split_seed)
    labels = kind.labels(train_examples)
    kind.check_valid(valid_examples, labels, valid if valid is not None else train)

    config = kind.configure(dataclasses.replace(base_config, extra=dict(base_config.extra)), labels)
    config.extra["encoderkit"] = {"task": kind.name, "max_length": recipe.max_length, **kind.settings(recipe, labels)}
    task_model = load_model(resolved, task=kind.model_task, config=config, new_head_expected=True,
                            new_head_seed=recipe.seed)
    train_features = kind.features(tokenizer, train_examples, labels, recipe, True)
    world_size = world_and_rank()[0]
    steps_per_epoch = math.ceil(len(train_features) / (recipe.batch_size * world_size))
    if recipe.group_by_length is None:
        recipe.group_by_length = kind.default_group_by_length and steps_per_epoch >= GROUPED_FROM_STEPS
    max_steps = max(1, math.ceil(recipe.epochs * steps_per_epoch))
    eval_every = recipe.eval_steps or steps_per_epoch
    setup = FinetuneSetup(kind, recipe, task_model, tokenizer, train_examples, valid_examples, train_features,
                          None, out_dir)  # type: ignore[arg-type]
    train_config = TrainingConfig(
        output_dir=str(out_dir / "training"), max_steps=max_steps, batch_size=recipe.batch_size,
        learning_rate=recipe.learning_rate, weight_decay=recipe.weight_decay, adam_eps=recipe.adam_eps,
        warmup_ratio=recipe.warmup_ratio, schedule="linear", max_grad_norm=recipe.max_grad_norm, bf16=recipe.bf16,
        eval_every=eval_every, save_every=min(recipe.save_steps, eval_every), keep_last=2, seed=recipe.seed,
        show_progress=recipe.show_progress, group_by_length=recipe.group_by_length, drop_last=False,
        metric_for_best=kind.main_metric, greater_is_better=kind.greater_is_better,
        early_stopping_patience=recipe.early_stopping_patience, save_final=False, device=recipe.device)
    pad = tokenizer.pad_token_id
    setup.trainer = Trainer(task_model, train_config, train_features, lambda items, epoch: collate(items, pad),
                            evaluate=lambda current: setup.evaluate(current), tokenizer=tokenizer,
                            lengths=[len(f["input_ids"]) for f in train_features])
    return setup


def _finetune(kind: TaskKind, train: Any, out_dir: Path, *, valid: Any, model: str | Path | None, recipe: Recipe,
              resume: bool) -> FinetuneResult:
    from ..modeling.models import load_weights

    setup = prepare_finetune(kind, train, out_dir, valid=valid, model=model, recipe=recipe)
    trainer, training_dir = setup.trainer, out_dir / "training"
    if not resume and training_dir.exists():
        shutil.rmtree(training_dir)
    outcome = trainer.train(resume=resume)

    best_dir = training_dir / "best"
    if best_dir.is_dir():
        load_weights(setup.model, best_dir)
    best_step = outcome.get("best_step")
    kept = next((r for r in reversed(outcome["history"]) if r.get("step") == best_step and "eval_" + kind.main_metric
                 in r), None)
    scores = ({k[5:]: v for k, v in kept.items() if k.startswith("eval_")} if kept else
              {k[5:]: v for k, v in outcome["final"].items()})
    if trainer.is_main:
        setup.model.save_pretrained(out_dir, tokenizer=setup.tokenizer)
        summary = {"task": kind.name, "metrics": scores, "best_step": best_step, "steps": outcome["step"],
                   "train_examples": len(setup.train_examples), "valid_examples": len(setup.valid_examples),
                   "recipe": dataclasses.asdict(setup.recipe), **kind.summary()}
        (out_dir / "eval_results.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    history = outcome["history"]
    rate = history[-1].get("examples_per_s", 0.0) if history else 0.0
    return FinetuneResult(out_dir, kind.name, scores, best_step, outcome["step"], len(setup.train_examples),
                          len(setup.valid_examples), rate, history)


def evaluate_model(model_dir: str | Path, data: Any, *, dtype: str = "fp32", **columns: Any) -> dict[str, float]:
    """The task metrics of a fine-tuned directory on a labelled file of its task's format."""
    from ..modeling.models import load_model
    from ..io.hub import resolve_model
    from ..modeling.models import task_settings

    resolved = resolve_model(model_dir)
    model = load_model(resolved)
    settings = task_settings(model.config)
    name = settings.get("task")
    if name not in TASK_KINDS:
        raise InputError(f"{resolved.root} was not fine-tuned by encoderkit (no task in config.json's \"encoderkit\" "
                         "section); evaluate needs the task kind to read the data")
    if name == "multitask":
        columns["heads"] = {head: ("multilabel" if spec["multi_label"] else "classify")
                            for head, spec in settings["heads"].items()}
    kind = task_kind(name, **columns)
    examples = kind.read(data)
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    if name == "multitask":
        kind.check_valid(examples, model.head_specs, data)
    elif name != "qa":
        kind.check_valid(examples, model.config.labels, data)
    return kind.evaluate(kind.pipeline(model, tokenizer, dtype), examples)
