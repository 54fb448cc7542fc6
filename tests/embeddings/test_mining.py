"""Hard-negative mining (embeddings.mining) on a hand-made corpus with fixed vectors, on SQuAD with the default
model, and through `encoderkit mine-negatives`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_file
from encoderkit.embeddings.data import AnchorPositive, read_training_file
from encoderkit.embeddings.mining import mine_hard_negatives
from encoderkit.errors import InputError

# score(a1, t) = x and score(a2, t) = y for each corpus text t = (x, y)
CORPUS = {"p1": (0.8, 0.1), "p1 dup": (0.78, 0.1), "p1b": (0.72, 0.0), "na": (0.7, 0.2), "nb": (0.6, 0.65),
          "nc": (0.5, 0.3), "p2": (0.1, 0.9), "far": (0.0, 0.0)}


class FakeEmbedder:
    """Fixed vectors: a1 = e0, a2 = e1, a corpus text (x, y) = (x, y, sqrt(1 - x² - y²), 0)."""

    def __init__(self) -> None:
        self.vectors = {"a1": [1.0, 0, 0, 0], "a2": [0, 1.0, 0, 0]}
        for text, (x, y) in CORPUS.items():
            self.vectors[text] = [x, y, math.sqrt(1 - x * x - y * y), 0]

    def encode(self, texts, *, batch_size=32, normalize=True, progress=None):
        if progress:
            progress(len(texts))
        return np.array([self.vectors[t] for t in texts], dtype=np.float32)


def negatives(result) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(e.anchor, e.positive, e.negatives) for e in result.examples]


def test_margin_excludes_near_duplicate_of_positive() -> None:
    corpus = list(CORPUS)
    result = mine_hard_negatives(FakeEmbedder(), ["a1", "a2"], ["p1", "p2"], corpus, margin=0.05, num_negatives=2)
    # a1: p1 dup (0.78) lies within 0.05 of p1 (0.8) and is dropped
    assert negatives(result) == [("a1", "p1", ("p1b", "na")), ("a2", "p2", ("nb", "nc"))]
    assert result.left_out == 0 and result.within_margin >= 1
    assert result.positive_mean == pytest.approx(0.85, abs=1e-6)
    assert result.negative_mean == pytest.approx((0.72 + 0.7 + 0.65 + 0.3) / 4, abs=1e-6)
    no_margin = mine_hard_negatives(FakeEmbedder(), ["a1", "a2"], ["p1", "p2"], corpus, margin=None, num_negatives=2)
    assert negatives(no_margin)[0] == ("a1", "p1", ("p1 dup", "p1b"))
    wide = mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1"], corpus, margin=0.15, num_negatives=2)
    assert negatives(wide) == [("a1", "p1", ("nb", "nc"))]  # 0.72 and 0.7 are within 0.15 of 0.8


def test_all_positives_of_an_anchor_excluded_and_lowest_sets_the_margin() -> None:
    corpus = list(CORPUS)
    result = mine_hard_negatives(FakeEmbedder(), ["a1", "a1"], ["p1", "p1b"], corpus, margin=0.05, num_negatives=2)
    # positives 0.8 and 0.72: neither is a negative, and the margin counts from 0.72 (keep score <= 0.67)
    assert negatives(result) == [("a1", "p1", ("nb", "nc")), ("a1", "p1b", ("nb", "nc"))]


def test_anchor_text_never_its_own_negative_and_ranges() -> None:
    corpus = [*CORPUS, "a2"]
    result = mine_hard_negatives(FakeEmbedder(), ["a2"], ["p2"], corpus, margin=None, num_negatives=2)
    assert negatives(result) == [("a2", "p2", ("nb", "nc"))]
    skipped = mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1"], corpus, margin=None, range_min=1, num_negatives=2)
    assert negatives(skipped) == [("a1", "p1", ("p1b", "na"))]
    short = mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1"], corpus, margin=0.05, range_max=2, num_negatives=2)
    assert short.examples == [] and short.left_out == 1  # ranks 1-2 are p1 dup (dropped) and p1b
    assert "1 left out" in short.summary(2)
    positives_only = mine_hard_negatives(FakeEmbedder(), ["a1", "a2"], ["p1", "p2"], margin=None, num_negatives=1)
    assert negatives(positives_only) == [("a1", "p1", ("p2",)), ("a2", "p2", ("p1",))]  # corpus = the positives


def test_bad_arguments() -> None:
    with pytest.raises(InputError, match="num_negatives must be at least 1"):
        mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1"], num_negatives=0)
    with pytest.raises(InputError, match="leaves fewer than num_negatives"):
        mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1"], range_min=2, range_max=3, num_negatives=2)
    with pytest.raises(InputError, match="1 anchors but 2 positives"):
        mine_hard_negatives(FakeEmbedder(), ["a1"], ["p1", "p2"])


def squad_pairs(articles: int = 2, questions_per_paragraph: int = 1) -> tuple[list[str], list[str], list[str]]:
    data = json.loads(shared_file("data", "squad_v1.1", "dev-v1.1.articles-00-20.json").read_text(encoding="utf-8"))
    anchors, positives, corpus = [], [], []
    for article in data["data"][:articles]:
        for paragraph in article["paragraphs"]:
            corpus.append(paragraph["context"])
            for qa in paragraph["qas"][:questions_per_paragraph]:
                anchors.append(qa["question"])
                positives.append(paragraph["context"])
    return anchors, positives, corpus


@pytest.mark.data
def test_squad_with_default_model_mines_no_positive(minilm_dir: Path) -> None:
    from encoderkit import Embedder

    anchors, positives, corpus = squad_pairs()
    anchors, positives = anchors[::4], positives[::4]
    embedder = Embedder.from_pretrained(minilm_dir, max_length=128)
    result = mine_hard_negatives(embedder, anchors, positives, corpus, margin=0.05, num_negatives=3)
    assert len(result.examples) + result.left_out == len(anchors) and len(result.examples) >= len(anchors) // 2
    for example in result.examples:
        assert example.positive not in example.negatives and len(set(example.negatives)) == 3
        vectors = embedder.encode([example.anchor, example.positive, *example.negatives], normalize=True)
        scores = vectors[1:] @ vectors[0]
        assert (scores[1:] + 0.05 <= scores[0] + 1e-5).all()
    assert result.negative_mean < result.positive_mean


# ----- the command ------------------------------------------------------------------------------------------
@pytest.fixture()
def cli_main():
    from encoderkit.cli.app import main

    return main


def test_command_writes_mined_file(tmp_path: Path, minilm_dir: Path, cli_main, capsys) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\nwhat do cats eat\tCats eat fish and mice.\n"
                     "how fast is a cheetah\tA cheetah runs at 110 km/h.\n", encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Dogs eat meat.\nBirds eat seeds.\nThe stock market fell.\nLions are big cats.\n"
                      "Cars drive fast on the highway.\nRain falls in spring.\n", encoding="utf-8")
    out = tmp_path / "mined.tsv"
    code = cli_main(["mine-negatives", str(minilm_dir), "--train", str(pairs), "--corpus", str(corpus),
                     "--out", str(out), "--num-negatives", "2", "--margin", "0.05"])
    assert code == 0
    assert "mined 2 negative(s) for 2 of 2 pairs" in capsys.readouterr().out
    mined = read_training_file(out, loss="triplet")
    assert mined.negative_columns == ("negative_1", "negative_2")
    assert [e.anchor for e in mined.examples] == ["what do cats eat", "how fast is a cheetah"]
    assert all(isinstance(e, AnchorPositive) and e.positive not in e.negatives for e in mined.examples)


@pytest.mark.parametrize("content,extra,message", [
    ("query\tpassage\nq\tp\n", [], "pairs.tsv:1: missing column(s) anchor, positive"),
    ("", [], "pairs.tsv is empty"),
    ("anchor\tpositive\nq\t\n", [], "pairs.tsv:2: empty text in column 'positive'"),
    ("anchor\tpositive\nq\tp\n", ["--num-negatives", "0"], "num_negatives must be at least 1"),
])
def test_command_bad_input_exit_2(tmp_path: Path, minilm_dir: Path, cli_main, capsys, content: str,
                                  extra: list[str], message: str) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(content, encoding="utf-8")
    code = cli_main(["mine-negatives", str(minilm_dir), "--train", str(pairs), "--out", str(tmp_path / "o.tsv"),
                     *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("encoderkit: error: ") and message in err[-1]
    assert not (tmp_path / "o.tsv").exists()
