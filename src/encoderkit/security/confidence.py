"""How far to trust a classifier's output: confidence and calibration, and out-of-distribution (OOD) scores.

Calibration (Guo et al., 2017, "On Calibration of Modern Neural Networks"): the confidence of a prediction is
its maximum softmax probability; M equal-width bins ((m-1)/M, m/M] over [0, 1]; the expected calibration error
is ECE = sum_m |B_m|/n * |accuracy(B_m) - confidence(B_m)|. The reliability diagram draws accuracy per bin
against confidence.

OOD scores, every one oriented so that a HIGHER score means MORE out-of-distribution:

- ``msp``: the negated maximum softmax probability (Hendrycks & Gimpel, 2017).
- ``energy``: E(x) = -T * logsumexp(logits / T) (Liu et al., 2020); in-distribution inputs get lower energy.
- ``mahalanobis_<feature>``: Lee et al. (2018): class-conditional means and one shared (tied) covariance
  of encoder features, fitted on in-distribution training texts; the score is the smallest Mahalanobis
  distance to a class mean. Features: "cls" (final [CLS] state), "mean" (mean of the final token
  states), "pooled" (the pooler output the classification head reads), from
  ``Classifier.logits_and_features``. The covariance is shrunk toward a scaled identity (Ledoit-Wolf by
  default) and inverted with a pseudo-inverse, so few or collinear training features stay safe.

With an OOD set, each score's detection quality is AUROC and FPR at 95% TPR (OOD = positive).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import DataError, InputError
from ..reports import Report, fpr_at_tpr, markdown_table, new_figure, roc_auc, roc_curve, save_figure
from ..tasks.classify import Classifier, is_multi_label
from .calibration import (DEFAULT_BINS, CalibrationBin, MahalanobisFit, bin_indices, calibration_bins,  # noqa: F401
                          energy_score, expected_calibration_error, ledoit_wolf_shrinkage, max_softmax_probability,
                          softmax_probabilities)

roc_curve_points = roc_curve  # the name the confidence report has always used

log = logging.getLogger(__name__)

FEATURES = ("cls", "mean", "pooled")
FIT_FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# The analyzer
# ---------------------------------------------------------------------------------------------
@dataclass
class TextScores:
    """A classifier's view of some texts: logits, prediction, confidence and every OOD score."""

    logits: np.ndarray  # (texts, labels)
    predicted: list[str]
    confidence: np.ndarray  # maximum softmax probability
    scores: dict[str, np.ndarray]  # OOD score name -> (texts,), higher = more out-of-distribution


