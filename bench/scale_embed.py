"""Embedding throughput without Ray and on a local Ray cluster (issue 23): `encoderkit embed` and
`encoderkit embed --engine ray` on the same texts, the same model (all-MiniLM-L6-v2, fp32) and the same
machine's CPUs.

Contenders, each the whole job (load the model, read the JSONL, embed, write the output):
  - no Ray: the single-process engine (``embed_file``), 2 torch threads in two lanes (as `encoderkit embed` runs),
    chunks of --shard-size texts;
  - Ray, 1 worker x 2 threads and Ray, 2 workers x 1 thread: ``embed_with_ray`` with shards of --shard-size
    texts, on a local cluster of 2 CPUs. The job's time counts the actors' start and their model loading; the
    cluster's start (``ray.init``) is measured apart, as it is paid once per command, not per text.
Every measurement runs in a fresh subprocess (so no Ray process runs beside the no-Ray contender), in interleaved
order, rotated every repeat. Ratios are per repeat, the median reported.

    python bench/scale_embed.py [--texts 30000] [--shard-size 500] [--repeats 3]
"""
from __future__ import annotations

import time

STARTED = time.perf_counter()  # a child's job counts its imports (torch, encoderkit), as a user's command does

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import SHARED, median, require, rotated, smoke_size, write_result

CONTENDERS = {"local": "no Ray (1 process, 2 threads in 2 lanes)", "ray-1x2": "Ray, 1 worker x 2 threads (2 lanes)",
              "ray-2x1": "Ray, 2 workers x 1 thread"}
DATA = SHARED / "data" / "ag_news" / "train_subset_10k.tsv"


