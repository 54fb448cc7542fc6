"""The pre-training job: a corpus, an objective and a model shape (or a checkpoint to continue from)."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import PRESETS, EncoderConfig, load_config
from ..data.corpus import pack_sequences, sentence_pairs, tokenize_corpus
from ..data.masking import IGNORE_INDEX, Masker, MaskingConfig
from ..errors import ConfigError, InputError
from ..families import FAMILIES
from ..modeling.models import build_model
from ..tokenizer import Tokenizer
from .config import TrainingConfig
from .ddp import distributed_run
from .trainer import Trainer

log = logging.getLogger(__name__)

OBJECTIVES = ("mlm", "mlm-nsp", "mlm-sop", "electra", "distill")
# What a run trains: every weight, or only the MLM head (the encoder kept as it is).
TRAINED_PARTS = ("all", "head")

# The share of tokens each family's paper masks: ModernBERT 30% (Warner et al., 2024); BERT's 15% otherwise.
MASK_RATES = {"modernbert": 0.30}
DEFAULT_MASK_RATE = 0.15


def default_mask_rate(model_type: str) -> float:
    return MASK_RATES.get(model_type, DEFAULT_MASK_RATE)


def resolve_masking(masking: MaskingConfig | dict[str, Any] | None, model_type: str) -> MaskingConfig:
    """A MaskingConfig is used as given; None or a dict of MaskingConfig fields without a rate (or with rate None)
    gets the family's rate (``default_mask_rate``)."""
    if isinstance(masking, MaskingConfig):
        return masking
    fields = dict(masking or {})
    if fields.get("rate") is None:
        fields["rate"] = default_mask_rate(model_type)
    try:
        return MaskingConfig(**fields)
    except TypeError as exc:
        raise InputError(f"invalid masking options {sorted(fields)}: {exc}") from exc


def _require_pair_head(config: EncoderConfig, objective: str) -> None:
    """MLM+NSP / MLM+SOP train the sentence-pair head that only some families have."""
    if config.family.pair_objective is None:
        having = ", ".join(f"{name} ({family.pair_objective.upper()})" for name, family in FAMILIES.items()
                           if family.pair_objective)
        raise ConfigError(f"--objective {objective} trains a sentence-pair head, which only {having} models have; "
                          f"{config.model_type} has none: use --objective mlm")


def _with_tokenizer(config: EncoderConfig, tok: Tokenizer, max_length: int, overrides: dict[str, Any] | None
                    ) -> EncoderConfig:
    """A fresh model's config fitted to the tokenizer: its vocabulary, padding and (where the family records them)
    bos/eos ids, and positions for max_length."""
    ids: dict[str, Any] = {}
    for field, role, fallback in (("bos_token_id", "bos", "cls"), ("eos_token_id", "eos", "sep")):
        if getattr(config, field) is not None:
            token = tok.token_id(role)
            ids[field] = token if token is not None else tok.token_id(fallback)
    return dataclasses.replace(config, vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                               max_position_embeddings=max(config.max_position_embeddings, max_length + 2), extra={},
                               **{**ids, **(overrides or {})})


@dataclass
class PretrainSetup:
    model: torch.nn.Module
    tokenizer: Tokenizer
    masker: Masker
    train_examples: list[dict]
    valid_examples: list[dict] | None


def _is_model_dir(source: Any) -> bool:
    if not isinstance(source, (str, Path)) or str(source).lstrip().startswith("{"):  # inline JSON is no path
        return False
    try:
        return Path(source).is_dir() and (Path(source) / "config.json").is_file()
    except OSError:  # e.g. a name too long for a path
        return False


