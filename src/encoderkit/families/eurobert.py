"""EuroBERT (Boizard et al., 2025): a Llama-style encoder. Pre-norm blocks with RMSNorm and no biases, grouped-query
attention (num_key_value_heads key/value heads shared by the query heads), rotary positions, SwiGLU, a final norm;
the embeddings are tokens only, unnormalised. The MLM head is the decoder alone; the sequence classifier is
dense -> GELU -> linear on the summary its config's classifier_pooling names ("bos", "mean"), or "late", on every
token, its logits averaged. The checkpoints' gate and up matrices are joined here as [up; gate]."""
from .base import Family
from .nomic_bert import ROTARY_BUFFERS

_LAYER = "layers.{i}."

FAMILY = Family(
    name="eurobert", hf_prefix="model", hf_class_stem="EuroBert",
    config_keys=dict(layer_norm_eps="rms_norm_eps", attention_probs_dropout_prob="attention_dropout",
                     decoder_bias="mlp_bias"),  # the MLM decoder's bias follows mlp_bias, as in transformers
    defaults=dict(
        vocab_size=128256, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=None, hidden_act="silu", max_position_embeddings=8192, initializer_range=0.02,
        layer_norm_eps=1e-5, pad_token_id=128001, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, decoder_bias=False, attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0, type_vocab_size=0, absolute_positions=False, norm_bias=False,
        classifier_pooling="late", global_rope_theta=10_000.0, local_rope_theta=10_000.0,
    ),
    own_fields=("attention_bias", "mlp_bias", "decoder_bias", "num_key_value_heads", "classifier_pooling"),
    skipped_fields=("hidden_dropout_prob", "type_vocab_size", "classifier_dropout"),
    norm_placement="pre", norm="rms", embedding_norm=False, final_norm=True, mlp="glu", glu_activated_half="second",
    rotary=True, mlm_transform=False, classifier="dense_gelu",
    base_rules=(
        ("embeddings.word", "embed_tokens"),
        ("layers.{i}.attention.query", _LAYER + "self_attn.q_proj"),
        ("layers.{i}.attention.key", _LAYER + "self_attn.k_proj"),
        ("layers.{i}.attention.value", _LAYER + "self_attn.v_proj"),
        ("layers.{i}.attention.output", _LAYER + "self_attn.o_proj"),
        ("layers.{i}.attention_norm", _LAYER + "input_layernorm"),
        ("layers.{i}.ffn_norm", _LAYER + "post_attention_layernorm"),
        ("layers.{i}.ffn_in", _LAYER + "mlp.up_proj+" + _LAYER + "mlp.gate_proj"),
        ("layers.{i}.ffn_out", _LAYER + "mlp.down_proj"),
        ("final_norm", "norm"),
    ),
    head_rules={
        "mlm": (("mlm_head.decoder", "lm_head"),),
        "classifier": (("classifier.dense", "dense"), ("classifier.out", "classifier")),
        "token": (("token_classifier.out", "classifier"),),
        "span": (("span_head.out", "qa_outputs"),),
    },
    ignorable=(ROTARY_BUFFERS,),
    tied_decoders=("lm_head.weight",),
)
