"""The sparse inverted index (SPLADE-like vectors) at 1M documents: build peak memory and query latency.

Synthetic documents: each draws ``terms`` (uniform 100-200) terms with replacement from a Zipf-like distribution
over BERT's 30,522-term vocabulary, p(rank r) proportional to 1 / (r + 100) (term ids shuffled, so frequent terms
are spread over the vocabulary), duplicates merged; weights are Gamma(2, 0.4) (positive, mean 0.8, a long right
tail, as SPLADE's log(1 + ReLU) weights). Queries: 20-40 terms from the same distribution. The index is built by
``build_sparse_index`` from chunks of 50,000 documents generated on the fly in a child process, whose peak
resident memory comes from os.wait4 (ru_maxrss) on a small launcher; queries are timed one at a time on the saved,
memory-mapped index. A few queries are checked against brute force over a 20,000-document prefix index.

    python bench/sparse_index.py [--n 1000000] [--queries 200]
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

from big_index import LAUNCHER  # the small process that starts the measured build
from common import ROOT, smoke_size, write_result

VOCABULARY = 30_522
CHUNK = 50_000
GOAL_MIB = 2048


class SyntheticSplade:
    """SPLADE-like sparse vectors (see the module's docstring), reproducible from ``seed``."""

    def __init__(self, seed: int = 0, vocabulary: int = VOCABULARY, offset: float = 100.0) -> None:
        self.rng = np.random.default_rng(seed)
        p = 1.0 / (np.arange(vocabulary) + offset)
        self.cdf = np.cumsum(p[np.random.default_rng(12345).permutation(vocabulary)] / p.sum())
        self.vocabulary = vocabulary

    def draw(self, rows: int, low: int = 100, high: int = 200):
        from encoderkit.embeddings.sparse_vectors import SparseVectors

        counts = self.rng.integers(low, high + 1, rows)
        terms = np.minimum(np.searchsorted(self.cdf, self.rng.random(int(counts.sum()))), self.vocabulary - 1)
        keys = np.sort(np.repeat(np.arange(rows, dtype=np.int64), counts) * self.vocabulary + terms)
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]  # (np.unique hashes: slower here)
        row, column = np.divmod(keys, self.vocabulary)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=rows))])
        return SparseVectors(indptr, column.astype(np.int32), self.rng.gamma(2.0, 0.4, len(keys)).astype(np.float32),
                             self.vocabulary)


def build_child(out: str, n: int, seed: int) -> None:
    """Runs in the measured child: generate n documents chunk by chunk and stream them into the index."""
    from encoderkit.retrieval import build_sparse_index

    generator = SyntheticSplade(seed)
    chunks = (generator.draw(min(CHUNK, n - start)) for start in range(0, n, CHUNK))
    build_sparse_index(chunks, out, info={"model": "synthetic SPLADE-like"}, show_progress=True)


