"""Retrieval beyond one dense vector per text: BM25, sparse (SPLADE) inverted indexes, multi-vector (ColBERT)
indexes and hybrid fusion of several, each saved with its kind, model and settings (``index.json``), and each
refusing queries of another kind or model. ``load_index`` opens any saved index, dense ones included.

The indexes take already-computed queries and documents (texts for BM25, ``SparseVectors``, token-vector lists,
dense arrays); ``encoderkit.retrieval.texts`` encodes texts with the models for the CLI.
"""
from __future__ import annotations

from .base import ALL_KINDS, RETRIEVAL_KINDS, load_index, search_any
from .bm25 import BM25Index
from .hybrid import FUSIONS, HybridIndex
from .multi_vector import MultiVectorIndex, MultiVectorIndexBuilder, MultiVectorSettings, build_multi_vector_index
from .sparse_index import SparseIndex, SparseIndexBuilder, build_sparse_index

__all__ = ["ALL_KINDS", "BM25Index", "FUSIONS", "HybridIndex", "MultiVectorIndex", "MultiVectorIndexBuilder",
           "MultiVectorSettings", "RETRIEVAL_KINDS", "SparseIndex", "SparseIndexBuilder", "build_multi_vector_index",
           "build_sparse_index", "load_index", "search_any"]
