"""DistilBERT (Sanh et al., 2019): BERT's block under other names; no segments, no pooler."""
from .base import BERT_DEFAULTS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

_LAYER = "transformer.layer.{i}."

FAMILY = Family(
    name="distilbert", hf_prefix="distilbert", hf_class_stem="DistilBert",
    config_keys=dict(hidden_size="dim", num_hidden_layers="n_layers", num_attention_heads="n_heads",
                     intermediate_size="hidden_dim", hidden_act="activation", hidden_dropout_prob="dropout",
                     attention_probs_dropout_prob="attention_dropout", classifier_dropout="seq_classif_dropout"),
    defaults=dict(BERT_DEFAULTS, type_vocab_size=0, classifier_dropout=0.2),
    own_fields=("sinusoidal_pos_embds",), skipped_fields=("type_vocab_size", "layer_norm_eps"),
    classifier="dense_relu",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", _LAYER + "attention.q_lin"),
        ("layers.{i}.attention.key", _LAYER + "attention.k_lin"),
        ("layers.{i}.attention.value", _LAYER + "attention.v_lin"),
        ("layers.{i}.attention.output", _LAYER + "attention.out_lin"),
        ("layers.{i}.attention_norm", _LAYER + "sa_layer_norm"),
        ("layers.{i}.ffn_in", _LAYER + "ffn.lin1"),
        ("layers.{i}.ffn_out", _LAYER + "ffn.lin2"),
        ("layers.{i}.ffn_norm", _LAYER + "output_layer_norm"),
    ),
    head_rules={
        "mlm": mlm_rules("vocab_transform", "vocab_layer_norm", "vocab_projector"),
        "classifier": (("classifier.dense", "pre_classifier"), ("classifier.out", "classifier")),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE,
    tied_decoders=("vocab_projector.weight",),
)