class ClassifierConfidenceAnalyzer:
    """Calibration and OOD scores of a single-label classifier.

    ``fit(train_texts, train_labels)`` prepares the Mahalanobis scores (optional: without it only ``msp`` and
    ``energy`` are computed); ``analyze(texts, labels, ood_texts=...)`` returns a ``ConfidenceReport``.
    ``save(path)`` / ``load(path)`` keep a fit in an ``.npz`` file.
    """

    def __init__(self, classifier: Classifier, *, features: Sequence[str] | None = None, bins: int = DEFAULT_BINS,
                 temperature: float = 1.0, shrinkage: float | str = "auto") -> None:
        if not isinstance(classifier, Classifier):
            raise InputError(f"ClassifierConfidenceAnalyzer needs a Classifier, got {type(classifier).__name__}")
        if classifier.model.task == "multitask" or is_multi_label(classifier.config):
            raise InputError("confidence analysis needs a single-label (softmax) classifier with one head; this "
                             "model is multi-task or multi-label")
        available = [f for f in FEATURES if f != "pooled" or classifier.model.encoder.pooler is not None]
        features = list(available if features is None else features)
        unknown = [f for f in features if f not in available]
        if unknown:
            raise InputError(f"unknown or unavailable features {unknown}; this model offers {', '.join(available)}")
        if bins < 1:
            raise InputError(f"the number of calibration bins must be at least 1, got {bins}")
        if temperature <= 0:
            raise InputError(f"the energy temperature must be positive, got {temperature}")
        if shrinkage != "auto":
            try:
                shrinkage = float(shrinkage)
            except (TypeError, ValueError):
                shrinkage = -1.0
            if not 0.0 <= shrinkage <= 1.0:
                raise InputError("covariance shrinkage must be 'auto' (Ledoit-Wolf) or a number in [0, 1]")
        self.classifier = classifier
        self.features = features
        self.bins = bins
        self.temperature = float(temperature)
        self.shrinkage = shrinkage
        self.labels = list(classifier.config.labels)
        self.fits: dict[str, MahalanobisFit] = {}
        self.fit_label_source: str | None = None

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: str = "fp32", **options) -> "ClassifierConfidenceAnalyzer":
        return cls(Classifier.from_pretrained(path, dtype=dtype), **options)

    @property
    def score_names(self) -> list[str]:
        return ["msp", "energy"] + [f"mahalanobis_{name}" for name in self.fits]

    # ----- fitting ----------------------------------------------------------------------------
    def fit(self, texts: Sequence[str], labels: Sequence[str] | None = None) -> "ClassifierConfidenceAnalyzer":
        """Fit the Mahalanobis scores on in-distribution training texts. With ``labels`` (gold) the class
        means follow Lee et al.; without, the classifier's own predictions group the texts."""
        if not self.features:
            raise InputError("no features chosen for the Mahalanobis scores; choose from cls, mean, pooled")
        texts = self._check_texts(texts, "fit texts")
        if labels is not None:
            labels = self._check_labels(labels, texts, "fit labels")
        if len(texts) < 2:
            raise InputError(f"fitting the Mahalanobis scores needs at least 2 texts, got {len(texts)}")
        logits, found = self.classifier.logits_and_features(texts, features=self.features)
        self.fit_label_source = "gold" if labels is not None else "predicted"
        if labels is None:
            labels = [self.labels[i] for i in np.asarray(logits).argmax(axis=1)]
        self.fits = {name: MahalanobisFit.fit(name, found[name], labels, self.shrinkage, self.labels)
                     for name in self.features}
        missing = [label for label in self.labels if label not in next(iter(self.fits.values())).classes]
        if missing:
            log.warning("no fit texts for classes %s: the Mahalanobis scores use the other classes only", missing)
        return self

    def save(self, path: str | Path) -> Path:
        """Write the fit (means, precision, shrinkage per feature) to an ``.npz`` file (no pickles)."""
        if not self.fits:
            raise InputError("nothing to save: call fit(texts, labels) first")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {
            "format_version": np.asarray(FIT_FORMAT_VERSION),
            "features": np.asarray(list(self.fits)),
            "model_labels": np.asarray(self.labels),
            "hidden_size": np.asarray(self.classifier.config.hidden_size),
            "label_source": np.asarray(self.fit_label_source or "unknown"),
        }
        for name, fit in self.fits.items():
            arrays[f"{name}/classes"] = np.asarray(fit.classes)
            arrays[f"{name}/means"] = fit.means
            arrays[f"{name}/precision"] = fit.precision
            arrays[f"{name}/shrinkage"] = np.asarray(fit.shrinkage)
            arrays[f"{name}/fit_texts"] = np.asarray(fit.fit_texts)
        with open(path, "wb") as handle:  # a file handle keeps numpy from appending ".npz" to the name
            np.savez(handle, **arrays)
        return path

    def load(self, path: str | Path) -> "ClassifierConfidenceAnalyzer":
        """Read a fit written by ``save``; it must come from a classifier with the same labels and hidden size."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"Mahalanobis fit not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except (OSError, ValueError) as exc:
            raise DataError(f"{path} is not a Mahalanobis fit written by ClassifierConfidenceAnalyzer.save: {exc}")
        needed = ["model_labels", "hidden_size", "features", "label_source"]
        if int(arrays.get("format_version", -1)) != FIT_FORMAT_VERSION or any(k not in arrays for k in needed):
            raise DataError(f"{path} is not a Mahalanobis fit of format {FIT_FORMAT_VERSION}; fit again")
        parts = ("classes", "means", "precision", "shrinkage", "fit_texts")
        missing = [f"{name}/{part}" for name in arrays["features"].tolist() for part in parts
                   if f"{name}/{part}" not in arrays]
        if missing:
            raise DataError(f"{path} is incomplete (no {missing[0]}); fit again")
        labels, hidden = arrays["model_labels"].tolist(), int(arrays["hidden_size"])
        if labels != self.labels or hidden != self.classifier.config.hidden_size:
            raise InputError(f"{path} was fitted for a classifier with labels {labels} and hidden size {hidden}; "
                             f"this one has {self.labels} and {self.classifier.config.hidden_size}: fit again")
        features = arrays["features"].tolist()
        self.fits = {name: MahalanobisFit(name, arrays[f"{name}/classes"].tolist(), arrays[f"{name}/means"],
                                          arrays[f"{name}/precision"], float(arrays[f"{name}/shrinkage"]),
                                          int(arrays[f"{name}/fit_texts"]))
                     for name in features}
        self.features = features
        self.fit_label_source = str(arrays["label_source"])
        return self

    # ----- scoring ----------------------------------------------------------------------------
    def score(self, texts: Sequence[str]) -> TextScores:
        """Prediction, confidence and every OOD score (higher = more out-of-distribution) of each text."""
        texts = self._check_texts(texts, "texts")
        logits, found = self.classifier.logits_and_features(texts, features=list(self.fits))
        logits = np.asarray(logits, dtype=np.float64)
        confidence = max_softmax_probability(logits)
        scores = {"msp": -confidence, "energy": energy_score(logits, self.temperature)}
        for name, fit in self.fits.items():
            scores[f"mahalanobis_{name}"] = fit.score(found[name])
        predicted = [self.labels[i] for i in logits.argmax(axis=1)]
        return TextScores(logits, predicted, confidence, scores)

    def analyze(self, texts: Sequence[str], labels: Sequence[str] | None = None, *,
                ood_texts: Sequence[str] | None = None, model: str = "") -> "ConfidenceReport":
        """Confidence distribution, calibration (with gold ``labels``) and, with ``ood_texts``, how well each
        OOD score separates them from ``texts`` (AUROC, FPR@95% TPR; OOD = positive)."""
        texts = self._check_texts(texts, "texts")
        if labels is not None:
            labels = self._check_labels(labels, texts, "labels")
        if ood_texts is not None:
            ood_texts = self._check_texts(ood_texts, "OOD texts")
        inside = self.score(texts)
        outside = self.score(ood_texts) if ood_texts is not None else None
        return self.build_report(inside, labels, outside, model=model, texts=texts, ood_texts=ood_texts)

    def build_report(self, inside: TextScores, labels: Sequence[str] | None = None, outside: TextScores | None = None,
                     *, model: str = "", texts: Sequence[str] | None = None,
                     ood_texts: Sequence[str] | None = None) -> "ConfidenceReport":
        """The report from texts already scored with ``score`` (to compare one in-distribution set with several
        OOD sets without scoring it again)."""
        if labels is not None:
            labels = self._check_labels(labels, inside.predicted, "labels")
        accuracy = ece = None
        bins: list[CalibrationBin] = []
        correct = None
        if labels is not None:
            correct = np.asarray([p == g for p, g in zip(inside.predicted, labels)])
            accuracy = float(correct.mean())
            bins = calibration_bins(inside.confidence, correct, self.bins)
            ece = expected_calibration_error(inside.confidence, correct, self.bins)
        histogram = np.bincount(bin_indices(inside.confidence, self.bins), minlength=self.bins).tolist()
        detection = ood_metrics(inside.scores, outside.scores) if outside is not None else []
        best = max(detection, key=lambda m: m.auroc).score if detection else None
        fits = {name: {"classes": fit.classes, "fit_texts": fit.fit_texts, "shrinkage": fit.shrinkage,
                       "labels": self.fit_label_source} for name, fit in self.fits.items()}
        return ConfidenceReport(
            model=model, labels=self.labels, num_texts=len(inside.predicted),
            num_ood=0 if outside is None else len(outside.predicted), bins=self.bins,
            temperature=self.temperature, mean_confidence=float(inside.confidence.mean()), accuracy=accuracy,
            ece=ece, calibration=bins, confidence_histogram=histogram, scores=self.score_names, ood=detection,
            best_score=best, mahalanobis=fits, _inside=inside, _outside=outside, _gold=list(labels or []),
            _texts=list(texts or []), _ood_texts=list(ood_texts or []))

    # ----- input checks -----------------------------------------------------------------------
    @staticmethod
    def _check_texts(texts: Sequence[str], what: str) -> list[str]:
        if isinstance(texts, str):
            raise InputError(f"{what}: pass a list of texts, not one string")
        texts = list(texts)
        if not texts:
            raise InputError(f"{what}: no texts given; pass at least one")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise InputError(f"{what}: item {bad} is a {type(texts[bad]).__name__}, not a string")
        return texts

    def _check_labels(self, labels: Sequence[str], texts: Sequence[str], what: str) -> list[str]:
        if isinstance(labels, str):
            raise InputError(f"{what}: pass a list of labels, not one string")
        labels = [str(label) for label in labels]
        if len(labels) != len(texts):
            raise InputError(f"{what}: {len(labels)} labels for {len(texts)} texts; give one label per text")
        unknown = sorted(set(labels) - set(self.labels))
        if unknown:
            shown = [label if len(label) <= 40 else label[:37] + "..." for label in unknown[:3]]
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            raise InputError(f"{what}: {shown}{more} not among the model's labels {self.labels}; give each text "
                             "one of the model's label names")
        return labels


# ---------------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------------
SCORE_DESCRIPTIONS = {
    "msp": "negated maximum softmax probability",
    "energy": "free energy -T*logsumexp(logits/T)",
    "mahalanobis_cls": "Mahalanobis distance, final [CLS] state",
    "mahalanobis_mean": "Mahalanobis distance, mean of final token states",
    "mahalanobis_pooled": "Mahalanobis distance, pooler output",
}


@dataclass
class OODMetrics:
    """How well one score separates the OOD texts (positives) from the in-distribution texts."""

    score: str
    auroc: float
    fpr_at_95_tpr: float
    mean_in_distribution: float
    mean_ood: float


def ood_metrics(inside: dict[str, np.ndarray], outside: dict[str, np.ndarray]) -> list[OODMetrics]:
    """AUROC and FPR at 95% TPR of every score (OOD texts = positives; higher score = more OOD)."""
    return [OODMetrics(name, roc_auc(outside[name], inside[name]), fpr_at_tpr(outside[name], inside[name], 0.95),
                       float(np.mean(inside[name])), float(np.mean(outside[name])))
            for name in inside]


@dataclass
class ConfidenceReport(Report):
    """Confidence, calibration and OOD detection of a classifier on some texts.

    JSON holds the summary; ``write(out_dir)`` also writes ``confidence_scores.tsv`` (every text's
    prediction, confidence and OOD scores) unless ``scores=False``.
    """

    model: str
    labels: list[str]
    num_texts: int
    num_ood: int
    bins: int
    temperature: float
    mean_confidence: float
    accuracy: float | None  # with gold labels
    ece: float | None  # with gold labels
    calibration: list[CalibrationBin]  # with gold labels
    confidence_histogram: list[int]  # in-distribution texts per confidence bin
    scores: list[str]  # the OOD scores computed; higher = more out-of-distribution
    ood: list[OODMetrics]  # with OOD texts
    best_score: str | None  # the score with the highest AUROC
    mahalanobis: dict[str, dict]  # per feature: classes, fit_texts, shrinkage, label source
    # Per-text values for the figures and the scores file; left out of the JSON.
    _inside: TextScores | None = field(default=None, repr=False)
    _outside: TextScores | None = field(default=None, repr=False)
    _gold: list[str] = field(default_factory=list, repr=False)
    _texts: list[str] = field(default_factory=list, repr=False)
    _ood_texts: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        from ..reports import to_jsonable

        return to_jsonable(self)  # drops the underscore (per-text) fields

    def metrics(self, score: str) -> OODMetrics:
        found = next((m for m in self.ood if m.score == score), None)
        if found is None:
            raise InputError(f"no OOD metrics for {score!r}; computed: {[m.score for m in self.ood]}")
        return found

    # ----- Markdown ---------------------------------------------------------------------------
    def markdown(self) -> str:
        lines = ["# Classifier confidence and out-of-distribution scores", ""]
        if self.model:
            lines += [f"Model: `{self.model}`; labels {self.labels}.", ""]
        summary = [("texts", self.num_texts), ("mean confidence (max softmax)", self.mean_confidence)]
        if self.accuracy is not None:
            summary += [("accuracy", self.accuracy), (f"ECE ({self.bins} equal-width bins)", self.ece)]
        if self.num_ood:
            summary += [("OOD texts", self.num_ood), ("best OOD score (AUROC)", self.best_score)]
        lines += [markdown_table(["", "value"], summary), ""]
        if self.calibration:
            rows = [(f"({b.lower:.3f}, {b.upper:.3f}]", b.count, "" if b.confidence is None else b.confidence,
                     "" if b.accuracy is None else b.accuracy) for b in self.calibration if b.count]
            lines += ["## Calibration (non-empty bins)", "", markdown_table(["bin", "texts", "confidence", "accuracy"],
                                                                              rows), ""]
        if self.ood:
            rows = [(m.score, SCORE_DESCRIPTIONS.get(m.score, ""), m.auroc, m.fpr_at_95_tpr, m.mean_in_distribution,
                     m.mean_ood) for m in self.ood]
            lines += ["## Out-of-distribution detection (OOD = positive, higher score = more OOD)", "",
                      markdown_table(["score", "what", "AUROC", "FPR@95%TPR", "mean (in)", "mean (OOD)"], rows), ""]
        for name, fit in self.mahalanobis.items():
            lines.append(f"- mahalanobis_{name}: fitted on {fit['fit_texts']} texts ({fit['labels']} labels), "
                         f"covariance shrinkage {fit['shrinkage']:.4g}")
        return "\n".join(lines) + "\n"

    # ----- files ------------------------------------------------------------------------------
    def write(self, out_dir: str | Path, *, scores: bool = True) -> dict[str, Path]:
        paths = super().write(out_dir)
        if scores and self._inside is not None:
            paths["scores"] = self.write_scores(Path(out_dir) / f"{self.name}_scores.tsv")
        return paths

    def write_scores(self, path: Path) -> Path:
        """One row per text: set (in / ood), index, predicted label, gold label, confidence, every OOD score, text."""
        header = ["set", "index", "predicted", "gold", "confidence", *self.scores, "text"]
        rows = ["\t".join(header)]
        for which, scored, texts in (("in", self._inside, self._texts), ("ood", self._outside, self._ood_texts)):
            if scored is None:
                continue
            for i in range(len(scored.predicted)):
                gold = self._gold[i] if which == "in" and self._gold else ""
                values = [f"{scored.scores[name][i]:.6g}" for name in self.scores]
                text = " ".join(texts[i].split()) if i < len(texts) else ""  # no tabs or line breaks in a cell
                rows.append("\t".join([which, str(i), scored.predicted[i], gold, f"{scored.confidence[i]:.6g}",
                                       *values, text]))
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        return path

    def figures(self, out_dir: Path) -> list[Path]:
        if self._inside is None:
            return []
        out_dir = Path(out_dir)
        paths = [self.confidence_histogram_figure(out_dir / "confidence_histogram.png")]
        if self.calibration:
            paths.append(self.reliability_figure(out_dir / "reliability.png"))
        if self._outside is not None:
            paths += [self.ood_figure(name, out_dir / f"ood_{name}.png") for name in self.scores]
        return paths

    def reliability_figure(self, path: Path) -> Path:
        """Accuracy against confidence per bin (bars), the diagonal of perfect calibration, and the texts per bin."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, (top, bottom) = plt.subplots(2, 1, figsize=(6.0, 6.5), dpi=110, sharex=True,
                                             gridspec_kw={"height_ratios": [3, 1]})
        width = 1.0 / self.bins
        centres = [b.lower + width / 2 for b in self.calibration]
        accuracy = [b.accuracy or 0.0 for b in self.calibration]
        confidence = [b.confidence if b.confidence is not None else c for b, c in zip(self.calibration, centres)]
        counts = [b.count for b in self.calibration]
        top.bar(centres, accuracy, width=width * 0.95, color="#4c72b0", edgecolor="black", label="accuracy")
        gaps = [(a - c) if n else 0.0 for a, c, n in zip(accuracy, confidence, counts)]
        top.bar(centres, gaps, bottom=confidence, width=width * 0.95, color="#dd8452", alpha=0.45,
                label="gap to mean confidence")
        top.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
        for x, a, n in zip(centres, accuracy, counts):
            if n:
                top.annotate(str(n), (x, a), ha="center", va="bottom", fontsize=7)
        top.set_ylim(0, 1.08)
        top.set_ylabel("accuracy")
        top.set_title(f"Reliability diagram: ECE {self.ece:.4f}, accuracy {self.accuracy:.4f} "
                      f"({self.num_texts} texts)")
        top.legend(loc="upper left", fontsize=8)
        bottom.bar(centres, counts, width=width * 0.95, color="#8c8c8c")
        bottom.set_yscale("log" if max(counts) > 50 * max(1, min(c for c in counts if c)) else "linear")
        bottom.set_xlim(0, 1)
        bottom.set_xlabel("confidence (max softmax probability)")
        bottom.set_ylabel("texts")
        return save_figure(figure, path)

    def confidence_histogram_figure(self, path: Path) -> Path:
        figure, axis = new_figure(6.5, 3.8)
        edges = np.linspace(0.0, 1.0, self.bins + 1)
        axis.hist(self._inside.confidence, bins=edges, alpha=0.6, label=f"in-distribution ({self.num_texts})",
                  color="#4c72b0", weights=np.full(self.num_texts, 1.0 / self.num_texts))
        if self._outside is not None:
            axis.hist(self._outside.confidence, bins=edges, alpha=0.6, label=f"OOD ({self.num_ood})", color="#c44e52",
                      weights=np.full(self.num_ood, 1.0 / self.num_ood))
        axis.set_xlabel("confidence (max softmax probability)")
        axis.set_ylabel("share of texts")
        axis.set_title("Confidence distribution")
        axis.legend(fontsize=8)
        return save_figure(figure, path)

    def ood_figure(self, score: str, path: Path) -> Path:
        """ROC curve (left) and the score's distribution in and out of distribution (right)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        inside, outside = self._inside.scores[score], self._outside.scores[score]
        metrics = self.metrics(score)
        figure, (roc, hist) = plt.subplots(1, 2, figsize=(10.0, 4.0), dpi=110)
        fpr, tpr = roc_curve_points(outside, inside)
        roc.plot(fpr, tpr, color="#4c72b0", label=f"AUROC {metrics.auroc:.4f}")
        roc.plot([0, 1], [0, 1], "k:", linewidth=1)
        roc.axhline(0.95, color="#c44e52", linewidth=0.8, linestyle="--",
                    label=f"TPR 95%: FPR {metrics.fpr_at_95_tpr:.3f}")
        roc.set_xlabel("false-positive rate (in-distribution flagged)")
        roc.set_ylabel("true-positive rate (OOD flagged)")
        roc.set_title(f"ROC: {score}")
        roc.legend(loc="lower right", fontsize=8)
        both = np.concatenate([inside, outside])
        # The central 99% of all values: a few extreme scores would otherwise squeeze every bar into one.
        low, high = np.percentile(both, [0.5, 99.5])
        if not high > low:
            low, high = both.min() - 0.5, both.max() + 0.5
        edges = np.linspace(low, high, 50)
        hist.hist(inside, bins=edges, alpha=0.6, density=True, color="#4c72b0", label="in-distribution")
        hist.hist(outside, bins=edges, alpha=0.6, density=True, color="#c44e52", label="OOD")
        hist.set_xlabel(f"{score} (higher = more OOD; central 99% of values)")
        hist.set_ylabel("density")
        hist.set_title(SCORE_DESCRIPTIONS.get(score, score))
        hist.legend(fontsize=8)
        return save_figure(figure, path)


# ---------------------------------------------------------------------------------------------
# Reading inputs (for the command line)
# ---------------------------------------------------------------------------------------------
def read_texts(path: str | Path, labels_path: str | Path | None = None) -> tuple[list[str], list[str] | None]:
    """Texts and, where the file has them, gold labels.

    ``.csv`` / ``.tsv`` (with a header naming a text and a label column) and ``.jsonl`` are read as
    `encoderkit finetune` reads them (labels optional); any other file holds one text per line (blank lines
    skipped). ``labels_path``: one gold label per line, for a plain text file (or to override a file's labels).
    """
    from ..data.readers import detect_format, read_lines
    from ..data.tasks import read_classification

    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    if detect_format(path) == "text":
        texts, labels = [line.strip() for line in read_lines(path) if line.strip()], None
    else:
        examples = read_classification(path, require_label=False)
        texts = [e.text for e in examples]
        labels = [str(e.label) for e in examples] if all(e.label is not None for e in examples) else None
    if not texts:
        raise DataError(f"{path} holds no texts")
    if labels_path is not None:
        labels = [line.strip() for line in read_lines(labels_path) if line.strip()]
        if len(labels) != len(texts):
            raise DataError(f"{labels_path} has {len(labels)} labels for the {len(texts)} texts of {path}; "
                            "give one label per line, in the same order")
    return texts, labels
