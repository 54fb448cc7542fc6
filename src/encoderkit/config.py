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
from .families import COMMON_FIELDS, FAMILIES, Family
from .presets import PRESETS

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")
POS_ATT_TYPES = ("c2p", "p2c")
# rotary scalings whose tables do not depend on the input's length within max_position_embeddings
ROPE_TYPES = ("default", "linear", "dynamic")

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
    # ----- pre-norm families (ModernBERT)
    norm_bias: bool = True  # LayerNorms have a bias
    attention_bias: bool = True  # the query/key/value and output projections have biases
    mlp_bias: bool = True
    decoder_bias: bool = True  # the MLM decoder has an output bias
    embedding_dropout: float | None = None  # None: hidden_dropout_prob
    mlp_dropout: float | None = None  # dropout inside the MLP (after the activation); None: none
    absolute_positions: bool = True  # a learned position table added to the embeddings
    layer_types: list[str] | None = None  # per layer "full_attention" | "sliding_attention"; None: all full
    local_attention: int | None = None  # sliding window: a token sees keys within local_attention // 2 of it
    global_rope_theta: float | None = None  # rotary positions (None: none) in full-attention layers
    local_rope_theta: float | None = None  # ... and in sliding-window layers
    rope_type: str = "default"  # "linear": positions divided by rope_factor; "dynamic": as "default" up to
    rope_factor: float | None = None  # max_position_embeddings (longer inputs are refused)
    num_key_value_heads: int | None = None  # grouped-query attention: heads share keys/values; None: one each
    # "cls" | "mean": what the sequence classifier reads (ModernBERT); EuroBERT: "bos" (= "cls"), "mean", or "late"
    # (the classifier on every token, its logits averaged over the real tokens)
    classifier_pooling: str = "cls"
    classifier_activation: str | None = None  # the prediction head's activation; None: hidden_act
    classifier_bias: bool = True
    # ----- disentangled attention (DeBERTa-v2/v3)
    relative_attention: bool = False
    max_relative_positions: int = -1  # < 1: max_position_embeddings
    position_buckets: int = -1  # > 0: relative positions in log buckets, this many each side
    pos_att_type: list[str] | None = None  # "c2p", "p2c"
    share_att_key: bool = False  # positions are projected by the content query/key projections
    norm_rel_ebd: str = "none"  # "layer_norm": the relative embeddings are normalised
    conv_kernel_size: int = 0  # > 0: a convolution beside the first layer
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooler_dropout: float | None = None
    pooler_hidden_act: str | None = None  # DeBERTa's classifier pooler activation; None: gelu
    legacy: bool = True  # DeBERTa's MLM head layout (cls.predictions.* vs lm_predictions.lm_head.*)
    # ----- a learned bias on attention scores by relative position in log buckets (MPNet, after T5)
    relative_attention_num_buckets: int = 0  # rows of the bias table; 0: none
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
    def is_pre_norm(self) -> bool:
        return self.family.norm_placement == "pre"

    def layer_type(self, index: int) -> str:
        return self.layer_types[index] if self.layer_types else "full_attention"

    @property
    def relative_span(self) -> int:
        """DeBERTa: relative positions -span..span-1 have an embedding each (buckets, or max_relative_positions)."""
        if self.position_buckets > 0:
            return self.position_buckets
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def head_activation(self) -> str:
        """The activation of the MLM transform (and of ModernBERT's prediction head)."""
        if self.family.classifier == "prediction_head":
            return self.classifier_activation or self.hidden_act
        return self.family.mlm_activation or self.hidden_act

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
    def kv_heads(self) -> int:
        """Heads of keys and values: fewer than the query heads with grouped-query attention (EuroBERT)."""
        return self.num_key_value_heads or self.num_attention_heads

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
        if self.embedding_size is not None and self.embedding_size != self.hidden_size and \
                not self.family.factorised_embeddings:
            raise ConfigError(f"{self.model_type} has no factorised embeddings; embedding_size must equal hidden_size")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        for name in ("classifier_activation", "pooler_hidden_act", "conv_act"):
            value = getattr(self, name)
            if value is not None and value not in SUPPORTED_ACTIVATIONS:
                raise ConfigError(f"unsupported {name} {value!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
                raise ConfigError(f"layer_types must list one of {LAYER_TYPES} for each of the "
                                  f"{self.num_hidden_layers} layers, found {self.layer_types!r}")
            if "sliding_attention" in self.layer_types:
                window = self.local_attention
                if not isinstance(window, int) or isinstance(window, bool) or window <= 0 or window % 2:
                    raise ConfigError(f"local_attention (the sliding window, {window!r}) must be a positive even "
                                      "number: a token sees local_attention // 2 tokens on each side")
        if (self.global_rope_theta is None) != (self.local_rope_theta is None) or any(
                theta is not None and not theta > 0 for theta in (self.global_rope_theta, self.local_rope_theta)):
            raise ConfigError("rotary positions need a positive global_rope_theta and local_rope_theta, found "
                              f"{self.global_rope_theta!r} and {self.local_rope_theta!r}")
        if self.global_rope_theta is not None and self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head size, found {self.head_dim}")
        poolings = ("cls", "mean") + (("bos", "late") if "classifier_pooling" in self.family.own_fields
                                      and self.family.classifier != "prediction_head" else ())
        if self.classifier_pooling not in poolings:
            raise ConfigError(f"classifier_pooling of {self.model_type} must be one of {', '.join(poolings)}, "
                              f"found {self.classifier_pooling!r}")
        kv_heads = self.num_key_value_heads
        if kv_heads is not None and (not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads <= 0
                                     or self.num_attention_heads % kv_heads):
            raise ConfigError(f"num_key_value_heads ({kv_heads!r}) must be a positive divisor of "
                              f"num_attention_heads ({self.num_attention_heads})")
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope_type {self.rope_type!r} is not supported; encoderkit runs {', '.join(ROPE_TYPES)}")
        if self.rope_type != "default" and not (isinstance(self.rope_factor, (int, float)) and self.rope_factor >= 1):
            raise ConfigError(f"rope_type {self.rope_type!r} needs a factor >= 1 in rope_parameters, "
                              f"found {self.rope_factor!r}")
        if self.pos_att_type is not None and set(self.pos_att_type) - set(POS_ATT_TYPES):
            raise ConfigError(f"pos_att_type may hold {POS_ATT_TYPES}, found {self.pos_att_type!r}")
        if self.norm_rel_ebd not in ("none", "layer_norm"):
            raise ConfigError(f"norm_rel_ebd must be 'none' or 'layer_norm', found {self.norm_rel_ebd!r}")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.hidden_size % self.conv_groups):
            raise ConfigError(f"conv_kernel_size ({self.conv_kernel_size}) must be >= 0 and hidden_size must be "
                              f"divisible by conv_groups ({self.conv_groups})")
        if self.family.positions_from_padding and self.max_position_embeddings <= self.padding_position_id + 1:
            raise ConfigError(f"{self.model_type} needs max_position_embeddings > {self.padding_position_id + 1} "
                              "(positions start after padding)")

    @property
    def max_sequence_length(self) -> int:
        """Longest input (special tokens included) the position embeddings can address."""
        if self.family.positions_from_padding:
            return self.max_position_embeddings - self.padding_position_id - 1
        return self.max_position_embeddings

    @property
    def padding_position_id(self) -> int:
        """Families that count positions from padding (RoBERTa): the id whose position the padding takes, the
        first real token being at that + 1; pad_token_id, except where the family fixes it (MPNet: 1)."""
        fixed = self.family.position_padding_id
        return self.pad_token_id if fixed is None else fixed

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
        names = _family_fields(family)
        kwargs: dict[str, Any] = {"model_type": model_type}
        for name, default in family.defaults.items():
            if name in _field_names():
                kwargs[name] = default
        for name in names:
            key = family.config_key(name)
            if key in data:
                kwargs[name] = data[key]
        used = {family.config_key(name) for name in names}
        used |= {"model_type", "id2label", "label2id", "num_labels", "position_embedding_type"}
        if "id2label" in data and data["id2label"]:
            kwargs["id2label"] = {int(k): str(v) for k, v in data["id2label"].items()}
        elif "num_labels" in data:
            kwargs["id2label"] = {i: f"LABEL_{i}" for i in range(int(data["num_labels"]))}
        if "architectures" in data:
            kwargs["architectures"] = data["architectures"]
            used.add("architectures")
        if model_type == "distilbert":
            kwargs["type_vocab_size"] = 0
            kwargs["layer_norm_eps"] = 1e-12  # fixed in DistilBERT, not a config field
        if model_type == "modernbert":
            used |= _read_modernbert_layers(data, kwargs)
        if family.rotary:
            used |= _read_rope(data, kwargs)
        head_dim = data.get("head_dim")
        hidden, heads = kwargs.get("hidden_size"), kwargs.get("num_attention_heads")
        if head_dim is not None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0 \
                and head_dim != hidden // heads:
            raise ConfigError(f"head_dim ({head_dim}) differs from hidden_size / num_attention_heads "
                              f"({hidden} / {heads}); encoderkit's heads split the hidden size evenly")
        if model_type == "deberta-v2":
            if isinstance(kwargs.get("pos_att_type"), str):  # "p2c|c2p", as DeBERTa's own configs spell it
                kwargs["pos_att_type"] = [x.strip() for x in kwargs["pos_att_type"].lower().split("|") if x.strip()]
            if "embedding_size" not in data:
                kwargs["embedding_size"] = None
            used.add("pooler_hidden_size")
            pooler_size = data.get("pooler_hidden_size", data.get("hidden_size"))
            if pooler_size is not None and pooler_size != kwargs.get("hidden_size"):
                raise ConfigError(f"pooler_hidden_size ({pooler_size}) differs from hidden_size; encoderkit's "
                                  "DeBERTa classifier pools at the hidden size")
        kwargs["extra"] = {k: v for k, v in data.items() if k not in used and k not in _IGNORED_KEYS}
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a field of the wrong JSON type
            raise ConfigError(f"invalid config.json: {exc}") from exc

    def to_hf_dict(self) -> dict[str, Any]:
        family = self.family
        out: dict[str, Any] = {"model_type": self.model_type}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        for name in _family_fields(family):
            value = getattr(self, name)
            if name == "embedding_size":
                if self.embedding_size is None and family.embedding_projection == "before_norm":
                    continue  # DeBERTa reads a missing embedding_size as hidden_size
                value = self.embedding_dim
            elif name == "num_hidden_groups":
                value = self.num_groups
            if value is None and family.defaults.get(name) is not None:
                value = family.defaults[name]  # e.g. DistilBERT's seq_classif_dropout must be a number
            if value is None and name not in ("classifier_dropout",):
                continue
            out[family.config_key(name)] = value
        if self.model_type == "modernbert":
            _write_modernbert_layers(self, out)
        if family.rotary:
            out["rope_parameters"] = {"rope_type": self.rope_type, "rope_theta": self.global_rope_theta}
            if self.rope_type != "default":
                out["rope_parameters"]["factor"] = self.rope_factor
        if self.model_type == "deberta-v2":
            out["pooler_hidden_size"] = self.hidden_size
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


