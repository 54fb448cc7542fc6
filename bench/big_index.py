"""Indexes larger than memory: IVF-PQ, int8 and binary built from Parquet shards, against exact search.

Synthetic: N 384-d vectors from ``SyntheticEmbeddings`` (a decaying spectrum and anisotropic topics at
cosine ~0.7 from their centre, like sentence embeddings) written as Parquet shards, the exact top 10 of
held-out queries computed on the way. Each index is built by `encoderkit index SHARDS --kind K` in a
child process whose peak resident memory comes from os.wait4 (ru_maxrss). Real: MiniLM embeddings of
12k short texts from /work/shared/data (embedded once, cached in bench/.cache). Searches read the saved
index memory-mapped; latency is one query at a time.

    python bench/big_index.py [--n 1000000] [--queries 1000] [--latency-queries 200] [--real 12000]
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

from common import CACHE, ROOT, SMOKE, smoke_size, write_result
from smoke_training import skip

NPROBES = (8, 16, 32, 64, 128)


REAL_TEXTS = smoke_size(12_000, 300)


def real_texts(limit: int = REAL_TEXTS) -> list[str]:
    """Distinct real texts: paragraphs of mlm_corpus (Wikipedia, SQuAD contexts, news; 40 to 300 characters)
    and SST-2 sentences (over 30 characters), in file order, up to ``limit``."""
    data = Path(os.environ.get("ENCODERKIT_DATA", "/work/shared/data"))
    seen: dict[str, None] = {}
    for line in (data / "mlm_corpus" / "train.txt").read_text(encoding="utf-8").splitlines():
        if 40 < len(line.strip()) <= 300:
            seen.setdefault(line.strip())
    for line in (data / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        text = line.split("\t")[0].strip()
        if len(text) > 30:
            seen.setdefault(text)
    return list(seen)[:limit]


def real_vectors(limit: int = REAL_TEXTS) -> np.ndarray:
    """MiniLM (the default embedder) vectors of ``real_texts``, computed once and cached in bench/.cache."""
    path = CACHE / f"big_index_real_{limit}_v2.npy"
    if not path.is_file():
        import encoderkit as ek

        texts = real_texts(limit)
        from encoderkit.progress import Progress

        with Progress(len(texts), "embedding real texts", "texts") as progress:
            vectors = ek.Embedder.from_pretrained().encode(texts, progress=progress.advance)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.asarray(vectors, dtype=np.float32))
    return np.load(path)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / exact.shape[1] for a, b in zip(found, exact)]))


class SyntheticEmbeddings:
    """A generator of sentence-embedding-like unit vectors (documented in BENCHMARKS.md through the result).

    Real sentence embeddings are not isotropic: their variance sits in few directions (a decaying
    spectrum) and they group into topics whose members lie at cosine ~0.6-0.8 from the topic's centre.
    Here a vector is ``normalize(z @ basis + noise)``:

    - ``z`` (``latent`` = 64 dimensions): one of ``clusters`` topic centres (standard normal) plus a
      Gaussian offset of scale ``within`` whose per-axis scales (uniform 0.3-1) differ by topic, so each
      topic is an anisotropic ellipsoid;
    - ``basis``: 64 orthonormal directions of the 384-d space, the j-th scaled by (j+1)^-0.5 (a power-law
      spectrum);
    - ``noise``: isotropic, ``noise`` (0.3) times the vector's length over all 384 dimensions.

    With ``within`` = 1.2 the cosine of a vector to its topic centre averages 0.73 (10th-90th percentile
    0.60-0.85); among 100k vectors a query's nearest neighbour is at cosine 0.73, its 10th at 0.66 (closer
    among more vectors: see the result's neighbours), and IVF recall rises with
    nprobe as it does on real embeddings (isotropic mixtures have no neighbourhoods for IVF to find).
    """

    def __init__(self, seed: int = 0, dim: int = 384, latent: int = 64, clusters: int = 2000, within: float = 1.2,
                 noise: float = 0.3, decay: float = 0.5) -> None:
        self.rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(self.rng.standard_normal((dim, latent)))
        self.basis = (q * (1 + np.arange(latent)) ** -decay).T
        self.centres = self.rng.standard_normal((clusters, latent))
        self.scales = self.rng.uniform(0.3, 1.0, (clusters, latent))
        self.within, self.noise = within, noise

    def draw(self, n: int) -> np.ndarray:
        topic = self.rng.integers(0, len(self.centres), n)
        z = self.centres[topic] + self.within * self.scales[topic] * self.rng.standard_normal(
            (n, self.centres.shape[1]))
        x = z @ self.basis
        x += (self.noise * np.linalg.norm(x, axis=1, keepdims=True) / np.sqrt(x.shape[1])) * self.rng.standard_normal(
            x.shape)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_data(directory: Path, n: int, dim: int, queries: int, clusters: int, chunk: int = 100_000):
    """Shards of n vectors, the queries, and the queries' exact top 10 (scanned chunk by chunk)."""
    from encoderkit.embeddings.shards import ShardWriter

    generator = SyntheticEmbeddings(dim=dim, clusters=clusters)
    query_vectors = generator.draw(queries)
    q = torch.from_numpy(query_vectors)
    best_scores, best_rows = torch.full((queries, 10), -torch.inf), torch.full((queries, 10), -1, dtype=torch.long)
    writer = ShardWriter(directory, {"source": "bench/big_index.py SyntheticEmbeddings"})
    for start in range(0, n, chunk):
        block = generator.draw(min(chunk, n - start))
        writer.write(block, [f"doc-{i}" for i in range(start, start + len(block))])
        scores = q @ torch.from_numpy(block).T
        top = scores.topk(10, dim=1)
        merged_scores = torch.cat([best_scores, top.values], 1)
        merged_rows = torch.cat([best_rows, top.indices + start], 1)
        keep = merged_scores.topk(10, dim=1)
        best_scores, best_rows = keep.values, merged_rows.gather(1, keep.indices)
    writer.close()
    return query_vectors, best_rows.numpy(), best_scores.numpy()


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