def prepare(corpus: str | Path, *, objective: str = "mlm", config: str | Path | dict | None = "minilm-l6-h384",
            tokenizer: str | Path | None = None, valid: str | Path | None = None, max_length: int = 128,
            masking: MaskingConfig | dict[str, Any] | None = None, document_mode: str = "blank-line", seed: int = 0,
            cache_dir: str | Path | None = None, config_overrides: dict[str, Any] | None = None,
            teacher: str | Path | None = None, generator_config: str | Path | None = None,
            train: str = "all") -> PretrainSetup:
    """Model, tokenizer, masker and examples for a run. ``config`` is a preset name, a config.json or
    dict, or a model directory to continue pre-training from (its MLM head is added if missing).
    ``masking``: see ``resolve_masking`` (None: the family's masking rate, 30% for ModernBERT, else 15%).
    ``train``: "all", or "head" (``freeze_all_but_mlm_head``: MLM only, from a model directory)."""
    from ..modeling.models import load_model
    from ..io.hub import resolve_model

    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if train not in TRAINED_PARTS:
        raise InputError(f"unknown part to train {train!r}; choose one of {', '.join(TRAINED_PARTS)}")
    if train == "head" and (objective != "mlm" or not _is_model_dir(config)):
        raise InputError("--train head trains the MLM head of an existing model: use it with --objective mlm and "
                         "--config set to a model directory")
    task = "pretraining" if objective in ("mlm-nsp", "mlm-sop") else "masked-lm"
    if objective == "distill":
        if not _is_model_dir(teacher):
            raise InputError("distillation needs --teacher: a model directory with a trained MLM head")
        config = teacher
    continuing = _is_model_dir(config)
    tokenizer_source = tokenizer or (resolve_model(config).tokenizer_dir if continuing else resolve_model(None).tokenizer_dir)
    tok = Tokenizer.from_pretrained(tokenizer_source)
    if objective == "distill":
        from .objectives import DistillationObjective

        model = DistillationObjective(load_model(teacher, task="masked-lm"))
    elif objective == "electra":
        from .objectives import ElectraObjective

        base = load_model(config, task="base").config if continuing else load_config(config)
        base = _with_tokenizer(base, tok, max_length, config_overrides)
        torch.manual_seed(seed)
        model = ElectraObjective(base, load_config(generator_config) if generator_config else None)
        if continuing and (Path(config) / "generator").is_dir():  # an earlier ELECTRA run: both networks
            model.load_checkpoint(config)
    elif continuing:
        if task == "pretraining":
            _require_pair_head(load_config(config), objective)
        model = load_model(config, task=task)
        if model.config.vocab_size < tok.vocab_size:
            raise ConfigError(f"the tokenizer has {tok.vocab_size} tokens but the model only {model.config.vocab_size}")
    else:
        if config is None:
            raise InputError(f"name a model shape: a preset ({', '.join(PRESETS)}), a config.json or a model directory")
        model_config = _with_tokenizer(load_config(config), tok, max_length, config_overrides)
        if task == "pretraining":
            _require_pair_head(model_config, objective)
        torch.manual_seed(seed)
        model = build_model(model_config, task)
    if train == "head":
        log.info("training the MLM head only: %d weights; the encoder is frozen", freeze_all_but_mlm_head(model))
    if model.config.max_sequence_length < max_length:
        raise ConfigError(f"max_length {max_length} exceeds what the model's positions allow "
                          f"({model.config.max_sequence_length})")
    cls_id, sep_id = tok.token_id("cls"), tok.token_id("sep")
    specials = [tok.token_id(role) for role in ("cls", "sep", "pad", "mask", "unk", "bos", "eos")]
    masker = Masker(resolve_masking(masking, model.config.model_type), vocab_size=model.config.vocab_size,
                    mask_token_id=tok.mask_token_id, special_token_ids=specials, seed=seed)

    def examples(path: str | Path) -> list[dict]:
        corpus_tokens = tokenize_corpus(path, tok, mode=document_mode, cache_dir=cache_dir)
        if objective in ("mlm", "electra", "distill"):
            return pack_sequences(corpus_tokens, max_length, cls_id, sep_id)
        return sentence_pairs(corpus_tokens, max_length, cls_id, sep_id, objective=objective[4:], seed=seed)

    return PretrainSetup(model, tok, masker, examples(corpus), examples(valid) if valid else None)


def freeze_all_but_mlm_head(model: torch.nn.Module) -> int:
    """Leave only the MLM head's own weights trainable (its transform, norm and decoder bias; a decoder tied to the
    word embeddings stays as it is); returns how many weights train. For a model that has no MLM head yet (an
    embedder): the head learns to read the encoder's states as they are, so the encoder stays the embedder it was,
    and a step costs a forward pass of the encoder and the head's backward only. The start of a SPLADE model
    (README: "Retrieval beyond one dense vector")."""
    head = getattr(model, "mlm_head", None)
    if head is None:
        raise InputError(f"{type(model).__name__} has no MLM head to train")
    shared = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if not name.startswith("mlm_head.")}
    model.requires_grad_(False)
    trainable = [p for p in head.parameters() if id(p) not in shared]
    for param in trainable:
        param.requires_grad_(True)
    return sum(p.numel() for p in trainable)


