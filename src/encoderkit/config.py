"""EncoderConfig: one dataclass for every supported family, read from and written to HF config.json.

The families differ in a handful of switches (how position ids are made, whether there are segment
embeddings, a factorised embedding size, cross-layer parameter sharing, the activation, the shape
of the task heads). Everything else is the same post-norm BERT block. The field names follow
BERT's config.json; ``FAMILIES`` says how each family spells them in its own config.json.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")


@dataclass(frozen=True)
class Family:
    """How one model family differs from BERT, and how its config.json names things."""

    name: str
    hf_prefix: str  # attribute name of the base model inside HF task models ("bert" -> "bert.")
    hf_class_stem: str  # "Bert" -> BertModel, BertForMaskedLM ...
    renamed_keys: dict[str, str]  # our field -> the family's config.json key
    defaults: dict[str, Any]  # the family's defaults (as HF fills them) for keys a config.json omits
    has_pooler: bool  # the base model carries a [CLS] pooler (dense + tanh)
    positions_from_padding: bool  # RoBERTa: position ids count real tokens, starting at pad_token_id + 1
    always_project_embeddings: bool  # ALBERT maps embeddings to hidden size even when they are equal
    mlm_activation: str | None  # activation of the MLM transform; None = the config's hidden_act
    classifier: str  # "pooled": pooler -> linear; "dense_tanh"/"dense_gelu"/"dense_relu": [CLS] -> dense -> act -> linear
    pair_objective: str | None  # "nsp" (BERT), "sop" (ALBERT) or None


_BERT_DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0, initializer_range=0.02,
)

FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "bert", "Bert", {}, dict(_BERT_DEFAULTS), True, False, False, None, "pooled", "nsp"),
    "roberta": Family(
        "roberta", "roberta", "Roberta", {},
        dict(_BERT_DEFAULTS, vocab_size=50265, pad_token_id=1, bos_token_id=0, eos_token_id=2),
        True, True, False, "gelu", "dense_tanh", None,
    ),
    "distilbert": Family(
        "distilbert", "distilbert", "DistilBert",
        dict(hidden_size="dim", num_hidden_layers="n_layers", num_attention_heads="n_heads",
             intermediate_size="hidden_dim", hidden_act="activation", hidden_dropout_prob="dropout",
             attention_probs_dropout_prob="attention_dropout", classifier_dropout="seq_classif_dropout"),
        dict(_BERT_DEFAULTS, type_vocab_size=0, classifier_dropout=0.2),
        False, False, False, None, "dense_relu", None,
    ),
    "albert": Family(
        "albert", "albert", "Albert", dict(classifier_dropout="classifier_dropout_prob"),
        dict(_BERT_DEFAULTS, vocab_size=30000, embedding_size=128, hidden_size=4096, num_attention_heads=64,
             intermediate_size=16384, hidden_act="gelu_new", hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0, classifier_dropout=0.1, bos_token_id=2, eos_token_id=3),
        True, False, True, None, "pooled", "sop",
    ),
    "electra": Family(
        "electra", "electra", "Electra", {},
        dict(_BERT_DEFAULTS, embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
        False, False, False, "gelu", "dense_gelu", None,
    ),
}

# config.json keys that only matter to decoders or to transformers' internals; dropped on read.
_IGNORED_KEYS = {
    "use_cache", "is_decoder", "add_cross_attention", "_name_or_path", "transformers_version", "gradient_checkpointing",
    "torch_dtype", "dtype", "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
}


@dataclass
class EncoderConfig:
    """Shape and behaviour of an encoder. Field names follow BERT's config.json."""

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    embedding_size: int | None = None  # ALBERT / ELECTRA factorised embeddings; None = hidden_size
    num_hidden_groups: int | None = None  # ALBERT cross-layer sharing; None = no sharing
    inner_group_num: int = 1
    sinusoidal_pos_embds: bool = False  # DistilBERT's fixed sinusoidal positions (stored as weights anyway)
    tie_word_embeddings: bool = True
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    problem_type: str | None = None  # single_label_classification | multi_label_classification | regression
    architectures: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # unknown config.json keys, kept for a faithful round trip

    def __post_init__(self) -> None:
        self.validate()

    # ----- derived switches -------------------------------------------------------------------
    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def projects_embeddings(self) -> bool:
        return self.family.always_project_embeddings or self.embedding_dim != self.hidden_size

    @property
    def num_groups(self) -> int:
        """Number of distinct parameter groups of layers (ALBERT shares one group across layers)."""
        return self.num_hidden_groups or self.num_hidden_layers

    @property
    def num_unique_layers(self) -> int:
        return self.num_groups * self.inner_group_num

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def labels(self) -> list[str]:
        if self.id2label:
            return [self.id2label[i] for i in range(len(self.id2label))]
        return ["LABEL_0", "LABEL_1"]

    def with_labels(self, labels: list[str] | int) -> EncoderConfig:
        """A copy with the given label names (or that many generic ``LABEL_i`` names)."""
        if isinstance(labels, int):
            labels = [f"LABEL_{i}" for i in range(labels)]
        if len(labels) < 1 or len(set(labels)) != len(labels):
            raise ConfigError(f"labels must be distinct and at least one; got {labels!r}")
        return dataclasses.replace(self, id2label=dict(enumerate(labels)), extra=dict(self.extra))

    def validate(self) -> None:
        if self.model_type not in FAMILIES:
            raise ConfigError(
                f"unknown model_type {self.model_type!r}; encoderkit supports {', '.join(FAMILIES)}"
            )
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings", "inner_group_num")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"config field {name} must be a positive integer, found {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        if self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size must be >= 0, found {self.type_vocab_size}")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ConfigError(
                f"unsupported activation {self.hidden_act!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
            )
        if self.num_hidden_groups is not None and (
            self.num_hidden_groups <= 0 or self.num_hidden_groups > self.num_hidden_layers
        ):
            raise ConfigError(
                f"num_hidden_groups must be between 1 and num_hidden_layers ({self.num_hidden_layers}), "
                f"found {self.num_hidden_groups}"
            )
        if self.embedding_size is not None and self.embedding_size != self.hidden_size and self.model_type not in (
            "albert", "electra"
        ):
            raise ConfigError(f"{self.model_type} has no factorised embeddings; embedding_size must equal hidden_size")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.model_type == "roberta" and self.max_position_embeddings <= self.pad_token_id + 1:
            raise ConfigError("roberta needs max_position_embeddings > pad_token_id + 1 (positions start after padding)")

    @property
    def max_sequence_length(self) -> int:
        """Longest input (special tokens included) the position embeddings can address."""
        if self.family.positions_from_padding:
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    # ----- HF config.json ---------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"config.json must hold a JSON object, found {type(data).__name__}")
        model_type = data.get("model_type")
        if model_type is None:
            raise ConfigError("config.json has no 'model_type'; expected one of " + ", ".join(FAMILIES))
        if model_type not in FAMILIES:
            raise ConfigError(
                f"unknown model_type {model_type!r} in config.json; encoderkit supports {', '.join(FAMILIES)}"
            )
        family = FAMILIES[model_type]
        if data.get("is_decoder") or data.get("add_cross_attention"):
            raise ConfigError(f"this {model_type} config is a decoder (is_decoder/add_cross_attention); "
                              "encoderkit handles encoder-only models")
        position_type = data.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ConfigError(f"position_embedding_type {position_type!r} is not supported; only 'absolute'")
        hf_key = {name: family.renamed_keys.get(name, name) for name in _field_names()}
        kwargs: dict[str, Any] = {"model_type": model_type}
        for name, key in hf_key.items():
            if name in ("model_type", "extra", "id2label"):
                continue
            if key in data:
                kwargs[name] = data[key]
            elif name in family.defaults:
                kwargs[name] = family.defaults[name]
        if "id2label" in data and data["id2label"]:
            kwargs["id2label"] = {int(k): str(v) for k, v in data["id2label"].items()}
        elif "num_labels" in data:
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(int(data["num_labels"]))}
        used = set(hf_key.values()) | {"model_type", "id2label", "label2id", "num_labels", "position_embedding_type"}
        kwargs["extra"] = {k: v for k, v in data.items() if k not in used and k not in _IGNORED_KEYS}
        if model_type == "distilbert":
            kwargs["type_vocab_size"] = 0
            kwargs["layer_norm_eps"] = 1e-12  # fixed in DistilBERT, not a config field
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a field of the wrong JSON type
            raise ConfigError(f"invalid config.json: {exc}") from exc

    def to_hf_dict(self) -> dict[str, Any]:
        family = self.family
        out: dict[str, Any] = {"model_type": self.model_type}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        skip = {"model_type", "architectures", "extra", "id2label"}
        if self.model_type == "distilbert":
            skip |= {"type_vocab_size", "layer_norm_eps"}
        if self.model_type not in ("albert", "electra"):
            skip.add("embedding_size")
        if self.model_type != "albert":
            skip |= {"num_hidden_groups", "inner_group_num"}
        if self.model_type != "distilbert":
            skip.add("sinusoidal_pos_embds")
        for name in _field_names():
            if name in skip:
                continue
            value = getattr(self, name)
            if name == "embedding_size":
                value = self.embedding_dim
            elif name == "num_hidden_groups":
                value = self.num_groups
            if value is None and family.defaults.get(name) is not None:
                value = family.defaults[name]  # e.g. DistilBERT's seq_classif_dropout must be a number
            if value is None and name not in ("classifier_dropout",):
                continue
            out[family.renamed_keys.get(name, name)] = value
        if self.id2label:
            out["id2label"] = {str(i): label for i, label in self.id2label.items()}
            out["label2id"] = {label: i for i, label in self.id2label.items()}
        out.update(self.extra)
        return out

    @classmethod
    def from_json_file(cls, path: str | Path) -> EncoderConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_hf_dict(data)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(EncoderConfig)]


