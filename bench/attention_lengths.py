"""Which batches the PyTorch layers' inference attention runs natively: ``native.attention_max_length()``, measured.

The native kernel's attention (``native.attention``: one call for a packed batch, each sequence and head in
registers) against the SDPA path it replaces (``SelfAttention.attend_groups``: one SDPA call per run of equal
lengths, written in place), all-MiniLM-L6-v2's shape (12 heads of 32):

- by length: the attention alone, on packed batches of about 2,048 tokens of sequences of L tokens (L = 16 to 1,024),
  each with a few lengths in it as the engine's sorted batches have (L, L - 1, L - 2, ... in runs: several SDPA
  calls), random q | k | v; on 1 thread (a lane of the default two) and on 2; in turns over the rounds, median
  seconds a batch;
- end to end: the 2,000 texts of ../shared/bench/sentences.txt as bench/peers.py embeds them
  (``encode(batch_size=32)``, the default lanes, fp32), with the native attention off (SDPA everywhere) and with its
  limit at 64, 128, 256 and 512 tokens, in turns over the rounds; median seconds. The default model truncates at
  256 tokens, so the last two take the same batches: the by-length rows decide between them. Batches of at most
  ``native.MAX_TOKENS`` tokens run the whole-layer kernel either way, whose attention is this one too; larger ones
  run the PyTorch layers here (``native.FP32_MAX_TOKENS`` set to ``MAX_TOKENS``), whose attention this measures.
  Which of them the whole kernel takes instead is bench/kernel_batches.py's measure.

Goals: the native attention faster end to end than SDPA everywhere; this build's limit within 2% of the fastest
limit measured end to end; and, by the attention alone, native no slower than SDPA at the limit (1 and 2 threads)
and slower at the next length measured on 1 thread (a lane). Written as bench/results/attention_lengths_<bits>.json,
by the native build's vectors (256 or 512 bits); an AVX2 tier is imitated on a bigger CPU with
``ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni' ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` (the result
records them).

    flock -x /tmp/bench.lock python bench/attention_lengths.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from common import SHARED, require, smoke_size, write_result

LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
LIMITS = (0, 64, 128, 256, 512)  # 0: off, SDPA everywhere
BATCH_TOKENS = 2048
HEADS, HEAD_DIM = 12, 32
TOLERANCE = 0.02


def batch_lengths(length: int) -> list[int]:
    """About BATCH_TOKENS tokens of sequences of ``length`` tokens and a little less, longest first: runs of equal
    lengths, as a sorted batch of real texts has."""
    count = max(1, BATCH_TOKENS // length)
    return sorted((max(1, length - (k * 4) // max(1, count)) for k in range(count)), reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=smoke_size(5, 1))
    args = parser.parse_args()
    import numpy as np
    import torch

    from encoderkit import Embedder, default_model_path, native
    from encoderkit.config import EncoderConfig
    from encoderkit.modeling.attention import AttentionContext, SelfAttention
    from encoderkit.modeling.packing import Packing

    lib = native.library()
    if lib is None:
        raise SystemExit(f"the native kernel is not available here: {native.status()}")
    lanes = lib.ek_vector_width()  # this build's entry of ATTENTION_MAX_LENGTHS
    bits = 32 * lanes
    texts = require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:smoke_size(2000, 64)]
    layer = SelfAttention(EncoderConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                        intermediate_size=4 * HEADS * HEAD_DIM)).eval()
    generator = torch.Generator().manual_seed(0)
    batches = {}
    for length in LENGTHS:
        lengths = batch_lengths(length)
        packing = Packing.from_lengths(np.array(lengths), overhead=0, mask_dtype=torch.float32)
        qkv = torch.randn(sum(lengths), 3 * HEADS * HEAD_DIM, generator=generator)
        batches[length] = (qkv, AttentionContext(packing), packing)
    threads_before, own = torch.get_num_threads(), native.attention_max_length()  # own: this build's limit
    by_length: dict[tuple[int, int], dict[str, list[float]]] = {
        (threads, n): {"native": [], "sdpa": []} for threads in (1, 2) for n in LENGTHS}
    with torch.inference_mode():
        try:
            native.ATTENTION_MAX_LENGTHS[lanes] = max(LENGTHS)  # the kernel at every length here (restored below)
            for length, (qkv, context, packing) in batches.items():  # the same numbers both ways, before any timing
                ours = native.attention(qkv, packing.cu_seqlens, HEADS, HEAD_DIM**-0.5, packing.max_length)
                difference = float((ours - layer.attend_groups(qkv, context)[0]).abs().max())
                assert difference < 1e-4, f"length {length}: native attention off SDPA's by {difference:.3g}"
            for _ in range(args.rounds):
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    for length, (qkv, context, packing) in batches.items():
                        runs = {"native": lambda q=qkv, p=packing: native.attention(
                                    q, p.cu_seqlens, HEADS, HEAD_DIM**-0.5, p.max_length),
                                "sdpa": lambda q=qkv, c=context: layer.attend_groups(q, c)}
                        for side, run in runs.items():
                            run()  # warm
                            repeats = max(1, 4096 // length)
                            started = time.perf_counter()
                            for _ in range(repeats):
                                run()
                            by_length[(threads, length)][side].append((time.perf_counter() - started) / repeats)
        finally:
            torch.set_num_threads(threads_before)
            native.ATTENTION_MAX_LENGTHS[lanes] = own

    embedder = Embedder.from_pretrained(default_model_path(), dtype="fp32")
    embedder.encode(texts[:64])
    measured = tuple(sorted(set(LIMITS) | {own}))  # this build's limit among them, whatever it is
    by_limit: dict[int, list[float]] = {n: [] for n in measured}
    vectors = {}
    cap, native.FP32_MAX_TOKENS[lanes] = native.fp32_max_tokens(), native.MAX_TOKENS  # PyTorch past MAX_TOKENS
    try:
        for turn in range(args.rounds):
            for limit in (measured if turn % 2 == 0 else measured[::-1]):
                native.ATTENTION_MAX_LENGTHS[lanes] = limit
                started = time.perf_counter()
                vectors[limit] = embedder.encode(texts, batch_size=32)
                by_limit[limit].append(time.perf_counter() - started)
    finally:
        native.ATTENTION_MAX_LENGTHS[lanes] = own
        native.FP32_MAX_TOKENS[lanes] = cap
    largest = max(float(np.abs(vectors[n] - vectors[0]).max()) for n in measured)
    rows = [{"threads": threads, "length": n, "sequences": len(batch_lengths(n)),
             "tokens": sum(batch_lengths(n)), "groups": len(batches[n][2].groups),
             "native_ms": 1e3 * statistics.median(by_length[(threads, n)]["native"]),
             "sdpa_ms": 1e3 * statistics.median(by_length[(threads, n)]["sdpa"])}
            for threads in (1, 2) for n in LENGTHS]
    limits = [{"limit": n, "seconds": statistics.median(by_limit[n]), "all": by_limit[n]} for n in measured]
    best = min(limits, key=lambda r: r["seconds"])
    current = next(r for r in limits if r["limit"] == own)
    off = next(r for r in limits if r["limit"] == 0)
    goals = [{"goal": "the native attention (this build's limit) faster end to end than SDPA everywhere",
              "met": current["seconds"] < off["seconds"],
              "measured": f"{current['seconds']:.2f} s against {off['seconds']:.2f} s "
                          f"({off['seconds'] / current['seconds']:.3f}x)"},
             {"goal": f"this build's limit ({own} tokens) within {TOLERANCE:.0%} of the fastest limit measured",
              "met": current["seconds"] <= best["seconds"] * (1 + TOLERANCE),
              "measured": f"{current['seconds']:.2f} s at {own} against {best['seconds']:.2f} s at "
                          f"{best['limit'] or 'off'} ({current['seconds'] / best['seconds']:.3f}x)"}]
    at = [r for r in rows if r["length"] == own]
    past = [r for r in rows if r["threads"] == 1 and r["length"] > own][:1]
    if at and past:  # the limit by the attention alone: native no slower at it, slower on a lane past it
        goals.append({"goal": f"the native attention at least as fast as SDPA at this build's limit ({own} tokens, "
                              f"1 and 2 threads) and slower at the next length measured ({past[0]['length']}, 1 "
                              "thread: a lane)",
                      "met": all(r["sdpa_ms"] >= r["native_ms"] for r in at)
                      and past[0]["sdpa_ms"] < past[0]["native_ms"],
                      "measured": ", ".join(f"{r['length']} tokens, {r['threads']} thread(s): SDPA / native "
                                            f"{r['sdpa_ms'] / r['native_ms']:.2f}x" for r in at + past)})
    for r in rows:
        print(f"{r['threads']} thread(s), length {r['length']:4d} x {r['sequences']:3d} ({r['groups']} runs): native "
              f"{r['native_ms']:7.2f} ms, SDPA {r['sdpa_ms']:7.2f} ms ({r['sdpa_ms'] / r['native_ms']:.2f}x)")
    for r in limits:
        print(f"limit {r['limit'] or 'off':>4}: {r['seconds']:.2f} s for {len(texts)} texts")
    print(f"largest difference between the limits' vectors: {largest:.2e}")
    for goal in goals:
        print(f"goal: {goal['goal']}: {'met' if goal['met'] else 'NOT met'} ({goal['measured']})")
    write_result(f"attention_lengths_{bits}bit", {
        "bits": bits, "native": native.status(), "rounds": args.rounds, "texts": len(texts), "limit": own,
        "rows": rows, "limits": limits, "largest_difference": largest, "goals": goals,
        "command": "python bench/attention_lengths.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")},
        benchmark="attention_lengths")


def render(r: dict[str, Any]) -> list[str]:
    from report import _table

    lines = [f"### Which batches take the native attention, {r['bits']}-bit build (`bench/attention_lengths.py`)", "",
             f"all-MiniLM-L6-v2's attention (12 heads of 32), {r['rounds']} rounds in turns, medians. The kernel: "
             f"{r['native']}.", "",
             "The attention alone, native (one call a batch) against SDPA (one call a run of equal lengths), on "
             "packed batches of about 2,048 tokens, the lengths in runs as in a sorted batch:", ""]
    lines += _table(["threads", "longest sequence", "sequences", "runs", "native ms", "SDPA ms", "SDPA / native"],
                    [[str(x["threads"]), str(x["length"]), str(x["sequences"]), str(x["groups"]),
                      f"{x['native_ms']:.2f}", f"{x['sdpa_ms']:.2f}", f"{x['sdpa_ms'] / x['native_ms']:.2f}x"]
                     for x in r["rows"]])
    lines += ["", f"The {r['texts']:,} texts of sentences.txt (`encode(batch_size=32)`, default lanes, fp32) with the "
                  f"native attention taking batches up to each longest sequence (this build's: {r['limit']}); "
                  f"largest difference between their vectors {r['largest_difference']:.1e}:", ""]
    lines += _table(["limit (tokens)", "seconds"],
                    [[str(x["limit"] or "off (SDPA)"), f"{x['seconds']:.2f}"] for x in r["limits"]])
    lines += [""] + [f"- {g['goal']}: **{'met' if g['met'] else 'not met'}** ({g['measured']})" for g in r["goals"]]
    return lines


if __name__ == "__main__":
    main()
