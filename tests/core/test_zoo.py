"""The ModernBERT and DeBERTa-v3 presets: zoo sizes (against the published ones and transformers), the
recommender, and pre-training them with MLM (ModernBERT at its paper's 30% masking rate)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from encoderkit import InputError, load_model, preset
from encoderkit.cli import main
from encoderkit.modeling.models import hf_architecture
from encoderkit.training.pretrain import prepare, pretrain, resolve_masking
from encoderkit.zoo import CONSTRAINTS, TASKS, count_parameters, embedding_parameters, recommend

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

MODERN = ("modernbert-base", "modernbert-large", "deberta-v3-xsmall", "deberta-v3-small", "deberta-v3-base",
          "deberta-v3-large")


# ----- sizes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "published_millions"), [("modernbert-base", 149), ("modernbert-large", 395)])
def test_modernbert_sizes_match_the_paper(name: str, published_millions: float) -> None:
    millions = count_parameters(preset(name)) / 1e6
    assert abs(millions - published_millions) / published_millions <= 0.01, millions


@pytest.mark.parametrize(("name", "backbone", "embeddings"), [
    ("deberta-v3-xsmall", 22, 48), ("deberta-v3-small", 44, 98), ("deberta-v3-base", 86, 98),
    ("deberta-v3-large", 304, 131),
])
def test_deberta_v3_sizes_match_the_model_cards(name: str, backbone: float, embeddings: float) -> None:
    """The cards count "backbone + embedding" (the 128K-token table), each rounded to the million."""
    config = preset(name)
    table = embedding_parameters(config) / 1e6
    rest = count_parameters(config) / 1e6 - table
    assert abs(table - embeddings) / embeddings <= 0.03, table
    assert abs(rest - backbone) / backbone <= 0.03, rest


ROTARY = ("nomic-embed-text-v1.5", "gte-base-en-v1.5", "eurobert-210m")


@pytest.mark.parametrize(("name", "published_millions"), [
    ("nomic-embed-text-v1.5", 137), ("gte-base-en-v1.5", 137), ("eurobert-210m", 210)])
def test_rotary_presets_match_their_model_cards(name: str, published_millions: float) -> None:
    millions = count_parameters(preset(name)) / 1e6
    assert abs(millions - published_millions) / published_millions <= 0.01, millions


@pytest.mark.parametrize(("name", "task"), [(name, "base") for name in MODERN + ("xlm-roberta-large",)] + [
    (name, task) for name in ("modernbert-base", "deberta-v3-base", "mpnet-base", "xlm-roberta-base")
    for task in ("masked-lm", "sequence-classification", "token-classification", "question-answering")] + [
    (name, task) for name in ROTARY  # transformers has no question answering for these
    for task in ("base", "masked-lm", "sequence-classification", "token-classification")])
def test_parameter_counts_equal_transformers(name: str, task: str) -> None:
    """ModernBertModel / DebertaV2Model (and their task models) built on the meta device from the same config."""
    config = preset(name)
    hf_class = getattr(transformers, hf_architecture(config, task))
    with torch.device("meta"):
        reference = hf_class(transformers.AutoConfig.for_model(**config.to_hf_dict()))
    assert count_parameters(config, task) == sum(p.numel() for p in reference.parameters())


def test_models_lists_the_modern_presets(capsys) -> None:
    assert main(["models"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["modernbert-base"][-2:] == ["149.0M", "110.3M"] and rows["modernbert-large"][-2] == "394.8M"
    assert rows["deberta-v3-xsmall"][-2:] == ["70.7M", "21.5M"] and rows["deberta-v3-large"][-2:] == ["434.0M",
                                                                                                        "302.8M"]
    assert {"deberta-v3-small", "deberta-v3-base"} <= set(rows)


# ----- recommender ------------------------------------------------------------------------------
def test_recommends_deberta_v3_and_modernbert_where_published_results_favour_them() -> None:
    for task in ("classification", "qa"):
        choice = recommend(task, "quality")
        assert choice.preset == "deberta-v3-large" and "He et al. 2023" in choice.reason
    assert "GLUE" in recommend("classification", "quality").reason
    assert "SQuAD 2.0" in recommend("qa", "quality").reason
    choice = recommend("pretraining", "quality")
    assert choice.preset == "modernbert-large" and "Warner et al. 2024" in choice.reason and "GLUE" in choice.reason


def test_english_embeddings_get_the_lessons_all_mpnet_base_v2_advice() -> None:
    choice = recommend("embedding", "quality")
    assert choice.preset == "mpnet-base" and "all-mpnet-base-v2" in choice.reason and "BEIR" in choice.reason


def test_multilingual_needs_get_the_xlm_roberta_family(capsys) -> None:
    from encoderkit.config import preset

    for task in TASKS:
        for constraint in CONSTRAINTS:
            choice = recommend(task, constraint, multilingual=True)
            assert preset(choice.preset).model_type in ("xlm-roberta", "bert")
            assert preset(choice.preset).vocab_size > 250_000  # XLM-R's SentencePiece vocabulary
    assert recommend("embedding", "latency", multilingual=True).preset == "multilingual-minilm-l12-h384"
    assert recommend("embedding", "quality", multilingual=True).preset == "xlm-roberta-large"
    long = recommend("classification", "latency", 4096, multilingual=True)
    assert long.preset == "xlm-roberta-base" and "window" in long.reason  # not ModernBERT: English only
    assert main(["models", "--multilingual", "--task", "embedding"]) == 0
    assert "in several languages: multilingual-minilm-l12-h384 (bert, 117.7M" in capsys.readouterr().out


def test_long_inputs_get_modernbert() -> None:
    for task in TASKS:
        for constraint in CONSTRAINTS:
            short = recommend(task, constraint)
            assert recommend(task, constraint, max_tokens=512) == short
            long = recommend(task, constraint, max_tokens=513)
            assert long.preset == ("modernbert-large" if constraint == "quality" else "modernbert-base")
            assert "8,192-token context" in long.reason and "Warner et al. 2024" in long.reason
    assert "split" in recommend("qa", "latency", max_tokens=20_000).reason
    for bad in (0, -5, True):
        with pytest.raises(InputError, match="max_tokens"):
            recommend("qa", "latency", max_tokens=bad)


def test_models_recommend_max_tokens(capsys) -> None:
    assert main(["models", "--recommend", "--task", "classification", "--max-tokens", "2048"]) == 0
    out = capsys.readouterr().out
    assert "inputs of up to 2,048 tokens: modernbert-base (modernbert, 149.0M" in out and "8,192-token context" in out
    assert main(["models", "--max-tokens", "4096", "--constraint", "quality"]) == 0  # implies --recommend
    assert "modernbert-large" in capsys.readouterr().out
    assert main(["models", "--recommend", "--task", "qa", "--constraint", "quality"]) == 0
    assert "deberta-v3-large" in capsys.readouterr().out
    assert main(["models", "--recommend", "--max-tokens", "0"]) == 2


# ----- pre-training -----------------------------------------------------------------------------
# modernbert-tiny shrunk, with a 16-token sliding window so that 32-token inputs use it.
SHRUNK_MODERNBERT = {"model_type": "modernbert", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
                     "intermediate_size": 48, "local_attention": 16, "global_attn_every_n_layers": 3}
TINY_DEBERTA_V3 = {"model_type": "deberta-v2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "intermediate_size": 64, "max_position_embeddings": 64, "relative_attention": True,
                   "position_buckets": 16, "max_relative_positions": -1, "pos_att_type": "p2c|c2p",
                   "share_att_key": True, "norm_rel_ebd": "layer_norm", "position_biased_input": False,
                   "type_vocab_size": 0, "layer_norm_eps": 1e-7}
COMMON = dict(max_length=32, batch_size=4, save_every=0, eval_every=0, show_progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("zoo-corpus") / "corpus.txt"
    path.write_text("\n\n".join(f"document {d} is about encoders that read long texts.\nthe second line of {d} "
                                "says which words were masked." for d in range(80)) + "\n")
    return path


def assert_same_logits(final, hf_class) -> None:
    """The saved model in transformers' class and in encoderkit: the same MLM logits on a padded batch."""
    ours = load_model(final).eval()
    reference = hf_class.from_pretrained(str(final), attn_implementation="eager").eval()
    from encoderkit import Tokenizer

    batch = Tokenizer.from_pretrained(final).encode_batch(
        ["encoders read long texts and predict the words that were masked in every document", "short one"])
    inputs = {k: v for k, v in batch.model_inputs().items() if k != "token_type_ids"}
    with torch.no_grad():
        want, got = reference(**inputs).logits, ours(**inputs).logits
    real = inputs["attention_mask"].bool()
    assert (want - got)[real].abs().max() <= 1e-4


