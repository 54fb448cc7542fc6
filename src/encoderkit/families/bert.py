"""BERT (Devlin et al., 2019): the post-norm block every other family is written against."""
from .base import BERT_EMBEDDINGS, BERT_IGNORABLE, BERT_LAYER, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

FAMILY = Family(
    name="bert", hf_prefix="bert", hf_class_stem="Bert", has_pooler=True, classifier="pooled", pair_objective="nsp",
    base_rules=BERT_EMBEDDINGS + BERT_LAYER + (("pooler.dense", "pooler.dense"),),
    head_rules={
        "mlm": mlm_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                         "cls.predictions.decoder", "cls.predictions.bias"),
        "pair": (("pair_head", "cls.seq_relationship"),),
        "classifier": (("classifier.out", "classifier"),),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^cls\.predictions\.decoder\.bias$",),
    tied_decoders=("predictions.decoder.weight",),
)
