"""Search indexes: build time, query time and recall@10 against exact search.

Two data sets: 100k random 384-dim unit vectors (no neighbourhood structure: the hardest case for
graph indexes) and MiniLM embeddings of SST-2 sentences (real structure).

    python bench/search.py [--real 20000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from common import SHARED, require, smoke_size, write_result


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


def measure(name: str, vectors: np.ndarray, queries: np.ndarray, rows: list[dict]) -> None:
    from encoderkit.tasks.search import build_index

    exact = None
    for kind in ("exact", "sq8", "hnsw"):
        start = time.perf_counter()
        index = build_index(vectors, kind=kind)
        build = time.perf_counter() - start
        start = time.perf_counter()
        found = index.search(queries, 10).indices
        query_ms = (time.perf_counter() - start) / len(queries) * 1000
        if kind == "exact":
            exact = found
        size = {"exact": 4 * vectors.shape[1], "sq8": vectors.shape[1], "hnsw": 4 * vectors.shape[1] + 2 * 4 * 32}
        rows.append({"data": name, "index": kind, "build_seconds": build, "query_ms": query_ms,
                     "recall_at_10": recall(found, exact), "bytes_per_vector": size[kind]})
        print(rows[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=int, default=smoke_size(20000, 40),
                        help="SST-2 sentences to embed for the real-data case")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    count, held_out = smoke_size(100_000, 1000), smoke_size(1000, 10)  # vectors; queries of each data set
    vectors = rng.standard_normal((count, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((held_out, 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    measure(f"{count // 1000}k random unit vectors, 384-d", vectors, queries, rows)

    from encoderkit import Embedder

    lines = require(SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = list(dict.fromkeys(line.split("\t")[0].strip() for line in lines))[: args.real + held_out]
    embedder = Embedder.from_pretrained(dtype="bf16")
    embedded = embedder.encode(texts)
    measure(f"{args.real:,} SST-2 sentences, MiniLM", embedded[: args.real], embedded[args.real:], rows)
    write_result("search", {
        "description": "1,000 queries per data set (for SST-2: 1,000 held-out sentences); recall@10 against the "
                       "exact index. hnsw: FAISS HNSW, 32 links, efConstruction 200, efSearch 128. sq8: FAISS "
                       "8-bit scalar quantisation, full scan.",
        "rows": rows,
    })


if __name__ == "__main__":
    main()
