"""Membership inference: PLL and loss scores against by-hand loops and transformers, the calibrated score,
a tiny overfit model whose members score as members, bad input, and the `scan membership` command."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import load_model
from encoderkit.cli import main
from encoderkit.errors import DataError, InputError
from encoderkit.reports import roc_auc
from encoderkit.security.membership import MembershipInference, MLMScorer, read_texts, roc_curve
from encoderkit.tokenizer import Tokenizer

from helpers import tiny_bert_dir

LONG_TEXT = ("the quick brown fox jumps over the lazy dog, and then it runs far away into the deep dark forest "
             "where nobody has ever seen it again.")
TEXTS = [LONG_TEXT, "hello world", "membership inference asks whether a text was in the training data."]


def _perturbed_mlm_dir(directory: Path, minilm_dir: Path, seed: int) -> Path:
    """A tiny random MLM whose weights are moved off their initial values, so predictions vary by token."""
    tiny_bert_dir(directory, minilm_dir, task="masked-lm")
    model = load_model(directory, task="masked-lm")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)
    model.save_pretrained(directory)
    return directory


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_mlm(tmp_path_factory, minilm_dir) -> Path:
    return _perturbed_mlm_dir(tmp_path_factory.mktemp("tiny-mlm"), minilm_dir, seed=1)


@pytest.fixture(scope="module")
def other_mlm(tmp_path_factory, minilm_dir) -> Path:
    return _perturbed_mlm_dir(tmp_path_factory.mktemp("other-mlm"), minilm_dir, seed=2)


def _windows_by_hand(tokenizer: Tokenizer, text: str, max_length: int) -> list[list[int]]:
    ids = tokenizer.encode(text, add_special_tokens=False, truncation=False).input_ids
    cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
    content = max_length - 2
    return [[cls_id, *ids[start:start + content], sep_id] for start in range(0, len(ids), content)]


# ---------------------------------------------------------------------------------------------
# Scores against independent references
# ---------------------------------------------------------------------------------------------
def test_pll_equals_a_by_hand_masking_loop(tiny_mlm: Path) -> None:
    max_length = 12  # LONG_TEXT (28 tokens) spans three windows
    scorer = MLMScorer.from_pretrained(tiny_mlm, max_length=max_length, pll_max_tokens=None)
    model = load_model(tiny_mlm, task="masked-lm").eval()
    tokenizer = Tokenizer.from_pretrained(tiny_mlm)
    scores = scorer.pll_scores(TEXTS)
    for index, text in enumerate(TEXTS):
        log_likelihoods = []
        for window in _windows_by_hand(tokenizer, text, max_length):
            for position in range(1, len(window) - 1):  # every token but [CLS] and [SEP], masked alone
                masked = torch.tensor([window])
                masked[0, position] = tokenizer.mask_token_id
                with torch.no_grad():
                    logits = model(masked).logits[0, position]
                log_likelihoods.append(float(logits.double().log_softmax(-1)[window[position]]))
        assert scores.token_counts[index] == len(log_likelihoods)
        assert abs(scores.pseudo_log_likelihoods[index] - sum(log_likelihoods)) < 1e-5 * len(log_likelihoods)
        assert abs(scores.values[index] + np.mean(log_likelihoods)) < 1e-5
    assert len(_windows_by_hand(tokenizer, LONG_TEXT, max_length)) >= 3

    capped = MLMScorer.from_pretrained(tiny_mlm, max_length=max_length, pll_max_tokens=5).pll_scores([LONG_TEXT])
    first_five = []
    window = _windows_by_hand(tokenizer, LONG_TEXT, max_length)[0]
    for position in range(1, 6):
        masked = torch.tensor([window])
        masked[0, position] = tokenizer.mask_token_id
        with torch.no_grad():
            first_five.append(float(model(masked).logits[0, position].double().log_softmax(-1)[window[position]]))
    assert capped.token_counts[0] == 5 and abs(capped.pseudo_log_likelihoods[0] - sum(first_five)) < 1e-5 * 5


def test_loss_score_equals_transformers_masked_lm_loss(tiny_mlm: Path, other_mlm: Path) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertForMaskedLM.from_pretrained(tiny_mlm).eval()
    scorer = MLMScorer.from_pretrained(tiny_mlm, max_length=12, draws=3, mask_rate=0.3, seed=7)
    scores = scorer.loss_scores(TEXTS)
    special = set(scorer.special_ids)
    for index, ids in enumerate(scorer.tokenize(TEXTS)):
        copies = scorer.masked_copies(ids)
        assert len(copies) == 3 * len(scorer.windows(ids))
        total, count = 0.0, 0
        for masked, labels in copies:
            selected = labels != -100
            assert selected.any(), "every draw masks at least one token"
            assert not set(labels[selected].tolist()) & special, "special tokens are never masked"
            assert (masked[selected] == scorer.mask_id).all()
            with torch.no_grad():
                out = reference(input_ids=torch.from_numpy(masked)[None], labels=torch.from_numpy(labels)[None])
            total += float(out.loss) * int(selected.sum())
            count += int(selected.sum())
        assert scores.token_counts[index] == count
        assert abs(scores.values[index] - total / count) < 1e-5

    # The masks depend on the text and the seed only: another model masks the same positions ...
    other = MLMScorer.from_pretrained(other_mlm, max_length=12, draws=3, mask_rate=0.3, seed=7)
    ids = scorer.tokenize([LONG_TEXT])[0]
    for (a, la), (b, lb) in zip(scorer.masked_copies(ids), other.masked_copies(ids)):
        assert np.array_equal(a, b) and np.array_equal(la, lb)
    # ... and another seed other positions.
    reseeded = MLMScorer.from_pretrained(tiny_mlm, max_length=12, draws=3, mask_rate=0.3, seed=8)
    assert any(not np.array_equal(a, b) for (a, _), (b, _) in zip(scorer.masked_copies(ids),
                                                                  reseeded.masked_copies(ids)))


def test_unmasked_tokens_are_kept_and_rate_is_respected(tiny_mlm: Path) -> None:
    scorer = MLMScorer.from_pretrained(tiny_mlm, max_length=128, draws=50, mask_rate=0.2)
    ids = scorer.tokenize([LONG_TEXT])[0]
    window = scorer.windows(ids)[0]
    masked_share = []
    for masked, labels in scorer.masked_copies(ids):
        kept = labels == -100
        assert np.array_equal(masked[kept], window[kept])
        assert np.array_equal(labels[~kept], window[~kept]) and (masked[~kept] == scorer.mask_id).all()
        masked_share.append((~kept).sum() / len(ids))
    assert 0.15 < np.mean(masked_share) < 0.25  # 50 draws of 28 tokens at rate 0.2: mean 0.2, sd about 0.01


def test_calibrated_score_is_target_minus_reference(tiny_mlm: Path, other_mlm: Path) -> None:
    for kind in ("loss", "pll"):
        attack = MembershipInference.from_pretrained(tiny_mlm, reference=other_mlm, max_length=16, pll_max_tokens=8)
        scores = attack.score(TEXTS, kind)
        target_alone = MLMScorer.from_pretrained(tiny_mlm, max_length=16, pll_max_tokens=8).scores(TEXTS, kind)
        reference_alone = MLMScorer.from_pretrained(other_mlm, max_length=16, pll_max_tokens=8).scores(TEXTS, kind)
        assert np.array_equal(scores.target, target_alone.values)
        assert np.array_equal(scores.reference, reference_alone.values)
        assert np.array_equal(scores.calibrated, target_alone.values - reference_alone.values)
        assert np.abs(scores.calibrated).min() > 1e-4  # two different models: a real difference

        same = MembershipInference.from_pretrained(tiny_mlm, reference=tiny_mlm, max_length=16).score(TEXTS, kind)
        assert np.array_equal(same.calibrated, np.zeros(len(TEXTS)))

    alone = MembershipInference.from_pretrained(tiny_mlm, max_length=16).score(TEXTS)
    assert alone.reference is None and alone.calibrated is None and np.array_equal(alone.best, alone.target)


def test_roc_curve_matches_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    positive, negative = np.round(rng.normal(1, 1, 200), 1), np.round(rng.normal(0, 1, 300), 1)  # with ties
    fpr, tpr = roc_curve(positive, negative)
    labels = np.concatenate([np.ones(200), np.zeros(300)])
    expected_fpr, expected_tpr, _ = metrics.roc_curve(labels, np.concatenate([positive, negative]),
                                                      drop_intermediate=False)
    assert np.allclose(fpr, expected_fpr) and np.allclose(tpr, expected_tpr)
    assert abs(np.trapezoid(tpr, fpr) - roc_auc(positive, negative)) < 1e-12


# ---------------------------------------------------------------------------------------------
# A model overfit on a few texts recognises them
# ---------------------------------------------------------------------------------------------
WORDS = ("river mountain apple window garden yellow silent market doctor winter violin castle engine bridge "
         "orange pencil rabbit thunder island candle forest mirror jacket planet summer copper lantern meadow "
         "harbor pillow desert crystal").split()


def _random_sentences(count: int, seed: int, length: int = 10) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=length)) for _ in range(count)]


def test_overfit_tiny_model_scores_members_as_members(tmp_path: Path, minilm_dir: Path) -> None:
    torch.manual_seed(0)
    model_dir = tiny_bert_dir(tmp_path / "model", minilm_dir, task="masked-lm")
    members, non_members = _random_sentences(12, seed=1), _random_sentences(12, seed=2)
    model = load_model(model_dir, task="masked-lm").train()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    batch = tokenizer.encode_batch(members)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    generator = torch.Generator().manual_seed(0)
    real = batch.attention_mask.bool() & (batch.special_tokens_mask == 0)
    for _ in range(80):  # a few seconds: fresh random masks each step, members only
        selected = real & (torch.rand(batch.input_ids.shape, generator=generator) < 0.3)
        labels = torch.where(selected, batch.input_ids, torch.full_like(batch.input_ids, -100))
        inputs = torch.where(selected, torch.full_like(batch.input_ids, tokenizer.mask_token_id), batch.input_ids)
        loss = model(inputs, batch.attention_mask, labels=labels, sparse=True).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(model_dir)

    report = MembershipInference.from_pretrained(model_dir, draws=8).evaluate(members, non_members, "loss")
    assert report.auc > 0.9, report.markdown()
    assert report.mean_scores["target"]["members"] < report.mean_scores["target"]["non_members"]
    pll = MembershipInference.from_pretrained(model_dir).evaluate(members, non_members, "pll")
    assert pll.auc > 0.9, pll.markdown()


# ---------------------------------------------------------------------------------------------
# Bad input, reading texts, the report and the command
# ---------------------------------------------------------------------------------------------
def test_bad_input_raises_input_error(tiny_mlm: Path, tmp_path: Path, minilm_dir: Path) -> None:
    scorer = MLMScorer.from_pretrained(tiny_mlm, max_length=16)
    with pytest.raises(InputError, match="no texts"):
        scorer.loss_scores([])
    with pytest.raises(InputError, match="not one string"):
        scorer.loss_scores("a single string")
    with pytest.raises(InputError, match="text 1 has no tokens"):
        scorer.loss_scores(["fine", "   "])
    with pytest.raises(InputError, match="not a string"):
        scorer.loss_scores(["fine", 3])
    with pytest.raises(InputError, match="unknown score"):
        scorer.scores(["fine"], kind="perplexity")
    with pytest.raises(InputError, match="max_length"):
        MLMScorer.from_pretrained(tiny_mlm, max_length=1000)
    with pytest.raises(InputError, match="mask_rate"):
        MLMScorer.from_pretrained(tiny_mlm, mask_rate=1.5)
    with pytest.raises(InputError, match="draws"):
        MLMScorer.from_pretrained(tiny_mlm, draws=0)
    with pytest.raises(InputError, match="without a trained MLM head"):
        MLMScorer.from_pretrained(tiny_bert_dir(tmp_path / "base", minilm_dir, task="base"))
    attack = MembershipInference(scorer)
    with pytest.raises(InputError, match="non-members"):
        attack.evaluate(["a text"], [])
    with pytest.raises(InputError, match="settings"):
        MembershipInference(scorer, MLMScorer.from_pretrained(tiny_mlm, max_length=16, draws=2))


def test_read_texts(tmp_path: Path) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("first line\nof one document\n\n\n  second document  \n\nthird\n", encoding="utf-8")
    assert read_texts(path) == ["first line\nof one document", "second document", "third"]
    assert read_texts(path, "line") == ["first line", "of one document", "second document", "third"]
    with pytest.raises(DataError, match="does not exist"):
        read_texts(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(DataError, match="holds no text"):
        read_texts(tmp_path / "empty.txt")
    with pytest.raises(InputError, match="documents"):
        read_texts(path, "paragraph")


def test_cli_writes_report_files(tiny_mlm: Path, other_mlm: Path, tmp_path: Path, capsys) -> None:
    members, non_members = tmp_path / "members.txt", tmp_path / "non_members.txt"
    members.write_text("\n\n".join(_random_sentences(6, seed=3)) + "\n", encoding="utf-8")
    non_members.write_text("\n\n".join(_random_sentences(5, seed=4)) + "\n", encoding="utf-8")
    out = tmp_path / "report"
    code = main(["scan", "membership", str(tiny_mlm), "--members", str(members), "--non-members", str(non_members),
                 "--reference", str(other_mlm), "--score", "pll", "--max-length", "16", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "membership.json").read_text())
    assert data["score"] == "pll" and data["members"] == 6 and data["non_members"] == 5
    assert len(data["member_scores"]["calibrated"]) == 6 and data["calibrated_auc"] is not None
    assert "AUC" in (out / "membership.md").read_text()
    for name in ("membership_roc.png", "membership_scores.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / name).stat().st_size > 2000
    assert "AUC" in capsys.readouterr().out

    code = main(["scan", "membership", str(tiny_mlm), "--members", str(tmp_path / "absent.txt"),
                 "--non-members", str(non_members), "--out", str(out)])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
