"""GTE (Li et al., 2023; Alibaba's gte-*-v1.5 "new" architecture): BERT's post-norm block with rotary positions
(optionally scaled), a GLU MLP whose input projection has no bias and drops out after the gate, one fused
query/key/value projection with biases; no position table; a [CLS] pooler only under the sequence classifier.
The fused up-and-gate matrix stores [up; gate], so the activation takes its second half."""
from .base import BERT_DEFAULTS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules
from .nomic_bert import ROTARY_BUFFERS

_LAYER = "encoder.layer.{i}."

FAMILY = Family(
    name="gte", hf_prefix="gte", hf_class_stem="Gte",
    defaults=dict(BERT_DEFAULTS, vocab_size=250048, attention_probs_dropout_prob=0.0, max_position_embeddings=8192,
                  type_vocab_size=1, pad_token_id=1, absolute_positions=False, global_rope_theta=160_000.0,
                  local_rope_theta=160_000.0),
    mlp="glu", glu_activated_half="second", ffn_in_bias=False, mlp_inner_dropout=True, fused_qkv=True, rotary=True,
    mlm_activation="gelu", classifier="pooled",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.token_type", "embeddings.token_type_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.qkv", _LAYER + "attention.qkv_proj"),
        ("layers.{i}.attention.output", _LAYER + "attention.o_proj"),
        ("layers.{i}.attention_norm", _LAYER + "attn_ln"),
        ("layers.{i}.ffn_in", _LAYER + "mlp.up_gate_proj"),
        ("layers.{i}.ffn_out", _LAYER + "mlp.down_proj"),
        ("layers.{i}.ffn_norm", _LAYER + "mlp_ln"),
        ("pooler.dense", "pooler.dense"),
    ),
    head_rules={
        "mlm": mlm_rules("lm_head.dense", "lm_head.norm", "lm_head.decoder"),
        "classifier": (("classifier.out", "classifier"),),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (ROTARY_BUFFERS,),
    tied_decoders=("lm_head.decoder.weight",),
)
