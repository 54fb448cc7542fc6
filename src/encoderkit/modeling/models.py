"""Encoder + head = a task model. One class per task, shared by every family."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..errors import CheckpointError, ConfigError, InputError
from ..io.checkpoints import load_extra_state, load_state, read_state_dict, write_checkpoint
from .embeddings import init_weights
from .encoder import EncoderModel, EncoderOutput
from .crf import CRF, word_emissions
from .heads import (
    MaskedLMHead,
    ReplacedTokenHead,
    SequenceClassificationHead,
    SpanHead,
    TokenClassificationHead,
)

if TYPE_CHECKING:
    from ..io.hub import ResolvedModel


@dataclass
class TaskOutput:
    logits: Any = None  # MLM: (batch, len, vocab); classification: (batch, labels); tokens: (batch, len[, labels]); multi-task: {head: (batch, labels)}
    loss: torch.Tensor | None = None
    pair_logits: torch.Tensor | None = None  # NSP / SOP: (batch, 2)
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class _Pretrained:
    """Loading and saving in the HF directory format (see ``encoderkit.io.checkpoints``)."""

    task: str = "base"
    config: EncoderConfig
    # Submodules transformers has no counterpart for (a CRF, multi-task heads): saved under our own names
    # in encoderkit_extra.safetensors, so model.safetensors stays a plain transformers checkpoint.
    extra_prefixes: tuple[str, ...] = ()
    # Learning-rate multipliers by parameter-name prefix (a CRF's transitions start at zero and need more).
    learning_rate_multipliers: dict[str, float] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, **kwargs: Any):
        return load_model(path, task=cls.task, **kwargs)

    def save_pretrained(self, directory: str | Path, **kwargs: Any) -> Path:
        return save_model(self, directory, **kwargs)

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())  # type: ignore[attr-defined]


class Encoder(EncoderModel, _Pretrained):
    """The bare encoder (``BertModel`` & co.): hidden states and, where the family has one, the pooled output."""

    task = "base"

    def __init__(self, config: EncoderConfig, add_pooler: bool | None = None) -> None:
        super().__init__(config, add_pooler)
        init_weights(self, config.initializer_range)


class _TaskModel(nn.Module, _Pretrained):
    uses_pooler = False

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = EncoderModel(config, add_pooler=self.uses_pooler)

    def _finish_init(self) -> None:
        init_weights(self, self.config.initializer_range)
        if getattr(self, "mlm_head", None) is not None and self.config.tie_word_embeddings:
            self.mlm_head.decoder.weight = self.encoder.embeddings.word.weight

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                output_attentions, first_only: bool = False) -> EncoderOutput:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must have shape (batch, length), found {tuple(input_ids.shape)}")
        return self.encoder(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                            output_attentions, first_only=first_only)

    @staticmethod
    def _output(out: EncoderOutput, **fields: Any) -> TaskOutput:
        return TaskOutput(last_hidden_state=out.last_hidden_state, hidden_states=out.hidden_states,
                          attentions=out.attentions, **fields)


class EncoderForMaskedLM(_TaskModel):
    task = "masked-lm"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.mlm_head = MaskedLMHead(config, self.encoder.embeddings.word)
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False, sparse: bool = False) -> TaskOutput:
        """``sparse=True`` (with labels): the vocabulary projection runs only at the labelled positions,
        and ``logits`` is (labelled positions, vocab) in row-major order of those positions."""
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions)
        logits, loss = mlm_logits_and_loss(self.mlm_head, out.last_hidden_state, labels, sparse)
        return self._output(out, logits=logits, loss=loss)


def mlm_logits_and_loss(head: MaskedLMHead, hidden: torch.Tensor, labels: torch.Tensor | None,
                        sparse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if labels is None:
        return head(hidden), None
    if sparse:
        selected = labels != -100
        logits = head(hidden[selected])
        return logits, F.cross_entropy(logits.float(), labels[selected])
    logits = head(hidden)
    return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)


class EncoderForPreTraining(_TaskModel):
    """MLM plus the sentence-pair objective of the family: NSP (BERT) or SOP (ALBERT)."""

    task = "pretraining"
    uses_pooler = True

    def __init__(self, config: EncoderConfig) -> None:
        if config.family.pair_objective is None:
            raise ConfigError(f"{config.model_type} has no sentence-pair pre-training head (NSP/SOP); "
                              "use EncoderForMaskedLM")
        super().__init__(config)
        self.mlm_head = MaskedLMHead(config, self.encoder.embeddings.word)
        self.pair_head = nn.Linear(config.hidden_size, 2)
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                pair_labels=None, output_hidden_states=False, output_attentions=False,
                sparse: bool = False) -> TaskOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions)
        logits, loss = mlm_logits_and_loss(self.mlm_head, out.last_hidden_state, labels, sparse)
        pair_logits = self.pair_head(out.pooler_output)
        if pair_labels is not None:
            pair_loss = F.cross_entropy(pair_logits.float(), pair_labels.view(-1))
            loss = pair_loss if loss is None else loss + pair_loss
        return self._output(out, logits=logits, pair_logits=pair_logits, loss=loss)


class EncoderForReplacedTokenDetection(_TaskModel):
    """ELECTRA's discriminator (``ElectraForPreTraining``): a replaced/original logit per token."""

    task = "replaced-token-detection"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.rtd_head = ReplacedTokenHead(config)
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> TaskOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions)
        logits = self.rtd_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
            loss = F.binary_cross_entropy_with_logits(logits[real].float(), labels[real].float())
        return self._output(out, logits=logits, loss=loss)


