"""Sparse vectors over a vocabulary (SPLADE's, BM25's), rows in CSR layout: what ``SparseEmbedder.encode`` returns
and what the sparse indexes take.

CSR rather than torch's COO (sentence-transformers' ``SparseEncoder.encode`` returns COO): a row is a contiguous
slice, so an index is built and a row read without sorting, and the three arrays save to and memory-map from .npy
files. ``to_torch`` gives the COO tensor for code that expects sentence-transformers' type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from ..errors import InputError


def _row_of_entries(indptr: np.ndarray) -> np.ndarray:
    """The row of each entry of a CSR layout with these row pointers."""
    return np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))


@dataclass
class SparseVectors:
    """``len(indptr) - 1`` rows of ``dimension`` columns: row r holds ``values[indptr[r]:indptr[r+1]]`` at columns
    ``indices[indptr[r]:indptr[r+1]]`` (ascending, no repeats, no zero values)."""

    indptr: np.ndarray  # int64, (rows + 1,)
    indices: np.ndarray  # int32 column (term) ids
    values: np.ndarray  # float32 weights
    dimension: int

    def __post_init__(self) -> None:
        self.indptr = np.asarray(self.indptr, dtype=np.int64)
        self.indices = np.asarray(self.indices, dtype=np.int32)
        self.values = np.asarray(self.values, dtype=np.float32)
        if self.indptr.ndim != 1 or len(self.indptr) < 1 or self.indptr[0] != 0 \
                or self.indptr[-1] != len(self.indices) or len(self.indices) != len(self.values) \
                or (np.diff(self.indptr) < 0).any():
            raise InputError("sparse vectors: indptr must rise from 0 to the number of entries, and indices and "
                             "values must be as long")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= self.dimension):
            raise InputError(f"sparse vectors: a column id is outside 0..{self.dimension - 1}")

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        """The number of stored (non-zero) entries."""
        return len(self.indices)

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(column ids, weights) of row ``r``."""
        if not -len(self) <= r < len(self):
            raise IndexError(f"row {r} of {len(self)}")
        r %= len(self)
        begin, end = self.indptr[r], self.indptr[r + 1]
        return self.indices[begin:end], self.values[begin:end]

    def __getitem__(self, rows: int | slice | Sequence[int]) -> "SparseVectors":
        """The rows picked, as SparseVectors (one int: a single row), gathered in whole arrays: rows are already
        sorted and checked, so a million picked rows cost no Python loop."""
        n = len(self)
        if isinstance(rows, slice):
            picked = np.arange(n)[rows]
        else:
            picked = np.asarray([rows] if np.isscalar(rows) else rows)
            if picked.size and not np.issubdtype(picked.dtype, np.integer):
                raise IndexError(f"sparse vectors: rows are picked by integers, found {picked.dtype}")
            picked = picked.astype(np.int64).reshape(-1)
            outside = picked[(picked < -n) | (picked >= n)]
            if outside.size:
                raise IndexError(f"row {int(outside[0])} of {n}")
            picked %= max(n, 1)
        begins = self.indptr[picked]
        lengths = self.indptr[picked + 1] - begins
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        positions = np.repeat(begins - indptr[:-1], lengths) + np.arange(indptr[-1])
        return SparseVectors(indptr, self.indices[positions], self.values[positions], self.dimension)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[np.ndarray, np.ndarray]], dimension: int) -> "SparseVectors":
        """From (column ids, weights) per row; the ids of a row are sorted here, and zero weights dropped."""
        indptr, indices, values = [0], [], []
        for ids, weights in rows:
            ids, weights = np.asarray(ids, dtype=np.int64), np.asarray(weights, dtype=np.float32)
            keep = weights != 0
            ids, weights = ids[keep], weights[keep]
            order = np.argsort(ids, kind="stable")
            ids, weights = ids[order], weights[order]
            if len(ids) > 1 and (np.diff(ids) == 0).any():
                raise InputError("sparse vectors: a row names one column twice")
            indices.append(ids)
            values.append(weights)
            indptr.append(indptr[-1] + len(ids))
        return cls(np.asarray(indptr), np.concatenate(indices) if indices else np.zeros(0),
                   np.concatenate(values) if values else np.zeros(0), dimension)

    @classmethod
    def from_dense(cls, dense: torch.Tensor | np.ndarray, max_active_dims: int | None = None) -> "SparseVectors":
        """From a (rows, dimension) array: its non-zero entries; ``max_active_dims`` keeps the largest k per row
        (sentence-transformers' ``max_active_dims``: the top-k by value, the rest set to zero)."""
        dense = torch.as_tensor(dense).float()
        if dense.ndim != 2:
            raise InputError(f"dense vectors must be (rows, dimension), found shape {tuple(dense.shape)}")
        if max_active_dims is not None:
            check_max_active_dims(max_active_dims)
            if max_active_dims < dense.shape[1]:
                top = dense.topk(max_active_dims, dim=1)
                dense = torch.zeros_like(dense).scatter_(1, top.indices, top.values)
        nonzero = dense != 0
        counts = nonzero.sum(dim=1)
        rows, columns = nonzero.nonzero(as_tuple=True)  # row-major: each row's columns ascending
        indptr = np.concatenate([[0], np.cumsum(counts.numpy())])
        return cls(indptr, columns.numpy(), dense[rows, columns].numpy(), dense.shape[1])

    @classmethod
    def concatenate(cls, parts: Sequence["SparseVectors"]) -> "SparseVectors":
        if not parts:
            raise InputError("nothing to concatenate")
        dimension = parts[0].dimension
        if any(p.dimension != dimension for p in parts):
            raise InputError("sparse vectors of different dimensions cannot be concatenated")
        offsets = np.cumsum([0] + [p.nnz for p in parts[:-1]])
        indptr = np.concatenate([[0]] + [p.indptr[1:] + offset for p, offset in zip(parts, offsets)])
        return cls(indptr, np.concatenate([p.indices for p in parts]), np.concatenate([p.values for p in parts]),
                   dimension)

    def to_dense(self) -> np.ndarray:
        out = np.zeros((len(self), self.dimension), dtype=np.float32)
        rows = _row_of_entries(self.indptr)
        out[rows, self.indices] = self.values
        return out

    def to_torch(self) -> torch.Tensor:
        """A (rows, dimension) torch sparse COO tensor, the type sentence-transformers' ``SparseEncoder.encode``
        returns."""
        rows = _row_of_entries(self.indptr)
        index = torch.from_numpy(np.stack([rows, self.indices.astype(np.int64)]))
        return torch.sparse_coo_tensor(index, torch.from_numpy(self.values.copy()), check_invariants=False,
                                       size=(len(self), self.dimension)).coalesce()

    def dot(self, other: "SparseVectors", chunk_entries: int = 1 << 22) -> np.ndarray:
        """(len(self), len(other)) dot products, summed in float64. ``other`` is read column by column (its entries
        sorted by term once), so the work is the pairs of entries that share a term, as an inverted index does:
        rows of ``self`` go in chunks of about ``chunk_entries`` such pairs (and at most four times as many outputs),
        each chunk one ``bincount``."""
        if other.dimension != self.dimension:
            raise InputError(f"sparse vectors of dimension {self.dimension} and {other.dimension} do not compare")
        out = np.zeros((len(self), len(other)), dtype=np.float64)
        if not self.nnz or not other.nnz:
            return out
        by_term = np.argsort(other.indices, kind="stable")
        term_start = np.searchsorted(other.indices[by_term], np.arange(self.dimension + 1))
        other_rows = _row_of_entries(other.indptr)[by_term]
        other_values = other.values[by_term].astype(np.float64)
        postings = term_start[self.indices + 1] - term_start[self.indices]  # pairs each entry of self makes
        pairs_before_row = np.concatenate([[0], np.cumsum(postings)])[self.indptr]
        row = 0
        while row < len(self):
            end = max(row + 1, int(np.searchsorted(pairs_before_row, pairs_before_row[row] + chunk_entries,
                                                   side="right")) - 1)
            # the chunk's bincount spans its rows times len(other): no more than a few chunks of pairs either
            end = min(end, len(self), row + max(1, 4 * chunk_entries // len(other)))
            entries = slice(self.indptr[row], self.indptr[end])
            counts = postings[entries]
            total = int(counts.sum())
            if total:
                # the positions in other's by-term order of every pair: each entry's run of its term's postings
                runs = np.repeat(term_start[self.indices[entries]] - np.cumsum(counts) + counts, counts)
                position = runs + np.arange(total)
                local_row = np.repeat(_row_of_entries(self.indptr[row:end + 1]), counts)
                weight = np.repeat(self.values[entries].astype(np.float64), counts) * other_values[position]
                flat = local_row * len(other) + other_rows[position]
                out[row:end] = np.bincount(flat, weights=weight, minlength=(end - row) * len(other)).reshape(
                    end - row, len(other))
            row = end
        return out

    def terms(self, r: int, vocabulary: Sequence[str] | None = None, top: int | None = None
              ) -> list[tuple[str | int, float]]:
        """Row ``r``'s (term, weight) pairs, heaviest first: what a sparse vector says about its text.
        ``vocabulary``: the token of each column id (else the ids)."""
        columns, weights = self.row(r)
        order = np.argsort(-weights, kind="stable")[:top]
        return [(vocabulary[c] if vocabulary is not None else int(c), float(w))
                for c, w in zip(columns[order].tolist(), weights[order].tolist())]


def check_max_active_dims(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise InputError(f"max_active_dims must be a positive integer, found {value!r}")
    return int(value)
