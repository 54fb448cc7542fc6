"""The loss curve of a training run, as PNG (matplotlib, imported only when a plot is drawn)."""
from __future__ import annotations

import json
from pathlib import Path


def plot_losses(metrics_path: Path, out_path: Path) -> Path | None:
    """The training (and evaluation) loss curve as PNG."""
    records = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line]
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evaluation = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    axis.plot(*zip(*train), label="training loss", linewidth=1)
    if evaluation:
        axis.plot(*zip(*evaluation), "o-", label="evaluation loss")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(out_path)
    plt.close(figure)
    return out_path
