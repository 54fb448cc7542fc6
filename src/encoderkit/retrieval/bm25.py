"""BM25 over raw texts, scored by ``bm25s`` (the ``bm25`` extra: ``pip install 'encoderkit[bm25]'``).

Tokenisation (bm25s's own ``bm25s.tokenize``, the same for documents and queries, recorded in the index):

- lowercase (``lowercase=True``);
- split by bm25s's default regular expression ``(?u)\\b\\w\\w+\\b`` (scikit-learn's CountVectorizer pattern: runs
  of two or more word characters; single characters and punctuation are dropped);
- stopwords removed: ``stopwords="en"`` (bm25s's English list, NLTK's) by default, ``None`` for none, or another
  language code bm25s knows (de, fr, es, ...);
- no stemmer: bm25s's stemmers come from PyStemmer, which encoderkit does not install, so "running" and "run"
  are different terms.

Scoring: bm25s's ``method``, default "lucene": idf = ln(1 + (N - df + 0.5) / (df + 0.5)) and term weight
tf / (tf + k1 (1 - b + b |d| / avgdl)) (Lucene 8's form, without the constant factor k1 + 1); also "robertson",
"atire", "bm25l", "bm25+". ``k1`` = 1.5 and ``b`` = 0.75 by default. A query's score for a document is the sum
over its terms; documents that share no term with the query score 0 and are not returned. Ties are broken by
ascending row.
"""
from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import DataError, InputError
from ..tasks.search import SearchResult
from .base import (check_k, check_model, check_queries, default_ids, padded_result, read_ids, read_meta, register_kind,
                   top_k, write_ids, write_meta)

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
TOKEN_PATTERN = r"(?u)\b\w\w+\b"


def _bm25s():
    from ..extras import require

    require("bm25", "a BM25 index")
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


@register_kind
@dataclass
class BM25Index:
    """BM25 of texts (see the module's docstring for the tokenisation and the formula)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    lowercase: bool = True
    stopwords: str | None = "en"
    ids: Sequence[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    kind = "bm25"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"unknown BM25 method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not self.k1 >= 0:
            raise InputError(f"BM25 k1 must be 0 or more, found {self.k1}")
        if not 0 <= self.b <= 1:
            raise InputError(f"BM25 b must be between 0 and 1, found {self.b}")
        if self.stopwords in ("none", ""):
            self.stopwords = None
        if self.stopwords is not None:
            _bm25s()
            from bm25s.tokenization import _infer_stopwords

            try:
                _infer_stopwords(self.stopwords)
            except ValueError as exc:
                raise InputError(f"unknown stopword list {self.stopwords!r}: bm25s knows en, de, fr, es, pt, it, "
                                 "ru, sv, no, nl, zh, tr, ko, da (or none)") from exc
        self._retriever: Any = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def settings(self) -> dict[str, Any]:
        return {"k1": self.k1, "b": self.b, "method": self.method, "lowercase": self.lowercase,
                "stopwords": self.stopwords, "token_pattern": TOKEN_PATTERN, "stemmer": None}

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text's terms, as documents and queries are tokenised."""
        with contextlib.redirect_stderr(io.StringIO()):  # bm25s's progress bars
            return _bm25s().tokenize(list(texts), lower=self.lowercase, token_pattern=TOKEN_PATTERN,
                                     stopwords=self.stopwords or [], return_ids=False, show_progress=False)

    @classmethod
    def build(cls, texts: Sequence[str], ids: Sequence[Any] | None = None, *, info: dict[str, Any] | None = None,
              **settings: Any) -> "BM25Index":
        """Index ``texts`` (in memory; ``save`` writes it)."""
        texts = list(texts)
        if not texts:
            raise InputError("the corpus is empty: a BM25 index needs at least one text")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise InputError(f"text {bad} is a {type(texts[bad]).__name__}, not a string")
        index = cls(ids=default_ids(len(texts), ids, "texts"), info=dict(info or {}), **settings)
        tokens = index.tokenize(texts)
        if not any(tokens):
            raise InputError("no text of the corpus holds a term (after lowercasing, splitting and removing "
                             "stopwords): nothing to index")
        retriever = _bm25s().BM25(k1=index.k1, b=index.b, method=index.method)
        with contextlib.redirect_stderr(io.StringIO()):
            retriever.index(tokens, show_progress=False)
        index._retriever = retriever
        return index

    def search(self, queries: str | Sequence[str], k: int = 10, *, model: str | None = None) -> SearchResult:
        """The k best documents of each query text. ``model``: BM25 has none, so any model is refused."""
        check_queries(self.kind, queries)
        if model is not None:
            check_model("no model (BM25 scores the texts themselves)", model)
        check_k(k)
        if self._retriever is None:
            raise InputError("the index is empty; build it first")
        texts = [queries] if isinstance(queries, str) else list(queries)
        k = min(k, len(self.ids))
        vocabulary = self._retriever.vocab_dict
        results = []
        for terms in self.tokenize(texts):
            known = [vocabulary[t] for t in terms if t in vocabulary]
            if not known:
                results.append((np.zeros(0, np.float32), np.zeros(0, np.int64)))
                continue
            scores = self._retriever.get_scores_from_ids(known)
            rows = np.flatnonzero(scores > 0)
            results.append(top_k(scores[rows].astype(np.float32), rows, k))
        return padded_result(results, k, self.ids)

    # ----- persistence ----------------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        if self._retriever is None:
            raise InputError("the index is empty; build it before saving it")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with contextlib.redirect_stderr(io.StringIO()):
            self._retriever.save(str(directory / "bm25s"), show_progress=False)
        write_ids(directory, self.ids)
        write_meta(directory, self.kind, len(self.ids), self.settings, self.info)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "BM25Index":
        directory = Path(directory)
        meta = read_meta(directory, "bm25")
        params = {key: meta["params"][key] for key in ("k1", "b", "method", "lowercase", "stopwords")}
        if meta["params"].get("token_pattern", TOKEN_PATTERN) != TOKEN_PATTERN:
            raise DataError(f"{directory}: built with the token pattern {meta['params']['token_pattern']!r}, which "
                            "this version does not apply to queries; rebuild the index")
        index = cls(info=meta.get("info", {}), **params)
        if not (directory / "bm25s").is_dir():
            raise DataError(f"{directory}: the BM25 data (bm25s/) is missing")
        with contextlib.redirect_stderr(io.StringIO()):
            index._retriever = _bm25s().BM25.load(str(directory / "bm25s"), mmap=True, show_progress=False)
        index.ids = read_ids(directory, meta["count"])
        return index