class EncoderForSequenceClassification(_TaskModel):
    task = "sequence-classification"

    def __init__(self, config: EncoderConfig) -> None:
        self.uses_pooler = config.family.classifier == "pooled"
        super().__init__(config)
        self.classifier = SequenceClassificationHead(config, config.num_labels)
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> TaskOutput:
        # Training a head on [CLS]: the last layer computes only those rows (``EncoderModel.forward``'s first_only;
        # last_hidden_state is then (batch, 1, hidden)). SST-2 with all-MiniLM-L6-v2: 1/8 of a step's products.
        first_only = self.training and self.classifier.pooling == "cls"
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions, first_only)
        logits = self.classifier.from_states(out.last_hidden_state, attention_mask, out.pooler_output)
        loss = None if labels is None else classification_loss(logits, labels, self.config.problem_type)
        return self._output(out, logits=logits, loss=loss)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """Cross-entropy for class ids, BCE for multi-hot rows, MSE for one regression output."""
    if problem_type is None:
        if logits.shape[-1] == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int32, torch.int64):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1))
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return F.cross_entropy(logits.float(), labels.view(-1))


def task_settings(config: EncoderConfig) -> dict[str, Any]:
    """What encoderkit records about a fine-tuned model in config.json (``"encoderkit"``: task kind,
    max length, CRF, multi-task heads ...); transformers keeps the key and ignores it."""
    settings = config.extra.get("encoderkit")
    return dict(settings) if isinstance(settings, dict) else {}


class EncoderForTokenClassification(_TaskModel):
    """A tag per token; with ``"crf": true`` in the task settings, a CRF over the words' first sub-tokens."""

    task = "token-classification"
    extra_prefixes = ("crf.",)
    learning_rate_multipliers = {"crf.": 100.0}

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.token_classifier = TokenClassificationHead(config, config.num_labels)
        self.crf = CRF(config.num_labels, config.labels) if task_settings(config).get("crf") else None
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states=False, output_attentions=False) -> TaskOutput:
        """``labels``: a tag id per token, -100 where there is none (with a CRF: on every token but each
        word's first sub-token, which is how the CRF finds the words)."""
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions)
        logits = self.token_classifier(out.last_hidden_state)
        loss = None
        if labels is not None and self.crf is not None:
            starts = labels != -100
            emissions, mask = word_emissions(logits.float(), starts)
            tags, _ = word_emissions(labels.unsqueeze(-1), starts)
            has_words = mask.any(dim=1)
            log_likelihood = self.crf.log_likelihood(emissions[has_words], tags[has_words, :, 0], mask[has_words])
            loss = -log_likelihood.sum() / mask.sum().clamp(min=1)  # per word, on the scale of cross-entropy
        elif labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)
        return self._output(out, logits=logits, loss=loss)


class EncoderForQuestionAnswering(_TaskModel):
    task = "question-answering"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.span_head = SpanHead(config)
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_hidden_states=False,
                output_attentions=False) -> TaskOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions)
        start, end = self.span_head(out.last_hidden_state)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = qa_loss(start, end, start_positions, end_positions, attention_mask)
        return self._output(out, start_logits=start, end_logits=end, loss=loss)


def qa_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
            end_positions: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Extractive QA's loss: the mean of the start and the end ``span_loss``."""
    return (span_loss(start_logits, start_positions, attention_mask)
            + span_loss(end_logits, end_positions, attention_mask)) / 2