def neighbour_stats(queries: np.ndarray, scores_top10: np.ndarray) -> dict:
    """How close the neighbours are: mean cosine of each query's 1st and 10th exact neighbour."""
    return {"top1_cosine": float(scores_top10[:, 0].mean()), "top10_cosine": float(scores_top10[:, 9].mean())}


def evaluate(index, kind: str, queries: np.ndarray, exact: np.ndarray, timed: np.ndarray, facts: dict) -> list[dict]:
    """Recall@10 against exact search and one-query latency for each nprobe (ivfpq) and rescore multiplier."""
    rows = []
    settings = ([(nprobe, m) for nprobe in NPROBES for m in (0, 10)] if kind == "ivfpq"
                else [(None, m) for m in (1, 4, 10)])
    for nprobe, multiplier in settings:
        if nprobe is not None:
            index.nprobe = nprobe
        index.rescore_multiplier = multiplier
        found = index.search(queries, 10).indices
        rows.append({"index": kind, "nprobe": nprobe, "rescore_multiplier": multiplier, **facts,
                     "recall_at_10": recall(found, exact), **latency(index, timed)})
        print(rows[-1], flush=True)
    return rows


def real_rows(limit: int, queries: int, latency_queries: int, directory: Path) -> tuple[list[dict], dict]:
    """The same indexes over real MiniLM embeddings: ``queries`` held-out texts against the other texts."""
    from encoderkit.tasks.search import VectorIndex, build_index

    vectors = real_vectors(limit)
    order = np.random.default_rng(0).permutation(len(vectors))
    query_vectors, corpus = vectors[order[:queries]], vectors[order[queries:]]
    exact = build_index(corpus).search(query_vectors, 10)
    data = f"real ({len(corpus):,} MiniLM)"
    rows = []
    kinds = ("ivfpq", "int8", "binary")
    if SMOKE:  # IVF-PQ trains its codebooks on 9,984 vectors or more: the synthetic part has them, a smoke run's few
        skip("IVF-PQ on real embeddings", "its codebooks need about 10,000 vectors; the synthetic part builds it")
        kinds = kinds[1:]
    for kind in kinds:
        built = build_index(corpus, kind=kind, **({"rescore_multiplier": 10} if kind == "ivfpq" else {}))
        built.save(directory / kind)
        index = VectorIndex.load(directory / kind)
        facts = {"data": data, "n": len(corpus), **sizes(directory / kind, len(corpus))}
        if kind == "ivfpq":
            facts.update(nlist=index.nlist, pq_m=index.pq_m)
        rows += evaluate(index, kind, query_vectors, exact.indices, query_vectors[:latency_queries], facts)
    return rows, {"n": len(corpus), "queries": queries, **neighbour_stats(query_vectors, exact.scores)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=smoke_size(1_000_000, 12_000))
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=smoke_size(2000, 20))
    parser.add_argument("--queries", type=int, default=smoke_size(1000, 20), help="queries for recall@10")
    parser.add_argument("--latency-queries", type=int, default=smoke_size(200, 5), help="queries timed one at a time")
    parser.add_argument("--real", type=int, default=REAL_TEXTS, help="real texts embedded with MiniLM (0: skip)")
    parser.add_argument("--workdir", default=None, help="where the shards and indexes go (default: a temp dir)")
    parser.add_argument("--result", default="big_index", help="name of the JSON written to bench/results/")
    args = parser.parse_args()
    torch.set_num_threads(2)
    from encoderkit.tasks.search import ExactIndex, VectorIndex

    rows: list[dict] = []
    stats: dict = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        if args.real:
            real, stats["real"] = real_rows(args.real, args.queries, args.latency_queries, work / "real")
            rows += real
        start = time.perf_counter()
        queries, exact, exact_scores = make_data(work / "shards", args.n, args.dim, args.queries, args.clusters)
        stats["synthetic"] = {"n": args.n, "queries": args.queries, **neighbour_stats(queries, exact_scores)}
        print(f"wrote {args.n:,} vectors as shards, exact top 10 of {args.queries} queries in "
              f"{time.perf_counter() - start:.0f} s; {stats}")
        timed = queries[:args.latency_queries]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, env=env)
        plans = [("ivfpq", ["--rescore-multiplier", "10"]), ("int8", []), ("binary", [])]
        data = f"synthetic ({args.n:,})"
        for kind, extra in plans:
            out = work / kind
            built = build(launcher, work / "shards", out, kind, extra)
            index = VectorIndex.load(out)
            facts = {"data": data, "n": args.n, **built, **sizes(out, args.n)}
            if kind == "ivfpq":
                facts.update(nlist=index.nlist, pq_m=index.pq_m)
            rows += evaluate(index, kind, queries, exact, timed, facts)
            if kind == "int8":  # the exact scan over the same float vectors, memory-mapped, for latency
                flat = ExactIndex(args.dim, "cosine")
                flat._load_data(out)
                flat.ids = index.ids
                rows.append({"index": "exact (float32 scan)", "data": data, "nprobe": None,
                             "rescore_multiplier": None, "n": args.n, "build_seconds": None,
                             "build_peak_rss_mib": None, "index_bytes_per_vector": 4 * args.dim,
                             "ids_bytes_per_vector": None, "float_vectors_bytes_per_vector": 4 * args.dim,
                             "recall_at_10": 1.0, **latency(flat, timed)})
                print(rows[-1])
            del index
        launcher.stdin.close()
        launcher.wait()
    print(f"{'data':<24}{'index':<22}{'nprobe':>7}{'rescore':>8}{'recall@10':>10}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'B/vec':>7}{'build s':>8}{'peak MiB':>9}")
    for row in rows:
        print(f"{row['data']:<24}{row['index']:<22}{row['nprobe'] or '':>7}{row['rescore_multiplier'] or '':>8}"
              f"{row['recall_at_10']:>10.3f}{row['latency_ms_p50']:>8.2f}{row['latency_ms_p99']:>8.2f}"
              f"{row['index_bytes_per_vector']:>7.1f}{row.get('build_seconds') or 0:>8.0f}"
              f"{row.get('build_peak_rss_mib') or 0:>9.0f}")
    generator = SyntheticEmbeddings.__doc__.split("\n\n", 1)[1]
    write_result(args.result, {
        "command": "flock -x /tmp/bench.lock python bench/big_index.py" + (f" --n {args.n}" if args.n != 1_000_000
                                                                          else ""),
        "description": (f"Synthetic: {args.n:,} {args.dim}-d vectors from `SyntheticEmbeddings` ({args.clusters:,} "
                        f"topics; see below) in Parquet shards of 100k, built by `encoderkit index SHARDS --kind K` "
                        f"in a child process (peak RSS from wait4 on a small launcher); {args.queries:,} queries from "
                        f"the same generator. Real: {args.real:,} distinct texts (mlm_corpus paragraphs, SST-2 "
                        f"sentences) embedded by the default MiniLM, {args.queries:,} of them held out as queries, "
                        f"indexes built in memory (`build_index`). Recall@10 is against exact search; latency: "
                        f"{args.latency_queries} queries one at a time (2 threads). ivfpq keeps its float vectors "
                        f"(--rescore-multiplier 10), so the same index is searched with and without rescoring. "
                        f"Index B/vector: the FAISS file (codes, list ids, centroids) per vector; the ids and the "
                        f"float vectors for rescoring are separate files, memory-mapped."),
        "generator": " ".join(generator.split()),
        "neighbours": stats,
        "goal": "the IVF-PQ build of 1M 384-d vectors stays under 2 GiB peak RSS",
        "rows": rows,
    })


