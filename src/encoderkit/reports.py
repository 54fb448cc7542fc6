"""Result objects that write themselves out: JSON for machines, a short Markdown report for people,
and PNG figures where a picture says more than numbers.

Every inspection and audit engine (``encoderkit.analysis``, ``encoderkit.security``) returns a
result that subclasses ``Report``. ``Report.write(out_dir)`` puts ``<name>.json``, ``<name>.md``
and the figures in one directory; the ``encoderkit scan ...`` commands call exactly that.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def to_jsonable(value: Any) -> Any:
    """Plain JSON types from dataclasses, numpy scalars/arrays, tensors, paths, sets and tuples.

    Non-finite floats become None (JSON has no NaN), so every written file parses everywhere.
    """
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value) if not f.name.startswith("_")}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if hasattr(value, "detach") and hasattr(value, "tolist"):  # a torch tensor
        return to_jsonable(value.detach().cpu().tolist())
    return value


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-style table; floats are shown with 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, (float, np.floating)):
            return f"{float(value):.4g}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Report:
    """Base of every engine's result. Subclasses are dataclasses; override ``markdown`` and ``figures``."""

    @property
    def name(self) -> str:
        """File stem of the written report, e.g. "provenance"."""
        return type(self).__name__.lstrip("_").removesuffix("Result").removesuffix("Report").lower() or "report"

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(asdict(self) if is_dataclass(self) else vars(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def markdown(self) -> str:
        """A short human-readable report; the default lists the scalar fields."""
        rows = [(key, value) for key, value in self.to_dict().items() if not isinstance(value, (list, dict))]
        return f"# {self.name}\n\n" + markdown_table(["field", "value"], rows) + "\n"

    def figures(self, out_dir: Path) -> list[Path]:
        """Write PNG figures into ``out_dir`` and return their paths (none by default)."""
        return []

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """``<name>.json``, ``<name>.md`` (which links the figures) and the PNGs, in ``out_dir``."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        pictures = self.figures(out_dir)
        text = self.markdown().rstrip() + "\n"
        if pictures:
            text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pictures) + "\n"
        paths = {"json": out_dir / f"{self.name}.json", "markdown": out_dir / f"{self.name}.md"}
        paths["json"].write_text(self.to_json() + "\n", encoding="utf-8")
        paths["markdown"].write_text(text, encoding="utf-8")
        paths.update({p.stem: p for p in pictures})
        return paths


def new_figure(width: float = 7.0, height: float = 4.0):
    """A matplotlib (figure, axis) on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=110)


def save_figure(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def roc_auc(scores_positive: Sequence[float], scores_negative: Sequence[float]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half
    (the Mann-Whitney U statistic; equal to scikit-learn's roc_auc_score)."""
    pos, neg = np.asarray(scores_positive, dtype=np.float64), np.asarray(scores_negative, dtype=np.float64)
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("AUROC needs at least one positive and one negative score")
    values = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based ranks, ties averaged
    rank_sum = ranks[: len(pos)].sum()
    return float((rank_sum - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def tpr_at_fpr(scores_positive: Sequence[float], scores_negative: Sequence[float], fpr: float) -> float:
    """True-positive rate at the threshold whose false-positive rate is at most ``fpr`` (higher score =
    more likely positive)."""
    pos, neg = np.asarray(scores_positive, dtype=np.float64), np.asarray(scores_negative, dtype=np.float64)
    allowed = int(math.floor(fpr * len(neg)))
    negatives = np.sort(neg)[::-1]
    threshold = negatives[allowed] if allowed < len(negatives) else -np.inf  # scores above it are flagged
    return float(np.mean(pos > threshold))


def fpr_at_tpr(scores_positive: Sequence[float], scores_negative: Sequence[float], tpr: float) -> float:
    """False-positive rate at the highest threshold that flags at least ``tpr`` of the positives
    (FPR@95 with tpr=0.95; higher score = more likely positive)."""
    pos, neg = np.asarray(scores_positive, dtype=np.float64), np.asarray(scores_negative, dtype=np.float64)
    needed = int(math.ceil(tpr * len(pos)))
    threshold = np.sort(pos)[::-1][max(needed - 1, 0)]  # flag scores >= threshold
    return float(np.mean(neg >= threshold))


def roc_curve(scores_positive: Sequence[float], scores_negative: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(false-positive rates, true-positive rates) at every distinct threshold, from (0, 0) to (1, 1); higher score =
    more likely positive. Equal to scikit-learn's roc_curve(drop_intermediate=False) with (0, 0) prepended."""
    pos, neg = np.asarray(scores_positive, dtype=np.float64), np.asarray(scores_negative, dtype=np.float64)
    thresholds = np.unique(np.concatenate([pos, neg]))[::-1]
    pos_sorted, neg_sorted = np.sort(pos), np.sort(neg)
    tpr = 1.0 - np.searchsorted(pos_sorted, thresholds, side="left") / len(pos)  # share with score >= threshold
    fpr = 1.0 - np.searchsorted(neg_sorted, thresholds, side="left") / len(neg)
    return np.concatenate([[0.0], fpr]), np.concatenate([[0.0], tpr])