def span_loss(logits: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy of the answer's start (or end) token over the real tokens of each sequence.

    Padding is no candidate: its logits are masked out of the softmax, so an example's loss does not depend on
    the lengths of the other sequences in its batch. transformers' *ForQuestionAnswering (like BERT's code)
    leaves padding in. Here that is no option: the unpadded path leaves padding states at zero, so padding
    would keep a fixed logit, the head's bias, that training cannot lower (bench/finetune.py's one SQuAD epoch
    scored F1 13.8 and 11.9 that way, 14.7 to 18.4 masked). transformers' padding states are real, and pushing
    their logits down seems to help short runs with random batches: its Trainer with this loss instead of its
    own scored about 2 F1 lower after one epoch of the 4k-question benchmark (22.0 -> 20.2 and 17.6 -> 15.8 at
    two seeds; the transformers-masked ablation of bench/finetune.py). With this loss on both sides, dropout
    off, the same head and batch order, encoderkit's and transformers' Trainers give the same loss curve and
    the same scores after that epoch (bench/finetune_parity.py). Positions beyond the sequence are ignored, as
    in transformers."""
    logits = logits.float()
    if attention_mask is not None:
        logits = logits.masked_fill(attention_mask == 0, torch.finfo(logits.dtype).min)
    length = logits.shape[1]
    return F.cross_entropy(logits, positions.clamp(0, length), ignore_index=length)


@dataclass(frozen=True)
class HeadSpec:
    """One head of a multi-task classifier."""

    labels: tuple[str, ...]
    multi_label: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "multi_label": self.multi_label}


def multitask_heads(config: EncoderConfig) -> dict[str, HeadSpec]:
    heads = task_settings(config).get("heads")
    if not isinstance(heads, dict) or not heads:
        raise ConfigError('a multi-task model needs "heads" in the "encoderkit" section of config.json')
    return {name: HeadSpec(tuple(spec["labels"]), bool(spec.get("multi_label"))) for name, spec in heads.items()}


class EncoderForMultiTask(_TaskModel):
    """One encoder, several sequence-classification heads (single- or multi-label), trained jointly.

    Each example belongs to one head (``task_ids``). ``labels`` is (batch, width) float: for a
    single-label head the class id in column 0, for a multi-label head the multi-hot row in the first
    ``len(labels)`` columns. The encoder saves as the family's base model (transformers loads it as
    ``BertModel`` & co.); the heads go to encoderkit_extra.safetensors.
    """

    task = "multitask"
    extra_prefixes = ("heads.",)

    def __init__(self, config: EncoderConfig) -> None:
        self.uses_pooler = config.family.classifier == "pooled"
        super().__init__(config)
        self.head_specs = multitask_heads(config)
        self.head_names = list(self.head_specs)
        self.heads = nn.ModuleDict({name: SequenceClassificationHead(config, len(spec.labels))
                                    for name, spec in self.head_specs.items()})
        self._finish_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, task_ids=None,
                labels=None, output_hidden_states=False, output_attentions=False) -> TaskOutput:
        first_only = self.training and all(head.pooling == "cls" for head in self.heads.values())
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states,
                           output_attentions, first_only)
        logits = {name: head.from_states(out.last_hidden_state, attention_mask, out.pooler_output)
                  for name, head in self.heads.items()}
        loss = None
        if labels is not None:
            if task_ids is None:
                raise InputError("multi-task training needs task_ids: which head each example belongs to")
            loss = logits[self.head_names[0]].new_zeros((), dtype=torch.float32)
            for index, name in enumerate(self.head_names):
                rows = task_ids == index
                if not bool(rows.any()):
                    continue
                spec, head_logits = self.head_specs[name], logits[name][rows].float()
                if spec.multi_label:
                    part = F.binary_cross_entropy_with_logits(head_logits, labels[rows, :len(spec.labels)],
                                                              reduction="sum") / len(spec.labels)
                else:
                    part = F.cross_entropy(head_logits, labels[rows, 0].long(), reduction="sum")
                loss = loss + part
            loss = loss / input_ids.shape[0]  # every example counts once, whatever its head
        return self._output(out, logits=logits, loss=loss)


TASK_MODELS: dict[str, type[nn.Module]] = {
    "base": Encoder,
    "masked-lm": EncoderForMaskedLM,
    "pretraining": EncoderForPreTraining,
    "replaced-token-detection": EncoderForReplacedTokenDetection,
    "sequence-classification": EncoderForSequenceClassification,
    "token-classification": EncoderForTokenClassification,
    "question-answering": EncoderForQuestionAnswering,
    "multitask": EncoderForMultiTask,
}

# transformers' class name = family stem + this suffix (ELECTRA's "ForPreTraining" is its discriminator).
HF_SUFFIX = {
    "base": "Model",
    "masked-lm": "ForMaskedLM",
    "pretraining": "ForPreTraining",
    "replaced-token-detection": "ForPreTraining",
    "sequence-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
    "multitask": "Model",  # transformers sees the shared encoder; the heads are encoderkit's
}


def hf_architecture(config: EncoderConfig, task: str) -> str:
    return config.family.hf_class_stem + HF_SUFFIX[task]


def task_from_architectures(config: EncoderConfig) -> str:
    """The task a checkpoint was saved for, read from config.json's ``architectures``; "base" if unknown."""
    if task_settings(config).get("task") == "multitask":
        return "multitask"
    for name in config.architectures or ():
        stem = config.family.hf_class_stem
        if not name.startswith(stem):
            continue
        suffix = name[len(stem):]
        if suffix == "ForPreTraining":  # NSP/SOP where the family has one, else its RTD discriminator
            return "pretraining" if config.family.pair_objective else "replaced-token-detection"
        for task, task_suffix in HF_SUFFIX.items():
            if task_suffix == suffix and task != "multitask":
                return task
    return "base"