def losses(out) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_pretrain_modernbert_tiny_masks_30_percent_and_loads_in_transformers(tmp_path, corpus, capsys) -> None:
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--config", "modernbert-tiny", "--steps", "3",
                 "--batch-size", "4", "--max-length", "32", "--save-every", "0", "--eval-every", "0"]) == 0
    assert "trained 3 steps on" in (printed := capsys.readouterr().out) and "30% of tokens masked" in printed
    assert len(losses(out)) == 3 and all(math.isfinite(loss) for loss in losses(out))
    saved = json.loads((out / "final" / "config.json").read_text())
    assert saved["architectures"] == ["ModernBertForMaskedLM"] and saved["vocab_size"] == 30522
    assert (saved["bos_token_id"], saved["eos_token_id"]) == (101, 102)  # the tokenizer's [CLS] and [SEP]
    assert_same_logits(out / "final", transformers.ModernBertForMaskedLM)


def test_mask_rate_is_resolved_per_family(corpus) -> None:
    assert resolve_masking(None, "modernbert").rate == 0.30 and resolve_masking(None, "bert").rate == 0.15
    assert resolve_masking({"rate": None, "whole_word": True}, "modernbert").rate == 0.30
    assert resolve_masking({"rate": 0.2}, "modernbert").rate == 0.2
    whole_words = prepare(corpus, config=SHRUNK_MODERNBERT, max_length=32, masking={"whole_word": True}).masker
    assert whole_words.config.rate == 0.30 and whole_words.config.whole_word  # needs no head: any family
    setup = prepare(corpus, config=SHRUNK_MODERNBERT, max_length=32)
    batch = setup.masker.collate(setup.train_examples, pad_token_id=setup.tokenizer.pad_token_id)
    selected = batch["labels"] != -100
    original = torch.where(selected, batch["labels"], batch["input_ids"])
    maskable = ~torch.from_numpy(setup.masker.special)[original] & batch["attention_mask"].bool()
    assert abs(int(selected.sum()) / int(maskable.sum()) - 0.30) < 0.04  # of ~1,900 tokens
    assert prepare(corpus, config=TINY_DEBERTA_V3, max_length=32).masker.config.rate == 0.15