def child(contender: str, source: Path, out: Path, shard_size: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process: the job's seconds from the process's start (imports included;
    for Ray less the local cluster's start, reported apart) and the times each chunk/shard was written."""
    import torch

    written: list[tuple[float, int]] = []  # (seconds since the start, rows) per chunk/shard written
    if contender == "local":
        from encoderkit.engine import lanes_for
        from encoderkit.tasks.embed import Embedder, embed_file

        torch.set_num_threads(2)
        embedder = Embedder.from_pretrained(None)
        encode = embedder.encode

        def timed_encode(texts, **options):
            vectors = encode(texts, **options)
            written.append((time.perf_counter() - STARTED, len(texts)))
            return vectors

        embedder.encode = timed_encode
        result = embed_file(source, out / "vectors.npy", id_field="id", chunk_size=shard_size, embedder=embedder,
                            show_progress=False, lanes=lanes_for(2))  # as `encoderkit embed` runs
        return {"job_seconds": time.perf_counter() - STARTED, "rows": result.rows, "cluster_start_seconds": 0.0,
                "workers": 1, "written": written}
    from encoderkit.embeddings.distributed import embed_with_ray, ray_cluster

    workers, threads = (1, 2) if contender == "ray-1x2" else (2, 1)
    start = time.perf_counter()
    with ray_cluster(None, num_cpus=2):
        cluster = time.perf_counter() - start
        result = embed_with_ray(source, out, id_field="id", shard_size=shard_size, workers=workers,
                                threads_per_worker=threads, show_progress=False,
                                on_shard=lambda e: written.append((time.perf_counter() - STARTED - cluster,
                                                                   e["rows"])))
        job = time.perf_counter() - STARTED - cluster
    return {"job_seconds": job, "rows": result.rows, "cluster_start_seconds": cluster, "workers": workers,
            "written": written, "cluster_stop_seconds": time.perf_counter() - STARTED - cluster - job}


def steady_rate(run: dict[str, Any]) -> float:
    """Texts/s once every worker has finished its first shard: the rows written after the workers-th shard,
    over the time from it to the last (what a long job runs at; the start-up is excluded)."""
    times = sorted(run["written"])
    first = run["workers"] - 1
    rows = sum(r for _, r in times[first + 1:])
    return rows / (times[-1][0] - times[first][0])


def measure(contender: str, source: Path, shard_size: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ekscale") as out:
        command = [sys.executable, __file__, "--child", contender, "--source", str(source), "--out", out,
                   "--shard-size", str(shard_size)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{contender} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=smoke_size(30000, 48))
    parser.add_argument("--shard-size", type=int, default=smoke_size(500, 8))
    parser.add_argument("--repeats", type=int, default=smoke_size(3, 1))
    parser.add_argument("--child", choices=list(CONTENDERS))
    parser.add_argument("--source", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.source, args.out, args.shard_size)))
        return

    lines = require(DATA).read_text(encoding="utf-8").splitlines()
    rows = [lines[i % len(lines)] for i in range(args.texts)]  # past 10,000 texts the file is read again
    work = Path(tempfile.mkdtemp(prefix="ekscale"))
    source = work / "news.jsonl"
    source.write_text("".join(json.dumps({"id": f"n{i}", "text": row.split("\t")[0]}) + "\n"
                              for i, row in enumerate(rows)), encoding="utf-8")
    order = list(CONTENDERS)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    load = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for name in rotated(order, repeat):
            run = measure(name, source, args.shard_size)
            run["texts_per_second"] = run["rows"] / run["job_seconds"]
            run["steady_texts_per_second"] = steady_rate(run)
            runs[name].append(run)
            print(f"repeat {repeat + 1}: {CONTENDERS[name]:<28} {run['texts_per_second']:7.1f} texts/s "
                  f"(steady {run['steady_texts_per_second']:6.1f}; job {run['job_seconds']:.1f} s, cluster start {run['cluster_start_seconds']:.1f} s)", flush=True)
        load.append(os.getloadavg()[0])
    table = []
    for name, label in CONTENDERS.items():
        ratios = [local["job_seconds"] / run["job_seconds"] for local, run in zip(runs["local"], runs[name])]
        with_start = [local["job_seconds"] / (run["job_seconds"] + run["cluster_start_seconds"])
                      for local, run in zip(runs["local"], runs[name])]
        steady = [run["steady_texts_per_second"] / local["steady_texts_per_second"]
                  for local, run in zip(runs["local"], runs[name])]
        table.append({"contender": name, "label": label,
                      "steady_texts_per_second": median([r["steady_texts_per_second"] for r in runs[name]]),
                      "steady_speed_vs_no_ray": median(steady),
                      "texts_per_second": median([r["texts_per_second"] for r in runs[name]]),
                      "job_seconds": median([r["job_seconds"] for r in runs[name]]),
                      "cluster_start_seconds": median([r["cluster_start_seconds"] for r in runs[name]]),
                      "speed_vs_no_ray": median(ratios), "speed_vs_no_ray_with_cluster_start": median(with_start),
                      "runs": runs[name]})
    print(f"\n{'contender':<28} {'texts/s':>8} {'job s':>7} {'vs no Ray':>10} {'incl. cluster start':>20} "
          f"{'steady texts/s':>15} {'steady vs no Ray':>17}")
    for row in table:
        print(f"{row['label']:<28} {row['texts_per_second']:8.1f} {row['job_seconds']:7.1f} "
              f"{row['speed_vs_no_ray']:9.2f}x {row['speed_vs_no_ray_with_cluster_start']:19.2f}x "
              f"{row['steady_texts_per_second']:15.1f} {row['steady_speed_vs_no_ray']:16.2f}x")
    overhead = 1 / table[1]["speed_vs_no_ray"] - 1
    steady_overhead = 1 / table[1]["steady_speed_vs_no_ray"] - 1
    print(f"Ray overhead at one worker (2 threads) against no Ray: {100 * overhead:+.1f}% of the whole job, "
          f"{100 * steady_overhead:+.1f}% in the steady state (goal < 10%)")
    write_result("scale_embed", {
        "command": f"python bench/scale_embed.py --texts {args.texts} "
                   f"--shard-size {args.shard_size} --repeats {args.repeats}",
        "texts": len(rows), "data": "ag_news/train_subset_10k.tsv (its 10,000 texts, repeated past that)", "model": "all-MiniLM-L6-v2 fp32",
        "shard_size": args.shard_size, "repeats": args.repeats, "ray_overhead_one_worker": overhead,
        "ray_overhead_one_worker_steady": steady_overhead,
        "load_average_1min": load, "rows": table})


def render(r: dict[str, Any]) -> list[str]:
    steady = "ray_overhead_one_worker_steady" in r  # results from before the steady-state figure lack it
    lines = ["## Embedding with and without Ray (`bench/scale_embed.py`)", "",
             f"{r['texts']:,} texts of {r['data']}, {r['model']}, shards (chunks) of {r['shard_size']} texts, "
             f"{r['repeats']} interleaved repeats, each measurement a fresh process. A job: load the model, read the "
             "JSONL, embed, write"
             + (", timed from the process's start (imports included)" if steady else "")
             + "; for Ray the actors' start and model loading included, the local cluster's start (`ray.init`, once "
             "per command) shown apart. "
             + ("Steady state: the texts/s once every worker has written its first shard (what a long job runs at). "
                if steady else "")
             + "Speed against no Ray: median of per-repeat ratios. "
             f"1-minute load average during the run: {', '.join(f'{x:.1f}' for x in r['load_average_1min'])}.", ""]
    header = ["contender", "texts/s", "job s", "vs no Ray", "vs no Ray, cluster start included", "cluster start s"]
    header += ["steady texts/s", "steady vs no Ray"] if steady else []
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in r["rows"]:
        cells = [row["label"], f"{row['texts_per_second']:,.1f}", f"{row['job_seconds']:.1f}",
                 f"**{row['speed_vs_no_ray']:.2f}x**", f"{row['speed_vs_no_ray_with_cluster_start']:.2f}x",
                 f"{row['cluster_start_seconds']:.1f}"]
        if steady:
            cells += [f"{row['steady_texts_per_second']:,.1f}", f"{row['steady_speed_vs_no_ray']:.2f}x"]
        table.append("| " + " | ".join(cells) + " |")
    overhead = f"{100 * r['ray_overhead_one_worker']:+.1f}% of the whole job"
    if steady:
        overhead += f", {100 * r['ray_overhead_one_worker_steady']:+.1f}% in the steady state"
    return lines + table + ["", f"Ray's overhead at one worker (2 threads) against no Ray: {overhead} "
                                "(goal: under 10%).", ""]


if __name__ == "__main__":
    main()
