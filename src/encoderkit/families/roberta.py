"""RoBERTa (Liu et al., 2019): BERT's block; positions count from pad_token_id + 1, a dense+tanh classifier."""
from .base import BERT_DEFAULTS, BERT_EMBEDDINGS, BERT_IGNORABLE, BERT_LAYER, TOKEN_AND_SPAN_HEADS, Family, mlm_rules

FAMILY = Family(
    name="roberta", hf_prefix="roberta", hf_class_stem="Roberta",
    defaults=dict(BERT_DEFAULTS, vocab_size=50265, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    has_pooler=True, positions_from_padding=True, mlm_activation="gelu", classifier="dense_tanh",
    base_rules=BERT_EMBEDDINGS + BERT_LAYER + (("pooler.dense", "pooler.dense"),),
    head_rules={
        "mlm": mlm_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
        "classifier": (("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")),
        **TOKEN_AND_SPAN_HEADS,
    },
    ignorable=BERT_IGNORABLE + (r"^lm_head\.decoder\.bias$",),
    tied_decoders=("lm_head.decoder.weight",),
)
