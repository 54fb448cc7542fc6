"""MPNet (Song et al., 2020): BERT's post-norm block with a learned relative-position bias on the attention scores
(T5's buckets, one table shared by every layer), RoBERTa's positions (counted from 2: transformers' MPNet takes id 1
as padding whatever pad_token_id says), no segments;
a [CLS] pooler; a dense+tanh sequence classifier, as RoBERTa's."""
from .base import BERT_DEFAULTS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

_LAYER = "encoder.layer.{i}."

FAMILY = Family(
    name="mpnet", hf_prefix="mpnet", hf_class_stem="MPNet",
    defaults=dict(BERT_DEFAULTS, vocab_size=30527, type_vocab_size=0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  max_position_embeddings=514, relative_attention_num_buckets=32),
    own_fields=("relative_attention_num_buckets",), skipped_fields=("type_vocab_size",),
    has_pooler=True, positions_from_padding=True, position_padding_id=1, position_bias=True, mlm_activation="gelu",
    classifier="dense_tanh",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", _LAYER + "attention.attn.q"),
        ("layers.{i}.attention.key", _LAYER + "attention.attn.k"),
        ("layers.{i}.attention.value", _LAYER + "attention.attn.v"),
        ("layers.{i}.attention.output", _LAYER + "attention.attn.o"),
        ("layers.{i}.attention_norm", _LAYER + "attention.LayerNorm"),
        ("layers.{i}.ffn_in", _LAYER + "intermediate.dense"),
        ("layers.{i}.ffn_out", _LAYER + "output.dense"),
        ("layers.{i}.ffn_norm", _LAYER + "output.LayerNorm"),
        ("position_bias.table", "encoder.relative_attention_bias"),
        ("pooler.dense", "pooler.dense"),
    ),
    head_rules={
        "mlm": mlm_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
        "classifier": (("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^lm_head\.decoder\.bias$",),
    tied_decoders=("lm_head.decoder.weight",),
)
