"""ALBERT (Lan et al., 2020): factorised embeddings and cross-layer parameter sharing; SOP."""
from .base import BERT_DEFAULTS, BERT_EMBEDDINGS, BERT_IGNORABLE, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

_LAYER = "encoder.albert_layer_groups.{g}.albert_layers.{j}."

FAMILY = Family(
    name="albert", hf_prefix="albert", hf_class_stem="Albert",
    config_keys=dict(classifier_dropout="classifier_dropout_prob"),
    defaults=dict(BERT_DEFAULTS, vocab_size=30000, embedding_size=128, hidden_size=4096, num_attention_heads=64,
                  intermediate_size=16384, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, classifier_dropout=0.1, bos_token_id=2, eos_token_id=3),
    own_fields=("embedding_size", "num_hidden_groups", "inner_group_num"),
    has_pooler=True, always_project_embeddings=True, factorised_embeddings=True, layer_sharing=True,
    classifier="pooled", pair_objective="sop",
    base_rules=BERT_EMBEDDINGS + (
        ("embeddings.projection", "encoder.embedding_hidden_mapping_in"),
        ("layers.{i}.attention.query", _LAYER + "attention.query"),
        ("layers.{i}.attention.key", _LAYER + "attention.key"),
        ("layers.{i}.attention.value", _LAYER + "attention.value"),
        ("layers.{i}.attention.output", _LAYER + "attention.dense"),
        ("layers.{i}.attention_norm", _LAYER + "attention.LayerNorm"),
        ("layers.{i}.ffn_in", _LAYER + "ffn"),
        ("layers.{i}.ffn_out", _LAYER + "ffn_output"),
        ("layers.{i}.ffn_norm", _LAYER + "full_layer_layer_norm"),
        ("pooler.dense", "pooler"),
    ),
    head_rules={
        "mlm": mlm_rules("predictions.dense", "predictions.LayerNorm", "predictions.decoder", "predictions.bias"),
        "pair": (("pair_head", "sop_classifier.classifier"),),
        "classifier": (("classifier.out", "classifier"),),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^predictions\.decoder\.bias$",),
    tied_decoders=("predictions.decoder.weight",),
)
