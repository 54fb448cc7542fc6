"""The model zoo: the published shapes of each family's models, as config.json keys (``config.preset`` makes an
``EncoderConfig`` of one; ``zoo`` counts their parameters). Data only."""
from __future__ import annotations

from typing import Any


def _bert(hidden: int, layers: int, heads: int, **kw: Any) -> dict[str, Any]:
    return dict(model_type="bert", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden, **kw)


_ROBERTA = dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
_ALBERT = dict(model_type="albert", vocab_size=30000, embedding_size=128, hidden_act="gelu_new",
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_hidden_groups=1,
               bos_token_id=2, eos_token_id=3, classifier_dropout=0.1)
_ELECTRA = dict(model_type="electra")

# ModernBERT: base and large are the paper's shapes (Warner et al., 2024, table 4); tiny and small keep their
# proportions (head size 64, MLP 1.5x hidden, global attention every third layer, a 128-token local window).
_MODERNBERT = dict(model_type="modernbert", vocab_size=50368, max_position_embeddings=8192, hidden_act="gelu",
                   layer_norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
                   attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, embedding_dropout=0.0, mlp_dropout=0.0,
                   type_vocab_size=0, absolute_positions=False, local_attention=128, global_rope_theta=160_000.0,
                   local_rope_theta=10_000.0, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282,
                   classifier_activation="gelu", classifier_bias=False, classifier_dropout=0.0)


def _modernbert(hidden: int, layers: int, heads: int, intermediate: int) -> dict[str, Any]:
    return dict(_MODERNBERT, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=intermediate,
                layer_types=["sliding_attention" if i % 3 else "full_attention" for i in range(layers)])


# DeBERTa-v3 (He et al., 2023): the released xsmall/small/base/large shapes.
_DEBERTA_V3 = dict(model_type="deberta-v2", vocab_size=128100, max_position_embeddings=512, type_vocab_size=0,
                   layer_norm_eps=1e-7, relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                   share_att_key=True, pos_att_type=["p2c", "c2p"], absolute_positions=False,
                   max_relative_positions=-1, pooler_hidden_act="gelu", pooler_dropout=0.0)


def _deberta_v3(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    return dict(_DEBERTA_V3, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=4 * hidden)


PRESETS: dict[str, dict[str, Any]] = {
    "modernbert-tiny": _modernbert(256, 6, 4, 384),
    "modernbert-small": _modernbert(384, 12, 6, 576),
    "modernbert-base": _modernbert(768, 22, 12, 1152),
    "modernbert-large": _modernbert(1024, 28, 16, 2624),
    "deberta-v3-xsmall": _deberta_v3(384, 12, 6),
    "deberta-v3-small": _deberta_v3(768, 6, 12),
    "deberta-v3-base": _deberta_v3(768, 12, 12),
    "deberta-v3-large": _deberta_v3(1024, 24, 16),
    "bert-base": _bert(768, 12, 12),
    "bert-large": _bert(1024, 24, 16),
    "minilm-l6-h384": _bert(384, 6, 12),
    "roberta-base": dict(_ROBERTA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "roberta-large": dict(_ROBERTA, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096),
    # XLM-R (Conneau et al., 2020): RoBERTa's shapes over a 250,002-token vocabulary
    "xlm-roberta-base": dict(_ROBERTA, model_type="xlm-roberta", vocab_size=250002, hidden_size=768,
                             num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "xlm-roberta-large": dict(_ROBERTA, model_type="xlm-roberta", vocab_size=250002, hidden_size=1024,
                              num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    # paraphrase-multilingual-MiniLM-L12-v2 (Reimers & Gurevych, 2020): a 12-layer, 384-wide BERT over XLM-R's
    # 250,002-token SentencePiece vocabulary (its tokenizer is XLM-R's)
    "multilingual-minilm-l12-h384": dict(_bert(384, 12, 12), vocab_size=250037, pad_token_id=0),
    # MPNet base (Song et al., 2020), the backbone of all-mpnet-base-v2
    "mpnet-base": dict(model_type="mpnet", vocab_size=30527, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
                       type_vocab_size=0, pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
                       relative_attention_num_buckets=32),
    # nomic-embed-text-v1.5 (Nussbaum et al., 2024): BERT-base's shape, SwiGLU, rotary positions of base 1,000
    "nomic-embed-text-v1.5": dict(model_type="nomic_bert", vocab_size=30528, hidden_size=768, num_hidden_layers=12,
                                  num_attention_heads=12, intermediate_size=3072, max_position_embeddings=8192,
                                  type_vocab_size=2, hidden_act="silu", hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, absolute_positions=False, attention_bias=False,
                                  mlp_bias=False, global_rope_theta=1000.0, local_rope_theta=1000.0),
    # gte-base-en-v1.5 (Li et al., 2023; Alibaba-NLP): BERT-base's shape, GLU, rotary positions of base 500,000, no
    # segments. The release scales its rotary table past 8,192 tokens ("ntk"), which encoderkit does not run: the
    # preset keeps the unscaled table, the same within max_position_embeddings.
    "gte-base-en-v1.5": dict(model_type="gte", vocab_size=30528, hidden_size=768, num_hidden_layers=12,
                             num_attention_heads=12, intermediate_size=3072, max_position_embeddings=8192,
                             type_vocab_size=0, pad_token_id=0, attention_probs_dropout_prob=0.0,
                             absolute_positions=False, global_rope_theta=500_000.0, local_rope_theta=500_000.0),
    # EuroBERT-210m (Boizard et al., 2025): 12 layers of 768, one key/value head per query head, a Llama-3 vocabulary
    "eurobert-210m": dict(model_type="eurobert", vocab_size=128256, hidden_size=768, num_hidden_layers=12,
                          num_attention_heads=12, num_key_value_heads=12, intermediate_size=3072,
                          max_position_embeddings=8192, hidden_act="silu", layer_norm_eps=1e-5, pad_token_id=128001,
                          bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False, attention_bias=False,
                          mlp_bias=False, decoder_bias=False, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, type_vocab_size=0, absolute_positions=False,
                          norm_bias=False, classifier_pooling="late", global_rope_theta=250_000.0,
                          local_rope_theta=250_000.0),
    "distilbert-base": dict(model_type="distilbert", hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                            intermediate_size=3072, type_vocab_size=0, classifier_dropout=0.2),
    "albert-base": dict(_ALBERT, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "albert-large": dict(_ALBERT, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096),
    "albert-xlarge": dict(_ALBERT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=8192),
    "albert-xxlarge": dict(_ALBERT, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64,
                           intermediate_size=16384),
    "electra-small": dict(_ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
                          intermediate_size=1024),
    "electra-base": dict(_ELECTRA, embedding_size=768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072),
    "electra-large": dict(_ELECTRA, embedding_size=1024, hidden_size=1024, num_hidden_layers=24,
                          num_attention_heads=16, intermediate_size=4096, layer_norm_eps=1e-12),
    "electra-small-generator": dict(_ELECTRA, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                                    num_attention_heads=4, intermediate_size=1024),
    "electra-base-generator": dict(_ELECTRA, embedding_size=768, hidden_size=256, num_hidden_layers=12,
                                   num_attention_heads=4, intermediate_size=1024),
    "electra-large-generator": dict(_ELECTRA, embedding_size=1024, hidden_size=256, num_hidden_layers=24,
                                    num_attention_heads=4, intermediate_size=1024),
}
