"""The config against the weights, without loading them: the shapes a config.json implies for the tensors of its
family (embeddings, query/key/value widths, the feed-forward sizes, the layer count, every other tensor), compared
with the shapes a safetensors header holds. Part of ``scan provenance`` (``security.provenance``)."""
from __future__ import annotations

from typing import Any


def joined_shape(shapes: dict[str, tuple[int, ...]], hf_name: str) -> tuple[int, ...] | None:
    """The shape of the tensor ``hf_name`` names: one checkpoint tensor's, or, for parts joined by ``+`` (NomicBERT's
    fc11 + fc12), their concatenation along the first axis; None where a part is absent or the widths differ."""
    from ..io.checkpoints import JOIN

    parts = [shapes.get(part) for part in hf_name.split(JOIN)]
    if any(shape is None for shape in parts) or len({tuple(shape[1:]) for shape in parts}) > 1:
        return None
    return (sum(shape[0] for shape in parts), *parts[0][1:])


def config_weight_checks(config: Any, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
    """Compare tensor shapes (transformers' names, with or without the family prefix) with the shapes the
    config implies. Returns {"check", "expected", "found", "ok"} rows."""
    import torch

    from ..io.checkpoints import JOIN, transformers_name
    from ..modeling.models import build_model, task_from_architectures

    family = config.family
    prefix = family.hf_prefix + "."
    base = {name.removeprefix(prefix): shape for name, shape in shapes.items()}
    width, hidden = config.embedding_dim, config.hidden_size
    rows: list[dict[str, Any]] = []

    def compare(check: str, ours: str, expected: tuple[int, ...]) -> None:
        hf_name = transformers_name(config, ours)
        found = joined_shape(base, hf_name) if hf_name else None
        rows.append({"check": check, "tensor": hf_name, "expected": list(expected),
                     "found": list(found) if found is not None else "absent",
                     "ok": found is not None and tuple(found) == tuple(expected)})

    compare("word embeddings (vocab_size x embedding)", "embeddings.word.weight", (config.vocab_size, width))
    if config.absolute_positions:
        compare("position embeddings (max_position_embeddings x embedding)", "embeddings.position.weight",
                (config.max_position_embeddings, width))
    if config.type_vocab_size > 0 and any(o == "embeddings.token_type" for o, _ in family.base_rules):
        compare("segment embeddings (type_vocab_size x embedding)", "embeddings.token_type.weight",
                (config.type_vocab_size, width))
    query = "qkv" if family.fused_qkv else "query"  # ModernBERT's fused Wqkv, or BERT's query
    kv_width = config.kv_heads * config.head_dim  # grouped-query attention: fewer key/value heads
    compare(f"hidden size ({query} projection)", f"layers.0.attention.{query}.weight",
            ((hidden + 2 * kv_width if family.fused_qkv else hidden), hidden))
    gated = 2 if family.mlp == "glu" else 1  # GeGLU's input projection holds the value and the gate
    compare("intermediate size (feed-forward in)", "layers.0.ffn_in.weight", (gated * config.intermediate_size, hidden))
    compare("intermediate size (feed-forward out)", "layers.0.ffn_out.weight", (hidden, config.intermediate_size))

    # Layers: which layer indices have a query projection, against the config's count.
    query_rule = next(theirs for ours, theirs in family.base_rules if ours == f"layers.{{i}}.attention.{query}")
    import re

    regex = re.escape(query_rule + ".weight")
    for key in ("i", "g", "j"):
        regex = regex.replace(re.escape("{" + key + "}"), r"(\d+)")
    present = {name for name in base if re.fullmatch(regex, name)}
    expected_layers = {transformers_name(config, f"layers.{i}.attention.{query}.weight")
                       for i in range(config.num_unique_layers)}
    rows.append({"check": "layers (num_hidden_layers)", "tensor": query_rule,
                 "expected": len(expected_layers), "found": len(present), "ok": present == expected_layers})

    # Every other encoder tensor, from the model the config builds (on the meta device: no memory, no init cost).
    with torch.device("meta"):
        encoder = build_model(config, "base")
    named = {r["tensor"] for r in rows}
    absent, misshaped = [], []
    for ours, tensor in encoder.state_dict().items():
        hf_name = transformers_name(config, ours)
        if hf_name is None or hf_name in named or hf_name in expected_layers:
            continue
        missing = [part for part in hf_name.split(JOIN) if part not in base]
        if missing:
            absent.extend(missing)
            continue
        joined = joined_shape(base, hf_name)
        if joined != tuple(tensor.shape):
            misshaped.append(f"{hf_name} {list(joined) if joined else 'parts of unequal widths'} "
                             f"(config implies {list(tensor.shape)})")
    rows.append({"check": "other encoder tensors present", "tensor": None, "expected": "all",
                 "found": f"{len(absent)} absent" + (f": {', '.join(absent[:5])}" if absent else ""),
                 "ok": not absent})
    rows.append({"check": "other encoder tensors shaped as the config implies", "tensor": None, "expected": "all",
                 "found": f"{len(misshaped)} differ" + (f": {'; '.join(misshaped[:5])}" if misshaped else ""),
                 "ok": not misshaped})

    # The classification head's rows against the number of labels.
    if task_from_architectures(config) == "sequence-classification":
        out_name = dict(family.head_rules["classifier"])["classifier.out"] + ".weight"
        found = shapes.get(out_name)
        rows.append({"check": "classifier outputs (num_labels)", "tensor": out_name, "expected": config.num_labels,
                     "found": found[0] if found else "absent", "ok": bool(found) and found[0] == config.num_labels})
    return rows
