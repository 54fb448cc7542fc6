"""Embedding speed before and after a refactor, measured in the same run.

``Embedder.from_pretrained().encode(sentences)`` (the default model, all-MiniLM-L6-v2) on the 2,000 texts of
../shared/bench/sentences.txt, in fp32 and bf16, 2 threads, for two versions of the package: BEFORE (by default
commit 8ef4bb8, the last with ``modeling.fast.FastEncoder``, checked out by this script into a temporary
``git worktree`` that it removes afterwards) and AFTER (this checkout's src/).

Two versions of a package cannot live in one process, so each runs in its own long-lived worker subprocess
(PYTHONPATH=<its src>) that loads the models once, warms up, and then times one full encode per request. The
parent interleaves the requests ABBA (before, after, after, before) in every repeat, so a drift in machine speed
hits both alike. Reported: texts/s (median), the per-repeat speed ratio after/before (> 1: after is faster) and
its median, and the max |difference| between the two versions' vectors. With ``--latency-calls N`` (> 0), each
repeat also times N single-text calls (``encode`` of one short text, the serving case; bench/peers.py's 5 short
texts in turn) in the same ABBA order: their p50 in ms.

``--model`` and ``--shared`` name the model directory and the shared folder where the defaults are absent (a
borrowed machine; a model carried with fp16 weights is widened to fp32 first, ``common.widened``); ``--result``
the file under bench/results/ (default refactor_speed.json), so that a run on another CPU does not replace this
one's. ``--texts wikitext`` embeds long paragraphs instead (``TEXTS``): with a model that reads past 256 tokens
(all-mpnet-base-v2: 384), their int8 batches run the PyTorch int8 layers, not the native kernel.

The machine is shared: run it alone, e.g. ``flock /tmp/bench.lock python bench/refactor_speed.py``.

    python bench/refactor_speed.py [--repeats 5] [--before-rev 8ef4bb8 | --before-src DIR] [--after-src DIR]
        [--model DIR] [--shared DIR] [--texts sentences | wikitext] [--latency-calls 0] [--result refactor_speed]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni")
DTYPES = ("fp32", "bf16", "int8")
GOAL = 0.98  # issue 41: after at least 0.98x of before, each measure, in one interleaved run
ABBA = ("before", "after", "after", "before")  # each repeat's order of requests


# ---------------------------------------------------------------------------------------------
# Worker: one version of the package, its models loaded once
# ---------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """Replies on the original stdout, one JSON line per request; everything else goes to stderr."""
    import gc
    import logging
    import time

    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    import encoderkit
    from encoderkit import Embedder

    sentences = Path(args.sentences).read_text(encoding="utf-8").splitlines()
    embedders = {dtype: Embedder.from_pretrained(args.model, dtype=dtype) for dtype in args.dtypes}
    from peers import short_texts

    short = short_texts(sentences)
    info: dict[str, Any] = {"encoderkit": str(Path(encoderkit.__file__).resolve().parent), "dtypes": {}}
    for dtype, embedder in embedders.items():
        vectors = embedder.encode(sentences)  # warm-up; also the vectors compared between versions
        logging.getLogger("encoderkit").setLevel(logging.ERROR)  # the truncation warning: once is enough
        for _ in range(args.warmup - 1):
            embedder.encode(sentences)
        path = Path(args.vectors) / f"{dtype}.npy"
        np.save(path, vectors)
        info["dtypes"][dtype] = {"vectors": str(path), "token_budget": int(embedder.token_budget),
                                 "compute_dtype": str(embedder.dtype)}
    if args.finetune_rows:
        info["finetune_step_seconds"] = finetune_step(args)  # warm-up; also checks that it runs
    reply.write(json.dumps(info) + "\n")
    for line in sys.stdin:
        request = line.strip()
        if request == "quit":
            break
        gc.collect()
        if request == "finetune":
            reply.write(json.dumps({"seconds": finetune_step(args)}) + "\n")
            continue
        if request.startswith("latency "):  # single-text calls: their seconds each
            embedder, seconds = embedders[request.split()[1]], []
            for i in range(3 + args.latency_calls):
                start = time.perf_counter()
                embedder.encode(short[i % len(short)])
                seconds.append(time.perf_counter() - start)
            reply.write(json.dumps({"seconds": seconds[3:]}) + "\n")
            continue
        start = time.perf_counter()
        embedders[request].encode(sentences)
        reply.write(json.dumps({"seconds": time.perf_counter() - start}) + "\n")


def finetune_step(args: argparse.Namespace) -> float:
    """Seconds per training step of one fine-tuning run on the SST-2 rows the parent wrote into ``args.sst2`` (the
    API both versions share: ``finetune(task, train, out_dir, valid=, model=, recipe=)``)."""
    from encoderkit.training.finetune import Recipe, finetune

    train, valid = Path(args.sst2) / "train.tsv", Path(args.sst2) / "valid.tsv"  # written once by the parent
    with tempfile.TemporaryDirectory(prefix="refactor-finetune-") as work:
        recipe = Recipe(epochs=1, batch_size=32, max_length=64, group_by_length=False, show_progress=False,
                        save_steps=10**9, seed=42)
        result = finetune("classify", train, Path(work) / "out", valid=valid, model=args.model, recipe=recipe)
    return recipe.batch_size / result.examples_per_second


class Worker:
    def __init__(self, label: str, src: Path, args: argparse.Namespace, sentences: Path, vectors: Path) -> None:
        vectors.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(args.threads),
               "MKL_NUM_THREADS": str(args.threads)}
        self.label, self.src = label, src
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--sentences", str(sentences), "--vectors", str(vectors),
             "--threads", str(args.threads), "--warmup", str(args.warmup), "--dtypes", *args.dtypes,
             "--latency-calls", str(args.latency_calls), "--finetune-rows", str(args.finetune_rows),
             "--sst2", str(args.sst2), *(["--model", args.model] if args.model else [])],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._read()
        if Path(self.info["encoderkit"]) != (src / "encoderkit").resolve():
            sys.exit(f"{label}: the worker imported {self.info['encoderkit']}, not {src / 'encoderkit'}")

    def _read(self) -> dict[str, Any]:
        line = self.process.stdout.readline()
        if not line:
            sys.exit(f"the {self.label} worker ({self.src}) stopped (exit {self.process.wait()}); see its stderr above")
        return json.loads(line)

    def time(self, dtype: str) -> float:
        self.process.stdin.write(dtype + "\n")
        return float(self._read()["seconds"])

    def finetune(self) -> float:
        self.process.stdin.write("finetune\n")
        return float(self._read()["seconds"])

    def latency(self, dtype: str) -> list[float]:
        self.process.stdin.write(f"latency {dtype}\n")
        return [float(x) for x in self._read()["seconds"]]

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            self.process.wait(timeout=60)


# ---------------------------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------------------------
def git(*args: str) -> str:
    from common import ROOT

    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def before_source(args: argparse.Namespace) -> Iterator[Path]:
    """``--before-src``, or the src/ of a temporary detached worktree of ``--before-rev``, removed afterwards."""
    if args.before_src:
        yield Path(args.before_src).resolve()
        return
    tree = Path(tempfile.mkdtemp(prefix="encoderkit-before-")) / "tree"
    git("worktree", "add", "--detach", str(tree), args.before_rev)
    try:
        yield tree / "src"
    finally:
        git("worktree", "remove", "--force", str(tree))
        tree.parent.rmdir()


# --texts: what each choice embeds, and the file under the shared folder it reads
TEXTS = {"sentences": ("the 2,000 texts of `../shared/bench/sentences.txt`", "bench/sentences.txt"),
         "wikitext": ("the first 300 paragraphs of at least 1,000 characters of WikiText-2's test split "
                      "(`../shared/data/wikitext2_raw/wiki.test.raw`): long texts, most past 256 tokens",
                      "data/wikitext2_raw/wiki.test.raw")}


def paragraphs(raw: Path, scratch: Path, count: int = 300, least: int = 1000) -> Path:
    """The first ``count`` lines of WikiText's ``raw`` text of at least ``least`` characters (its paragraphs; its
    headings are short lines), one a line in a file in ``scratch`` (the workers read a file)."""
    lines = [line.strip() for line in raw.read_text(encoding="utf-8").splitlines() if len(line.strip()) >= least]
    out = scratch / "paragraphs.txt"
    out.write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    return out


def first_lines(sentences: Path, scratch: Path) -> Path:
    """``sentences``, or in a smoke run a copy of its first 16 lines in ``scratch`` (the workers read a file)."""
    from common import SMOKE

    if not SMOKE:
        return sentences
    copy = scratch / "sentences.txt"
    copy.write_text("\n".join(sentences.read_text(encoding="utf-8").splitlines()[:16]) + "\n", encoding="utf-8")
    return copy


def sst2_files(train: Path, rows: int, scratch: Path) -> Path:
    """``scratch`` holding train.tsv (the header and the first ``rows`` rows of SST-2's train.tsv) and valid.tsv (its
    last 64): the fine-tuning data both versions read."""
    lines = train.read_text(encoding="utf-8").splitlines()
    (scratch / "train.tsv").write_text("\n".join(lines[:1 + rows]) + "\n", encoding="utf-8")
    (scratch / "valid.tsv").write_text("\n".join(lines[:1] + lines[-64:]) + "\n", encoding="utf-8")
    return scratch


def cpu_flags() -> dict[str, bool]:
    present: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                break
    return {flag: flag in present for flag in FLAGS}


def print_rows(rows: list[dict[str, Any]], latency: bool) -> None:
    """Per dtype: texts/s before and after, their ratio (the median, and each repeat's), the vectors' largest
    difference; with ``latency``, the single-text p50s."""
    print(f"{'dtype':5s} {'before t/s':>10s} {'after t/s':>10s} {'after/before':>12s} {'per repeat':>32s} "
          f"{'max|diff|':>9s}")
    for row in rows:
        print(f"{row['dtype']:5s} {row['before_texts_per_second']:10.0f} {row['after_texts_per_second']:10.0f} "
              f"{row['median_ratio']:11.3f}x {' '.join(f'{r:.3f}' for r in row['ratios_after_over_before']):>32s} "
              f"{row['max_abs_diff']:9.1e}")
        if latency:
            print(f"      single text p50: before {row['before_single_text_p50_ms']:.2f} ms, after "
                  f"{row['after_single_text_p50_ms']:.2f} ms")


def verdicts(rows: list[dict[str, Any]], finetune: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each measure's goal: after at least ``GOAL`` x before (texts/s; single-text p50 as before / after; step time
    as before / after), judged on the median ratio of the interleaved repeats (p50s: on their ratio)."""
    goals = []
    for row in rows:
        goals.append({"goal": f"{row['dtype']} texts/s after at least {GOAL}x before",
                      "measured": f"{row['median_ratio']:.3f}x", "met": row["median_ratio"] >= GOAL})
        if "after_single_text_p50_ms" in row:
            ratio = row["before_single_text_p50_ms"] / row["after_single_text_p50_ms"]
            goals.append({"goal": f"{row['dtype']} single-text speed (1 / p50) after at least {GOAL}x before",
                          "measured": f"{row['after_single_text_p50_ms']:.2f} against {row['before_single_text_p50_ms']:.2f} "
                                      f"ms ({ratio:.3f}x)", "met": ratio >= GOAL})
    if finetune:
        goals.append({"goal": f"fine-tuning step speed after at least {GOAL}x before",
                      "measured": f"{finetune['after_step_ms']:.0f} against {finetune['before_step_ms']:.0f} ms a step "
                                  f"({finetune['median_ratio']:.3f}x)", "met": finetune["median_ratio"] >= GOAL})
    return goals


def arguments() -> argparse.Namespace:
    """The command line (the parent's, or a worker's: ``--worker`` and its hidden options)."""
    from common import smoke_size

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=smoke_size(5, 1), help="ABBA rounds per dtype (default 5)")
    parser.add_argument("--before-rev", default="8ef4bb8", help="the commit measured as BEFORE (default 8ef4bb8)")
    parser.add_argument("--before-src", help="an existing src/ directory to measure as BEFORE instead of --before-rev")
    parser.add_argument("--after-src", help="the src/ directory measured as AFTER (default: this checkout's)")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=DTYPES,
                        help="default fp32 bf16 (int8 needs a BEFORE with int8: 991af94 on)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=smoke_size(2, 1),
                        help="untimed encodes per model before timing")
    parser.add_argument("--latency-calls", type=int, default=0,
                        help="single-text calls per version, dtype and repeat (0: no latency)")
    parser.add_argument("--finetune-rows", type=int, default=0,
                        help="SST-2 rows of one timed fine-tuning run per version and repeat (0: none)")
    parser.add_argument("--model", help="the model directory (default: the default model)")
    parser.add_argument("--shared", help="the shared folder holding bench/sentences.txt (default: ../shared)")
    parser.add_argument("--texts", choices=sorted(TEXTS), default="sentences",
                        help="what to embed: " + "; ".join(f"{k}: {v[0]}" for k, v in sorted(TEXTS.items())))
    parser.add_argument("--result", default="refactor_speed", help="bench/results/<RESULT>.json")
    parser.add_argument("--revisions", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="the commits to record, where the src/ directories are not git checkouts")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sentences", help=argparse.SUPPRESS)
    parser.add_argument("--vectors", help=argparse.SUPPRESS)
    parser.add_argument("--sst2", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    if args.worker:
        worker(args)
        return

    import numpy as np
    import torch

    from common import (ROOT, SHARED, median, refuse_unfaithful_imitation, require, source_revision, widened,
                        write_result)

    refuse_unfaithful_imitation()

    torch.set_num_threads(args.threads)  # what write_result records as the machine's threads
    shared = Path(args.shared) if args.shared else SHARED
    sentences = require(shared / TEXTS[args.texts][1])
    sst2 = require(shared / "data" / "sst2" / "train.tsv") if args.finetune_rows else None
    steps: dict[str, list[float]] = {"before": [], "after": []}
    step_ratios: list[float] = []
    after_src = Path(args.after_src).resolve() if args.after_src else ROOT / "src"
    sys.path.insert(0, str(after_src))  # the package write_result asks about the machine
    times: dict[str, dict[str, list[float]]] = {d: {"before": [], "after": []} for d in args.dtypes}
    ratios: dict[str, list[float]] = {d: [] for d in args.dtypes}
    single: dict[str, dict[str, list[float]]] = {d: {"before": [], "after": []} for d in args.dtypes}
    with before_source(args) as before_src, tempfile.TemporaryDirectory(prefix="refactor-speed-") as scratch:
        if args.model:
            args.model = str(widened(Path(args.model), Path(scratch)))
        sentences = first_lines(paragraphs(sentences, Path(scratch)) if args.texts == "wikitext" else sentences,
                                Path(scratch))
        args.sst2 = sst2_files(sst2, args.finetune_rows, Path(scratch)) if sst2 else ""
        texts = len(sentences.read_text(encoding="utf-8").splitlines())
        sources = {"before": before_src, "after": after_src}
        revisions = dict(zip(sources, args.revisions)) if args.revisions else \
            {label: source_revision(src) for label, src in sources.items()}
        workers: dict[str, Worker] = {}
        try:
            for label, src in sources.items():
                print(f"{label}: {src} ({revisions[label]}) loading and warming up ...", flush=True)
                workers[label] = Worker(label, src, args, sentences, Path(scratch) / label)
            for repeat in range(args.repeats):
                for dtype in args.dtypes:
                    seconds = {"before": [], "after": []}
                    for label in ABBA:
                        seconds[label].append(workers[label].time(dtype))
                    for label, values in seconds.items():
                        times[dtype][label] += values
                    ratios[dtype].append(sum(seconds["before"]) / sum(seconds["after"]))
                    if args.latency_calls:
                        for label in ABBA:
                            single[dtype][label] += workers[label].latency(dtype)
                    print(f"repeat {repeat + 1} {dtype}: before " + ", ".join(f"{s:.2f}s" for s in seconds["before"])
                          + "; after " + ", ".join(f"{s:.2f}s" for s in seconds["after"])
                          + f"; speed after/before {ratios[dtype][-1]:.3f}", flush=True)
                if args.finetune_rows:
                    step = {"before": [], "after": []}
                    for label in ABBA:
                        step[label].append(workers[label].finetune())
                    for label, values in step.items():
                        steps[label] += values
                    step_ratios.append(sum(step["before"]) / sum(step["after"]))
                    print(f"repeat {repeat + 1} fine-tuning step: before {median(step['before']) * 1e3:.0f} ms, after "
                          f"{median(step['after']) * 1e3:.0f} ms; speed after/before {step_ratios[-1]:.3f}", flush=True)
        finally:
            for w in workers.values():
                w.close()
        vectors = {label: {d: np.load(w.info["dtypes"][d]["vectors"]) for d in args.dtypes}
                   for label, w in workers.items()}
    rows = []
    for dtype in args.dtypes:
        before_info, after_info = (workers[label].info["dtypes"][dtype] for label in ("before", "after"))
        rows.append({
            "dtype": dtype,
            "before_texts_per_second": texts / median(times[dtype]["before"]),
            "after_texts_per_second": texts / median(times[dtype]["after"]),
            "before_seconds": times[dtype]["before"], "after_seconds": times[dtype]["after"],
            "ratios_after_over_before": ratios[dtype], "median_ratio": median(ratios[dtype]),
            "max_abs_diff": float(np.abs(vectors["before"][dtype] - vectors["after"][dtype]).max()),
            "before_token_budget": before_info["token_budget"], "after_token_budget": after_info["token_budget"],
        })
        if args.latency_calls:
            rows[-1].update({f"{label}_single_text_p50_ms": 1e3 * median(single[dtype][label])
                             for label in ("before", "after")})
    finetune = None if not args.finetune_rows else {
        "rows": args.finetune_rows, "before_step_ms": 1e3 * median(steps["before"]),
        "after_step_ms": 1e3 * median(steps["after"]), "ratios_after_over_before": step_ratios,
        "median_ratio": median(step_ratios)}
    goals = verdicts(rows, finetune)
    flags = cpu_flags()
    print(f"\n{texts} texts, {args.threads} threads; before {revisions['before']}, after {revisions['after']}")
    print("CPU flags: " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in flags.items()))
    print_rows(rows, bool(args.latency_calls))
    if finetune:
        print(f"fine-tuning step: before {finetune['before_step_ms']:.0f} ms, after {finetune['after_step_ms']:.0f} "
              f"ms, after/before {finetune['median_ratio']:.3f}x")
    for goal in goals:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'NOT MET'}")
    write_result(args.result, {
        "texts": texts, "text_source": TEXTS[args.texts][0], "repeats": args.repeats, "order": "ABBA (before, after, after, before) per repeat and dtype",
        "before": {"revision": revisions["before"], "rev_argument": None if args.before_src else args.before_rev},
        "after": {"revision": revisions["after"]}, "cpu_flags": flags, "rows": rows,
        "latency_calls": args.latency_calls, "finetune": finetune, "goals": goals, "command": "python bench/refactor_speed.py " + " ".join(sys.argv[1:]),
    }, benchmark="refactor_speed")


if __name__ == "__main__":
    main()
