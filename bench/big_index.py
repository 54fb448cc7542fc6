"""Indexes larger than memory: IVF-PQ, int8 and binary built from Parquet shards, against exact search.

Generates N synthetic 384-d vectors (a normalized Gaussian mixture: neighbourhoods with structure, so
recall means something) as Parquet shards, computing the exact top 10 of held-out queries on the way.
Each index is built by `encoderkit index SHARDS --kind K` in a child process whose peak resident
memory comes from os.wait4 (ru_maxrss). Searches read the saved index memory-mapped; latency is one
query at a time.

    python bench/big_index.py [--n 1000000] [--queries 1000] [--latency-queries 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import ROOT, write_result

NPROBES = (8, 16, 32, 64, 128)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


def mixture(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    x = centres[rng.integers(0, len(centres), n)] + rng.standard_normal((n, centres.shape[1])) / np.sqrt(
        centres.shape[1])
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_data(directory: Path, n: int, dim: int, queries: int, clusters: int, chunk: int = 100_000):
    """Shards of n vectors, the queries, and the queries' exact top 10 (scanned chunk by chunk)."""
    from encoderkit.embeddings.shards import ShardWriter

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    query_vectors = mixture(rng, centres, queries)
    q = torch.from_numpy(query_vectors)
    best_scores, best_rows = torch.full((queries, 10), -torch.inf), torch.full((queries, 10), -1, dtype=torch.long)
    writer = ShardWriter(directory, {"source": "synthetic Gaussian mixture"})
    for start in range(0, n, chunk):
        block = mixture(rng, centres, min(chunk, n - start))
        writer.write(block, [f"doc-{i}" for i in range(start, start + len(block))])
        scores = q @ torch.from_numpy(block).T
        top = scores.topk(10, dim=1)
        merged_scores = torch.cat([best_scores, top.values], 1)
        merged_rows = torch.cat([best_rows, top.indices + start], 1)
        keep = merged_scores.topk(10, dim=1)
        best_scores, best_rows = keep.values, merged_rows.gather(1, keep.indices)
    writer.close()
    return query_vectors, best_rows.numpy()


# Builds are started by this small process, not by the benchmark: a child's ru_maxrss includes the resident
# memory of the process it was forked from (and exec keeps it), which for the benchmark is gigabytes.
LAUNCHER = """
import json, os, subprocess, sys
for line in sys.stdin:
    child = subprocess.Popen(json.loads(line), stdout=sys.stderr)
    _, status, usage = os.wait4(child.pid, 0)
    print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]), flush=True)
"""


def build(launcher: subprocess.Popen, shards: Path, out: Path, kind: str, extra: list[str]) -> dict:
    """`encoderkit index` in a child process: wall seconds and peak RSS (ru_maxrss, KiB on Linux)."""
    command = [sys.executable, "-m", "encoderkit.cli", "index", str(shards), "--out", str(out), "--kind", kind, *extra]
    start = time.perf_counter()
    launcher.stdin.write(json.dumps(command) + "\n")
    launcher.stdin.flush()
    code, peak_kib = json.loads(launcher.stdout.readline())
    seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"build failed: {' '.join(command)}")
    return {"build_seconds": seconds, "build_peak_rss_mib": peak_kib / 1024}


def latency(index, queries: np.ndarray) -> dict:
    times = []
    for query in queries:
        start = time.perf_counter()
        index.search(query, 10)
        times.append((time.perf_counter() - start) * 1000)
    return {"latency_ms_p50": float(np.percentile(times, 50)), "latency_ms_p99": float(np.percentile(times, 99))}


