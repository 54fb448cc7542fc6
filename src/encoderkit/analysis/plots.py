"""The attention figures: one head's map with tokens on both axes, small multiples of many heads, and
layer x head maps of a per-head number. PNG through matplotlib's non-interactive backend."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from ..reports import save_figure

# Beyond this many tokens an axis shows every k-th label: 8-point labels start to overlap there.
DEFAULT_MAX_LABELS = 60


def subplots(rows: int, cols: int, width: float, height: float, **kwargs):
    """``plt.subplots`` on the Agg backend (``reports.new_figure`` makes one axis; grids need many)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(width, height), dpi=110, squeeze=False, **kwargs)


def thinned_labels(tokens: Sequence[str], max_labels: int = DEFAULT_MAX_LABELS) -> tuple[list[int], list[str]]:
    """Tick positions and labels: every token when there are at most ``max_labels``, else every k-th token
    (the first always shown), so long inputs stay readable. Labels are cut at 14 characters."""
    step = max(1, math.ceil(len(tokens) / max(1, max_labels)))
    positions = list(range(0, len(tokens), step))
    return positions, [_short(tokens[p]) for p in positions]


def _short(token: str, width: int = 14) -> str:
    return token if len(token) <= width else token[: width - 1] + "…"


def draw_attention(axis, matrix: np.ndarray, tokens: Sequence[str] | None, title: str,
                   max_labels: int = DEFAULT_MAX_LABELS, vmax: float | None = None):
    """One (queries, keys) map on ``axis``: queries down the side, keys along the top."""
    top = vmax if vmax is not None else max(float(matrix.max()), 1e-9)
    image = axis.imshow(matrix, cmap="Blues", vmin=0.0, vmax=top, interpolation="nearest", aspect="equal")
    axis.set_title(title, fontsize=9)
    if tokens is None:
        axis.set_xticks([])
        axis.set_yticks([])
        return image
    positions, labels = thinned_labels(tokens, max_labels)
    font = 8 if len(positions) <= 30 else 6
    axis.set_xticks(positions, labels, rotation=90, fontsize=font)
    axis.set_yticks(positions, labels, fontsize=font)
    axis.xaxis.tick_top()
    axis.set_xlabel("key (attended to)", fontsize=8)
    axis.set_ylabel("query (attending)", fontsize=8)
    return image


def plot_head(matrix: np.ndarray, tokens: Sequence[str], title: str, path: Path,
              max_labels: int = DEFAULT_MAX_LABELS, label: str = "attention probability",
              diverging: bool = False) -> Path:
    """A heatmap of one head, with the tokens on both axes and a colour bar (``diverging``: signed scores,
    centred on 0)."""
    shown = min(len(tokens), max_labels)
    side = min(14.0, max(4.5, 2.5 + 0.18 * shown))
    figure, axes = subplots(1, 1, side + 1.2, side)
    image = draw_attention(axes[0, 0], matrix, tokens, title, max_labels)
    if diverging:
        bound = float(np.abs(matrix).max()) or 1.0
        image.set_cmap("RdBu_r")
        image.set_clim(-bound, bound)
    figure.colorbar(image, ax=axes[0, 0], fraction=0.046, pad=0.04, label=label)
    return save_figure(figure, path)


def plot_head_grid(matrices: np.ndarray, titles: Sequence[Sequence[str]], path: Path, suptitle: str,
                   highlight: tuple[int, int] | None = None, tokens: Sequence[str] | None = None) -> Path:
    """Small multiples of (rows, cols, length, length) maps, each scaled to its own maximum.

    ``highlight`` (row, col) frames one panel in red. Token labels go on the left column and the bottom
    row only when they fit (at most 16 tokens); otherwise the panels are bare.
    """
    rows, cols = matrices.shape[:2]
    panel = 1.7 if cols > 6 else 2.3
    figure, axes = subplots(rows, cols, panel * cols + 0.6, panel * rows + 0.8)
    labelled = tokens is not None and len(tokens) <= 16
    for r in range(rows):
        for c in range(cols):
            axis = axes[r, c]
            draw_attention(axis, matrices[r, c], None, titles[r][c])
            if labelled:
                ticks = list(range(len(tokens)))
                if c == 0:
                    axis.set_yticks(ticks, [_short(t, 8) for t in tokens], fontsize=5)
                if r == rows - 1:
                    axis.set_xticks(ticks, [_short(t, 8) for t in tokens], fontsize=5, rotation=90)
            if highlight == (r, c):
                for spine in axis.spines.values():
                    spine.set_edgecolor("red")
                    spine.set_linewidth(2.5)
    figure.suptitle(suptitle, fontsize=11)
    return save_figure(figure, path)


def plot_layer_head_maps(values: dict[str, np.ndarray], path: Path, suptitle: str,
                         mark: dict[str, tuple[int, int]] | None = None, shared_scale: bool = False) -> Path:
    """One layer x head heatmap per named (layers, heads) array, side by side, each with its colour bar.

    ``mark`` puts a red box on a (layer, head) cell of a panel; ``shared_scale`` gives every panel the
    0..max range of all of them (shares that are comparable), else each panel its own range.
    """
    names = list(values)
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    layers, heads = next(iter(values.values())).shape
    width = max(2.6, 0.28 * heads + 1.4)
    height = max(2.2, 0.3 * layers + 1.0)
    figure, axes = subplots(rows, cols, width * cols, height * rows + 0.5)
    top = max(float(np.nanmax(v)) for v in values.values()) if shared_scale else None
    for index, axis in enumerate(axes.flat):
        if index >= len(names):
            axis.axis("off")
            continue
        name = names[index]
        data = values[name]
        image = axis.imshow(data, cmap="viridis", aspect="auto", interpolation="nearest",
                            vmin=0.0 if shared_scale else None, vmax=top)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("head", fontsize=8)
        axis.set_ylabel("layer", fontsize=8)
        axis.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=6)
        axis.set_yticks(range(layers), [str(layer) for layer in range(layers)], fontsize=6)
        figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
        if mark and name in mark:
            layer, head = mark[name]
            import matplotlib.patches as patches

            axis.add_patch(patches.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    figure.suptitle(suptitle, fontsize=11)
    return save_figure(figure, path)
