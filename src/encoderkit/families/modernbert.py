"""ModernBERT (Warner et al., 2024): pre-norm blocks without biases, fused Wqkv, rotary positions with a global
and a local theta, global attention every N layers and sliding-window attention in the others, GeGLU, a final
norm; embeddings are tokens only (no position or segment tables)."""
from .base import Family

_LAYER = "layers.{i}."
_HEAD = (("dense", "head.dense"), ("norm", "head.norm"))  # ModernBertPredictionHead, before every task output

FAMILY = Family(
    name="modernbert", hf_prefix="model", hf_class_stem="ModernBert",
    config_keys=dict(hidden_act="hidden_activation", layer_norm_eps="norm_eps",
                     attention_probs_dropout_prob="attention_dropout"),
    defaults=dict(
        vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22, num_attention_heads=12,
        hidden_act="gelu", max_position_embeddings=8192, initializer_range=0.02, layer_norm_eps=1e-5,
        norm_bias=False, pad_token_id=50283, eos_token_id=50282, bos_token_id=50281, attention_bias=False,
        attention_probs_dropout_prob=0.0, local_attention=128, embedding_dropout=0.0, mlp_bias=False,
        mlp_dropout=0.0, decoder_bias=True, classifier_pooling="cls", classifier_dropout=0.0, classifier_bias=False,
        classifier_activation="gelu", type_vocab_size=0, hidden_dropout_prob=0.0, absolute_positions=False,
        global_rope_theta=160_000.0, local_rope_theta=10_000.0,
    ),
    own_fields=("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "embedding_dropout", "mlp_dropout",
                "layer_types", "local_attention", "classifier_pooling", "classifier_activation", "classifier_bias"),
    skipped_fields=("hidden_dropout_prob", "type_vocab_size"),
    norm_placement="pre", mlp="glu", fused_qkv=True, final_norm=True, first_layer_attention_norm=False,
    classifier="prediction_head", token_head_transform=True,
    base_rules=(
        ("embeddings.word", "embeddings.tok_embeddings"),
        ("embeddings.norm", "embeddings.norm"),
        ("layers.{i}.attention.qkv", _LAYER + "attn.Wqkv"),
        ("layers.{i}.attention.output", _LAYER + "attn.Wo"),
        ("layers.{i}.attention_norm", _LAYER + "attn_norm"),
        ("layers.{i}.ffn_norm", _LAYER + "mlp_norm"),
        ("layers.{i}.ffn_in", _LAYER + "mlp.Wi"),
        ("layers.{i}.ffn_out", _LAYER + "mlp.Wo"),
        ("final_norm", "final_norm"),
    ),
    head_rules={
        "mlm": (("mlm_head.transform", "head.dense"), ("mlm_head.norm", "head.norm"), ("mlm_head.decoder", "decoder")),
        "classifier": tuple((f"classifier.{ours}", theirs) for ours, theirs in _HEAD)
        + (("classifier.out", "classifier"),),
        "token": tuple((f"token_classifier.{ours}", theirs) for ours, theirs in _HEAD)
        + (("token_classifier.out", "classifier"),),
        "span": tuple((f"span_head.{ours}", theirs) for ours, theirs in _HEAD) + (("span_head.out", "classifier"),),
    },
    tied_decoders=("decoder.weight",),
)
