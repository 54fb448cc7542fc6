"""Where the native kernel's time goes for one short text: the steps of ``small_batch.cpp`` (issue 22, the profile
behind the single-text latency).

The kernel built with ``-DEK_PROFILE`` (``ENCODERKIT_NATIVE_FLAGS``, a build of its own in the cache) sums, on its
first thread, the seconds of each step of every layer (the waits at the barriers included) and of quantising the
int8 products' rows. all-MiniLM-L6-v2, bench/peers.py's 5 short texts in turn, fp32 and int8, interleaved in
blocks; the engine's whole call (``Embedder.encode_tokens``) is timed around the kernel, so the rest is what runs in
Python around it.

    flock -x /tmp/bench.lock python bench/native_phases.py [--calls 500] [--threads 2]

Writes bench/results/native_phases.json.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time
from typing import Any

import numpy as np

os.environ["ENCODERKIT_NATIVE_FLAGS"] = (os.environ.get("ENCODERKIT_NATIVE_FLAGS", "") + " -DEK_PROFILE").strip()

import torch  # noqa: E402

from common import SHARED, require, smoke_size, write_result  # noqa: E402
from peers import MAX_LENGTH, THREADS, short_texts  # noqa: E402

PHASES = ("embeddings", "query/key/value product", "attention", "attention output product", "attention LayerNorm",
          "FFN in product (+ GELU)", "FFN out product", "FFN LayerNorm", "of the products: int8 quantisation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=smoke_size(500, 10))
    parser.add_argument("--threads", type=int, default=THREADS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from encoderkit import Embedder, default_model_path, native

    lib = native.library()
    buffer = (ctypes.c_double * len(PHASES))()
    if lib is None or lib.ek_phases(buffer) != len(PHASES):
        raise SystemExit(f"no profiling build of the native kernel here: {native.status()}")
    texts = short_texts(require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines())
    embedders = {dtype: Embedder.from_pretrained(default_model_path(), dtype=dtype) for dtype in ("fp32", "int8")}
    ids = embedders["fp32"].tokenizer.encode_ids(texts, max_length=MAX_LENGTH)[0]
    totals = {dtype: np.zeros(len(PHASES)) for dtype in embedders}
    calls = {dtype: [] for dtype in embedders}
    for embedder in embedders.values():  # warm-up, and the kernel's plan made
        for i in range(20):
            embedder.encode_tokens([ids[i % len(ids)]], None)
        if native.kernel_of(embedder.engine.encoder) is None:
            raise SystemExit(f"the native kernel did not run for {embedder.engine.precision.name}: {native.status()}")
    for block in range(args.calls // 10):
        for dtype, embedder in embedders.items():
            time.sleep(0.1)
            lib.ek_phases(buffer)  # zeroed
            for i in range(10):
                started = time.perf_counter()
                embedder.encode_tokens([ids[(block * 10 + i) % len(ids)]], None)
                calls[dtype].append(time.perf_counter() - started)
            lib.ek_phases(buffer)
            totals[dtype] += np.array(buffer[:])
    rows = []
    for dtype in embedders:
        per_call = totals[dtype] / len(calls[dtype]) * 1e3
        engine_ms = float(np.mean(calls[dtype]) * 1e3)
        kernel_ms = float(per_call[:len(PHASES) - 1].sum())
        rows.append({"dtype": dtype, "calls": len(calls[dtype]), "engine_mean_ms": engine_ms,
                     "engine_p50_ms": float(np.median(calls[dtype]) * 1e3), "kernel_ms": kernel_ms,
                     "phases_ms": dict(zip(PHASES, map(float, per_call)))})
        print(f"{dtype}: engine mean {engine_ms:.3f} ms (p50 {rows[-1]['engine_p50_ms']:.3f}), "
              f"kernel {kernel_ms:.3f} ms")
        for name, value in rows[-1]["phases_ms"].items():
            print(f"  {name:36s} {value:6.3f} ms")
    command = f"python bench/native_phases.py --calls {args.calls}" + (
        f" --threads {args.threads}" if args.threads != THREADS else "")
    write_result("native_phases", {"texts": texts, "tokens": [len(x) for x in ids], "threads": args.threads,
                                   "rows": rows, "native": native.status(), "command": command})


def render(r: dict[str, Any]) -> list[str]:
    from report import _table

    by_dtype = {row["dtype"]: row for row in r["rows"]}
    lines = ["## Where the native kernel's time goes, one short text (`bench/native_phases.py`)", "",
             f"all-MiniLM-L6-v2, {len(r['texts'])} short texts of {min(r['tokens'])}-{max(r['tokens'])} tokens in "
             "turn, "
             f"{r['threads']} threads, {r['rows'][0]['calls']} calls per precision, interleaved in blocks of 10. The "
             "kernel built with `-DEK_PROFILE` sums the seconds its first thread spends in each step of the six "
             "layers (its waits at the barriers included); the engine's call (`Embedder.encode_tokens`, from token "
             "ids to the pooled vector) is timed around it, and what it takes beyond the kernel's steps is the "
             "Python around the kernel. Milliseconds per call, means:", ""]
    names = list(r["rows"][0]["phases_ms"])
    table = [[name] + [f"{by_dtype[d]['phases_ms'][name]:.3f}" for d in by_dtype] for name in names]
    table.append(["**the kernel's steps**"] + [f"**{by_dtype[d]['kernel_ms']:.3f}**" for d in by_dtype])
    table.append(["the engine's call, around them"] + [f"{by_dtype[d]['engine_mean_ms']:.3f}" for d in by_dtype])
    table.append(["the Python around the kernel"] + [
        f"{by_dtype[d]['engine_mean_ms'] - by_dtype[d]['kernel_ms']:.3f}" for d in by_dtype])
    lines += _table(["step"] + list(by_dtype), table)
    return lines


if __name__ == "__main__":
    main()
