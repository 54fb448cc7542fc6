from __future__ import annotations

import numpy as np
import pytest

from encoderkit.metrics import (accuracy, entities, entity_scores, macro_f1, micro_f1_multilabel, normalize_answer,
                                squad_exact_match, squad_f1, squad_scores)


def test_classification_metrics_equal_sklearn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 4, 500), rng.integers(0, 5, 500)  # a class only ever predicted
    assert accuracy(y_true, y_pred) == pytest.approx(metrics.accuracy_score(y_true, y_pred))
    assert macro_f1(y_true, y_pred) == pytest.approx(metrics.f1_score(y_true, y_pred, average="macro", zero_division=0))
    multi_true, multi_pred = rng.integers(0, 2, (200, 6)), rng.integers(0, 2, (200, 6))
    assert micro_f1_multilabel(multi_true, multi_pred) == pytest.approx(
        metrics.f1_score(multi_true, multi_pred, average="micro"))


def test_entity_f1_seqeval_readme_case() -> None:
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    scores = entity_scores(gold, pred)
    assert (scores["precision"], scores["recall"], scores["f1"]) == (0.5, 0.5, 0.5)
    assert scores["PER_f1"] == 1.0 and scores["MISC_f1"] == 0.0


@pytest.mark.parametrize(("tags", "expected"), [
    (["I-LOC", "B-LOC", "I-LOC", "O"], {("LOC", 0, 0), ("LOC", 1, 2)}),  # IOB1: B- only between neighbours
    (["I-PER", "I-ORG", "O", "I-ORG"], {("PER", 0, 0), ("ORG", 1, 1), ("ORG", 3, 3)}),  # a type change splits
    (["B-PER", "I-PER", "B-PER"], {("PER", 0, 1), ("PER", 2, 2)}),  # IOB2
    (["S-PER", "B-LOC", "E-LOC", "O", "B-ORG", "I-ORG", "E-ORG"], {("PER", 0, 0), ("LOC", 1, 2), ("ORG", 4, 6)}),
    (["O", "I-MISC"], {("MISC", 1, 1)}),  # I- after O starts an entity (conlleval)
    ([], set()),
])
def test_entity_chunks(tags, expected) -> None:
    assert entities(tags) == expected


def test_squad_metrics_official_definitions() -> None:
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("an apple a day") == "apple day"
    assert squad_exact_match("the Eiffel Tower", ["Eiffel tower.", "Paris"]) == 1.0
    assert squad_f1("the cat sat", ["a cat sat on"]) == pytest.approx(0.8)  # P = 1, R = 2/3
    assert squad_f1("dog", ["cat"]) == 0.0
    assert squad_f1("cat sat", ["mat", "cat sat"]) == 1.0  # best over references
    scores = squad_scores({"q1": "Denver Broncos", "q2": "1990"}, {"q1": ["Denver Broncos"], "q2": ["1989"],
                                                                    "q3": ["missing"]})
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 / 3)}
