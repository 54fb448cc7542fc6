"""Embedding shift detection: distances against scikit-learn / by hand, a text's shift with itself, leave-one-out
attribution recomputed by hand, threshold calibration at the intended false-positive rate, the single-text
(k-nearest-reference) score against scikit-learn's NearestNeighbors, input errors, and `scan shift`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from encoderkit.cli import main
from encoderkit.errors import DataError, InputError
from encoderkit.security.shift import (
    REPRESENTATIONS,
    EmbeddingShiftDetector,
    calibrated_threshold,
    cosine_distance,
    read_pairs,
    total_variation,
)
from encoderkit.tasks.classify import Classifier
from encoderkit.tasks.embed import Embedder


ORIGINALS = [
    "the movie was a wonderful and moving experience",
    "a dull , lifeless film that never finds its footing",
    "brilliant acting and sharp writing make this special",
    "the plot is predictable but the cast keeps it watchable",
]
MODIFIED = [
    "the movie was a terrible and moving experience",
    "a dull , lifeless film that never finds its footing",
    "brilliant acting and sharp writting make this special",
    "the plot is predictable but the cast keeps it watchable indeed",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def classifier(tiny_classifier_dir: Path) -> Classifier:
    return Classifier.from_pretrained(tiny_classifier_dir)


@pytest.fixture(scope="module")
def detector(classifier: Classifier) -> EmbeddingShiftDetector:
    return EmbeddingShiftDetector(classifier, representation="cls")


def test_distances_against_references() -> None:
    from sklearn.metrics.pairwise import cosine_similarity

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 7)), rng.normal(size=(5, 7))
    np.testing.assert_allclose(cosine_distance(a, b), 1.0 - np.diag(cosine_similarity(a, b)), atol=1e-12)
    assert np.all(cosine_distance(a, a) == 0.0)  # exactly, not merely close
    p, q = np.array([[0.7, 0.2, 0.1]]), np.array([[0.1, 0.2, 0.7]])
    assert total_variation(p, q)[0] == pytest.approx(0.6)


@pytest.mark.parametrize("representation", REPRESENTATIONS)
def test_shift_of_a_text_with_itself_is_zero(classifier: Classifier, tiny_classifier_dir: Path, representation: str) -> None:
    embedder = Embedder.from_pretrained(tiny_classifier_dir) if representation == "embedding" else None
    detector = EmbeddingShiftDetector(classifier, representation=representation, embedder=embedder)
    scores = detector.shift_scores(ORIGINALS, ORIGINALS)
    assert np.all(scores == 0.0)
    changed = detector.shift_scores(ORIGINALS, MODIFIED)
    assert changed[1] == 0.0  # the unchanged pair
    assert np.all(changed[[0, 2, 3]] > 0.0)


def test_shift_equals_one_minus_cosine_of_classifier_features(classifier: Classifier,
                                                              detector: EmbeddingShiftDetector) -> None:
    _, first = classifier.logits_and_features(ORIGINALS, features=("cls",))
    _, second = classifier.logits_and_features(MODIFIED, features=("cls",))
    a, b = first["cls"].astype(np.float64), second["cls"].astype(np.float64)
    by_hand = 1.0 - (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    np.testing.assert_allclose(detector.shift_scores(ORIGINALS, MODIFIED), by_hand, atol=1e-5)


def test_leave_one_out_attribution_matches_recomputation(detector: EmbeddingShiftDetector) -> None:
    original, modified = ORIGINALS[0], MODIFIED[0]
    shift, words = detector.attribute(original, modified)
    assert [w.word for w in words] == modified.split()
    assert [w.differing for w in words] == [w == "terrible" for w in modified.split()]
    assert shift == pytest.approx(detector.shift_scores([original], [modified])[0], abs=1e-9)
    tokens = modified.split()
    for position, attribution in enumerate(words):
        without = " ".join(tokens[:position] + tokens[position + 1:])  # the word deleted, by hand
        expected = shift - detector.shift_scores([original], [without])[0]
        assert attribution.attribution == pytest.approx(expected, abs=1e-6)
    report = detector.compare([original], [modified], top_k=3)
    top = report.records[0].top_words
    assert [w.attribution for w in top] == sorted((w.attribution for w in words), reverse=True)[:3]


def test_calibrated_threshold_gives_the_intended_false_positive_rate(detector: EmbeddingShiftDetector) -> None:
    assert calibrated_threshold(np.arange(1, 11) / 10, 0.2) == pytest.approx(0.8)  # flags 0.9 and 1.0 only
    words = "the movie was a wonderful and moving experience for all of us".split()
    rng = np.random.default_rng(0)
    originals, modifieds = [], []
    for _ in range(40):
        kept = [w for w in words if rng.random() > 0.15]
        originals.append(" ".join(words))
        modifieds.append(" ".join(kept))
    for rate in (0.05, 0.1, 0.25):
        calibration = detector.calibrate(originals, modifieds, false_positive_rate=rate)
        scores = detector.shift_scores(originals, modifieds)
        flagged = np.mean(scores > calibration.threshold)
        assert flagged == calibration.achieved_false_positive_rate
        distinct = len(set(np.round(scores, 12))) == len(scores)
        assert flagged <= rate + 1e-12
        if distinct:  # without ties the quantile hits the target exactly (to 1/n)
            assert flagged == pytest.approx(np.floor(rate * len(scores)) / len(scores))
    report = detector.compare(originals[:5], modifieds[:5], top_k=0)
    assert [r.flagged for r in report.records] == [bool(r.score > calibration.threshold) for r in report.records]
    assert report.threshold == calibration.threshold


def test_single_text_scores_match_nearest_neighbours(classifier: Classifier) -> None:
    from sklearn.neighbors import NearestNeighbors

    detector = EmbeddingShiftDetector(classifier, representation="mean", neighbours=2)
    reference = ORIGINALS + ["an utterly forgettable comedy", "one of the best films of the year"]
    detector.fit_reference(reference)
    _, found = classifier.logits_and_features(reference + MODIFIED, features=("mean",))
    rows = found["mean"].astype(np.float64)
    distances, _ = NearestNeighbors(n_neighbors=2, metric="cosine").fit(rows[:len(reference)]).kneighbors(
        rows[len(reference):])
    np.testing.assert_allclose(detector.distribution_scores(MODIFIED), distances.mean(axis=1), atol=1e-5)
    detector.calibrate_single(MODIFIED, false_positive_rate=0.25)
    report = detector.score(MODIFIED[:2], top_k=2)
    assert report.mode == "single" and len(report.records[0].top_words) == 2
    score, words = detector.attribute_single(MODIFIED[0])
    without = " ".join(MODIFIED[0].split()[1:])
    assert words[0].attribution == pytest.approx(score - detector.distribution_scores([without])[0], abs=1e-6)


def test_bad_inputs_raise_input_errors(classifier: Classifier, detector: EmbeddingShiftDetector) -> None:
    with pytest.raises(InputError, match="empty"):
        detector.shift_scores([], [])
    with pytest.raises(InputError, match="2 original texts but 1 modified"):
        detector.shift_scores(["a", "b"], ["a"])
    with pytest.raises(InputError, match="not one string"):
        detector.compare("a text", "a text")
    with pytest.raises(InputError, match="false-positive rate"):
        detector.calibrate(["a"], ["b"], false_positive_rate=1.5)
    with pytest.raises(InputError, match="unknown representation"):
        EmbeddingShiftDetector(classifier, representation="tokens")
    with pytest.raises(InputError, match="fit_reference"):
        EmbeddingShiftDetector(classifier).distribution_scores(["a"])
    with pytest.raises(InputError, match="fewer than"):
        EmbeddingShiftDetector(classifier, neighbours=10).fit_reference(["a", "b"])


def test_pairs_file_format(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("a good film\ta goood film\nfine\tFINE\n", encoding="utf-8")
    assert read_pairs(path) == (["a good film", "fine"], ["a goood film", "FINE"])
    path.write_text("only one column\n", encoding="utf-8")
    with pytest.raises(DataError, match="original<TAB>modified"):
        read_pairs(path)


def test_cli_scan_shift_pair_and_single_modes(tiny_classifier_dir: Path, tmp_path: Path) -> None:
    original, modified, calibrate = tmp_path / "original.txt", tmp_path / "modified.txt", tmp_path / "benign.tsv"
    original.write_text("\n".join(ORIGINALS) + "\n")
    modified.write_text("\n".join(MODIFIED) + "\n")
    calibrate.write_text("".join(f"{t}\t{t.upper()}\n{t}\t{t} .\n" for t in ORIGINALS))
    out = tmp_path / "pair"
    assert main(["scan", "shift", str(tiny_classifier_dir), "--original", str(original), "--modified", str(modified),
                 "--calibrate", str(calibrate), "--out", str(out), "--top-k", "2"]) == 0
    data = json.loads((out / "shift.json").read_text())
    assert data["mode"] == "pair" and len(data["records"]) == 4 and data["calibration"]["count"] == 8
    assert all(isinstance(r["flagged"], bool) for r in data["records"])
    assert (out / "shift_histogram.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "shift_histogram.png" in (out / "shift.md").read_text()

    single = tmp_path / "single"
    assert main(["scan", "shift", str(tiny_classifier_dir), "--texts", str(modified), "--reference", str(original),
                 "--neighbours", "2", "--out", str(single)]) == 0
    assert json.loads((single / "shift.json").read_text())["mode"] == "single"

    assert main(["scan", "shift", str(tiny_classifier_dir), "--original", str(original), "--out", str(out)]) == 2
    assert main(["scan", "shift", str(tiny_classifier_dir), "--original", str(original), "--modified", str(calibrate),
                 "--out", str(out)]) == 2  # 4 originals, 8 modified lines