def _family_fields(family: Family) -> list[str]:
    """The fields a family's config.json carries."""
    return [name for name in COMMON_FIELDS if name not in family.skipped_fields] + list(family.own_fields)


_ROPE_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def _read_modernbert_layers(data: dict[str, Any], kwargs: dict[str, Any]) -> set[str]:
    """ModernBERT's attention pattern and rotary thetas, from either config style: ``layer_types`` with
    ``rope_parameters`` (transformers 5), or ``global_attn_every_n_layers`` with ``global_rope_theta`` /
    ``local_rope_theta`` (the original release). Returns the keys it read."""
    layers = int(kwargs["num_hidden_layers"]) if isinstance(kwargs.get("num_hidden_layers"), int) else 0
    if data.get("layer_types") is None:
        every = data.get("global_attn_every_n_layers", 3)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"global_attn_every_n_layers must be a positive integer, found {every!r}")
        kwargs["layer_types"] = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    rope = data.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"rope_parameters must be an object, found {rope!r}")
    for layer_type, field_name in _ROPE_KEYS.items():
        params = rope.get(layer_type) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"rope_type {params['rope_type']!r} ({layer_type}) is not supported; only 'default'")
        if "rope_theta" in params:
            kwargs[field_name] = float(params["rope_theta"])
        elif field_name in data:
            kwargs[field_name] = float(data[field_name])
    if data.get("rope_scaling"):
        raise ConfigError("rope_scaling is not supported for ModernBERT; remove it or use rope_type 'default'")
    return {"layer_types", "rope_parameters", "global_attn_every_n_layers", "global_rope_theta", "local_rope_theta",
            "rope_scaling", "rope_theta", "sliding_window"}