EVAL_MASK_SEED = 12345


def fixed_mask_batches(masker: Masker, examples: list[dict], pad_token_id: int, batch_size: int = 64,
                       max_examples: int = 2000) -> list[dict[str, torch.Tensor]]:
    """Validation batches with static masks from ``EVAL_MASK_SEED``: the same for every run and model."""
    static = masker.fixed(EVAL_MASK_SEED)
    examples = examples[:max_examples]
    return [static.collate(examples[i:i + batch_size], pad_token_id=pad_token_id)
            for i in range(0, len(examples), batch_size)]


def mlm_evaluator(setup: PretrainSetup, batch_size: int = 64, max_examples: int = 2000):
    """Validation MLM loss and masked-token top-1 accuracy on fixed (static) masks."""
    batches = fixed_mask_batches(setup.masker, setup.valid_examples or [], setup.tokenizer.pad_token_id,
                                 batch_size, max_examples)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        model = getattr(model, "student", None) or getattr(model, "generator", None) or model  # the MLM network
        total_loss, correct, count = 0.0, 0, 0
        for batch in batches:
            out = model(**{k: v for k, v in batch.items() if k != "pair_labels"}, sparse=True)
            targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
            logits = out.logits.float()
            total_loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
            correct += int((logits.argmax(-1) == targets).sum())
            count += int(targets.numel())
        return {"loss": total_loss / max(count, 1), "accuracy": correct / max(count, 1)}

    return evaluate if batches else None


def pretrain(corpus: str | Path, output_dir: str | Path, *, objective: str = "mlm",
             config: str | Path | dict | None = "minilm-l6-h384", tokenizer: str | Path | None = None,
             valid: str | Path | None = None, max_length: int = 128,
             masking: MaskingConfig | dict[str, Any] | None = None, document_mode: str = "blank-line",
             resume: bool = True, teacher: str | Path | None = None, generator_config: str | Path | None = None,
             train: str = "all", **training: Any) -> dict[str, Any]:
    """Pre-train (or continue pre-training) and save checkpoints and the final model in HF format.
    ``train="head"``: only the MLM head of the model directory ``config`` learns (``freeze_all_but_mlm_head``).

    ``masking``: a MaskingConfig, or a dict of its fields; without a rate, the family's (``default_mask_rate``:
    0.30 for ModernBERT as in its paper, 0.15 otherwise). The result's "masking" holds the options used."""
    seed = training.pop("seed", 0)
    with distributed_run():
        return _pretrain(corpus, output_dir, objective=objective, config=config, tokenizer=tokenizer, valid=valid,
                         max_length=max_length, masking=masking, document_mode=document_mode, resume=resume,
                         seed=seed, teacher=teacher, generator_config=generator_config, train=train, **training)


def _pretrain(corpus, output_dir, *, objective, config, tokenizer, valid, max_length, masking, document_mode, resume,
              seed, teacher, generator_config, train, **training) -> dict[str, Any]:
    setup = prepare(corpus, objective=objective, config=config, tokenizer=tokenizer, valid=valid,
                    max_length=max_length, masking=masking, document_mode=document_mode, seed=seed,
                    cache_dir=Path(output_dir) / "cache", teacher=teacher, generator_config=generator_config,
                    train=train)
    train_config = TrainingConfig(output_dir=str(output_dir), seed=seed, **training)
    pad = setup.tokenizer.pad_token_id
    trainer = Trainer(setup.model, train_config, setup.train_examples,
                      lambda examples, epoch: setup.masker.collate(examples, epoch, pad_token_id=pad),
                      evaluate=mlm_evaluator(setup), forward_kwargs={"sparse": True}, tokenizer=setup.tokenizer)
    result = trainer.train(resume=resume)
    result["examples"] = len(setup.train_examples)
    result["masking"] = dataclasses.asdict(setup.masker.config)
    result["trained"] = train
    return result