def sizes(directory: Path, count: int) -> dict:
    index_bytes = (directory / "index.faiss").stat().st_size
    ids = sum((directory / name).stat().st_size for name in ("ids.npy", "ids.offsets.npy", "ids.bytes")
              if (directory / name).is_file())
    floats = (directory / "vectors.npy").stat().st_size if (directory / "vectors.npy").is_file() else 0
    return {"index_bytes_per_vector": index_bytes / count, "ids_bytes_per_vector": ids / count,
            "float_vectors_bytes_per_vector": floats / count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=1000, help="queries for recall@10")
    parser.add_argument("--latency-queries", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--workdir", default=None, help="where the shards and indexes go (default: a temp dir)")
    parser.add_argument("--result", default="big_index", help="name of the JSON written to bench/results/")
    args = parser.parse_args()
    torch.set_num_threads(2)
    from encoderkit.tasks.search import ExactIndex, VectorIndex

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        queries, exact = make_data(work / "shards", args.n, args.dim, args.queries, args.clusters)
        print(f"wrote {args.n:,} vectors as shards, exact top 10 of {args.queries} queries in "
              f"{time.perf_counter() - start:.0f} s")
        timed = queries[:args.latency_queries]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, env=env)
        plans = [("ivfpq", ["--rescore-multiplier", "10"]), ("int8", []), ("binary", [])]
        for kind, extra in plans:
            out = work / kind
            built = build(launcher, work / "shards", out, kind, extra)
            index = VectorIndex.load(out)
            facts = {"n": args.n, **built, **sizes(out, args.n)}
            if kind == "ivfpq":
                facts.update(nlist=index.nlist, pq_m=index.pq_m)
                for nprobe in NPROBES:
                    for multiplier in (0, 10):
                        index.nprobe, index.rescore_multiplier = nprobe, multiplier
                        found = index.search(queries, 10).indices
                        rows.append({"index": kind, "nprobe": nprobe, "rescore_multiplier": multiplier, **facts,
                                     "recall_at_10": recall(found, exact), **latency(index, timed)})
                        print(rows[-1])
            else:
                for multiplier in (1, 4, 10):
                    index.rescore_multiplier = multiplier
                    found = index.search(queries, 10).indices
                    rows.append({"index": kind, "nprobe": None, "rescore_multiplier": multiplier, **facts,
                                 "recall_at_10": recall(found, exact), **latency(index, timed)})
                    print(rows[-1])
            if kind == "int8":  # the exact scan over the same float vectors, memory-mapped, for latency
                flat = ExactIndex(args.dim, "cosine")
                flat._load_data(out)
                flat.ids = index.ids
                rows.append({"index": "exact (float32 scan)", "nprobe": None, "rescore_multiplier": None,
                             "n": args.n, "build_seconds": None, "build_peak_rss_mib": None,
                             "index_bytes_per_vector": 4 * args.dim, "ids_bytes_per_vector": None,
                             "float_vectors_bytes_per_vector": 4 * args.dim, "recall_at_10": 1.0,
                             **latency(flat, timed)})
                print(rows[-1])
            del index
        launcher.stdin.close()
        launcher.wait()
    print(f"{'index':<22}{'nprobe':>7}{'rescore':>8}{'recall@10':>10}{'p50 ms':>8}{'p99 ms':>8}{'B/vec':>7}"
          f"{'build s':>8}{'peak MiB':>9}")
    for row in rows:
        print(f"{row['index']:<22}{row['nprobe'] or '':>7}{row['rescore_multiplier'] or '':>8}"
              f"{row['recall_at_10']:>10.3f}{row['latency_ms_p50']:>8.2f}{row['latency_ms_p99']:>8.2f}"
              f"{row['index_bytes_per_vector']:>7.0f}{row['build_seconds'] or 0:>8.0f}"
              f"{row['build_peak_rss_mib'] or 0:>9.0f}")
    write_result(args.result, {
        "command": "flock -x /tmp/bench.lock python bench/big_index.py" + (f" --n {args.n}" if args.n != 1_000_000
                                                                          else ""),
        "description": (f"{args.n:,} synthetic {args.dim}-d vectors (a normalized mixture of {args.clusters:,} "
                        f"Gaussians, noise as long as the centre) in Parquet shards of 100k; {args.queries:,} "
                        f"queries from the same mixture, recall@10 against exact search; latency: "
                        f"{args.latency_queries} queries one at a time (2 threads). Builds: `encoderkit index "
                        f"--kind K` in a child process (peak RSS from wait4). ivfpq keeps its float vectors "
                        f"(--rescore-multiplier 10) so the same index is searched with and without rescoring."),
        "goal": "the IVF-PQ build of 1M 384-d vectors stays under 2 GiB peak RSS",
        "rows": rows,
    })


def render(r: dict) -> list[str]:
    def number(row: dict, key: str, form: str) -> str:
        return "-" if row.get(key) is None else format(row[key], form)

    lines = ["## Indexes larger than memory (`bench/big_index.py`)", "", r["description"], ""]
    if r.get("timing_note"):
        lines += [f"**{r['timing_note']}**", ""]
    table = [[row["index"], str(row["nprobe"] or ""), str(row["rescore_multiplier"] or "-"),
              f"{row['recall_at_10']:.3f}", number(row, "latency_ms_p50", ".2f"), number(row, "latency_ms_p99", ".2f"),
              f"{row['index_bytes_per_vector']:.1f}",
              f"{row['float_vectors_bytes_per_vector']:.0f}" if row["float_vectors_bytes_per_vector"] else "-",
              number(row, "build_seconds", ".0f"),
              f"{row['build_peak_rss_mib']:,.0f}" if row["build_peak_rss_mib"] else "-"] for row in r["rows"]]
    lines += ["| index | nprobe | rescore x | recall@10 | p50 ms | p99 ms | index B/vector | float B/vector on disk "
              "| build s | build peak RSS MiB |", "|" + "---|" * 10]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    peaks = [row["build_peak_rss_mib"] for row in r["rows"] if row["index"] == "ivfpq"]
    if peaks:
        lines += ["", f"Goal: {r['goal']}: peak {peaks[0]:,.0f} MiB, "
                      f"**{'met' if peaks[0] < 2048 else 'not met'}**."]
    return lines + [""]


if __name__ == "__main__":
    main()
