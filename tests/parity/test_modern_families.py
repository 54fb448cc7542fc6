"""Parity with transformers for ModernBERT and DeBERTa-v2/v3: every head, on padded batches of mixed lengths,
through both the unpadded path and the padded explicit one (attention maps), then saved and reloaded in
transformers. Shapes vary where the families have switches: ModernBERT's global-attention period, local windows
smaller and larger than the input, odd head counts; DeBERTa's pos_att_type, share_att_key, position buckets,
absolute positions and the convolution."""
from __future__ import annotations

import pytest
import torch

from encoderkit import load_model
from test_families import TOL, VOCAB, assert_parity_and_round_trip, make_batch, perturbed_reference

transformers = pytest.importorskip("transformers")


def modernbert(every: int = 3, window: int = 4, heads: int = 4, layers: int = 4, pooling: str = "cls"):
    hidden = 8 * heads  # head size 8, even for the rotary halves
    return lambda: transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=3 * hidden // 2 + 1, global_attn_every_n_layers=every, local_attention=window,
        global_rope_theta=1000.0, local_rope_theta=50.0, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, cls_token_id=1, sep_token_id=2, classifier_pooling=pooling)


def deberta(**switches):
    settings = dict(relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8, max_relative_positions=-1,
                    share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)
    settings.update(switches)
    return lambda: transformers.DebertaV2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40, **settings)


VARIANTS = {
    # ModernBERT: the batch's rows have 13, 9 and 6 tokens
    "modernbert-every3-window4": modernbert(),
    "modernbert-every1": modernbert(every=1),
    "modernbert-every2-window64": modernbert(every=2, window=64),
    "modernbert-odd-heads-mean": modernbert(every=2, window=6, heads=3, layers=3, pooling="mean"),
    # DeBERTa-v3 as released, and the switches one at a time
    "deberta-v3": deberta(),
    "deberta-c2p-own-keys": deberta(pos_att_type="c2p", share_att_key=False),
    "deberta-p2c-no-buckets": deberta(pos_att_type="p2c", position_buckets=-1, max_relative_positions=6,
                                      norm_rel_ebd="none"),
    "deberta-v2-style": deberta(share_att_key=False, position_buckets=-1, max_relative_positions=-1,
                                position_biased_input=True, type_vocab_size=2, conv_kernel_size=3, norm_rel_ebd="none"),
    "deberta-no-relative": deberta(relative_attention=False, position_biased_input=True),
}
STEMS = {"modernbert": "ModernBert", "deberta": "DebertaV2"}
TASKS = {"base": "Model", "masked-lm": "ForMaskedLM", "sequence-classification": "ForSequenceClassification",
         "token-classification": "ForTokenClassification", "question-answering": "ForQuestionAnswering"}
CASES = [(variant, task) for variant in VARIANTS for task in TASKS
         if task in ("base", "masked-lm") or variant in ("modernbert-every3-window4", "modernbert-odd-heads-mean",
                                                         "deberta-v3", "deberta-v2-style")]


def hf_class(variant: str, task: str):
    return getattr(transformers, STEMS[variant.split("-")[0]] + TASKS[task])


def build_reference(variant: str, task: str, **config_changes):
    config = VARIANTS[variant]()
    for key, value in config_changes.items():
        setattr(config, key, value)
    return config, perturbed_reference(hf_class(variant, task), config, task)


@pytest.mark.parametrize(("variant", "task"), CASES, ids=[f"{v}-{t}" for v, t in CASES])
def test_load_matches_transformers_and_round_trips(variant: str, task: str, tmp_path) -> None:
    config, reference = build_reference(variant, task)
    reference.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.task == task
    inputs = make_batch(config, config.pad_token_id)
    assert_parity_and_round_trip(reference, ours, inputs, tmp_path / "ours", f"{variant}/{task}")


