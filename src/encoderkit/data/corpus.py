"""Pre-training corpora: read documents, tokenise once (cached), pack or pair them into examples.

- ``pack_sequences``: RoBERTa's FULL-SENTENCES packing. Lines follow each other across document
  boundaries (marked by an extra separator) and are cut into sequences of exactly ``max_length``
  tokens, so no compute is spent on padding.
- ``sentence_pairs``: BERT's segment pairs for NSP (50% the true next segment, 50% a segment of
  another document) or ALBERT's SOP (50% the true order, 50% swapped).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, InputError
from ..tokenizer import Tokenizer
from .readers import read_lines

log = logging.getLogger(__name__)


def read_documents(path: str | Path, mode: str = "blank-line") -> list[list[str]]:
    """Documents as lists of non-empty lines. mode "blank-line": blank lines separate documents;
    "line": every line is a document."""
    if mode not in ("blank-line", "line"):
        raise InputError(f"document mode must be 'blank-line' or 'line', found {mode!r}")
    documents: list[list[str]] = [[]]
    for line in read_lines(path):
        if line.strip():
            documents[-1].append(line.strip())
            if mode == "line":
                documents.append([])
        elif documents[-1]:
            documents.append([])
    documents = [d for d in documents if d]
    if not documents:
        raise DataError(f"{path} holds no text")
    return documents


@dataclass
class TokenizedCorpus:
    ids: np.ndarray  # all tokens, int32
    word_starts: np.ndarray  # bool: the token begins a word
    line_starts: np.ndarray  # (lines + 1,) offsets into ids
    document_starts: np.ndarray  # (documents + 1,) offsets into lines

    @property
    def num_documents(self) -> int:
        return len(self.document_starts) - 1

    def document_lines(self, document: int) -> range:
        return range(int(self.document_starts[document]), int(self.document_starts[document + 1]))

    def line(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.line_starts[index], self.line_starts[index + 1]
        return self.ids[start:end], self.word_starts[start:end]


def tokenize_corpus(path: str | Path, tokenizer: Tokenizer, *, mode: str = "blank-line",
                    cache_dir: str | Path | None = None, batch_lines: int = 20_000) -> TokenizedCorpus:
    """Tokenise every line once (the tokenizers library runs batches on all cores) and cache the result."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"corpus file not found: {path}")
    cache = None
    if cache_dir is not None:
        stat = path.stat()
        key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, mode,
                          hashlib.sha1(tokenizer.backend.to_str().encode()).hexdigest()])
        cache = Path(cache_dir) / f"corpus-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"
        if cache.is_file():
            data = np.load(cache)
            return TokenizedCorpus(data["ids"], data["word_starts"], data["line_starts"], data["document_starts"])
    documents = read_documents(path, mode)
    lines = [line for document in documents for line in document]
    ids_parts, starts_parts, lengths = [], [], []
    for start in range(0, len(lines), batch_lines):
        for enc in tokenizer.encode_raw(lines[start:start + batch_lines], truncation=False, add_special_tokens=False):
            words = enc.word_ids
            ids_parts.append(np.asarray(enc.ids, dtype=np.int32))
            starts_parts.append(np.array([i == 0 or words[i] != words[i - 1] for i in range(len(words))], dtype=bool))
            lengths.append(len(enc.ids))
    line_starts = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum(lengths, out=line_starts[1:])
    document_starts = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in documents], out=document_starts[1:])
    corpus = TokenizedCorpus(np.concatenate(ids_parts), np.concatenate(starts_parts), line_starts, document_starts)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npz")  # processes of one run may race here
        np.savez(tmp, ids=corpus.ids, word_starts=corpus.word_starts, line_starts=corpus.line_starts,
                 document_starts=corpus.document_starts)
        tmp.replace(cache)
    log.info("%s: %d documents, %d lines, %d tokens", path, len(documents), len(lines), len(corpus.ids))
    return corpus


