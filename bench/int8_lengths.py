"""Which int8 batches the native kernel takes: the longest sequence it runs (``native.int8_max_length``), measured.

The kernel of this CPU (its int8 products: exact 8-bit sums with VNNI, or pairs of products summed in 16 bits on
AVX2 and AVX512BW) against PyTorch's int8 kernels, all-MiniLM-L6-v2 in int8 (``Embedder(dtype="int8")``):

- by length: batches of 2,048 tokens of sequences of L tokens (L = 32, 64, 128, 256; token ids cut from
  ../shared/bench/sentences.txt), once on the kernel and once on PyTorch's int8 kernels (``native.disable``), in
  turns over the rounds; median seconds a batch;
- the 2,000 texts of sentences.txt as bench/peers.py embeds them (``encode(batch_size=32)``, the default lanes), with
  the limit at each of 64, 128 and 256 tokens, in turns over the rounds; median seconds.

The goal: this tier's limit (``INT8_MAX_LENGTHS``) is within 2% of the fastest limit measured. Written as
bench/results/int8_lengths_<tier>.json (``vnni``, ``vnni_256bit``: AVX-VNNI without AVX-512, or ``pair_sums``). On a CPU
with VNNI the pair-sum tier can be imitated with ``ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni'
ONEDNN_MAX_CPU_ISA=AVX2``: the kernel is then built for 256-bit vectors without VNNI, and PyTorch's int8 products run
oneDNN's AVX2 kernels with 7-bit weight codes, as on an AVX2 CPU; caches and clocks stay the bigger CPU's, and the
result says it was imitated. On a CPU with AVX-VNNI, the tier of such CPUs without AVX-512 is imitated with
``ENCODERKIT_NATIVE_FLAGS=-mno-avx512f ONEDNN_MAX_CPU_ISA=AVX2_VNNI`` (``vnni_256bit``).

    flock -x /tmp/bench.lock python bench/int8_lengths.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from common import SHARED, batch_of_length, refuse_unfaithful_imitation, require, smoke_size, write_result

LENGTHS = (32, 64, 128, 256)
LIMITS = (64, 128, 256)
BATCH_TOKENS = 2048
TOLERANCE = 0.02


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=smoke_size(5, 1))
    args = parser.parse_args()
    refuse_unfaithful_imitation(vnni_tier=True)
    import torch

    from encoderkit import Embedder, default_model_path, native
    from encoderkit.precision import EXACT_WEIGHT_LEVELS, PAIR_SUM_WEIGHT_LEVELS

    torch.set_num_threads(2)
    texts = require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:smoke_size(2000, 64)]
    limit_now = native.int8_max_length()
    key = native.int8_weight_limit()  # this tier's entry of INT8_MAX_LENGTHS
    tier = {EXACT_WEIGHT_LEVELS: "vnni", PAIR_SUM_WEIGHT_LEVELS: "pair_sums"}.get(key)
    if tier is None:
        raise SystemExit(f"the kernel has no int8 products here: {native.status()}")
    if tier == "vnni" and native.library().ek_vector_width() == 8:  # AVX-VNNI: the same limit, other vectors
        tier = "vnni_256bit"
    ours = Embedder.from_pretrained(default_model_path(), dtype="int8")
    theirs = Embedder.from_pretrained(default_model_path(), dtype="int8")
    for embedder in (ours, theirs):  # the guard's calibration, the kernel's plan
        embedder.encode(texts[:32])
    native.disable(theirs.engine.encoder)

    by_length: dict[int, dict[str, list[float]]] = {n: {"kernel": [], "pytorch": []} for n in LENGTHS}
    by_limit: dict[int, list[float]] = {n: [] for n in LIMITS}
    saved = dict(native.INT8_MAX_LENGTHS)
    try:
        for _ in range(args.rounds):
            native.INT8_MAX_LENGTHS[key] = max(LENGTHS)
            for length in LENGTHS:
                batch = batch_of_length(ours.tokenizer, texts, length, BATCH_TOKENS)
                for side, embedder in (("kernel", ours), ("pytorch", theirs)):
                    embedder.encode_tokens(batch)  # warm
                    started = time.perf_counter()
                    embedder.encode_tokens(batch)
                    by_length[length][side].append(time.perf_counter() - started)
            for limit in LIMITS:
                native.INT8_MAX_LENGTHS[key] = limit
                started = time.perf_counter()
                ours.encode(texts, batch_size=32)
                by_limit[limit].append(time.perf_counter() - started)
    finally:
        native.INT8_MAX_LENGTHS.update(saved)
    assert native.kernel_of(ours.engine.encoder) is not None and native.kernel_of(theirs.engine.encoder) is None
    rows = [{"length": n, "sequences": BATCH_TOKENS // n,
             "kernel_ms": 1e3 * statistics.median(by_length[n]["kernel"]),
             "pytorch_ms": 1e3 * statistics.median(by_length[n]["pytorch"])} for n in LENGTHS]
    limits = [{"limit": n, "seconds": statistics.median(by_limit[n]), "all": by_limit[n]} for n in LIMITS]
    best = min(limits, key=lambda r: r["seconds"])
    current = next(r for r in limits if r["limit"] == limit_now)
    ratio = current["seconds"] / best["seconds"]
    goal = {"goal": f"this tier's limit ({limit_now} tokens) within {TOLERANCE:.0%} of the fastest limit measured",
            "met": ratio <= 1 + TOLERANCE, "measured": f"{current['seconds']:.2f} s at {limit_now} against "
            f"{best['seconds']:.2f} s at {best['limit']} ({ratio:.3f}x)"}
    imitated = "-mno-avx512f" in os.environ.get("ENCODERKIT_NATIVE_FLAGS", "")
    for r in rows:
        print(f"length {r['length']:4d} x {r['sequences']:3d}: kernel {r['kernel_ms']:7.1f} ms, PyTorch "
              f"{r['pytorch_ms']:7.1f} ms ({r['pytorch_ms'] / r['kernel_ms']:.2f}x)")
    for r in limits:
        print(f"limit {r['limit']:4d}: {r['seconds']:.2f} s for {len(texts)} texts")
    print(f"goal: {goal['goal']}: {'met' if goal['met'] else 'NOT met'} ({goal['measured']})")
    write_result(f"int8_lengths_{tier}", {
        "tier": tier, "native": native.status(), "imitated": imitated, "rounds": args.rounds, "texts": len(texts),
        "limit": limit_now, "rows": rows, "limits": limits, "goals": [goal],
        "command": "python bench/int8_lengths.py" + (f" --rounds {args.rounds}" if args.rounds != 5 else "")},
        benchmark="int8_lengths")


IMITATED = (" **Imitated tier**: the kernel built for 256-bit vectors without VNNI, and PyTorch's int8 products held "
            "to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`: 7-bit weight codes, as on an AVX2 CPU; with 8-bit codes the kernel "
            "would not take these batches); the rest, caches and clocks, is the bigger CPU's.")


IMITATED_VNNI = (" **Imitated tier**: the kernel built for 256-bit vectors with AVX-VNNI, and PyTorch's int8 products "
                 "held to the same instructions (`ONEDNN_MAX_CPU_ISA=AVX2_VNNI`); the rest, caches and clocks, is "
                 "the bigger CPU's.")


def render(r: dict[str, Any]) -> list[str]:
    from report import _table

    tier = {"vnni": "exact 8-bit sums (VNNI)", "vnni_256bit": "exact 8-bit sums on 256-bit vectors (AVX-VNNI)",
            "pair_sums": "pairs of products summed in 16 bits"}[r["tier"]]
    lines = [f"### Which int8 batches the native kernel takes, {tier} (`bench/int8_lengths.py`)", "",
             f"all-MiniLM-L6-v2 in int8, 2 threads, {r['rounds']} rounds in turns, medians. The kernel: "
             f"{r['native']}." + ((IMITATED_VNNI if r["tier"] == "vnni_256bit" else IMITATED) if r["imitated"]
                                  else ""),
             "", "Batches of 2,048 tokens, every sequence of one length:", ""]
    lines += _table(["sequence length", "sequences", "kernel ms", "PyTorch int8 ms", "PyTorch / kernel"],
                    [[str(x["length"]), str(x["sequences"]), f"{x['kernel_ms']:.1f}", f"{x['pytorch_ms']:.1f}",
                      f"{x['pytorch_ms'] / x['kernel_ms']:.2f}x"] for x in r["rows"]])
    lines += ["", f"The {r['texts']:,} texts of sentences.txt (`encode(batch_size=32)`, default lanes) with the "
                  f"kernel taking sequences up to each limit (this tier's: {r['limit']}):", ""]
    lines += _table(["limit (tokens)", "seconds"], [[str(x["limit"]), f"{x['seconds']:.2f}"] for x in r["limits"]])
    lines += [""] + [f"- {g['goal']}: **{'met' if g['met'] else 'not met'}** ({g['measured']})" for g in r["goals"]]
    return lines


if __name__ == "__main__":
    main()
