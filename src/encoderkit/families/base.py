"""What a model family is: how its config.json names things, which parts of the one encoder it uses, and how
its checkpoints name the tensors. Data only (no torch), so ``config`` can import it without a cycle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# (our name, transformers' name); {i}: our layer index; {g}/{j}: ALBERT group/inner index. transformers' side may
# name several tensors joined by "+": ours is their concatenation along the first dimension, in that order, in equal
# parts (a checkpoint's separate up and gate projections, one matrix here).
Rule = tuple[str, str]

BERT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0, initializer_range=0.02,
)

# The fields every family's config.json carries (under its own key names, see ``Family.config_keys``).
COMMON_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "layer_norm_eps", "initializer_range", "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings",
    "classifier_dropout", "problem_type",
)


@dataclass(frozen=True, kw_only=True)
class Family:
    """How one model family differs from BERT. Every switch has BERT's value as its default."""

    name: str  # config.json's model_type
    hf_prefix: str  # attribute of the base model inside HF task models ("bert" -> "bert.")
    hf_class_stem: str  # "Bert" -> BertModel, BertForMaskedLM ...
    config_keys: dict[str, str] = field(default_factory=dict)  # our field -> the family's config.json key
    defaults: dict[str, Any] = field(default_factory=lambda: dict(BERT_DEFAULTS))  # for keys a config.json omits
    own_fields: tuple[str, ...] = ()  # fields beyond COMMON_FIELDS that the family's config.json carries
    skipped_fields: tuple[str, ...] = ()  # COMMON_FIELDS the family's config.json does not carry
    # ----- the parts of the one encoder it uses
    norm_placement: str = "post"  # "post": x = LN(x + f(x)) (BERT); "pre": x = x + f(LN(x)) (ModernBERT)
    mlp: str = "plain"  # "plain": act(W1 x); "glu": act(a) * b with [a, b] = W1 x (ModernBERT's GeGLU)
    glu_activated_half: str = "first"  # "second": act(b) * a (the checkpoint stores [up; gate]: GTE, NomicBERT)
    ffn_in_bias: bool = True  # False: the MLP's input projection has no bias whatever mlp_bias says (GTE)
    mlp_inner_dropout: bool = False  # a post-norm MLP drops out after its activation (hidden_dropout_prob; GTE)
    norm: str = "layer"  # "layer": LayerNorm; "rms": RMSNorm, no bias (EuroBERT)
    embedding_norm: bool = True  # False: the embeddings enter the first layer unnormalised (EuroBERT)
    # One rotary table for every layer, its theta (and scaling) read from config.json's rope_parameters (or the
    # older rope_theta/rope_scaling); ModernBERT's global and local thetas are read by its own reader.
    rotary: bool = False
    fused_qkv: bool = False  # one Wqkv projection in the checkpoint (ModernBERT) instead of query/key/value
    final_norm: bool = False  # a LayerNorm after the last layer (pre-norm families)
    first_layer_attention_norm: bool = True  # ModernBERT's first layer has no attention norm
    embedding_projection: str = "after_norm"  # ALBERT/ELECTRA project after the norm; DeBERTa before, no bias
    # The order of the embedding sum, which fp32 rounding sees (1 ulp, then amplified by a loss's scale): BERT's
    # (word + type) + position; DeBERTa's (word + position) + type
    types_before_positions: bool = True
    has_pooler: bool = False  # the base model carries a [CLS] pooler (dense + tanh)
    position_bias: bool = False  # MPNet: a learned per-head bias by bucketed relative position, shared by layers
    positions_from_padding: bool = False  # RoBERTa: position ids count real tokens, from pad_token_id + 1
    position_padding_id: int | None = None  # the id positions count from, where not pad_token_id (MPNet: 1)
    always_project_embeddings: bool = False  # ALBERT maps embeddings to hidden size even when they are equal
    factorised_embeddings: bool = False  # embedding_size may differ from hidden_size
    layer_sharing: bool = False  # ALBERT's cross-layer parameter groups
    # ----- heads
    mlm_activation: str | None = None  # activation of the MLM transform; None = the config's hidden_act
    mlm_transform: bool = True  # False: the MLM head is the decoder alone (EuroBERT)
    # "pooled": pooler -> linear; "dense_tanh"/"dense_gelu"/"dense_relu": [CLS] -> dense -> act -> linear;
    # "context_pooler": DeBERTa's [CLS] -> dense -> pooler_hidden_act -> linear;
    # "prediction_head": ModernBERT's pooled (cls/mean) -> dense -> act -> norm -> linear
    classifier: str = "pooled"
    token_head_transform: bool = False  # ModernBERT runs its prediction head before token/span classifiers
    pair_objective: str | None = None  # "nsp" (BERT), "sop" (ALBERT) or None
    # ----- checkpoints
    base_rules: tuple[Rule, ...] = ()  # names inside the base model (no task prefix)
    head_rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # top-level names of the task heads
    alternative_head_rules: dict[str, tuple[Rule, ...]] = field(default_factory=dict)  # other layouts, read only
    ignorable: tuple[str, ...] = ()  # regexes of checkpoint tensors that are never an error (buffers, aliases)
    tied_decoders: tuple[str, ...] = ()  # checkpoint names of a decoder tied to the word embeddings
    hf_task_suffixes: dict[str, str] = field(default_factory=dict)  # overrides of models.HF_SUFFIX

    def config_key(self, name: str) -> str:
        return self.config_keys.get(name, name)


BERT_LAYER: tuple[Rule, ...] = (
    ("layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query"),
    ("layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key"),
    ("layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value"),
    ("layers.{i}.attention.output", "encoder.layer.{i}.attention.output.dense"),
    ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("layers.{i}.ffn_in", "encoder.layer.{i}.intermediate.dense"),
    ("layers.{i}.ffn_out", "encoder.layer.{i}.output.dense"),
    ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
)
BERT_EMBEDDINGS: tuple[Rule, ...] = (
    ("embeddings.word", "embeddings.word_embeddings"),
    ("embeddings.position", "embeddings.position_embeddings"),
    ("embeddings.token_type", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
)
TOKEN_AND_SPAN_HEADS: dict[str, tuple[Rule, ...]] = {
    "token": (("token_classifier.out", "classifier"),),
    "span": (("span_head.out", "qa_outputs"),),
}
# transformers' buffers that old or new checkpoints may carry
BERT_IGNORABLE = (r"(^|\.)embeddings\.(position_ids|token_type_ids)$",)


def mlm_rules(transform: str, norm: str, decoder: str, bias: str | None = None) -> tuple[Rule, ...]:
    rules = [("mlm_head.transform", transform), ("mlm_head.norm", norm)]
    if bias:  # the family keeps the output bias as its own parameter, outside the decoder
        rules.append(("mlm_head.decoder.bias", bias))
    return tuple(rules + [("mlm_head.decoder", decoder)])
