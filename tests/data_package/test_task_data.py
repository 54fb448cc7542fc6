from __future__ import annotations

import json

import pytest

from encoderkit import DataError
from encoderkit.data.tasks import (iob1_to_iob2, read_classification, read_conll, read_squad, split_validation)
from encoderkit.metrics import entities

from conftest import shared_file


def test_classification_csv_tsv_jsonl(tmp_path) -> None:
    (tmp_path / "a.csv").write_text('sentence1,sentence2,label\n"Hi, there",Bye,entail\nA,B,neutral\n')
    rows = read_classification(tmp_path / "a.csv")
    assert [(r.text, r.pair, r.label) for r in rows] == [("Hi, there", "Bye", "entail"), ("A", "B", "neutral")]
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "x", "labels": ["sport", "news"]}) + "\n")
    assert read_classification(tmp_path / "b.jsonl")[0].label == ["sport", "news"]
    (tmp_path / "c.tsv").write_text("text\tlabel\nfine\t1\nbroken\n")
    with pytest.raises(DataError, match=r"c.tsv:3: 1 column\(s\), expected at least 2"):
        read_classification(tmp_path / "c.tsv")


def test_conll_reader_and_iob_conversion(tmp_path) -> None:
    (tmp_path / "x.conll").write_text("EU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\n-DOCSTART- -X- O O\n\n"
                                      "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n")
    sentences = read_conll(tmp_path / "x.conll")
    assert [s.tokens for s in sentences] == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert sentences[1].document == 1
    assert iob1_to_iob2(["I-LOC", "B-LOC", "I-LOC", "O", "I-PER"]) == ["B-LOC", "B-LOC", "I-LOC", "O", "B-PER"]
    tags = ["I-ORG", "I-ORG", "O", "I-MISC", "B-MISC"]
    assert entities(tags) == entities(iob1_to_iob2(tags))
    (tmp_path / "bad.conll").write_text("EU NNP I-NP ORG\n")
    with pytest.raises(DataError, match=r"bad.conll:1: column 4 holds 'ORG'"):
        read_conll(tmp_path / "bad.conll")


@pytest.mark.data
def test_real_conll_counts() -> None:
    sentences = read_conll(shared_file("data", "conll2003", "eng.train"))
    assert len(sentences) == 14041 and sum(len(s.tokens) for s in sentences) == 203621  # SOURCE.md's counts


@pytest.mark.data
def test_real_squad_and_split_by_article() -> None:
    examples = read_squad(shared_file("data", "squad_v1.1", "dev-v1.1.articles-00-20.json"))
    assert len(examples) == 5021
    train, valid = split_validation(examples, 0.2, seed=0, groups=[e.title for e in examples])
    assert {e.title for e in train}.isdisjoint({e.title for e in valid}) and len(train) + len(valid) == 5021
    again = split_validation(examples, 0.2, seed=0, groups=[e.title for e in examples])
    assert [e.id for e in again[1]] == [e.id for e in valid]  # seeded


def test_squad_answer_offsets_are_checked(tmp_path) -> None:
    data = {"data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": [
        {"id": "1", "question": "Which?", "answers": [{"text": "Paris", "answer_start": 3}]}]}]}]}
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match="is not at character 3"):
        read_squad(tmp_path / "s.json")
