"""Attention maps: `encoderkit attention MODEL "text" --layer L --head H --out map.png` (encoderkit.analysis)."""
from __future__ import annotations

import click

from .options import out_option


@click.command()
@click.argument("model")
@click.argument("text")
@click.option("--pair", default=None, help="a second text: the input is the pair (TEXT, PAIR)")
@click.option("--layer", type=int, required=True, help="layer to draw, numbered from 0")
@click.option("--head", type=int, default=None, help="head to draw, numbered from 0 (needed unless --grid)")
@out_option("the PNG to write", dest="out_path")
@click.option("--grid", is_flag=True,
              help="draw every head of --layer as small multiples (--head, if given, is framed)")
@click.option("--mask", type=click.Choice(["bidirectional", "causal", "compare"]), default="bidirectional",
              show_default=True, help="the model's own mask, a causal (left-to-right) one, or both side by side")
@click.option("--stats", "stats_path", default=None,
              help="also write per-head statistics of this input as JSON (attention shares to [CLS], [SEP], itself, "
                   "its neighbours; entropy)")
@click.option("--part", type=click.Choice(["c2c", "c2p", "p2c"]), default=None,
              help="DeBERTa: draw one term of the scores (content-to-content, content-to-position, "
                   "position-to-content) before the softmax, instead of the probabilities")
@click.option("--max-labels", type=int, default=60, show_default=True,
              help="longer inputs label every k-th token so the axes stay readable")
def attention(model: str, text: str, pair: str | None, layer: int, head: int | None, out_path: str, grid: bool,
              mask: str, stats_path: str | None, part: str | None, max_labels: int) -> None:
    """Draw the attention probabilities of one head (or all heads of a layer) for TEXT as a PNG."""
    from pathlib import Path

    from ..analysis import AttentionAnalyzer
    from ..errors import InputError

    out = Path(out_path)
    if out.suffix.lower() != ".png":
        raise InputError(f"--out must name a .png file, found {out_path!r}")
    if head is None and not grid:
        raise InputError("give --head H (numbered from 0), or --grid to draw every head of the layer")
    if grid and mask == "compare":
        raise InputError("--mask compare draws one head under both masks; give --head instead of --grid")
    if part is not None and (grid or mask != "bidirectional"):
        raise InputError("--part draws one head under the model's own mask; drop --grid and --mask")
    if max_labels <= 0:
        raise InputError(f"--max-labels must be positive, found {max_labels}")
    analyzer = AttentionAnalyzer.from_pretrained(model)
    analyzer.check_layer_head(layer, head)  # before running the model: a bad index fails fast
    out.parent.mkdir(parents=True, exist_ok=True)
    maps = None
    if mask == "compare":
        comparison = analyzer.compare_masks(text, pair, layer=layer, head=head)
        comparison.plot(out, max_labels=max_labels)
        summary = (f"{len(comparison.tokens)} tokens; final-layer cosine bidirectional vs causal: first token "
                   f"{comparison.first_token_cosine:.4f}, mean-pooled {comparison.mean_pooled_cosine:.4f}")
    else:
        maps = analyzer.attend(text, pair, mask=mask)
        if grid:
            maps.grid(out, layer, highlight_head=head)
        else:
            maps.heatmap(layer, head, out, max_labels=max_labels, part=part)
        summary = f"{maps.length} tokens, {mask} mask" + (f", {part} scores" if part else "")
    what = f"layer {layer}, all {analyzer.num_heads} heads" if grid else f"layer {layer}, head {head}"
    click.echo(f"wrote {out} ({what}; {summary})")
    if stats_path:
        maps = maps if maps is not None else analyzer.attend(text, pair)
        stats_file = Path(stats_path)
        stats_file.parent.mkdir(parents=True, exist_ok=True)
        stats_file.write_text(maps.statistics().to_json() + "\n", encoding="utf-8")
        click.echo(f"wrote head statistics to {stats_file}")