# ---------------------------------------------------------------------------------------------
# The model zoo: published shapes.
# ---------------------------------------------------------------------------------------------
def _bert(hidden: int, layers: int, heads: int, **kw: Any) -> dict[str, Any]:
    return dict(model_type="bert", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden, **kw)


_ROBERTA = dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
_ALBERT = dict(model_type="albert", vocab_size=30000, embedding_size=128, hidden_act="gelu_new",
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_hidden_groups=1,
               bos_token_id=2, eos_token_id=3, classifier_dropout=0.1)
_ELECTRA = dict(model_type="electra")

PRESETS: dict[str, dict[str, Any]] = {
    "bert-base": _bert(768, 12, 12),
    "bert-large": _bert(1024, 24, 16),
    "minilm-l6-h384": _bert(384, 6, 12),
    "roberta-base": dict(_ROBERTA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "roberta-large": dict(_ROBERTA, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096),
    "distilbert-base": dict(model_type="distilbert", hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                            intermediate_size=3072, type_vocab_size=0, classifier_dropout=0.2),
    "albert-base": dict(_ALBERT, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "albert-large": dict(_ALBERT, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096),
    "albert-xlarge": dict(_ALBERT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=8192),
    "albert-xxlarge": dict(_ALBERT, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64,
                           intermediate_size=16384),
    "electra-small": dict(_ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                          intermediate_size=1024),
    "electra-base": dict(_ELECTRA, embedding_size=768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072),
    "electra-large": dict(_ELECTRA, embedding_size=1024, hidden_size=1024, num_hidden_layers=24,
                          num_attention_heads=16, intermediate_size=4096, layer_norm_eps=1e-12),
    "electra-small-generator": dict(_ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                                    num_attention_heads=4, intermediate_size=1024),
    "electra-base-generator": dict(_ELECTRA, embedding_size=768, hidden_size=256, num_hidden_layers=12,
                                   num_attention_heads=4, intermediate_size=1024),
    "electra-large-generator": dict(_ELECTRA, embedding_size=1024, hidden_size=256, num_hidden_layers=24,
                                    num_attention_heads=4, intermediate_size=1024),
}


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """The config of a published model shape, e.g. ``preset("bert-base")``; overrides replace fields."""
    key = name.lower()
    if key not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return EncoderConfig(**{**PRESETS[key], **overrides})


def load_config(source: str | Path | dict[str, Any]) -> EncoderConfig:
    """A config from a preset name, a config.json path, a model directory, inline JSON or a dict of HF keys."""
    accepted = (f"give a preset name ({', '.join(PRESETS)}), a config.json path or a model directory, or inline "
                f'JSON / a dict with "model_type" (one of {", ".join(FAMILIES)})')

    def from_dict(data: Any, what: str) -> EncoderConfig:
        if isinstance(data, dict) and "model_type" not in data:
            raise ConfigError(f'{what} has no "model_type"; {accepted}')
        return EncoderConfig.from_hf_dict(data)

    if isinstance(source, dict):
        return from_dict(source, "the config dict")
    text = str(source)
    if text.lower() in PRESETS:
        return preset(text)
    if text.lstrip().startswith("{"):  # inline JSON, as in --config '{"model_type": "bert", ...}'
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config looks like inline JSON but is not valid JSON: {exc}") from exc
        return from_dict(data, "the inline JSON config")
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                data = None  # from_json_file names the problem
            if isinstance(data, dict):
                return from_dict(data, str(path))
        return EncoderConfig.from_json_file(path)
    raise ConfigError(f"{text!r} is neither a preset nor a config file; {accepted}")
