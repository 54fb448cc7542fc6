"""Word-level adversarial attacks: neighbours against a brute-force cosine, the query budget counted independently,
the perturbed-word limit, successes that really flip the label (re-run), input errors, and `scan attack`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit.cli import main
from encoderkit.errors import DataError, InputError
from encoderkit.security.attacks import (
    STOP_WORDS,
    EmbeddingNeighbours,
    WordAttack,
    WordSequence,
    read_labelled_texts,
)
from encoderkit.tasks.classify import Classifier


TEXTS = [
    "the movie was a wonderful and moving experience for everyone involved",
    "a dull , lifeless film that never finds its footing at all",
    "brilliant acting , sharp writing and a memorable score make this special",
    "the plot is predictable but the cast keeps it watchable and funny",
    "an ugly , boring mess of a sequel with terrible dialogue",
    "Quietly powerful drama about family , grief and forgiveness",
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def classifier(tiny_classifier_dir: Path) -> Classifier:
    classifier = Classifier.from_pretrained(tiny_classifier_dir)
    # A random model gives nearly the same logits to every text; a larger head, centred so that the decision
    # boundary passes through these texts, makes the (random) decision depend on the words, so attacks both
    # succeed and fail within small budgets.
    with torch.no_grad():
        head = classifier.model.classifier.out
        head.weight.mul_(300.0)
        logits = classifier.logits(TEXTS)
        head.bias[1] -= float(np.median(logits[:, 1] - logits[:, 0]))
    return classifier


@pytest.fixture(scope="module")
def predicted(classifier: Classifier) -> list[str]:
    return [p.label for p in classifier(TEXTS)]


class CountingClassifier:
    """Forwards to the classifier and counts every text it scores: an independent tally of the queries."""

    def __init__(self, classifier: Classifier) -> None:
        self.inner, self.texts_scored = classifier, 0
        self.model, self.config, self.tokenizer = classifier.model, classifier.config, classifier.tokenizer

    def logits(self, texts, pairs=None):
        self.texts_scored += len(texts)
        return self.inner.logits(texts, pairs)


# ---------------------------------------------------------------------------------------------
# Neighbours
# ---------------------------------------------------------------------------------------------
def test_neighbours_equal_brute_force_cosine(classifier: Classifier) -> None:
    index = EmbeddingNeighbours.from_classifier(classifier)
    weight = classifier.model.encoder.embeddings.word.weight.detach().double().numpy()
    vocabulary = classifier.tokenizer.convert_ids_to_tokens(range(weight.shape[0]))
    allowed = [i for i, t in enumerate(vocabulary)
               if t and not t.startswith("##") and t.isalpha() and len(t) >= 2 and t not in STOP_WORDS]
    for word in ("movie", "wonderful", "dull"):
        query = weight[vocabulary.index(word)]
        rows = weight[allowed]
        cosines = rows @ query / (np.linalg.norm(rows, axis=1) * np.linalg.norm(query))
        order = [j for j in np.argsort(-cosines) if vocabulary[allowed[j]] != word][:10]
        expected = [(vocabulary[allowed[j]], float(cosines[j])) for j in order]
        found = index.nearest(word, 10)
        assert [w for w, _ in found] == [w for w, _ in expected]
        np.testing.assert_allclose([c for _, c in found], [c for _, c in expected], atol=1e-5)
        assert all(w != word and w.isalpha() and w not in STOP_WORDS for w, _ in found)


def test_neighbours_exclude_pieces_stop_words_and_self() -> None:
    vocabulary = ["[PAD]", "good", "great", "##ly", "the", "bad", "g00d", "[CLS]", "x", "fine"]
    vectors = np.array([[0, 0], [1, 0], [0.9, 0.1], [1, 0], [1, 0], [0.6, 0.8], [1, 0], [1, 0], [1, 0], [0, 1]],
                       dtype=np.float32)
    index = EmbeddingNeighbours(vectors, vocabulary)
    assert index.candidate_words == ["good", "great", "bad", "fine"]
    found = index.nearest("good", 3)
    assert [w for w, _ in found] == ["great", "bad", "fine"]  # "##ly", "the", "g00d", "x" all excluded
    np.testing.assert_allclose([c for _, c in found], [0.9 / math.hypot(0.9, 0.1), 0.6, 0.0], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Texts as words
# ---------------------------------------------------------------------------------------------
def test_word_sequence_edits_keep_the_layout() -> None:
    sequence = WordSequence.from_text("It's a dull, lifeless film.")
    assert sequence.words == ("It's", "a", "dull", "lifeless", "film")
    assert sequence.text() == "It's a dull, lifeless film."
    assert sequence.replaced(2, "grey").text() == "It's a grey, lifeless film."
    assert sequence.without(3).text() == "It's a dull, film."
    assert sequence.without(1).text() == "It's dull, lifeless film."
    assert sequence.inserted(2, "very").text() == "It's a very dull, lifeless film."
    assert sequence.inserted(5, "indeed").text() == "It's a dull, lifeless film indeed."
    assert sequence.inserted(2, "very").origins == (0, 1, None, 2, 3, 4)


# ---------------------------------------------------------------------------------------------
# The attack
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["substitute", "insert"])
@pytest.mark.parametrize("budget", [12, 45])
def test_attack_respects_budget_and_word_limit(classifier: Classifier, predicted: list[str], method: str,
                                               budget: int) -> None:
    counter = CountingClassifier(classifier)
    attack = WordAttack(counter, method=method, query_budget=budget, max_perturbed_rate=0.25, neighbours=8)
    for i, (text, label) in enumerate(zip(TEXTS, predicted)):
        before = counter.texts_scored
        record = attack.attack_one(text, attack.label_index(label), index=i)
        assert record.queries == counter.texts_scored - before  # every scored text is counted
        assert record.queries <= budget
        assert len(record.perturbations) <= math.floor(0.25 * record.words)
        assert record.perturbed_rate <= 0.25
        if method == "insert":
            assert len(WordSequence.from_text(record.adversarial)) == record.words + len(record.perturbations)
            assert all(p.original is None for p in record.perturbations)
        else:
            assert len(WordSequence.from_text(record.adversarial)) == record.words
            adversarial_words = WordSequence.from_text(record.adversarial).words
            original_words = WordSequence.from_text(text).words
            changed = [i for i, (a, b) in enumerate(zip(original_words, adversarial_words)) if a != b]
            assert changed == [p.position for p in record.perturbations]


@pytest.mark.parametrize("method", ["substitute", "insert"])
def test_reported_successes_really_flip_the_label(classifier: Classifier, predicted: list[str], method: str) -> None:
    result = WordAttack(classifier, method=method, query_budget=120, max_perturbed_rate=0.34,
                        neighbours=10).attack(TEXTS, predicted)
    assert result.attacked == len(TEXTS)  # labels are the predictions: every text starts correct
    assert 1 <= result.successes < len(TEXTS), "the sharpened random classifier should be attackable, not trivially"
    rerun = classifier([r.adversarial for r in result.records])
    for record, prediction in zip(result.records, rerun):
        if record.success:
            assert prediction.label != record.label and record.adversarial != record.original
        else:
            assert prediction.label == record.label
        assert prediction.label == record.adversarial_prediction
        assert prediction.scores[record.label] == pytest.approx(record.adversarial_probability, abs=1e-5)
    won = result.successful()
    assert result.success_rate == pytest.approx(len(won) / len(TEXTS))
    assert result.mean_perturbed_rate == pytest.approx(np.mean([len(r.perturbations) / r.words for r in won]))
    assert result.mean_queries == pytest.approx(np.mean([r.queries for r in result.records]))


def test_misclassified_texts_are_skipped(classifier: Classifier, predicted: list[str]) -> None:
    labels = classifier.config.labels
    wrong = [labels[1 - labels.index(label)] for label in predicted]
    result = WordAttack(classifier, query_budget=50).attack(TEXTS, wrong)
    assert all(r.status == "skipped" and r.queries == 1 and r.adversarial == r.original for r in result.records)
    assert result.attacked == 0 and result.success_rate == 0.0 and result.accuracy_before == 0.0


def test_bad_inputs_raise_input_errors(classifier: Classifier) -> None:
    attack = WordAttack(classifier, query_budget=20)
    with pytest.raises(InputError, match="no texts"):
        attack.attack([], [])
    with pytest.raises(InputError, match="2 texts but 1 labels"):
        attack.attack(["a b", "c d"], ["LABEL_0"])
    with pytest.raises(InputError, match="not one of the classifier's labels"):
        attack.attack(["a good film"], ["positive"])
    with pytest.raises(InputError, match="empty"):
        attack.attack(["  "], ["LABEL_0"])
    with pytest.raises(InputError, match="unknown attack method"):
        WordAttack(classifier, method="swap")
    with pytest.raises(InputError, match="query budget"):
        WordAttack(classifier, query_budget=1)
    with pytest.raises(InputError, match="perturbed-word rate"):
        WordAttack(classifier, max_perturbed_rate=0.0)


def test_labels_file_format(tmp_path: Path) -> None:
    path = tmp_path / "texts.tsv"
    path.write_text("text\tlabel\na fine film \t1\n\nbad\tLABEL_0\n", encoding="utf-8")
    assert read_labelled_texts(path) == (["a fine film", "bad"], ["1", "LABEL_0"])
    path.write_text("no label column here\n", encoding="utf-8")
    with pytest.raises(DataError, match="text<TAB>label"):
        read_labelled_texts(path)


def test_cli_scan_attack_writes_report(tiny_classifier_dir: Path, tmp_path: Path, classifier: Classifier) -> None:
    labels = [p.label for p in Classifier.from_pretrained(tiny_classifier_dir)(TEXTS[:3])]
    texts_file = tmp_path / "texts.tsv"
    texts_file.write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in zip(TEXTS[:3], labels)))
    out = tmp_path / "out"
    code = main(["scan", "attack", str(tiny_classifier_dir), str(texts_file), "--out", str(out), "--budget", "30",
                 "--method", "insert", "--insert-words", "truly,never"])
    assert code == 0
    data = json.loads((out / "attack.json").read_text())
    assert data["method"] == "insert" and len(data["records"]) == 3
    assert all(r["queries"] <= 30 for r in data["records"])
    assert "Adversarial attack" in (out / "attack.md").read_text()
    assert main(["scan", "attack", str(tiny_classifier_dir), str(tmp_path / "missing.tsv"), "--out", str(out)]) == 2