def build_model(config: EncoderConfig, task: str = "base") -> nn.Module:
    """A freshly initialised model for ``task`` (see ``TASK_MODELS``)."""
    if task not in TASK_MODELS:
        raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASK_MODELS)}")
    if task == "replaced-token-detection" and "rtd" not in config.family.head_rules:
        raise ConfigError("replaced-token detection is ELECTRA's and DeBERTa-v3's objective; the config is "
                          + config.model_type)
    return TASK_MODELS[task](config)


# ---------------------------------------------------------------------------------------------
# Loading and saving in the HF directory format (the format itself: ``encoderkit.io.checkpoints``)
# ---------------------------------------------------------------------------------------------
def load_model(
    path: str | Path | ResolvedModel | None = None,
    task: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    allow_pickle: bool = False,
    labels: list[str] | None = None,
    config: EncoderConfig | None = None,
    new_head_expected: bool = False,
    new_head_seed: int | None = None,
    head_required: str | None = None,
) -> nn.Module:
    """Load an HF-format model directory (or a sentence-transformers one; or a ``ResolvedModel`` a caller resolved
    already) into encoderkit's model code.

    ``task`` picks the head ("base", "masked-lm", "sequence-classification", ...); None reads it from
    config.json's ``architectures``. ``labels`` sets the label names of a new classification head.
    ``new_head_expected`` (fine-tuning): a head missing from the checkpoint is noted at INFO, not warned about.
    ``new_head_seed``: the tensors the checkpoint lacks (a new head) are initialised after ``torch.manual_seed`` of
    it, as the first draws, as transformers initialises missing weights after loading. Drawn before loading, the
    head's weights would be whatever followed the encoder's millions of draws: a function of the encoder's size.
    ``head_required``: what needs the head (e.g. "a SPLADE encoder"); a head the checkpoint lacks is then a
    CheckpointError saying so, where it is otherwise initialised anew with a warning."""
    from ..io.hub import resolve_model

    resolved = resolve_model(path)
    if config is None:
        config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    if labels is not None:
        config = config.with_labels(labels)
    if task is None:
        task = task_from_architectures(config)
    model = build_model(config, task)
    state = read_state_dict(resolved.weights_dir, allow_pickle=allow_pickle)
    fresh = load_state(model, state, source=str(resolved.weights_dir),
                       new_head_expected=new_head_expected or head_required is not None)
    head_missing = [name for name in fresh if ".pooler." not in f".{name}"]
    if head_required is not None and head_missing:
        raise CheckpointError(f"{resolved.weights_dir} has no trained {task} head ({', '.join(head_missing[:4])}"
                              f"{' ...' if len(head_missing) > 4 else ''} missing), which {head_required} needs")
    load_extra_state(model, resolved.weights_dir, new_head_expected)
    if new_head_seed is not None and fresh:
        torch.manual_seed(new_head_seed)
        init_fresh(model, set(fresh), config.initializer_range)
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    model.source = resolved  # type: ignore[attr-defined]
    return model


def init_fresh(model: nn.Module, fresh: set[str], std: float) -> None:
    """``init_weights`` of each leaf module (in module order) whose parameters are all in ``fresh``."""
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        if own and next(module.children(), None) is None and all(p in fresh for p in own):
            init_weights(module, std)


def load_weights(model: nn.Module, directory: str | Path) -> None:
    """Load a saved directory's weights (transformers-named and extra) into an existing model."""
    directory = Path(directory)
    load_state(model, read_state_dict(directory), source=str(directory))
    load_extra_state(model, directory)


def save_model(model: nn.Module, directory: str | Path, *, tokenizer: Any = None) -> Path:
    """Write config.json + model.safetensors under transformers' names (see ``checkpoints.write_checkpoint``),
    and the tokenizer when given. A task model that transformers sees as the bare encoder (multi-task) is
    saved under base-model names."""
    task = getattr(model, "task", None)
    if task is None:
        raise ConfigError(f"cannot save a {type(model).__name__}: not an encoderkit model")
    as_base = isinstance(model, Encoder) or HF_SUFFIX[task] == "Model"
    return write_checkpoint(model, directory, architecture=hf_architecture(model.config, task), as_base=as_base,
                            tokenizer=tokenizer)