def _read_rope(data: dict[str, Any], kwargs: dict[str, Any]) -> set[str]:
    """The one rotary table of NomicBERT, GTE and EuroBERT: ``rope_parameters`` (transformers 5) or ``rope_theta``
    with ``rope_scaling`` (older configs); a missing theta keeps the family's default. Returns the keys it read."""
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"rope_parameters must be an object, found {rope!r}")
    theta = rope.get("rope_theta", data.get("rope_theta"))
    if theta is not None:
        if isinstance(theta, bool) or not isinstance(theta, (int, float)):
            raise ConfigError(f"rope_theta must be a number, found {theta!r}")
        kwargs["global_rope_theta"] = kwargs["local_rope_theta"] = float(theta)
    kwargs["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
    kwargs["rope_factor"] = rope.get("factor")
    return {"rope_parameters", "rope_theta", "rope_scaling"}


def _write_modernbert_layers(config: EncoderConfig, out: dict[str, Any]) -> None:
    """Both config styles, so that transformers 5 reads ``layer_types``/``rope_parameters`` and older readers
    their ``global_attn_every_n_layers`` and thetas."""
    types = [config.layer_type(i) for i in range(config.num_hidden_layers)]
    out["layer_types"] = types
    out["rope_parameters"] = {layer_type: {"rope_type": "default", "rope_theta": getattr(config, field_name)}
                              for layer_type, field_name in _ROPE_KEYS.items()}
    out["global_rope_theta"], out["local_rope_theta"] = config.global_rope_theta, config.local_rope_theta
    globals_at = [i for i, t in enumerate(types) if t == "full_attention"]
    for every in range(1, config.num_hidden_layers + 1):
        if globals_at == list(range(0, config.num_hidden_layers, every)):
            out["global_attn_every_n_layers"] = every
            break


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
