"""Behaviour consistency: the edits are seeded and meaning-preserving (hand-checked examples and
invariants), an uncased model is exactly case-invariant, failing cases are exactly the label changes
(checked against the Classifier directly), bad input, the report and the `scan consistency` command."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from encoderkit import InputError
from encoderkit.cli import main
from encoderkit.errors import DataError
from encoderkit.security.consistency import (
    EDITS,
    FEMALE_NAMES,
    MALE_NAMES,
    BehaviorConsistencyValidator,
    apply_edit,
    parse_edits,
)
from encoderkit.tasks.classify import Classifier

from helpers import tiny_bert_dir

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TEXTS = [
    "the movie was wonderful and john loved it",
    "A sour little movie at its core ; the `` wild ride '' ends .",
    "Mary told Sarah that she was right!",
    "smart and fun , but far more witty than it is wise",
    "Peter and peter's sister Emma left early.",
    "It is a \"masterpiece\" of tedium",
    "ok",
    "an exploration of the emptiness that underlay the relentless gaiety of the 1920 's",
    "Will the real Mark please stand up?",  # "Will" and "Mark" are words here: not in the name lists
    "Not funny, not clever, and far too long.",
]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, minilm_dir) -> Classifier:
    """A tiny random BERT classifier with the (uncased) MiniLM tokenizer; large initial weights make its
    predictions sensitive to the tokens, so typos and punctuation do flip some labels."""
    directory = tiny_bert_dir(tmp_path_factory.mktemp("tiny-classifier"), minilm_dir, task="sequence-classification",
                              initializer_range=0.5)
    return Classifier.from_pretrained(directory)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    from conftest import shared_file

    try:
        path = shared_file("bench", "sentences.txt")
        return path.read_text(encoding="utf-8").splitlines()[:80]
    except pytest.skip.Exception:
        return TEXTS * 4


# ---------------------------------------------------------------------------------------------
# The edits
# ---------------------------------------------------------------------------------------------
def test_hand_checked_examples() -> None:
    text = "the movie was wonderful and john loved it"
    assert apply_edit("case", "Mary was RIGHT", 0) is not None
    assert apply_edit("case", text, 0)[1] in (text.upper(), "The Movie Was Wonderful And John Loved It")
    assert apply_edit("punctuation", text, 0) == ("add final period", text + ".")
    assert apply_edit("punctuation", "a fine film .", 0) == ("remove final period", "a fine film")
    assert apply_edit("punctuation", "what a film!", 0) is None  # "!" and "?" are left alone
    assert apply_edit("punctuation", "the `` wild ride '' ends !", 0) == ("swap quotes", 'the " wild ride " ends !')
    assert apply_edit("punctuation", 'a "masterpiece"', 0) == ("swap quotes", "a 'masterpiece'")
    assert apply_edit("name", "a sour little movie", 0) is None
    assert apply_edit("name", "Will the real Mark please stand up", 0) is None
    assert apply_edit("typo", "a b c ok", 0) is None  # no word of four letters
    assert apply_edit("whitespace", "ok", 0)[1].strip() == "ok"
    # Fixed outputs for seed 0, checked by eye once: each reads as the same sentence.
    assert apply_edit("name", "Mary told Sarah that she was right", 0) == (
        "name swap", "Samantha told Susie that she was right")
    assert apply_edit("typo", text, 0) == ("swap", "the movie was wonderful and jhon loved it")
    assert apply_edit("whitespace", text, 0) == ("tabs", "the movie was wonderful\tand john\tloved it")


def test_edits_are_deterministic_and_seeded() -> None:
    for edit in EDITS:
        first = [apply_edit(edit, t, seed=3) for t in TEXTS]
        assert first == [apply_edit(edit, t, seed=3) for t in TEXTS]  # same seed, same edits
        assert first[::-1] == [apply_edit(edit, t, seed=3) for t in TEXTS[::-1]]  # independent of order
    long_text = "the remarkable performances elevate this otherwise ordinary thriller considerably"
    outputs = {apply_edit("typo", long_text, seed=seed)[1] for seed in range(20)}
    assert len(outputs) > 5  # the seed matters


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W\d_]+", text)


def test_edits_preserve_meaning_by_construction(sentences) -> None:
    names = set(MALE_NAMES) | set(FEMALE_NAMES)
    for seed in range(3):
        for text in sentences + TEXTS:
            case = apply_edit("case", text, seed)
            if case:
                assert case[1].lower() == text.lower() and case[1] != text
            spaced = apply_edit("whitespace", text, seed)
            assert spaced[1].split() == text.split() and spaced[1] != text
            punctuated = apply_edit("punctuation", text, seed)
            if punctuated:
                variant, edited = punctuated
                if variant == "add final period":
                    assert edited == text.rstrip() + "."
                elif variant == "remove final period":
                    assert edited.rstrip() + " ." == text.rstrip() or edited + "." == text.rstrip()
                else:
                    assert re.sub(r"[\"'`]", "", edited) == re.sub(r"[\"'`]", "", text)
            swapped = apply_edit("name", text, seed)
            if swapped:
                before, after = _words(text), _words(swapped[1])
                assert len(before) == len(after)
                mapping: dict[str, str] = {}
                for old, new in zip(before, after):
                    if old == new:
                        continue
                    assert old.lower() in names and new.lower() in names
                    same_list = MALE_NAMES if old.lower() in MALE_NAMES else FEMALE_NAMES
                    assert new.lower() in same_list  # pronouns still agree
                    assert mapping.setdefault(old.lower(), new.lower()) == new.lower()  # one replacement per name
                    assert old[0].isupper() == new[0].isupper()
            typo = apply_edit("typo", text, seed)
            if typo:
                runs = lambda t: re.findall(r"[A-Za-z]+|[^A-Za-z]+", t)  # noqa: E731 - letter and non-letter runs
                before, after = runs(text), runs(typo[1])
                changed = [(a, b) for a, b in zip(before, after) if a != b]
                assert len(before) == len(after) and len(changed) == 1
                (old, new), = changed
                assert len(old) >= 4 and new[0] == old[0] and new[-1] == old[-1]  # first and last letter kept
                deleted = len(new) == len(old) - 1 and any(old[:i] + old[i + 1:] == new for i in range(len(old)))
                swapped = len(new) == len(old) and any(
                    old[:i] + old[i + 1] + old[i] + old[i + 2:] == new for i in range(len(old) - 1))
                assert deleted or swapped, (old, new)


def test_typos_never_spell_a_known_word(classifier) -> None:
    words = BehaviorConsistencyValidator(classifier).known_words
    assert {"good", "god", "film", "movie"} <= words and "##s" not in words and "cmofortable" not in words
    plain = {apply_edit("typo", "good", seed)[1] for seed in range(40)}
    assert "god" in plain  # without the vocabulary, deleting an "o" spells another word
    filtered = {apply_edit("typo", "good", seed, known_words=words) for seed in range(40)}
    assert None in filtered or all(e[1].lower() not in words for e in filtered if e)
    assert all(e is None or e[1] != "god" for e in filtered)
    edited = apply_edit("typo", "a good film", 1, known_words=words)
    assert edited is not None and edited[1].split()[1:] != ["good", "film"]


def test_parse_edits() -> None:
    assert parse_edits("case, typos,names") == ["case", "typo", "name"]
    assert parse_edits(None) == list(EDITS)
    with pytest.raises(InputError, match="unknown edit"):
        parse_edits("case,spelling")
    with pytest.raises(InputError, match="unknown edit"):
        parse_edits("")


# ---------------------------------------------------------------------------------------------
# The validator
# ---------------------------------------------------------------------------------------------
def test_uncased_model_is_case_and_whitespace_invariant(classifier, sentences) -> None:
    # The MiniLM tokenizer lowercases (and splits on any whitespace): case and spacing edits give the
    # same token ids, so the prediction cannot change.
    encode = classifier.tokenizer.encode_raw
    assert encode(["The MOVIE"])[0].ids == encode(["the movie"])[0].ids == encode(["the \t  movie"])[0].ids
    report = BehaviorConsistencyValidator(classifier).validate(sentences, ["case", "whitespace"], seed=1)
    for edit in report.edits:
        assert edit.texts == len(sentences) and edit.consistency_rate == 1.0 and edit.failures == []
        assert edit.max_probability_shift < 1e-5
        assert edit.same_tokens == edit.texts  # the reason: identical token ids


def test_failing_cases_are_exactly_the_label_changes(classifier, sentences) -> None:
    report = BehaviorConsistencyValidator(classifier).validate(sentences, ["punctuation", "name", "typo"], seed=0)
    total_failures = 0
    for edit in report.edits:
        validator_words = BehaviorConsistencyValidator(classifier).known_words
        pairs = [(i, apply_edit(edit.edit, t, 0, known_words=validator_words)) for i, t in enumerate(sentences)]
        pairs = [(i, e) for i, e in pairs if e is not None]
        assert edit.texts == len(pairs)
        # The reference: the Classifier's own predictions (separate calls for originals and edits, so batch
        # composition differs from the validator's single pass).
        originals = classifier([sentences[i] for i, _ in pairs])
        edits = classifier([edited for _, (_, edited) in pairs])
        expected = []
        shifts = []
        for (i, (variant, edited)), original, changed in zip(pairs, originals, edits):
            if original.label != changed.label:
                expected.append((i, edited, original.label, changed.label))
            shifts.append(max(abs(original.scores[k] - changed.scores[k]) for k in original.scores))
        found = [(f.index, f.edited, f.original_label, f.edited_label) for f in edit.failures]
        assert found == expected
        assert edit.consistent == edit.texts - len(expected)
        assert edit.consistency_rate == pytest.approx(1 - len(expected) / len(pairs))
        assert edit.mean_probability_shift == pytest.approx(np.mean(shifts), abs=1e-5)
        assert sum(v["texts"] for v in edit.variants.values()) == edit.texts
        assert edit.same_tokens < edit.texts  # typos, names and added periods do change the tokens
        total_failures += len(expected)
    assert total_failures > 0  # the test would be empty if this model never changed its mind


def test_report_files(classifier, tmp_path) -> None:
    report = BehaviorConsistencyValidator(classifier).validate(TEXTS, seed=0, model_name="tiny")
    paths = report.write(tmp_path)
    data = json.loads(paths["json"].read_text())
    assert [e["edit"] for e in data["edits"]] == list(EDITS) and data["texts"] == len(TEXTS)
    assert "| case |" in paths["markdown"].read_text()
    png = (tmp_path / "consistency.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 5000


def test_bad_input(classifier, tmp_path, minilm_dir) -> None:
    validator = BehaviorConsistencyValidator(classifier)
    with pytest.raises(InputError, match="no texts"):
        validator.validate([])
    with pytest.raises(InputError, match="list of texts"):
        validator.validate("one text")
    with pytest.raises(InputError, match="at least 1"):
        BehaviorConsistencyValidator(classifier, typos=0)
    with pytest.raises(InputError, match="sequence classifier"):
        BehaviorConsistencyValidator(object())


def test_cli_scan_consistency(classifier, tmp_path, capsys) -> None:
    model_dir = str(classifier.model.source.root)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n\n")
    out = tmp_path / "out"
    assert main(["scan", "consistency", model_dir, str(texts), "--out", str(out), "--edits", "case,typo",
                 "--seed", "2"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{len(TEXTS)} texts; consistency: case 100.0%, typo ")
    data = json.loads((out / "consistency.json").read_text())
    assert data["seed"] == 2 and [e["edit"] for e in data["edits"]] == ["case", "typo"]
    assert (out / "consistency.png").is_file() and (out / "consistency.md").is_file()

    assert main(["scan", "consistency", model_dir, str(texts), "--out", str(out), "--edits", "spelling"]) == 2
    assert "unknown edit" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("\n")
    assert main(["scan", "consistency", model_dir, str(tmp_path / "empty.txt"), "--out", str(out)]) == 2
    assert "holds no texts" in capsys.readouterr().err
    with pytest.raises(DataError):
        from encoderkit.security.consistency import read_texts

        read_texts(tmp_path / "absent.txt")