def pack_sequences(corpus: TokenizedCorpus, max_length: int, cls_id: int, sep_id: int) -> list[dict]:
    """FULL-SENTENCES packing into [CLS] ... [SEP] sequences of max_length tokens (the last may be shorter)."""
    if max_length < 8:
        raise InputError(f"max_length {max_length} is too short for pre-training")
    content = max_length - 2
    pieces, starts = [], []
    for document in range(corpus.num_documents):
        lines = corpus.document_lines(document)
        first, last = corpus.line_starts[lines.start], corpus.line_starts[lines.stop]
        pieces.append(corpus.ids[first:last])
        starts.append(corpus.word_starts[first:last])
        pieces.append(np.array([sep_id], dtype=np.int32))  # document boundary
        starts.append(np.array([True]))
    stream, stream_starts = np.concatenate(pieces), np.concatenate(starts)
    examples = []
    for index, begin in enumerate(range(0, len(stream), content)):
        body = stream[begin:begin + content]
        examples.append({
            "index": index,
            "input_ids": np.concatenate([[cls_id], body, [sep_id]]).astype(np.int64),
            "word_starts": np.concatenate([[True], stream_starts[begin:begin + content], [True]]),
        })
    return examples


def sentence_pairs(corpus: TokenizedCorpus, max_length: int, cls_id: int, sep_id: int, *, objective: str = "nsp",
                   seed: int = 0) -> list[dict]:
    """BERT-style segment pairs with a pair label: NSP (1 = B is from another document) or SOP (1 = swapped).

    A document is cut into chunks of about ``max_length`` tokens (whole lines where they fit). Each
    chunk is split into A and B at a line boundary, or inside its line when it holds only one.
    """
    if objective not in ("nsp", "sop"):
        raise InputError(f"pair objective must be 'nsp' or 'sop', found {objective!r}")
    if corpus.num_documents < 2 and objective == "nsp":
        raise DataError("NSP needs at least two documents (random next segments come from other documents)")
    rng = np.random.default_rng(seed)
    budget = max_length - 3
    examples: list[dict] = []
    for document in range(corpus.num_documents):
        lines = list(corpus.document_lines(document))
        chunk: list[int] = []
        size = 0
        for position, line in enumerate(lines):
            chunk.append(line)
            size += int(corpus.line_starts[line + 1] - corpus.line_starts[line])
            if size < budget and position < len(lines) - 1:
                continue
            if size >= 2:
                examples.append(_make_pair(corpus, chunk, document, budget, cls_id, sep_id, objective, rng,
                                           len(examples)))
            chunk, size = [], 0
    if not examples:
        raise DataError("the corpus gave no sentence pairs")
    return examples


def _tokens(corpus: TokenizedCorpus, lines: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([corpus.line(i)[0] for i in lines]), np.concatenate([corpus.line(i)[1] for i in lines]))


def _make_pair(corpus: TokenizedCorpus, chunk: list[int], document: int, budget: int, cls_id: int, sep_id: int,
               objective: str, rng: np.random.Generator, index: int) -> dict:
    ids, starts = _tokens(corpus, chunk)
    if len(chunk) >= 2:
        boundaries = np.cumsum([corpus.line(i)[0].shape[0] for i in chunk])[:-1]
        split = int(boundaries[rng.integers(0, len(boundaries))])
    else:
        split = int(rng.integers(1, len(ids)))
    (a, a_starts), (b, b_starts) = (ids[:split], starts[:split]), (ids[split:], starts[split:])
    label = int(rng.random() < 0.5)
    if label == 1 and objective == "nsp":  # B: a stretch of another document
        other = int(rng.integers(0, corpus.num_documents - 1))
        other += other >= document
        other_lines = list(corpus.document_lines(other))
        start = int(rng.integers(0, len(other_lines)))
        b, b_starts = _tokens(corpus, other_lines[start:])
        b, b_starts = b[:max(1, budget - len(a))], b_starts[:max(1, budget - len(a))]
    elif label == 1:  # SOP: the same two segments, swapped
        (a, a_starts), (b, b_starts) = (b, b_starts), (a, a_starts)
    while len(a) + len(b) > budget:  # longest-first truncation from the end
        if len(a) >= len(b):
            a, a_starts = a[:-1], a_starts[:-1]
        else:
            b, b_starts = b[:-1], b_starts[:-1]
    pair_ids = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]]).astype(np.int64)
    return {
        "index": index, "input_ids": pair_ids, "pair_label": label,
        "token_type_ids": np.concatenate([np.zeros(len(a) + 2, np.int64), np.ones(len(b) + 1, np.int64)]),
        "word_starts": np.concatenate([[True], a_starts, [True], b_starts, [True]]),
    }
