"""Which fp32 batches the native kernel takes whole (``native.FP32_MAX_TOKENS``, ``native.attention_max_length``),
measured.

The whole-layer kernel (``small_batch.cpp``: its products, attention and norms in one call) against the PyTorch
layers it replaces (oneDNN's products, the native attention, PyTorch's norms), all-MiniLM-L6-v2 in fp32:

- the products alone, on 1 thread (a lane of the default two): the kernel's (``ek_product``, weights packed once)
  against the PyTorch layers' (``modeling.inference.Prepacked``: oneDNN's, weights packed once), for the model's
  four shapes and M = 64 to 2,048 rows, in GFLOP/s. The kernel runs in two builds, each in a process of its own, in
  turns: this build, whose products take the rows in chunks that stay in the core's cache while the weights stream
  past, and the same without chunks (``-DEK_CHUNK_BYTES=0``);
- by batch: packed batches of about 2,048 tokens of sequences of L tokens (L = 16 to 512; token ids cut from
  ../shared/bench/sentences.txt), once on the kernel and once on the PyTorch layers (``native.disable``), on 1 thread
  and on 2, in turns over the rounds; median seconds a batch;
- end to end: the 2,000 texts of sentences.txt as bench/peers.py embeds them (``encode(batch_size=32)``, the default
  lanes), with the kernel taking batches up to ``BATCH_MAX_TOKENS`` tokens (on) and only up to ``MAX_TOKENS`` (off),
  in turns over the rounds; median seconds.

Goals: this build's entry of ``FP32_MAX_TOKENS`` (on or off) within 2% of the faster of the two end to end (the
decision); where it is on, by batch, the kernel within 2% of the PyTorch layers or faster (1 thread) at every length
up to this build's ``attention_max_length()`` (a batch of 2,048 tokens spends little time between ops, which is
where the kernel gains most, so here the products decide); the chunked products no slower than unchunked ones in
sum at 2,048 rows. Written as bench/results/kernel_batches_<bits>bit.json, by the
native build's vectors (256 or 512 bits); an AVX2 tier is imitated on a bigger CPU with
``ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni' ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2`` (the result records them).

    flock -x /tmp/bench.lock python bench/kernel_batches.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from common import SHARED, batch_of_length, require, smoke_size, write_result

LENGTHS = (16, 32, 64, 128, 256, 512)
ROWS = (64, 256, 1024, 2048)
SHAPES = ((1152, 384), (384, 384), (1536, 384), (384, 1536))  # (N, K): query/key/value, output, FFN in, FFN out
BATCH_TOKENS = 2048
UNCHUNKED = "-DEK_CHUNK_BYTES=0"
TOLERANCE = 0.02


def products(rounds: int) -> dict[str, float]:
    """Seconds of each (rows, N, K) product on 1 thread, the kernel's and torch's, medians over ``rounds``."""
    import ctypes

    import torch

    from encoderkit import native
    from encoderkit.modeling.inference import Prepacked
    from encoderkit.native.loader import Linear

    torch.set_num_threads(1)
    lib = native.library()
    if lib is None:
        raise SystemExit(f"the native kernel is not available here: {native.status()}")
    generator = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    for rows in ROWS:
        for n, k in SHAPES:
            weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
            x, y = torch.randn(rows, k, generator=generator), torch.empty(rows, n)
            parts = native._fp32_linear(lib, weight, bias)
            linear = Linear(*[None if t is None else t.data_ptr() for t in parts])
            prepacked = Prepacked([weight], [bias], torch.float32)  # the PyTorch layers' product (oneDNN's)
            repeats = max(2, int(4e8 / (2 * rows * n * k)))
            runs = {"kernel": lambda: lib.ek_product(ctypes.byref(linear), x.data_ptr(), y.data_ptr(), rows, n, k),
                    "torch": lambda: prepacked(x)}
            seconds: dict[str, list[float]] = {side: [] for side in runs}
            for _ in range(rounds):
                for side, run in runs.items():
                    run()
                    started = time.perf_counter()
                    for _ in range(repeats):
                        run()
                    seconds[side].append((time.perf_counter() - started) / repeats)
            difference = float((y - torch.nn.functional.linear(x, weight, bias)).abs().max())
            assert difference < 1e-3, f"the kernel's product ({rows}, {n}, {k}) is off by {difference:.3g}"
            for side in runs:
                out[f"{side} {rows} {n} {k}"] = statistics.median(seconds[side])
    return out


def products_in_turns(rounds: int) -> dict[str, dict[str, float]]:
    """``products`` of this build and of the unchunked one, each in a process of its own, in turns."""
    flags = os.environ.get("ENCODERKIT_NATIVE_FLAGS", "")
    builds = {"chunked": flags, "unchunked": f"{flags} {UNCHUNKED}".strip()}
    seconds: dict[str, dict[str, list[float]]] = {build: {} for build in builds}
    for turn in range(rounds):
        for build in (list(builds) if turn % 2 == 0 else list(builds)[::-1]):
            done = subprocess.run([sys.executable, __file__, "--products"], capture_output=True, text=True, check=True,
                                  env={**os.environ, "ENCODERKIT_NATIVE_FLAGS": builds[build]})
            for key, value in json.loads(done.stdout.splitlines()[-1]).items():
                seconds[build].setdefault(key, []).append(value)
    return {build: {key: statistics.median(values) for key, values in by_key.items()}
            for build, by_key in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=smoke_size(5, 1))
    parser.add_argument("--products", action="store_true", help=argparse.SUPPRESS)  # a child: one build's products
    args = parser.parse_args()
    if args.products:
        print(json.dumps(products(3)))
        return
    import numpy as np
    import torch

    from encoderkit import Embedder, default_model_path, native

    lib = native.library()
    if lib is None:
        raise SystemExit(f"the native kernel is not available here: {native.status()}")
    lanes = lib.ek_vector_width()  # this build's entry of FP32_MAX_TOKENS and ATTENTION_MAX_LENGTHS
    bits = 32 * lanes
    limit = native.attention_max_length()
    product_seconds = products_in_turns(args.rounds)

    torch.set_num_threads(2)
    texts = require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:smoke_size(2000, 64)]
    ours = Embedder.from_pretrained(default_model_path(), dtype="fp32")
    theirs = Embedder.from_pretrained(default_model_path(), dtype="fp32")
    for embedder in (ours, theirs):
        embedder.encode(texts[:32])
    native.disable(theirs.engine.encoder)

    batches = {n: batch_of_length(ours.tokenizer, texts, n, BATCH_TOKENS) for n in LENGTHS}
    by_length: dict[tuple[int, int], dict[str, list[float]]] = {
        (threads, n): {"kernel": [], "pytorch": []} for threads in (1, 2) for n in LENGTHS}
    by_rule: dict[str, list[float]] = {"on": [], "off": []}
    vectors = {}
    own_cap = native.fp32_max_tokens()
    saved_caps, saved_limits = dict(native.FP32_MAX_TOKENS), dict(native.ATTENTION_MAX_LENGTHS)
    try:
        for turn in range(args.rounds):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for length, batch in batches.items():
                    for side, embedder in (("kernel", ours), ("pytorch", theirs)):
                        # the kernel at every length here; the PyTorch layers with their own attention limit
                        native.ATTENTION_MAX_LENGTHS.update(saved_limits)
                        if side == "kernel":
                            native.ATTENTION_MAX_LENGTHS[lanes] = max(LENGTHS)
                            native.FP32_MAX_TOKENS[lanes] = native.BATCH_MAX_TOKENS
                        embedder.encode_tokens(batch)  # warm
                        started = time.perf_counter()
                        embedder.encode_tokens(batch)
                        by_length[(threads, length)][side].append(time.perf_counter() - started)
            torch.set_num_threads(2)
            native.ATTENTION_MAX_LENGTHS.update(saved_limits)
            for rule in (("on", "off") if turn % 2 == 0 else ("off", "on")):
                native.FP32_MAX_TOKENS[lanes] = native.BATCH_MAX_TOKENS if rule == "on" else native.MAX_TOKENS
                started = time.perf_counter()
                vectors[rule] = ours.encode(texts, batch_size=32)
                by_rule[rule].append(time.perf_counter() - started)
    finally:
        native.FP32_MAX_TOKENS.update(saved_caps)
        native.ATTENTION_MAX_LENGTHS.update(saved_limits)
        torch.set_num_threads(2)
    assert native.kernel_of(ours.engine.encoder) is not None and native.kernel_of(theirs.engine.encoder) is None
    largest = float(np.abs(vectors["on"] - vectors["off"]).max())

    product_rows = []
    for rows in ROWS:
        for n, k in SHAPES:
            key = f"{rows} {n} {k}"
            flops = 2 * rows * n * k
            product_rows.append({"rows": rows, "n": n, "k": k, **{
                name: flops / seconds / 1e9 for name, seconds in (
                    ("chunked", product_seconds["chunked"][f"kernel {key}"]),
                    ("unchunked", product_seconds["unchunked"][f"kernel {key}"]),
                    ("torch", statistics.median([product_seconds[b][f"torch {key}"] for b in product_seconds])))}})
    rows = [{"threads": threads, "length": n, "sequences": len(batches[n]),
             "kernel_ms": 1e3 * statistics.median(by_length[(threads, n)]["kernel"]),
             "pytorch_ms": 1e3 * statistics.median(by_length[(threads, n)]["pytorch"])}
            for threads in (1, 2) for n in LENGTHS]
    on, off = statistics.median(by_rule["on"]), statistics.median(by_rule["off"])

    def summed(build: str, rows_: int) -> float:
        return sum(product_seconds[build][f"kernel {rows_} {n} {k}"] for n, k in SHAPES)

    chunk_ratio = summed("unchunked", max(ROWS)) / summed("chunked", max(ROWS))
    up_to = [r for r in rows if r["threads"] == 1 and r["length"] <= limit]
    taken = own_cap > native.MAX_TOKENS  # whether this build's kernel takes large fp32 batches
    chosen = on if taken else off
    goals = [{"goal": f"this build's cap ({own_cap} tokens: large batches {'on' if taken else 'off'}) within "
                      f"{TOLERANCE:.0%} of the faster of on and off end to end",
              "met": chosen <= min(on, off) * (1 + TOLERANCE),
              "measured": f"on (up to {native.BATCH_MAX_TOKENS}) {on:.2f} s, off (up to {native.MAX_TOKENS}) "
                          f"{off:.2f} s (off / on {off / on:.3f}x)"}]
    if taken:  # the batches this build gives the kernel
        goals.append({"goal": f"the kernel within {TOLERANCE:.0%} of the PyTorch layers or faster, on 1 thread (a "
                              f"lane), at every length up to this build's attention limit ({limit} tokens)",
                      "met": all(r["pytorch_ms"] * (1 + TOLERANCE) >= r["kernel_ms"] for r in up_to),
                      "measured": ", ".join(f"{r['length']}: {r['pytorch_ms'] / r['kernel_ms']:.2f}x"
                                            for r in up_to)})
    goals += [{"goal": f"the products in chunks of rows no slower than without chunks at {max(ROWS)} rows (the four "
                      "shapes summed)",
              "met": chunk_ratio >= 1.0, "measured": f"unchunked / chunked {chunk_ratio:.3f}x"}]
    for r in product_rows:
        print(f"product {r['rows']:5d} x ({r['n']}, {r['k']}): kernel {r['chunked']:6.1f} GFLOP/s (unchunked "
              f"{r['unchunked']:6.1f}), oneDNN {r['torch']:6.1f}")
    for r in rows:
        print(f"{r['threads']} thread(s), length {r['length']:4d} x {r['sequences']:3d}: kernel {r['kernel_ms']:7.1f} "
              f"ms, PyTorch layers {r['pytorch_ms']:7.1f} ms ({r['pytorch_ms'] / r['kernel_ms']:.2f}x)")
    print(f"end to end: up to {native.BATCH_MAX_TOKENS} tokens {on:.2f} s, up to {native.MAX_TOKENS} {off:.2f} s; "
          f"largest difference between their vectors {largest:.2e}")
    for goal in goals:
        print(f"goal: {goal['goal']}: {'met' if goal['met'] else 'NOT met'} ({goal['measured']})")
    write_result(f"kernel_batches_{bits}bit", {
        "bits": bits, "native": native.status(), "rounds": args.rounds, "texts": len(texts),
        "cap": native.BATCH_MAX_TOKENS, "own_cap": own_cap,
        "small": native.MAX_TOKENS, "limit": limit, "products": product_rows, "rows": rows,
        "end_to_end": {"on": by_rule["on"], "off": by_rule["off"]}, "largest_difference": largest, "goals": goals,
        "command": "python bench/kernel_batches.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")},
        benchmark="kernel_batches")


def render(r: dict[str, Any]) -> list[str]:
    from report import _table

    on, off = statistics.median(r["end_to_end"]["on"]), statistics.median(r["end_to_end"]["off"])
    lines = [f"### Which fp32 batches the native kernel takes whole, {r['bits']}-bit build (`bench/kernel_batches.py`)",
             "", f"all-MiniLM-L6-v2 in fp32, {r['rounds']} rounds in turns, medians. The kernel: {r['native']}.", "",
             "The products alone, 1 thread, GFLOP/s: the kernel's with rows in chunks (this build) and without, each "
             "build in a process of its own, against the PyTorch layers' (oneDNN's, weights packed once):", ""]
    lines += _table(["rows", "(N, K)", "kernel, chunks", "kernel, no chunks", "oneDNN"],
                    [[str(x["rows"]), f"({x['n']}, {x['k']})", f"{x['chunked']:.1f}", f"{x['unchunked']:.1f}",
                      f"{x['torch']:.1f}"] for x in r["products"]])
    lines += ["", "The encoder on packed batches of about 2,048 tokens, every sequence of one length: the whole-layer "
                  "kernel against the PyTorch layers:", ""]
    lines += _table(["threads", "sequence length", "sequences", "kernel ms", "PyTorch layers ms", "PyTorch / kernel"],
                    [[str(x["threads"]), str(x["length"]), str(x["sequences"]), f"{x['kernel_ms']:.1f}",
                      f"{x['pytorch_ms']:.1f}", f"{x['pytorch_ms'] / x['kernel_ms']:.2f}x"] for x in r["rows"]])
    lines += ["", f"The {r['texts']:,} texts of sentences.txt (`encode(batch_size=32)`, default lanes): the kernel "
                  f"taking batches up to {r['cap']:,} tokens (sequences up to {r['limit']}) took {on:.2f} s, up to "
                  f"{r['small']} tokens {off:.2f} s (**{off / on:.3f}x**); largest difference between their vectors "
                  f"{r['largest_difference']:.1e}. This build's cap: {r.get('own_cap', r['cap']):,} tokens.", ""]
    lines += [f"- {g['goal']}: **{'met' if g['met'] else 'not met'}** ({g['measured']})" for g in r["goals"]]
    return lines


if __name__ == "__main__":
    main()