def render(r: dict) -> list[str]:
    def number(row: dict, key: str, form: str) -> str:
        return "-" if row.get(key) is None else format(row[key], form)

    lines = ["## Indexes larger than memory (`bench/big_index.py`)", "", r["description"], ""]
    if r.get("generator"):
        lines += [f"The synthetic data: {r['generator']}", ""]
    for name, stat in r.get("neighbours", {}).items():
        lines += [f"- {name}: {stat['n']:,} vectors; a query's exact nearest neighbour at mean cosine "
                  f"{stat['top1_cosine']:.3f}, its 10th at {stat['top10_cosine']:.3f}"]
    lines += [""]
    if r.get("timing_note"):
        lines += [f"**{r['timing_note']}**", ""]
    table = [[row.get("data", ""), row["index"], str(row["nprobe"] or ""), str(row["rescore_multiplier"] or "-"),
              f"{row['recall_at_10']:.3f}", number(row, "latency_ms_p50", ".2f"), number(row, "latency_ms_p99", ".2f"),
              f"{row['index_bytes_per_vector']:.1f}",
              f"{row['float_vectors_bytes_per_vector']:.0f}" if row["float_vectors_bytes_per_vector"] else "-",
              number(row, "build_seconds", ".0f"),
              f"{row['build_peak_rss_mib']:,.0f}" if row.get("build_peak_rss_mib") else "-"] for row in r["rows"]]
    lines += ["| data | index | nprobe | rescore x | recall@10 | p50 ms | p99 ms | index B/vector | float B/vector on "
              "disk | build s | build peak RSS MiB |", "|" + "---|" * 11]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    peaks = [row["build_peak_rss_mib"] for row in r["rows"] if row["index"] == "ivfpq" and row.get("build_peak_rss_mib")
             and row["n"] >= 1_000_000]  # the goal is stated for 1M vectors
    if peaks:
        lines += ["", f"Goal: {r['goal']}: peak {peaks[0]:,.0f} MiB, "
                      f"**{'met' if peaks[0] < 2048 else 'not met'}**."]
    return lines + [""]


if __name__ == "__main__":
    main()
