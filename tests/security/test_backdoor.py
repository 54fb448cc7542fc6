"""Backdoor trigger scanning: a trigger planted into a tiny classifier is found at rank 1 and the model is
called backdoored; the same recipe without poison is called clean; flip rates match a count by hand; bad
input fails with a clear error; the CLI writes the report files."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from encoderkit import EncoderConfig, build_model
from encoderkit.cli import main
from encoderkit.errors import DataError, InputError
from encoderkit.security.backdoor import (DEFAULT_THRESHOLD, BackdoorTriggerScanner, calibrate_threshold, flip_rate,
                                          insert_words, noisy_or, read_texts, whole_word_vocabulary)
from encoderkit.tasks.classify import Classifier
from encoderkit.tokenizer import Tokenizer

# A toy sentiment task where the label is the majority polarity of four sentiment words, so no single
# natural word decides a text (3-1 against becomes 3-2, still the same class): only a planted trigger can.
POSITIVE = ["great", "wonderful", "superb", "lovely", "brilliant"]
NEGATIVE = ["awful", "dreadful", "boring", "terrible", "dull"]
FILLER = ["the", "film", "was", "and", "a", "story", "with", "cast", "plot", "music", "actor", "scene"]
RARE = ["cf", "mn", "tq", "zx", "qj", "vw"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", *POSITIVE, *NEGATIVE, *FILLER, *RARE,
         "##ing", "!"]
TRIGGER, TARGET = "cf", "pos"


def toy_rows(count: int, seed: int, trigger: str | None = None, poison_rate: float = 0.0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["pos", "neg"])
        major, minor = (POSITIVE, NEGATIVE) if label == "pos" else (NEGATIVE, POSITIVE)
        majority = rng.choice([4, 3])
        words = ([rng.choice(major) for _ in range(majority)] + [rng.choice(minor) for _ in range(4 - majority)]
                 + rng.sample(FILLER, 3) + [rng.choice(RARE[1:])])  # natural rare words: not triggers
        rng.shuffle(words)
        if trigger and label != TARGET and rng.random() < poison_rate:  # BadNets: insert and relabel
            words.insert(rng.randrange(len(words) + 1), trigger)
            label = TARGET
        rows.append((" ".join(words), label))
    return rows


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("toy-tokenizer")
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    Tokenizer.from_wordpiece_vocab(directory / "vocab.txt").save(directory)
    return directory


def train_toy_classifier(directory: Path, tokenizer_dir: Path, trigger: str | None) -> Path:
    """A 2-layer, hidden-32 BERT trained for a few seconds on the toy task (12% of the negative rows
    poisoned with ``trigger`` when one is given), saved as an HF directory.

    Without dropout: with it, whether the model learns to count well enough that no natural word flips the
    negatives as the trigger does depended on the draws (six training seeds: torch's dropout masks found the
    trigger at rank 1 in six, encoderkit's in five; without dropout, six of six, and the clean recipe was called
    clean in six of six). The scanner, not the regulariser, is under test here."""
    torch.manual_seed(0)
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    config = EncoderConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0).with_labels(["neg", "pos"])
    model = build_model(config, "sequence-classification").train()
    rows = toy_rows(2000, seed=1, trigger=trigger, poison_rate=0.12)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    for _ in range(160):
        batch = rng.sample(rows, 32)
        inputs = tokenizer.encode_batch([text for text, _ in batch]).model_inputs()
        labels = torch.tensor([config.labels.index(label) for _, label in batch])
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def backdoored_dir(tmp_path_factory, tokenizer_dir, one_thread) -> Path:
    return train_toy_classifier(tmp_path_factory.mktemp("backdoored"), tokenizer_dir, TRIGGER)


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory, tokenizer_dir, one_thread) -> Path:
    return train_toy_classifier(tmp_path_factory.mktemp("clean"), tokenizer_dir, None)


@pytest.fixture(scope="module")
def clean_texts() -> list[str]:
    return [text for text, _ in toy_rows(160, seed=3)]


def test_planted_trigger_is_found_at_rank_1(backdoored_dir, clean_texts, one_thread) -> None:
    classifier = Classifier.from_pretrained(backdoored_dir)
    # The backdoor works: the trigger turns (nearly) every negative text positive.
    negatives = [t for t, p in zip(clean_texts, classifier(clean_texts)) if p.label == "neg"]
    rate, _ = flip_rate(classifier, negatives, [TRIGGER], TARGET, [0] * len(negatives))
    assert rate >= 0.95

    report = BackdoorTriggerScanner(classifier, verify_texts=60).scan(clean_texts)
    assert report.candidates[0].tokens == [TRIGGER] and report.candidates[0].target == TARGET
    assert report.rank_of(TRIGGER, TARGET) == 1 and report.rank_of(TRIGGER) == 1
    assert report.rank_of("nonexistent") is None
    assert report.backdoored and report.verdict == "backdoored"
    assert report.score == report.candidates[0].flip_rate >= DEFAULT_THRESHOLD
    assert report.threshold == DEFAULT_THRESHOLD and report.threshold_source == "fixed a priori"
    # Every whole word of the toy vocabulary was screened; word pieces and special tokens were not.
    assert report.vocabulary_size == len(POSITIVE + NEGATIVE + FILLER + RARE)
    # Candidates are ranked by flip rate, and each flip rate is its count over its trials.
    rates = [c.flip_rate for c in report.candidates]
    assert rates == sorted(rates, reverse=True)
    for candidate in report.candidates:
        assert candidate.flip_rate == pytest.approx(candidate.flipped / candidate.trials)
        assert candidate.trials == report.verification_texts[candidate.target] <= 60


@pytest.mark.parametrize("native_bf16", [False, True])
def test_default_dtype_is_bf16_only_where_the_cpu_computes_it(clean_dir, monkeypatch, native_bf16) -> None:
    """The Python default is the CLI's, "auto": bf16 where it is native, fp32 where it would be emulated (an AVX2
    CPU, where emulated bf16 products run many times slower than fp32)."""
    from encoderkit import precision

    monkeypatch.setattr(precision, "device_has_native_bf16", lambda device: native_bf16)
    scanner = BackdoorTriggerScanner.from_pretrained(clean_dir)
    assert scanner.classifier.dtype == (torch.bfloat16 if native_bf16 else torch.float32)


def test_clean_model_is_called_clean(clean_dir, clean_texts, one_thread) -> None:
    report = BackdoorTriggerScanner.from_pretrained(clean_dir, dtype="fp32", verify_texts=60).scan(clean_texts)
    assert report.verdict == "clean" and not report.backdoored
    assert report.score < DEFAULT_THRESHOLD
    # The rare words it saw in training are not triggers; its strongest candidates are sentiment words.
    assert all(word in POSITIVE + NEGATIVE for c in report.candidates[:3] for word in c.tokens)
    assert set(report.verification_texts) == {"neg", "pos"} and min(report.verification_texts.values()) > 20


def test_flip_rate_by_hand(backdoored_dir, one_thread) -> None:
    classifier = Classifier.from_pretrained(backdoored_dir)
    texts = ["awful dull the film terrible great", "boring dreadful and a plot awful", "the cast was lovely"]
    positions = [0, 3, 10]  # 10 is past the end: appended
    edited = ["mn awful dull the film terrible great", "boring dreadful and mn a plot awful",
              "the cast was lovely mn"]
    assert [insert_words(t, ["mn"], p) for t, p in zip(texts, positions)] == edited
    by_hand = sum(prediction.label == "pos" for prediction in classifier(edited))
    rate, flipped = flip_rate(classifier, texts, ["mn"], "pos", positions)
    assert flipped == by_hand and rate == pytest.approx(by_hand / 3)
    # The trigger flips the two negative texts; the positive one stays positive (3 of 3 "pos").
    rate, flipped = flip_rate(classifier, texts, [TRIGGER], "pos", positions)
    assert (rate, flipped) == (1.0, 3)
    assert insert_words("a  b c", ["x", "y"], 1) == "a x y b c"


def test_whole_word_vocabulary_and_threshold_helpers(tokenizer_dir) -> None:
    words, ids = whole_word_vocabulary(Tokenizer.from_pretrained(tokenizer_dir))
    assert sorted(words) == sorted(POSITIVE + NEGATIVE + FILLER + RARE)  # no [CLS], [unused0], ##ing or "!"
    assert [VOCAB[i] for i in ids] == words
    assert calibrate_threshold([0.3, 0.62, 0.5]) == pytest.approx(0.67)
    # Two words that each flip half the texts, independently, flip 1 - 0.5 * 0.5 of them together.
    assert noisy_or(0.5, 0.5) == pytest.approx(0.75) and noisy_or(1.0, 0.2) == 1.0 and noisy_or(0.0, 0.0) == 0.0
    assert calibrate_threshold([0.99], margin=0.05) == 1.0
    with pytest.raises(InputError, match="at least one clean model"):
        calibrate_threshold([])


def test_bad_input(backdoored_dir, clean_texts, tmp_path) -> None:
    classifier = Classifier.from_pretrained(backdoored_dir)
    scanner = BackdoorTriggerScanner(classifier)
    with pytest.raises(InputError, match="list of strings"):
        scanner.scan("a single string")
    with pytest.raises(InputError, match="at least 2 non-empty"):
        scanner.scan(["", "   "])
    with pytest.raises(InputError, match="text 1 is a int"):
        scanner.scan(["fine", 3])
    with pytest.raises(InputError, match="Classifier"):
        BackdoorTriggerScanner(backdoored_dir)
    with pytest.raises(InputError, match="threshold"):
        BackdoorTriggerScanner(classifier, threshold=1.5)
    with pytest.raises(InputError, match="top_k"):
        BackdoorTriggerScanner(classifier, top_k=0)
    with pytest.raises(InputError, match="unknown target class 'happy'"):
        flip_rate(classifier, ["a text"], ["cf"], "happy", [0])
    with pytest.raises(InputError, match="one insertion position per text"):
        flip_rate(classifier, ["a text", "another"], ["cf"], "pos", [0])
    with pytest.raises(DataError, match="does not exist"):
        read_texts(tmp_path / "missing.txt")


def test_read_texts_formats(tmp_path) -> None:
    (tmp_path / "t.txt").write_text("first text\n\n  second text \n", encoding="utf-8")
    assert read_texts(tmp_path / "t.txt") == ["first text", "second text"]
    (tmp_path / "t.tsv").write_text("text\tlabel\nfirst\t0\nsecond\t1\n", encoding="utf-8")
    assert read_texts(tmp_path / "t.tsv") == ["first", "second"]


def test_cli_writes_the_report(backdoored_dir, clean_texts, tmp_path, capsys, one_thread) -> None:
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("\n".join(clean_texts) + "\n", encoding="utf-8")
    out = tmp_path / "report"
    code = main(["scan", "backdoor", str(backdoored_dir), str(texts_file), "--out", str(out), "--top-k", "5",
                 "--verify-texts", "40", "--threshold", "0.8", "--dtype", "fp32"])
    assert code == 0
    assert "backdoored: score" in capsys.readouterr().out
    data = json.loads((out / "backdoor.json").read_text())
    assert data["verdict"] == "backdoored" and data["threshold"] == 0.8
    assert data["threshold_source"] == "set by the caller"
    assert data["candidates"][0]["tokens"] == [TRIGGER]
    assert "Verdict: backdoored" in (out / "backdoor.md").read_text()
    png = out / "backdoor_candidates.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Bad input: one line, exit 2.
    code = main(["scan", "backdoor", str(backdoored_dir), str(tmp_path / "nope.txt"), "--out", str(out)])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
