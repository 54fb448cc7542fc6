"""Hybrid search: two or more indexes of the same documents (dense + BM25, dense + sparse, ...), their rankings fused.

Each part returns its ``depth`` best documents for the query; a document's fused score is

- ``fusion="rrf"`` (reciprocal-rank fusion, Cormack et al. 2009): the sum over the parts that returned it of
  ``weight / (k_rrf + rank)``, rank counted from 1, ``k_rrf`` = 60 by default. Only ranks count, so parts whose
  scores live on different scales (cosine, BM25) combine without calibration;
- ``fusion="weighted"``: the sum of ``weight x`` the part's score min-max normalised over the part's returned
  list (best 1, worst 0; a list whose scores are all equal gives 1). A part that did not return the document adds 0.

Weights default to 1 for each part. Ties are broken by ascending row. The parts must index the same documents
in the same order (equal ids); each keeps its own kind, model and settings. Saved, the hybrid directory holds
``index.json`` (fusion settings and each part's kind and model) and each part under ``parts/NAME/``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import DataError, InputError
from ..tasks.search import SearchResult
from .base import (check_k, index_model, load_index, padded_result, read_meta, register_kind, search_any, top_k,
                   write_meta)

FUSIONS = ("rrf", "weighted")
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@register_kind
@dataclass
class HybridIndex:
    """Parts (name -> index of any non-hybrid kind) whose rankings are fused (see the module's docstring)."""

    parts: dict[str, Any]
    fusion: str = "rrf"
    k_rrf: float = 60.0
    weights: dict[str, float] | None = None
    depth: int = 100  # documents fetched from each part (at least k)
    info: dict[str, Any] = field(default_factory=dict)
    check_ids: bool = True  # compare every part's ids (load skips it: they were compared when it was built)
    kind = "hybrid"

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise InputError(f"unknown fusion {self.fusion!r}; choose one of {', '.join(FUSIONS)}")
        if not isinstance(self.parts, Mapping) or len(self.parts) < 2:
            raise InputError("a hybrid index needs at least two parts (name -> index)")
        for name, part in self.parts.items():
            if not _NAME.match(name):
                raise InputError(f"part name {name!r}: use letters, digits, '-' and '_'")
            if getattr(part, "kind", None) == "hybrid":
                raise InputError(f"part {name!r} is itself hybrid; give its parts instead")
            if not hasattr(part, "search") or not hasattr(part, "ids"):
                raise InputError(f"part {name!r} is a {type(part).__name__}, not an index")
        if not self.k_rrf >= 0:
            raise InputError(f"k_rrf must be 0 or more, found {self.k_rrf}")
        if self.depth < 1:
            raise InputError(f"depth must be at least 1, found {self.depth}")
        weights = {name: 1.0 for name in self.parts} if self.weights is None else dict(self.weights)
        unknown = sorted(set(weights) - set(self.parts))
        if unknown:
            raise InputError(f"weights name unknown parts {unknown}; the parts are {', '.join(self.parts)}")
        for name in self.parts:
            weights.setdefault(name, 1.0)
            if not np.isfinite(weights[name]) or weights[name] < 0:
                raise InputError(f"the weight of part {name!r} must be a finite number >= 0, found {weights[name]}")
        self.weights = weights
        self._check_same_documents()

    def _check_same_documents(self) -> None:
        names = list(self.parts)
        first = self.parts[names[0]].ids
        if len(first) == 0:
            raise InputError(f"part {names[0]!r} is empty: the corpus is empty")
        for name in names[1:]:
            ids = self.parts[name].ids
            if len(ids) != len(first):
                raise InputError(f"the parts index different corpora: {names[0]!r} holds {len(first):,} documents, "
                                 f"{name!r} {len(ids):,}; build every part from the same documents")
            for row in range(len(first) if self.check_ids else 0):
                if ids[row] != first[row]:
                    raise InputError(f"the parts index different corpora: row {row} is {first[row]!r} in "
                                     f"{names[0]!r} but {ids[row]!r} in {name!r}; build every part from the same "
                                     "documents in the same order")

    @property
    def ids(self):
        return next(iter(self.parts.values())).ids

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def settings(self) -> dict[str, Any]:
        return {"fusion": self.fusion, "k_rrf": self.k_rrf, "weights": self.weights, "depth": self.depth,
                "parts": {name: {"kind": part.kind, "model": index_model(part)} for name, part in self.parts.items()}}

    def search(self, queries: Mapping[str, Any], k: int = 10, *, model: str | None = None,
               models: Mapping[str, str | None] | None = None) -> SearchResult:
        """Fused top k. ``queries``: each part's queries by part name (texts for bm25, dense vectors, SparseVectors,
        token-vector lists), the same queries in the same order for every part; ``models``: the model that encoded
        each part's queries, checked against the part's."""
        if model is not None:
            raise InputError("a hybrid index's parts each have their own model: pass models={part: model}")
        if not isinstance(queries, Mapping):
            raise InputError(f"this is a hybrid index: it takes a dict of each part's queries by part name "
                             f"({', '.join(self.parts)}), but was given {type(queries).__name__}")
        missing, unknown = sorted(set(self.parts) - set(queries)), sorted(set(queries) - set(self.parts))
        if missing or unknown:
            raise InputError(f"a hybrid index needs queries for each of its parts ({', '.join(self.parts)}); "
                             + (f"missing: {', '.join(missing)}" if missing else f"unknown: {', '.join(unknown)}"))
        check_k(k)
        models = dict(models or {})
        depth = min(max(self.depth, k), len(self))
        results = {name: search_any(part, queries[name], depth, model=models.get(name), where=f"part {name!r}")
                   for name, part in self.parts.items()}
        counts = {name: len(result.indices) for name, result in results.items()}
        if len(set(counts.values())) != 1:
            raise InputError(f"the parts were given different numbers of queries: {counts}")
        fused = [self._fuse([(self.weights[name], r.scores[q], r.indices[q]) for name, r in results.items()],
                            min(k, len(self)))
                 for q in range(next(iter(counts.values())))]
        return padded_result(fused, min(k, len(self)), self.ids)

    def _fuse(self, lists: list[tuple[float, np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
        rows_all, contributions = [], []
        for weight, scores, rows in lists:
            valid = rows >= 0
            scores, rows = scores[valid].astype(np.float64), rows[valid]
            if not len(rows):
                continue
            if self.fusion == "rrf":
                value = weight / (self.k_rrf + np.arange(1, len(rows) + 1))
            else:
                low, high = scores.min(), scores.max()
                value = weight * ((scores - low) / (high - low) if high > low else np.ones(len(scores)))
            rows_all.append(rows)
            contributions.append(value)
        if not rows_all:
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        unique, inverse = np.unique(np.concatenate(rows_all), return_inverse=True)
        fused = np.bincount(inverse, weights=np.concatenate(contributions), minlength=len(unique))
        scores, rows = top_k(fused, unique, k)
        return scores.astype(np.float32), rows

    # ----- persistence ------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        (directory / "parts").mkdir(parents=True, exist_ok=True)
        for name, part in self.parts.items():
            part.save(directory / "parts" / name)
        settings = self.settings
        for name in self.parts:  # each part's own settings, as saved
            settings["parts"][name]["params"] = json.loads(
                (directory / "parts" / name / "index.json").read_text(encoding="utf-8")).get("params", {})
        write_meta(directory, self.kind, len(self), settings, self.info)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "HybridIndex":
        directory = Path(directory)
        meta = read_meta(directory, "hybrid")
        params = meta["params"]
        parts = {}
        for name, facts in params.get("parts", {}).items():
            part_dir = directory / "parts" / name
            if not part_dir.is_dir():
                raise DataError(f"{directory}: the part {name!r} (parts/{name}) is missing")
            parts[name] = load_index(part_dir)
            if parts[name].kind != facts.get("kind"):
                raise DataError(f"{part_dir} is a {parts[name].kind} index; index.json says {facts.get('kind')}")
        return cls(parts, fusion=params["fusion"], k_rrf=params["k_rrf"], weights=params["weights"],
                   depth=params["depth"], info=meta.get("info", {}), check_ids=False)
