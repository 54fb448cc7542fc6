"""Classifier confidence and OOD scores: ECE, MSP and energy by hand, Mahalanobis distances against scipy,
Ledoit-Wolf shrinkage and ROC points against scikit-learn, AUROC/FPR@95 plumbing on separable data, the
analyzer end to end on a tiny random classifier (figures, scores file, saved fit), bad input, and the
`scan confidence` command."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from encoderkit import InputError
from encoderkit.cli import main
from encoderkit.errors import DataError
from encoderkit.security.confidence import (
    ClassifierConfidenceAnalyzer,
    MahalanobisFit,
    bin_indices,
    calibration_bins,
    energy_score,
    expected_calibration_error,
    ledoit_wolf_shrinkage,
    max_softmax_probability,
    ood_metrics,
    read_texts,
    roc_curve_points,
)
from encoderkit.tasks.classify import Classifier

from helpers import tiny_bert_dir

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIT_TEXTS = ["the film was great", "a dull and boring movie", "lovely acting throughout", "the plot was awful",
             "a superb cast", "dreadful pacing"] * 4
FIT_LABELS = ["pos", "neg", "pos", "neg", "pos", "neg"] * 4
IN_TEXTS = ["a wonderful film", "terrible script", "brilliant and moving", "so dull"]
IN_LABELS = ["pos", "neg", "pos", "neg"]
OOD_TEXTS = ["shares of the bank fell 3% on tuesday", "who was the first president of the united states ?",
             "the match ended in a draw after extra time"]


@pytest.fixture(scope="module")
def tiny_classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-cls"), minilm_dir, task="sequence-classification",
                         id2label={0: "neg", 1: "pos"})


@pytest.fixture(scope="module")
def classifier(tiny_classifier_dir) -> Classifier:
    return Classifier.from_pretrained(tiny_classifier_dir)


def assert_png(path: Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 2000, f"{path} is not a real PNG ({len(data)} bytes)"


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------
def test_ece_by_hand() -> None:
    confidences = [0.95, 0.85, 0.72, 0.55, 0.91, 0.62]
    correct = [1, 0, 1, 1, 1, 0]
    # 5 bins of width 0.2: (0.4, 0.6] holds 0.55 (right): |1 - 0.55| = 0.45;
    # (0.6, 0.8] holds 0.72 (right), 0.62 (wrong): |0.5 - 0.67| = 0.17;
    # (0.8, 1.0] holds 0.95, 0.91 (right), 0.85 (wrong): |2/3 - 2.71/3| = 0.71/3.
    by_hand = 1 / 6 * 0.45 + 2 / 6 * 0.17 + 3 / 6 * (0.71 / 3)
    assert by_hand == pytest.approx(0.25)
    assert expected_calibration_error(confidences, correct, bins=5) == pytest.approx(by_hand, abs=1e-12)
    bins = calibration_bins(confidences, correct, bins=5)
    assert [b.count for b in bins] == [0, 0, 1, 2, 3]
    assert bins[3].accuracy == pytest.approx(0.5) and bins[3].confidence == pytest.approx(0.67)
    assert bins[0].accuracy is None and bins[0].confidence is None
    assert bins[4].lower == pytest.approx(0.8) and bins[4].upper == pytest.approx(1.0)
    # A perfectly calibrated bin contributes nothing.
    assert expected_calibration_error([0.75] * 4, [1, 1, 1, 0], bins=10) == pytest.approx(0.0, abs=1e-12)


def test_bins_are_closed_on_the_right() -> None:
    # (0, 0.2], (0.2, 0.4], ...: a confidence on an edge belongs to the bin below it; 0 joins the first bin.
    assert bin_indices(np.array([0.0, 0.2, 0.2000001, 0.6, 0.8, 1.0]), 5).tolist() == [0, 0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------
# MSP and energy from fixed logits
# ---------------------------------------------------------------------------------------------
LOGITS = np.array([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0], [-1.0, 3.0, 0.5]])


def by_hand_msp(row) -> float:
    return max(math.exp(v) for v in row) / sum(math.exp(v) for v in row)


def by_hand_energy(row, temperature: float) -> float:
    return -temperature * math.log(sum(math.exp(v / temperature) for v in row))


def test_msp_and_energy_by_hand() -> None:
    assert max_softmax_probability(LOGITS) == pytest.approx([by_hand_msp(r) for r in LOGITS], abs=1e-12)
    assert max_softmax_probability(LOGITS)[1] == pytest.approx(1 / 3)
    for temperature in (1.0, 2.0, 0.5):
        assert energy_score(LOGITS, temperature) == pytest.approx(
            [by_hand_energy(r, temperature) for r in LOGITS], abs=1e-12)
    assert energy_score(LOGITS)[1] == pytest.approx(-(1.0 + math.log(3.0)))
    # Stable for large logits (a naive exp overflows).
    assert energy_score(np.array([[1000.0, 0.0]]))[0] == pytest.approx(-1000.0)
    assert max_softmax_probability(np.array([[1000.0, 0.0]]))[0] == pytest.approx(1.0)
    with pytest.raises(InputError, match="temperature"):
        energy_score(LOGITS, 0.0)


# ---------------------------------------------------------------------------------------------
# Mahalanobis
# ---------------------------------------------------------------------------------------------
def test_mahalanobis_distance_matches_scipy() -> None:
    from scipy.spatial.distance import mahalanobis

    rng = np.random.default_rng(0)
    factor = rng.normal(size=(4, 4))
    covariance = factor @ factor.T + 0.5 * np.eye(4)
    precision = np.linalg.inv(covariance)
    means = np.array([[0.0, 1.0, 0.0, -1.0], [2.0, 0.0, 1.0, 0.5]])
    fit = MahalanobisFit("cls", ["a", "b"], means, precision, 0.0, 10)
    points = rng.normal(size=(6, 4))
    distances = fit.distances(points)
    expected = np.array([[mahalanobis(p, m, precision) for m in means] for p in points])
    np.testing.assert_allclose(distances, expected, rtol=1e-10)
    np.testing.assert_allclose(fit.score(points), expected.min(axis=1), rtol=1e-10)
    assert fit.score(means[1:])[0] == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(InputError, match="features must be"):
        fit.distances(points[:, :3])


def test_mahalanobis_fit_uses_class_means_and_tied_covariance() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(loc=0.0, size=(40, 3))
    b = rng.normal(loc=4.0, size=(60, 3)) @ np.diag([1.0, 2.0, 0.5])
    features, labels = np.vstack([a, b]), ["a"] * 40 + ["b"] * 60
    fit = MahalanobisFit.fit("mean", features, labels, shrinkage=0.0, label_order=["b", "a"])
    assert fit.classes == ["b", "a"]
    np.testing.assert_allclose(fit.means, [b.mean(0), a.mean(0)], rtol=1e-12)
    # Lee et al.'s tied covariance: the class-centred features pooled, divided by the number of texts.
    centred = np.vstack([a - a.mean(0), b - b.mean(0)])
    np.testing.assert_allclose(fit.precision, np.linalg.inv(centred.T @ centred / 100), rtol=1e-8)
    # Shrinkage mixes in the scaled identity.
    shrunk = MahalanobisFit.fit("mean", features, labels, shrinkage=0.3)
    covariance = centred.T @ centred / 100
    target = 0.7 * covariance + 0.3 * np.trace(covariance) / 3 * np.eye(3)
    np.testing.assert_allclose(shrunk.precision, np.linalg.inv(target), rtol=1e-8)


def test_ledoit_wolf_shrinkage_matches_scikit_learn() -> None:
    covariance_module = pytest.importorskip("sklearn.covariance")
    rng = np.random.default_rng(2)
    for n, d in ((50, 10), (20, 30), (500, 8)):
        x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
        x -= x.mean(axis=0)
        assert ledoit_wolf_shrinkage(x) == pytest.approx(
            covariance_module.ledoit_wolf_shrinkage(x, assume_centered=True), rel=1e-9)


def test_fewer_texts_than_dimensions_stays_finite() -> None:
    rng = np.random.default_rng(3)
    features = rng.normal(size=(6, 32))  # rank-deficient covariance
    for shrinkage in (0.0, "auto"):
        fit = MahalanobisFit.fit("cls", features, ["x", "y"] * 3, shrinkage=shrinkage)
        assert np.all(np.isfinite(fit.score(rng.normal(size=(5, 32)))))


# ---------------------------------------------------------------------------------------------
# AUROC / FPR@95 plumbing
# ---------------------------------------------------------------------------------------------
def test_ood_metrics_on_separable_and_overlapping_scores() -> None:
    metrics_module = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(4)
    inside = {"far": rng.uniform(0, 1, 200), "near": rng.normal(0, 1, 200)}
    outside = {"far": rng.uniform(2, 3, 100), "near": rng.normal(1, 1, 100)}
    far, near = ood_metrics(inside, outside)
    assert (far.score, far.auroc, far.fpr_at_95_tpr) == ("far", 1.0, 0.0)
    truth = np.r_[np.ones(100), np.zeros(200)]
    values = np.r_[outside["near"], inside["near"]]
    assert near.auroc == pytest.approx(metrics_module.roc_auc_score(truth, values))
    fpr, tpr, _ = metrics_module.roc_curve(truth, values, drop_intermediate=False)
    ours_fpr, ours_tpr = roc_curve_points(outside["near"], inside["near"])
    np.testing.assert_allclose(ours_fpr, fpr)
    np.testing.assert_allclose(ours_tpr, tpr)
    # FPR at the first threshold reaching 95% TPR, read off scikit-learn's curve.
    assert near.fpr_at_95_tpr == pytest.approx(fpr[np.argmax(tpr >= 0.95)])


def test_analyzer_detects_separable_ood_through_every_score(classifier, monkeypatch) -> None:
    """The analyzer's plumbing (scores -> AUROC/FPR) with a classifier whose outputs are made separable:
    in-distribution texts get confident logits and features near their class mean, OOD texts neither."""
    rng = np.random.default_rng(5)
    hidden = classifier.config.hidden_size

    def fake(texts, pairs=None, *, features=("cls", "mean")):
        logits, found = [], {name: [] for name in features}
        for text in texts:
            kind, label = text.split("-")[:2]
            if kind == "in":
                logits.append([4.0, -4.0] if label == "neg" else [-4.0, 4.0])
                centre = np.full(hidden, -1.0 if label == "neg" else 1.0)
            else:
                logits.append([0.1, 0.0])
                centre = np.full(hidden, 12.0)
            for name in features:
                found[name].append(centre + 0.1 * rng.normal(size=hidden))
        return np.asarray(logits, dtype=np.float32), {k: np.asarray(v, dtype=np.float32) for k, v in found.items()}

    monkeypatch.setattr(classifier, "logits_and_features", fake)
    analyzer = ClassifierConfidenceAnalyzer(classifier, features=["cls", "mean"])
    labels = ["neg", "pos"] * 20
    analyzer.fit([f"in-{label}-{i}" for i, label in enumerate(labels)], labels)
    report = analyzer.analyze([f"in-{label}-t{i}" for i, label in enumerate(labels[:10])], labels[:10],
                              ood_texts=[f"ood-x-{i}" for i in range(8)])
    assert report.scores == ["msp", "energy", "mahalanobis_cls", "mahalanobis_mean"]
    for metrics in report.ood:
        assert (metrics.auroc, metrics.fpr_at_95_tpr) == (1.0, 0.0), metrics
    assert report.accuracy == 1.0
    assert report.ece == pytest.approx(1.0 - max_softmax_probability(np.array([[4.0, -4.0]]))[0])


# ---------------------------------------------------------------------------------------------
# End to end on a tiny random classifier
# ---------------------------------------------------------------------------------------------
def test_analyzer_end_to_end(classifier, tiny_classifier_dir, tmp_path) -> None:
    from scipy.special import logsumexp

    analyzer = ClassifierConfidenceAnalyzer(classifier, bins=10).fit(FIT_TEXTS, FIT_LABELS)
    assert set(analyzer.fits) == {"cls", "mean", "pooled"} and analyzer.fit_label_source == "gold"
    report = analyzer.analyze(IN_TEXTS, IN_LABELS, ood_texts=OOD_TEXTS, model=str(tiny_classifier_dir))
    # The scores are the published formulas applied to the classifier's own logits and features.
    logits, features = classifier.logits_and_features(IN_TEXTS, features=("cls", "mean", "pooled"))
    scored = report._inside
    np.testing.assert_allclose(scored.confidence, np.exp(logits - logsumexp(logits, axis=1, keepdims=True)).max(1),
                               rtol=1e-5)
    np.testing.assert_allclose(scored.scores["msp"], -scored.confidence)
    np.testing.assert_allclose(scored.scores["energy"], -logsumexp(logits.astype(np.float64), axis=1), rtol=1e-5)
    np.testing.assert_allclose(scored.scores["mahalanobis_mean"], analyzer.fits["mean"].score(features["mean"]),
                               rtol=1e-5)
    correct = np.array([p == g for p, g in zip(scored.predicted, IN_LABELS)])
    assert report.accuracy == pytest.approx(correct.mean())
    assert report.ece == pytest.approx(expected_calibration_error(scored.confidence, correct, 10))
    assert sum(report.confidence_histogram) == len(IN_TEXTS) == sum(b.count for b in report.calibration)
    assert [m.score for m in report.ood] == report.scores and report.best_score in report.scores
    assert all(0.0 <= m.auroc <= 1.0 and 0.0 <= m.fpr_at_95_tpr <= 1.0 for m in report.ood)

    paths = report.write(tmp_path / "out")
    for name in ("reliability", "confidence_histogram", "ood_msp", "ood_energy", "ood_mahalanobis_cls",
                 "ood_mahalanobis_mean", "ood_mahalanobis_pooled"):
        assert_png(paths[name])
    written = json.loads(paths["json"].read_text())
    assert written["num_texts"] == 4 and written["num_ood"] == 3 and len(written["ood"]) == 5
    assert not any(key.startswith("_") for key in written)
    assert "reliability.png" in paths["markdown"].read_text()
    rows = paths["scores"].read_text().splitlines()
    assert rows[0].split("\t")[:5] == ["set", "index", "predicted", "gold", "confidence"]
    assert len(rows) == 1 + len(IN_TEXTS) + len(OOD_TEXTS)

    # A saved fit scores exactly as the fitted analyzer does.
    saved = analyzer.save(tmp_path / "fit.npz")
    again = ClassifierConfidenceAnalyzer(classifier).load(saved)
    for name, values in again.score(OOD_TEXTS).scores.items():
        np.testing.assert_allclose(values, report._outside.scores[name], rtol=1e-6)


def test_without_labels_or_fit(classifier, tmp_path) -> None:
    report = ClassifierConfidenceAnalyzer(classifier).analyze(IN_TEXTS)
    assert report.scores == ["msp", "energy"] and report.ece is None and report.ood == []
    paths = report.write(tmp_path)
    assert_png(paths["confidence_histogram"]) and "reliability" not in paths
    # Without gold labels the fit groups texts by the classifier's predictions.
    analyzer = ClassifierConfidenceAnalyzer(classifier, features=["mean"]).fit(FIT_TEXTS)
    assert analyzer.fit_label_source == "predicted"
    predicted = [p.label for p in classifier(FIT_TEXTS)]
    assert analyzer.fits["mean"].classes == [label for label in ("neg", "pos") if label in predicted]


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_raises_input_error(classifier, tmp_path, minilm_dir) -> None:
    analyzer = ClassifierConfidenceAnalyzer(classifier, features=["cls"])
    with pytest.raises(InputError, match="no texts"):
        analyzer.analyze([])
    with pytest.raises(InputError, match="not one string"):
        analyzer.analyze("one text")
    with pytest.raises(InputError, match=r"\['maybe'\] not among the model's labels \['neg', 'pos'\]"):
        analyzer.analyze(IN_TEXTS, ["pos", "neg", "pos", "maybe"])
    with pytest.raises(InputError, match="3 labels for 4 texts"):
        analyzer.analyze(IN_TEXTS, IN_LABELS[:3])
    with pytest.raises(InputError, match="OOD texts: no texts"):
        analyzer.analyze(IN_TEXTS, ood_texts=[])
    with pytest.raises(InputError, match="fit labels"):
        analyzer.fit(FIT_TEXTS, ["yes"] * len(FIT_TEXTS))
    with pytest.raises(InputError, match="at least 2 texts"):
        analyzer.fit(FIT_TEXTS[:1])
    with pytest.raises(InputError, match="nothing to save"):
        analyzer.save(tmp_path / "fit.npz")
    with pytest.raises(InputError, match="unknown or unavailable features"):
        ClassifierConfidenceAnalyzer(classifier, features=["max"])
    with pytest.raises(InputError, match="shrinkage"):
        ClassifierConfidenceAnalyzer(classifier, shrinkage="lots")
    with pytest.raises(InputError, match="bins"):
        ClassifierConfidenceAnalyzer(classifier, bins=0)
    # A fit from a classifier with other labels is refused.
    other_dir = tiny_bert_dir(tmp_path / "other", minilm_dir, task="sequence-classification",
                              id2label={0: "a", 1: "b", 2: "c"})
    fitted = ClassifierConfidenceAnalyzer(classifier, features=["cls"]).fit(FIT_TEXTS, FIT_LABELS)
    saved = fitted.save(tmp_path / "f.npz")
    with pytest.raises(InputError, match="fit again"):
        ClassifierConfidenceAnalyzer(Classifier.from_pretrained(other_dir)).load(saved)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a Mahalanobis fit"):
        analyzer.load(tmp_path / "junk.npz")


def test_read_texts_formats(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("first text\n\nsecond text\n", encoding="utf-8")
    assert read_texts(tmp_path / "a.txt") == (["first text", "second text"], None)
    (tmp_path / "l.txt").write_text("pos\nneg\n", encoding="utf-8")
    assert read_texts(tmp_path / "a.txt", tmp_path / "l.txt") == (["first text", "second text"], ["pos", "neg"])
    (tmp_path / "b.tsv").write_text("text\tlabel\ngood film\tpos\nbad film\tneg\n", encoding="utf-8")
    assert read_texts(tmp_path / "b.tsv") == (["good film", "bad film"], ["pos", "neg"])
    (tmp_path / "short.txt").write_text("pos\n", encoding="utf-8")
    with pytest.raises(DataError, match="1 labels for the 2 texts"):
        read_texts(tmp_path / "a.txt", tmp_path / "short.txt")
    with pytest.raises(DataError, match="not found"):
        read_texts(tmp_path / "missing.txt")


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------
def test_cli_scan_confidence(tiny_classifier_dir, tmp_path, capsys) -> None:
    fit = tmp_path / "fit.tsv"
    fit.write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in zip(FIT_TEXTS, FIT_LABELS)), encoding="utf-8")
    (tmp_path / "in.txt").write_text("\n".join(IN_TEXTS) + "\n", encoding="utf-8")
    (tmp_path / "labels.txt").write_text("\n".join(IN_LABELS) + "\n", encoding="utf-8")
    (tmp_path / "ood.txt").write_text("\n".join(OOD_TEXTS) + "\n", encoding="utf-8")
    common = ["--texts", str(tmp_path / "in.txt"), "--labels", str(tmp_path / "labels.txt"),
              "--ood", str(tmp_path / "ood.txt")]
    out = tmp_path / "report"
    assert main(["scan", "confidence", str(tiny_classifier_dir), "--fit", str(fit), *common, "--out", str(out),
                 "--bins", "10"]) == 0
    said = capsys.readouterr().out
    assert "ECE" in said and "best OOD score" in said and "mahalanobis_fit.npz" in said
    first = json.loads((out / "confidence.json").read_text())
    assert first["bins"] == 10 and first["accuracy"] is not None and len(first["ood"]) == 5
    assert_png(out / "reliability.png") and assert_png(out / "ood_energy.png")
    assert (out / "confidence.md").read_text().startswith("# Classifier confidence")

    # Fit once, score later: the saved fit gives the same per-text scores.
    later = tmp_path / "later"
    assert main(["scan", "confidence", str(tiny_classifier_dir), "--fit", str(out / "mahalanobis_fit.npz"),
                 "--texts", str(tmp_path / "in.txt"), "--out", str(later)]) == 0
    first_rows = [row.split("\t") for row in (out / "confidence_scores.tsv").read_text().splitlines()]
    later_rows = [row.split("\t") for row in (later / "confidence_scores.tsv").read_text().splitlines()]
    assert later_rows[0] == first_rows[0] and len(later_rows) == 1 + len(IN_TEXTS)
    for mine, theirs in zip(later_rows[1:], first_rows[1:]):
        assert mine[0] == theirs[0] == "in" and mine[3] == ""  # no gold labels the second time
        np.testing.assert_allclose([float(v) for v in mine[4:-1]], [float(v) for v in theirs[4:-1]], rtol=1e-5)
        assert mine[-1] == theirs[-1] and mine[-1] in IN_TEXTS

    # A user mistake is one line and exit code 2.
    (tmp_path / "bad_labels.txt").write_text("pos\nneg\npos\nunsure\n", encoding="utf-8")
    capsys.readouterr()
    code = main(["scan", "confidence", str(tiny_classifier_dir), "--texts", str(tmp_path / "in.txt"),
                 "--labels", str(tmp_path / "bad_labels.txt"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("encoderkit: error: ") and "unsure" in err and len(err.splitlines()) == 1