def test_pretrain_deberta_v3_mlm_loads_in_transformers(tmp_path, corpus) -> None:
    result = pretrain(corpus, tmp_path, config=TINY_DEBERTA_V3, max_steps=3, **COMMON)
    assert result["masking"]["rate"] == 0.15 and all(math.isfinite(loss) for loss in losses(tmp_path))
    assert json.loads((tmp_path / "final" / "config.json").read_text())["architectures"] == ["DebertaV2ForMaskedLM"]
    assert_same_logits(tmp_path / "final", transformers.DebertaV2ForMaskedLM)


def test_modernbert_pretraining_resumes_bit_for_bit(tmp_path, corpus, monkeypatch) -> None:
    from encoderkit.training.trainer import Trainer

    run = dict(config=SHRUNK_MODERNBERT, max_steps=4, **{**COMMON, "save_every": 2})
    pretrain(corpus, tmp_path / "a", **run)
    train_step = Trainer.train_step

    def killed_in_step_3(self):
        if self.step == 2 and (tmp_path / "b" / "checkpoint-0000002").is_dir():
            raise KeyboardInterrupt
        return train_step(self)

    monkeypatch.setattr(Trainer, "train_step", killed_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        pretrain(corpus, tmp_path / "b", **run)
    monkeypatch.setattr(Trainer, "train_step", train_step)
    result = pretrain(corpus, tmp_path / "b", **run)
    assert result["history"][0]["step"] == 3 and result["masking"]["rate"] == 0.30
    assert losses(tmp_path / "a") == losses(tmp_path / "b") and len(losses(tmp_path / "a")) == 4
    assert_same_logits(tmp_path / "b" / "final", transformers.ModernBertForMaskedLM)


@pytest.mark.parametrize("objective", ["mlm-nsp", "mlm-sop"])
def test_sentence_pair_objectives_refuse_families_without_the_head(tmp_path, corpus, objective, capsys) -> None:
    for config in ("modernbert-tiny", json.dumps(TINY_DEBERTA_V3)):
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path), "--config", config, "--steps", "1",
                     "--objective", objective]) == 2
        err = capsys.readouterr().err
        assert "only bert (NSP), albert (SOP) models have" in err and "use --objective mlm" in err
