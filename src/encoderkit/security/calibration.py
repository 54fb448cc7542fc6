"""The arithmetic of a classifier's confidence: softmax confidence and energy (Liu et al., 2020), calibration bins and
the expected calibration error (Guo et al., 2017), and the shrunk class-conditional Gaussian of Mahalanobis OOD
scores (Lee et al., 2018; Ledoit & Wolf, 2004). ``security.confidence`` runs them on a classifier's outputs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import InputError

DEFAULT_BINS = 15  # Guo et al.'s choice


# ---------------------------------------------------------------------------------------------
# Scores and calibration as plain functions of logits / features
# ---------------------------------------------------------------------------------------------
def softmax_probabilities(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (stable: the row maximum is subtracted first)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def max_softmax_probability(logits: np.ndarray) -> np.ndarray:
    """The confidence of each prediction: its largest softmax probability (Hendrycks & Gimpel's MSP)."""
    return softmax_probabilities(logits).max(axis=1)


def energy_score(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Free energy -T * logsumexp(logits / T) (Liu et al., 2020): higher = more out-of-distribution."""
    if temperature <= 0:
        raise InputError(f"the energy temperature must be positive, got {temperature}")
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    top = scaled.max(axis=1, keepdims=True)
    return -temperature * (top[:, 0] + np.log(np.exp(scaled - top).sum(axis=1)))


@dataclass
class CalibrationBin:
    """One equal-width confidence bin (lower, upper]; accuracy and confidence are None when it is empty."""

    lower: float
    upper: float
    count: int
    accuracy: float | None
    confidence: float | None


def bin_indices(confidences: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each confidence for ``bins`` equal-width bins ((m-1)/M, m/M]; a confidence of 0 joins the first."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    return np.clip(np.searchsorted(edges, confidences, side="left") - 1, 0, bins - 1)


def calibration_bins(confidences: Sequence[float], correct: Sequence[bool], bins: int = DEFAULT_BINS
                     ) -> list[CalibrationBin]:
    """Accuracy and mean confidence per equal-width confidence bin (the reliability diagram's data)."""
    confidences, correct = _check_calibration_input(confidences, correct, bins)
    which = bin_indices(confidences, bins)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for m in range(bins):
        members = which == m
        count = int(members.sum())
        out.append(CalibrationBin(float(edges[m]), float(edges[m + 1]), count,
                                  float(correct[members].mean()) if count else None,
                                  float(confidences[members].mean()) if count else None))
    return out


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[bool], bins: int = DEFAULT_BINS
                               ) -> float:
    """ECE with equal-width bins (Guo et al., 2017): sum over bins of |B|/n * |accuracy(B) - confidence(B)|."""
    confidences, correct = _check_calibration_input(confidences, correct, bins)
    total = len(confidences)
    return float(sum(b.count / total * abs(b.accuracy - b.confidence)
                     for b in calibration_bins(confidences, correct, bins) if b.count))


def _check_calibration_input(confidences, correct, bins: int) -> tuple[np.ndarray, np.ndarray]:
    confidences = np.asarray(confidences, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if bins < 1:
        raise InputError(f"the number of calibration bins must be at least 1, got {bins}")
    if confidences.ndim != 1 or confidences.shape != correct.shape or len(confidences) == 0:
        raise InputError(f"calibration needs as many correctness flags as confidences (and at least one); got "
                         f"{confidences.shape} and {correct.shape}")
    if np.any((confidences < 0) | (confidences > 1)) or not np.all(np.isfinite(confidences)):
        raise InputError("confidences must be probabilities in [0, 1]")
    return confidences, correct



# ---------------------------------------------------------------------------------------------
# Mahalanobis distance with a tied covariance (Lee et al., 2018)
# ---------------------------------------------------------------------------------------------
def ledoit_wolf_shrinkage(centered: np.ndarray) -> float:
    """The Ledoit-Wolf (2004) shrinkage intensity for the covariance of already-centred rows: the weight of the
    scaled identity in (1 - a) * S + a * (trace(S) / d) * I that minimises the expected squared error."""
    x = np.asarray(centered, dtype=np.float64)
    n, d = x.shape
    if n < 2:
        return 1.0
    squared = x ** 2
    sample_cov = x.T @ x / n
    mu = np.trace(sample_cov) / d
    # delta: squared distance of S from mu*I; beta: the estimated variance of S's entries (bounded by delta).
    delta = (np.sum(sample_cov ** 2) - 2 * mu * np.trace(sample_cov) + d * mu ** 2) / d
    beta = (np.sum(squared.T @ squared) / n - np.sum(sample_cov ** 2)) / (d * n)
    beta = min(beta, delta)
    return 0.0 if delta == 0 else float(beta / delta)


@dataclass
class MahalanobisFit:
    """Class means and the shared precision (inverse covariance) of one feature."""

    feature: str
    classes: list[str]  # the classes that had training texts, in the order of ``means``
    means: np.ndarray  # (classes, hidden) float64
    precision: np.ndarray  # (hidden, hidden) float64
    shrinkage: float  # weight of the scaled identity in the shrunk covariance
    fit_texts: int

    @classmethod
    def fit(cls, feature: str, features: np.ndarray, labels: Sequence[str], shrinkage: float | str = "auto",
            label_order: Sequence[str] | None = None) -> "MahalanobisFit":
        """Means per class and one covariance of the class-centred features, shrunk and pseudo-inverted.
        ``label_order``: the order of the classes (default: sorted); classes without texts are left out."""
        x = np.asarray(features, dtype=np.float64)
        labels = np.asarray([str(label) for label in labels])
        if x.ndim != 2 or len(x) != len(labels) or len(x) < 2:
            raise InputError(f"fitting needs (texts, hidden) features, one label per text and at least 2 texts; "
                             f"got {x.shape} and {len(labels)} labels")
        present = set(labels.tolist())
        classes = [name for name in (label_order or sorted(present)) if name in present]
        means = np.stack([x[labels == name].mean(axis=0) for name in classes])
        index = {name: i for i, name in enumerate(classes)}
        centered = x - means[[index[label] for label in labels]]
        covariance = centered.T @ centered / len(x)
        if shrinkage == "auto":
            alpha = ledoit_wolf_shrinkage(centered)
        else:
            alpha = float(shrinkage)
            if not 0.0 <= alpha <= 1.0:
                raise InputError(f"covariance shrinkage must be 'auto' or in [0, 1], got {shrinkage!r}")
        target = np.trace(covariance) / covariance.shape[0]
        shrunk = (1 - alpha) * covariance + alpha * target * np.eye(covariance.shape[0])
        # pinv, not inv: with fewer texts than dimensions (or alpha = 0) the covariance is singular.
        precision = np.linalg.pinv(shrunk, hermitian=True)
        return cls(feature, classes, means, precision, alpha, len(x))

    def distances(self, features: np.ndarray) -> np.ndarray:
        """(texts, classes) Mahalanobis distances sqrt((x - mean_c)^T P (x - mean_c))."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.means.shape[1]:
            raise InputError(f"{self.feature} features must be (texts, {self.means.shape[1]}), got {x.shape}")
        out = np.empty((len(x), len(self.means)))
        for c, mean in enumerate(self.means):
            diff = x - mean
            out[:, c] = np.einsum("ij,jk,ik->i", diff, self.precision, diff)
        return np.sqrt(np.maximum(out, 0.0))  # rounding can make a tiny squared distance negative

    def score(self, features: np.ndarray) -> np.ndarray:
        """The OOD score: the distance to the nearest class mean."""
        return self.distances(features).min(axis=1)
