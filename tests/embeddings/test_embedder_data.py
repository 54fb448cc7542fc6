"""Training files for sentence embedders (embeddings.data): the three shapes in TSV/CSV/JSONL, bad input, and the
no-duplicates batcher."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from encoderkit.embeddings.data import (
    ANCHOR_POSITIVE, LABELLED_PAIR, SCORED_PAIR, AnchorPositive, LabelledPair, NoDuplicatesBatcher, ScoredPair,
    detect_shape, negative_columns, read_training_file, write_training_file,
)
from encoderkit.errors import DataError


def write(path: Path, rows: list[list[str]], fmt: str) -> Path:
    if fmt == "jsonl":
        header, *body = rows
        path.write_text("".join(json.dumps(dict(zip(header, r))) + "\n" for r in body), encoding="utf-8")
    else:
        sep = "," if fmt == "csv" else "\t"
        path.write_text("".join(sep.join(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_anchor_positive_with_negatives(tmp_path: Path, fmt: str) -> None:
    rows = [["anchor", "positive", "negative_2", "negative", "negative_1", "id"],
            ["what is a cat", "a cat is an animal", "n2", "n0", "n1", "7"],
            ["who wrote it", "she wrote it", "m2", "m0", "m1", "8"]]
    data = read_training_file(write(tmp_path / f"t.{fmt}", rows, fmt))
    assert data.shape == ANCHOR_POSITIVE and data.negative_columns == ("negative", "negative_1", "negative_2")
    assert data.examples == [AnchorPositive("what is a cat", "a cat is an animal", ("n0", "n1", "n2")),
                             AnchorPositive("who wrote it", "she wrote it", ("m0", "m1", "m2"))]
    assert read_training_file(tmp_path / f"t.{fmt}", loss="triplet").shape == ANCHOR_POSITIVE


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_scored_pairs(tmp_path: Path, fmt: str) -> None:
    rows = [["sentence1", "sentence2", "score"], ["a dog runs", "a dog is running", "0.9"], ["x", "y", "0"]]
    data = read_training_file(write(tmp_path / f"s.{fmt}", rows, fmt), loss="cosine")
    assert data.shape == SCORED_PAIR
    assert data.examples == [ScoredPair("a dog runs", "a dog is running", 0.9), ScoredPair("x", "y", 0.0)]


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_labelled_pairs_and_validation_labels(tmp_path: Path, fmt: str) -> None:
    rows = [["premise", "hypothesis", "label"], ["p1", "h1", "neutral"], ["p2", "h2", "entailment"],
            ["p3", "h3", "contradiction"], ["p4", "h4", "neutral"]]
    train = read_training_file(write(tmp_path / f"n.{fmt}", rows, fmt))
    assert train.shape == LABELLED_PAIR
    assert train.labels == {"contradiction": 0, "entailment": 1, "neutral": 2}
    assert train.label_names == ["contradiction", "entailment", "neutral"]
    assert [e.label for e in train.examples] == [2, 1, 0, 2]
    valid = read_training_file(write(tmp_path / f"v.{fmt}", rows[:2], fmt), loss="softmax", labels=train.labels)
    assert valid.examples == [LabelledPair("p1", "h1", 2)]
    bad = write(tmp_path / f"b.{fmt}", [rows[0], ["p", "h", "entailment"], ["p", "h", "maybe"]], fmt)
    line = 3 if fmt != "jsonl" else 2
    with pytest.raises(DataError, match=rf"b\.{fmt}:{line}: label 'maybe' was never seen in training"):
        read_training_file(bad, labels=train.labels)


def test_quoted_fields_and_round_trip(tmp_path: Path) -> None:
    examples = [AnchorPositive('say "hi"', "a\ttab, and comma", ("n1", "multi\nline")),
                AnchorPositive("b", "c", ("d", "e"))]
    for ext in ("tsv", "csv", "jsonl"):
        path = write_training_file(tmp_path / f"r.{ext}", examples)
        assert read_training_file(path).examples == examples


def test_negative_column_names() -> None:
    assert negative_columns(["anchor", "negative_10", "negative_2", "negatives", "negative", "neg"]) == \
        ("negative", "negative_2", "negative_10")
    assert detect_shape(["premise", "hypothesis", "label"]) == LABELLED_PAIR


BAD = [
    # (file name, content, loss, message fragment)
    ("e.tsv", "", None, r"e\.tsv is empty"),
    ("h.tsv", "anchor\tpositive\n", None, r"h\.tsv holds a header but no examples"),
    ("w.tsv", "question\tanswer\nq\ta\n", None,
     r"w\.tsv:1: the columns question, answer match no training shape; expected anchor, positive"),
    ("nohead.tsv", "what is x\tx is y\n", "mnrl",
     r"nohead\.tsv:1: missing column\(s\) anchor, positive: the mnrl loss needs the columns anchor, positive"),
    ("m.csv", "sentence1,sentence2\na,b\n", "cosent", r"m\.csv:1: missing column\(s\) score.*sentence1, sentence2, score"),
    ("t.tsv", "anchor\tpositive\na\tb\n", "triplet", r"t\.tsv:1: the triplet loss needs a negative column"),
    ("x.tsv", "anchor\tpositive\na\tb\nc\t  \n", None, r"x\.tsv:3: empty text in column 'positive'"),
    ("j.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "", "positive": "b"}\n', None,
     r"j\.jsonl:2: empty text in column 'anchor'"),
    ("s.tsv", "sentence1\tsentence2\tscore\na\tb\t0.5\nc\td\thigh\n", "cosine",
     r"s\.tsv:3: score 'high' is not a number"),
    ("r.tsv", "sentence1\tsentence2\tscore\na\tb\t0.5\nc\td\t4.2\n", "cosine",
     r"r\.tsv:3: score 4.2 lies outside \[0, 1\], the range of the cosine loss \(CoSENT takes any real score\)"),
    ("c.tsv", "anchor\tpositive\na\tb\tc\n", None, r"c\.tsv:2: 3 column\(s\), the header has 2"),
    ("l.jsonl", '{"premise": "p", "hypothesis": "h"}\n', "softmax", r"l\.jsonl:1: missing column\(s\) label"),
    ("f.txt", "a\n", None, r"f\.txt: training files are \.tsv, \.csv or \.jsonl"),
]


@pytest.mark.parametrize("name,content,loss,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_file_and_line(tmp_path: Path, name: str, content: str, loss: str | None,
                                       message: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        read_training_file(path, loss=loss)
    assert "\n" not in str(info.value)


def test_cosent_takes_any_real_score(tmp_path: Path) -> None:
    path = tmp_path / "s.tsv"
    path.write_text("sentence1\tsentence2\tscore\na\tb\t4.2\nc\td\t-3\n", encoding="utf-8")
    assert [e.score for e in read_training_file(path, loss="cosent").examples] == [4.2, -3.0]


def _pairs() -> list[AnchorPositive]:
    # 40 questions on 10 paragraphs (4 each), like SQuAD: positives repeat across examples
    return [AnchorPositive(f"question {i}", f"paragraph {i % 10}") for i in range(40)]


def test_no_duplicates_batcher() -> None:
    examples = _pairs()
    batcher = NoDuplicatesBatcher(examples, batch_size=8, seed=3)
    batches = batcher.batches()
    assert sorted(i for b in batches for i in b) == list(range(40))  # every example once per epoch
    # full batches while enough distinct paragraphs remain; short ones at the end of the epoch (as sentence-transformers)
    assert [len(b) for b in batches][:4] == [8, 8, 8, 8] and all(len(b) <= 8 for b in batches)
    for batch in batches:
        texts = [t for i in batch for t in examples[i].texts]
        assert len(texts) == len(set(texts))
    assert batches == NoDuplicatesBatcher(examples, batch_size=8, seed=3).batches()  # deterministic
    assert batches != NoDuplicatesBatcher(examples, batch_size=8, seed=4).batches()
    assert batches != batcher.batches(epoch=1)
    batcher.set_epoch(1)
    assert list(batcher) == batcher.batches(epoch=1)


def test_no_duplicates_batcher_when_impossible() -> None:
    examples = [AnchorPositive(f"q{i}", "same paragraph" if i < 6 else f"p{i}") for i in range(10)]
    short = NoDuplicatesBatcher(examples, batch_size=4, seed=0).batches()
    assert sorted(i for b in short for i in b) == list(range(10))
    for batch in short:
        assert sum(i < 6 for i in batch) <= 1  # the repeated paragraph at most once per batch
    full = NoDuplicatesBatcher(examples, batch_size=4, seed=0, fill=True).batches()
    assert [len(b) for b in full] == [4, 4, 2] and sorted(i for b in full for i in b) == list(range(10))
    dropped = NoDuplicatesBatcher(examples, batch_size=4, seed=0, fill=True, drop_last=True).batches()
    assert [len(b) for b in dropped] == [4, 4]
