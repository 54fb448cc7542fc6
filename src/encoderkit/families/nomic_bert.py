"""NomicBERT (Nussbaum et al., 2024; nomic-embed-text): BERT's post-norm block with rotary positions instead of a
position table, SwiGLU, one fused query/key/value projection, no biases in the attention or the MLP; segment
embeddings; a [CLS] pooler only under the sequence classifier. Checkpoints keep the original layout (transformers
writes it back on save): the embedding norm beside the embeddings, the MLP's up (fc11) and gate (fc12) matrices
apart, joined here as [up; gate]."""
from .base import BERT_DEFAULTS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

_LAYER = "encoder.layers.{i}."
ROTARY_BUFFERS = r"rotary_emb\.(inv_freq|original_inv_freq)$"

FAMILY = Family(
    name="nomic_bert", hf_prefix="nomic_bert", hf_class_stem="NomicBert",
    defaults=dict(BERT_DEFAULTS, vocab_size=30528, hidden_act="silu", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, max_position_embeddings=2048, absolute_positions=False,
                  attention_bias=False, mlp_bias=False, global_rope_theta=1000.0, local_rope_theta=1000.0),
    mlp="glu", glu_activated_half="second", fused_qkv=True, rotary=True, classifier="pooled",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.token_type", "embeddings.token_type_embeddings"),
        ("embeddings.norm", "emb_ln"),
        ("layers.{i}.attention.qkv", _LAYER + "attn.Wqkv"),
        ("layers.{i}.attention.output", _LAYER + "attn.out_proj"),
        ("layers.{i}.attention_norm", _LAYER + "norm1"),
        ("layers.{i}.ffn_in", _LAYER + "mlp.fc11+" + _LAYER + "mlp.fc12"),
        ("layers.{i}.ffn_out", _LAYER + "mlp.fc2"),
        ("layers.{i}.ffn_norm", _LAYER + "norm2"),
        ("pooler.dense", "pooler.dense"),
    ),
    head_rules={
        "mlm": mlm_rules("cls.predictions.transform.dense", "cls.predictions.transform.layer_norm",
                         "cls.predictions.decoder", "cls.predictions.bias"),
        "classifier": (("classifier.out", "classifier"),),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^cls\.predictions\.decoder\.bias$", ROTARY_BUFFERS),
    tied_decoders=("predictions.decoder.weight",),
)
