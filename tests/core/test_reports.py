"""Report writing and the detection-quality measures every engine reports."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from encoderkit.reports import Report, fpr_at_tpr, markdown_table, roc_auc, tpr_at_fpr


def test_roc_auc_equals_sklearn_with_ties() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    pos, neg = rng.integers(0, 20, 300).astype(float), rng.integers(0, 15, 500).astype(float)  # many ties
    expected = metrics.roc_auc_score(np.r_[np.ones(300), np.zeros(500)], np.r_[pos, neg])
    assert roc_auc(pos, neg) == pytest.approx(expected, abs=1e-12)
    assert roc_auc([3.0], [1.0, 2.0]) == 1.0 and roc_auc([1.0], [1.0]) == 0.5


def test_tpr_at_fpr_and_fpr_at_tpr_by_hand() -> None:
    negatives = np.arange(100, dtype=float)  # 0..99
    positives = np.array([99.5, 98.5, 97.5, 50.0])
    # FPR 1%: one negative (99) may score above the threshold, so the threshold is 98: 99.5 and 98.5 pass.
    assert tpr_at_fpr(positives, negatives, 0.01) == pytest.approx(0.5)
    # To flag 3 of 4 positives (75%) the threshold is 97.5: negatives 98 and 99 are flagged.
    assert fpr_at_tpr(positives, negatives, 0.75) == pytest.approx(0.02)
    assert fpr_at_tpr(positives, negatives, 1.0) == pytest.approx(0.50)  # threshold 50: 50..99 flagged


@dataclass
class _Toy(Report):
    score: float
    flagged: bool
    values: list = field(default_factory=list)

    def figures(self, out_dir: Path) -> list[Path]:
        from encoderkit.reports import new_figure, save_figure

        figure, axis = new_figure()
        axis.plot(self.values)
        return [save_figure(figure, out_dir / "toy_curve.png")]


def test_report_writes_json_markdown_and_figures(tmp_path: Path) -> None:
    paths = _Toy(score=float("nan"), flagged=np.bool_(True), values=[np.float32(1.5), 2]).write(tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data == {"score": None, "flagged": True, "values": [1.5, 2]}  # NaN -> null, numpy -> plain
    text = paths["markdown"].read_text()
    assert text.startswith("# toy") and "![toy_curve](toy_curve.png)" in text
    assert paths["toy_curve"].stat().st_size > 1000 and paths["toy_curve"].read_bytes()[:4] == b"\x89PNG"


def test_markdown_table_escapes_pipes() -> None:
    assert markdown_table(["a", "b"], [["x|y", 0.123456]]) == "| a | b |\n|---|---|\n| x\\|y | 0.1235 |"