def measured_build(out: Path, n: int, seed: int) -> dict:
    """The build in a child started by a small launcher (a child's ru_maxrss includes what it was forked from)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)
    command = [sys.executable, str(Path(__file__).resolve()), "--build-child", str(out), "--n", str(n),
               "--seed", str(seed)]
    start = time.perf_counter()
    launcher.stdin.write(json.dumps(command) + "\n")
    launcher.stdin.flush()
    code, peak_kib = json.loads(launcher.stdout.readline())
    seconds = time.perf_counter() - start
    launcher.stdin.close()
    launcher.wait()
    if code != 0:
        sys.exit(f"build failed: {' '.join(command)}")
    return {"build_seconds": seconds, "build_peak_rss_mib": peak_kib / 1024}


def check_against_brute_force(work: Path, seed: int, queries) -> bool:
    """The first 20,000 documents (500 in a smoke run) indexed again in small runs; the index's top 10 against dense
    dot products."""
    from encoderkit.retrieval import build_sparse_index

    docs = SyntheticSplade(seed).draw(smoke_size(20_000, 500))
    index = build_sparse_index(docs, work / "prefix", run_postings=smoke_size(500_000, 20_000),
                               merge_postings=smoke_size(300_000, 12_000))  # several runs, merged
    found = index.search(queries[:5], 10)
    dense = queries[:5].to_dense() @ docs.to_dense().T
    expected = np.sort(dense, axis=1)[:, ::-1][:, :10]
    return bool(np.allclose(found.scores, expected, rtol=1e-4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=smoke_size(1_000_000, 2000))
    parser.add_argument("--queries", type=int, default=smoke_size(200, 5), help="queries timed one at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help="where the index goes (default: a temp dir)")
    parser.add_argument("--result", default="sparse_index", help="name of the JSON written to bench/results/")
    args = parser.parse_args()
    if args.build_child:
        build_child(args.build_child, args.n, args.seed)
        return
    from encoderkit.retrieval import SparseIndex

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        built = measured_build(work / "index", args.n, args.seed)
        index = SparseIndex.load(work / "index")
        disk = sum(p.stat().st_size for p in (work / "index").iterdir())
        queries = SyntheticSplade(args.seed + 1).draw(args.queries, 20, 40)
        correct = check_against_brute_force(work, args.seed, queries)
        touched, times = [], []
        index.search(queries[:5], 10)  # warm the page cache of the head terms' postings
        for q in range(len(queries)):
            terms, _ = queries.row(q)
            touched.append(int(sum(index.indptr[t + 1] - index.indptr[t] for t in terms)))
            one = queries[q]
            start = time.perf_counter()
            index.search(one, 10)
            times.append((time.perf_counter() - start) * 1000)
    row = {"n": args.n, "vocabulary": VOCABULARY, "postings": int(index.indptr[-1]),
           "terms_per_document": index.indptr[-1] / args.n, **built, "disk_bytes_per_posting": disk / index.indptr[-1],
           "queries": args.queries, "query_terms_mean": float(np.diff(queries.indptr).mean()),
           "postings_per_query_mean": float(np.mean(touched)),
           "latency_ms_p50": float(np.percentile(times, 50)), "latency_ms_p99": float(np.percentile(times, 99)),
           "top10_equals_brute_force": correct}
    met = built["build_peak_rss_mib"] < GOAL_MIB
    print(json.dumps(row, indent=2))
    print(f"goal (build of {args.n:,} documents under 2 GiB peak RSS): {'met' if met else 'NOT met'} "
          f"({built['build_peak_rss_mib']:,.0f} MiB); query p50 {row['latency_ms_p50']:.1f} ms")
    write_result(args.result, {
        "command": "flock -x /tmp/bench.lock python bench/sparse_index.py" + (f" --n {args.n}" if args.n != 1_000_000
                                                                             else ""),
        "description": " ".join(__doc__.split("\n\n")[1].split()),
        "goal": "a sparse index of 1M synthetic documents builds in under 2 GiB peak RSS; query p50 reported",
        "goal_met": met if args.n >= 1_000_000 else None,
        "rows": [row],
    })


def render(r: dict) -> list[str]:
    lines = ["## Sparse inverted index (`bench/sparse_index.py`)", "", r["description"], ""]
    lines += ["| documents | postings | terms/doc | build s | build peak RSS MiB | disk B/posting | query terms | "
              "postings/query | p50 ms | p99 ms | top 10 = brute force |", "|" + "---|" * 11]
    for row in r["rows"]:
        lines += [f"| {row['n']:,} | {row['postings']:,} | {row['terms_per_document']:.1f} | "
                  f"{row['build_seconds']:.0f} | {row['build_peak_rss_mib']:,.0f} | "
                  f"{row['disk_bytes_per_posting']:.1f} | {row['query_terms_mean']:.1f} | "
                  f"{row['postings_per_query_mean']:,.0f} | {row['latency_ms_p50']:.1f} | "
                  f"{row['latency_ms_p99']:.1f} | {'yes' if row['top10_equals_brute_force'] else 'no'} |"]
    if r.get("goal_met") is not None:
        peak = r["rows"][0]["build_peak_rss_mib"]
        lines += ["", f"Goal: {r['goal']}: peak {peak:,.0f} MiB, **{'met' if r['goal_met'] else 'not met'}**."]
    return lines + [""]


if __name__ == "__main__":
    main()