@pytest.mark.parametrize("variant", ["modernbert-every3-window4"])  # DeBERTa-v2 has no sdpa in transformers
def test_sdpa_reference_agrees(variant: str, tmp_path) -> None:
    """transformers' sdpa implementation (what users run) gives the same states as encoderkit."""
    config, reference = build_reference(variant, "base")
    reference.save_pretrained(tmp_path)
    sdpa = hf_class(variant, "base").from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    ours = load_model(tmp_path)
    inputs = make_batch(config, config.pad_token_id)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        diff = (sdpa(**inputs).last_hidden_state - ours(**inputs).last_hidden_state)[real].abs().max()
    assert diff <= TOL


@pytest.mark.parametrize("legacy", [True, False])
def test_deberta_mlm_head_in_both_layouts(legacy: bool, tmp_path) -> None:
    """DeBERTa's MLM head: cls.predictions.* (legacy) or lm_predictions.lm_head.* (new); both load, and saving
    keeps the config's layout."""
    config, reference = build_reference("deberta-v3", "masked-lm", legacy=legacy)
    reference.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    inputs = make_batch(config, config.pad_token_id)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = reference(**inputs).logits
        assert (ours(**inputs).logits - want)[real].abs().max() <= TOL
    ours.save_pretrained(tmp_path / "ours")
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "ours" / "model.safetensors")))
    assert ("cls.predictions.bias" in names) == legacy and ("lm_predictions.lm_head.bias" in names) == (not legacy)
    reloaded = hf_class("deberta-v3", "masked-lm").from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert (reloaded(**inputs).logits - want)[real].abs().max() <= TOL


def test_modernbert_local_attention_memory_is_linear_in_length() -> None:
    """The sliding-window kernel never builds a length x length score matrix: at 4x the length, its largest
    intermediate grows 4x (not 16x)."""
    from encoderkit.modeling.attention import local_attention, window_mask

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 8) for _ in range(3))
    key_mask = torch.ones(1, 300, dtype=torch.bool)
    key_mask[0, 250:] = False
    got = local_attention(q, k, v, key_mask, 16, 0.0)
    allowed = window_mask(300, 16, q.device)[None, None] & key_mask[:, None, None, :]
    bias = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert (got - want)[:, :, :250].abs().max() <= TOL

    peaks = []
    for length in (512, 2048):
        q = torch.randn(1, 2, length, 8)
        with torch.profiler.profile(profile_memory=True) as prof:
            local_attention(q, q, q, None, 64, 0.0)
        peaks.append(max(event.cpu_memory_usage for event in prof.key_averages()))
    assert peaks[1] <= 5 * peaks[0]


@pytest.mark.data
def test_modernbert_trained_at_1024_tokens_runs_at_8192(tmp_path) -> None:
    """ModernBERT's recipe: pre-train at 1,024 tokens, run at 8,192. A tiny modernbert pre-trained on WikiText
    windows of 1,024 tokens embeds an 8,192-token input on the engine with the states transformers computes."""
    import json

    from conftest import shared_file
    from encoderkit.engine import engine_for
    from encoderkit.training.pretrain import pretrain

    corpus = shared_file("data", "wikitext2_raw", "wiki.test.raw")
    config = {"model_type": "modernbert", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
              "intermediate_size": 48, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
              "local_attention": 64, "max_position_embeddings": 8192, "pad_token_id": 0}
    result = pretrain(corpus, tmp_path / "run", config=json.dumps(config), max_length=1024, max_steps=2,
                      batch_size=2, save_every=0, eval_every=0, show_progress=False)
    assert result["masking"]["rate"] == pytest.approx(0.30)
    final = tmp_path / "run" / "final"
    ours = load_model(final, task="base")
    reference = transformers.ModernBertModel.from_pretrained(final, attn_implementation="sdpa").eval()
    ids = torch.randint(5, ours.config.vocab_size, (1, 8192), generator=torch.Generator().manual_seed(0))
    (_, states, _), = list(engine_for(ours).run([ids[0].tolist()]))
    with torch.no_grad():
        want = reference(input_ids=ids).last_hidden_state[0]
    assert states.shape == (8192, 32) and (states - want).abs().max() <= 1e-4
