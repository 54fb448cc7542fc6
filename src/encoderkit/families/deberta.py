"""DeBERTa-v2/v3 (He et al., 2021, 2023): BERT's post-norm block with disentangled attention (content-to-position
and position-to-content scores from shared relative position embeddings, in log buckets), embeddings that may
carry no absolute positions, and an optional convolution beside the first layer."""
from .base import BERT_DEFAULTS, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

_LAYER = "encoder.layer.{i}."

FAMILY = Family(
    name="deberta-v2", hf_prefix="deberta", hf_class_stem="DebertaV2",
    config_keys=dict(absolute_positions="position_biased_input"),
    defaults=dict(BERT_DEFAULTS, vocab_size=128100, hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
                  intermediate_size=6144, type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=False,
                  max_relative_positions=-1, absolute_positions=True, pooler_dropout=0.0,
                  pooler_hidden_act="gelu", legacy=True),
    own_fields=("embedding_size", "relative_attention", "max_relative_positions", "position_buckets", "pos_att_type",
                "share_att_key", "norm_rel_ebd", "absolute_positions", "conv_kernel_size", "conv_groups",
                "conv_act", "pooler_dropout", "pooler_hidden_act", "legacy"),
    factorised_embeddings=True, embedding_projection="before_norm", types_before_positions=False,
    classifier="context_pooler",
    base_rules=(
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.token_type", "embeddings.token_type_embeddings"),
        ("embeddings.projection", "embeddings.embed_proj"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", _LAYER + "attention.self.query_proj"),
        ("layers.{i}.attention.key", _LAYER + "attention.self.key_proj"),
        ("layers.{i}.attention.value", _LAYER + "attention.self.value_proj"),
        ("layers.{i}.attention.pos_key", _LAYER + "attention.self.pos_key_proj"),
        ("layers.{i}.attention.pos_query", _LAYER + "attention.self.pos_query_proj"),
        ("layers.{i}.attention.output", _LAYER + "attention.output.dense"),
        ("layers.{i}.attention_norm", _LAYER + "attention.output.LayerNorm"),
        ("layers.{i}.ffn_in", _LAYER + "intermediate.dense"),
        ("layers.{i}.ffn_out", _LAYER + "output.dense"),
        ("layers.{i}.ffn_norm", _LAYER + "output.LayerNorm"),
        ("relative.embeddings", "encoder.rel_embeddings"),
        ("relative.norm", "encoder.LayerNorm"),
        ("conv.conv", "encoder.conv.conv"),
        ("conv.norm", "encoder.conv.LayerNorm"),
    ),
    head_rules={
        # the legacy layout (config "legacy": true, transformers' default); see alternative_head_rules
        "mlm": mlm_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                         "cls.predictions.decoder", "cls.predictions.bias"),
        "classifier": (("classifier.dense", "pooler.dense"), ("classifier.out", "classifier")),
        # DeBERTa-v3's RTD discriminator head (transformers has no class for it: it loads the encoder alone)
        "rtd": (("rtd_head.dense", "discriminator_predictions.dense"),
                ("rtd_head.prediction", "discriminator_predictions.dense_prediction")),
        **TOKEN_AND_SPAN_HEADS,
    },
    alternative_head_rules={  # "legacy": false: the decoder is the word embeddings, only the bias is stored
        "mlm": (("mlm_head.transform", "lm_predictions.lm_head.dense"),
                ("mlm_head.norm", "lm_predictions.lm_head.LayerNorm"),
                ("mlm_head.decoder.bias", "lm_predictions.lm_head.bias")),
    },
    ignorable=(r"(^|\.)embeddings\.position_ids$", r"^cls\.predictions\.decoder\.bias$", r"^mask_predictions\."),
    tied_decoders=("cls.predictions.decoder.weight",),
)
