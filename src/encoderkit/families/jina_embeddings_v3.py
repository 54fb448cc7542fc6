"""jina-embeddings-v3 (Sturua et al., 2024) as transformers has it (without the task LoRA adapters): XLM-RoBERTa's
post-norm block and heads with rotary positions instead of a position table, one fused query/key/value projection
with biases; segment embeddings; a [CLS] pooler in the base model. Checkpoints keep the original layout (the
embedding norm beside the embeddings, ``mixer.Wqkv``, ``norm1``/``norm2``) under RoBERTa's prefix."""
from .base import BERT_DEFAULTS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules
from .nomic_bert import ROTARY_BUFFERS

_LAYER = "encoder.layers.{i}."

FAMILY = Family(
    name="jina_embeddings_v3", hf_prefix="roberta", hf_class_stem="JinaEmbeddingsV3",
    defaults=dict(BERT_DEFAULTS, vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, absolute_positions=False,
                  global_rope_theta=20_000.0, local_rope_theta=20_000.0),
    fused_qkv=True, rotary=True, has_pooler=True, mlm_activation="gelu", classifier="dense_tanh",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.token_type", "embeddings.token_type_embeddings"),
        ("embeddings.norm", "emb_ln"),
        ("layers.{i}.attention.qkv", _LAYER + "mixer.Wqkv"),
        ("layers.{i}.attention.output", _LAYER + "mixer.out_proj"),
        ("layers.{i}.attention_norm", _LAYER + "norm1"),
        ("layers.{i}.ffn_in", _LAYER + "mlp.fc1"),
        ("layers.{i}.ffn_out", _LAYER + "mlp.fc2"),
        ("layers.{i}.ffn_norm", _LAYER + "norm2"),
        ("pooler.dense", "pooler.dense"),
    ),
    head_rules={
        "mlm": mlm_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
        "classifier": (("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^lm_head\.decoder\.bias$", ROTARY_BUFFERS),
    tied_decoders=("lm_head.decoder.weight",),
)
