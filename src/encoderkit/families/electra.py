"""ELECTRA (Clark et al., 2020): BERT's block with factorised embeddings; generator and discriminator heads."""
from .base import BERT_DEFAULTS, BERT_EMBEDDINGS, BERT_IGNORABLE, BERT_LAYER, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

FAMILY = Family(
    name="electra", hf_prefix="electra", hf_class_stem="Electra",
    defaults=dict(BERT_DEFAULTS, embedding_size=128, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    own_fields=("embedding_size",), factorised_embeddings=True, mlm_activation="gelu", classifier="dense_gelu",
    base_rules=BERT_EMBEDDINGS + (("embeddings.projection", "embeddings_project"),) + BERT_LAYER,
    head_rules={
        "mlm": mlm_rules("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head"),
        "rtd": (("rtd_head.dense", "discriminator_predictions.dense"),
                ("rtd_head.prediction", "discriminator_predictions.dense_prediction")),
        "classifier": (("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE,
    tied_decoders=("generator_lm_head.weight",),
    hf_task_suffixes={"replaced-token-detection": "ForPreTraining"},
)
