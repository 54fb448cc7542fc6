"""Single-text latency on a machine whose cores other processes also want (a shared server, a CI runner).

Why: the native kernel synchronises its OpenMP team at many barriers a layer, so a thread the OS deschedules stalls
the whole team. Beside busy processes, encoderkit's two-thread single-text p50 went from about 2 ms to tens or
hundreds (bench/peers.py's discarded loaded run, issue 39's note). ``encoderkit.native.team`` now picks the team
size by measuring calls. This script measures it: the default model (all-MiniLM-L6-v2), fp32, one short text a call
(bench/peers.py's short texts, in turn), in two conditions:

- quiet: nothing else running;
- busy: as many busy-looping processes at the same priority as there are cores.

Contenders, each in a process of its own, taking turns round by round (the order rotated each round):
- ``encoderkit``: the default, 2 torch threads, the team size chosen by measurement;
- ``encoderkit-fixed-team``: 2 threads, the team always whole (``TeamSize.pick`` held at the caller's count: the
  kernel before ``native.team``);
- ``encoderkit-1-thread``: 1 torch thread;
- ``onnxruntime``: bench/peers.py's ONNX Runtime O3 graph and session, 2 intra-op threads: the fp32 peer with the
  lowest single-text p50 there (skipped with a reason where onnxruntime is not installed).

Reported per condition and contender: p50, p90 and p99 over every round's calls. Goals, each printed met or not:
busy, encoderkit's p50 at most 1.25x its one-thread p50 (no collapse) and no worse than ONNX Runtime's; quiet,
encoderkit's p50 at most 1.05x the fixed team's (measuring costs little).

    flock -x /tmp/bench.lock python bench/latency_contention.py [--calls 200] [--rounds 3] [--busy N] [--smoke]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from common import SHARED, require, rotated, smoke_size, write_result

CONTENDERS = ("encoderkit", "encoderkit-fixed-team", "encoderkit-1-thread", "onnxruntime")
BUSY = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def worker(name: str, texts: list[str], calls: int, onnx_path: str) -> list[float]:
    """Seconds of each of ``calls`` single-text calls of ``name`` (after 20 untimed ones), in this process."""
    import torch

    torch.set_num_threads(1 if name == "encoderkit-1-thread" else 2)
    if name == "onnxruntime":
        encode = onnx_encoder(onnx_path)
    else:
        from encoderkit import Embedder

        if name == "encoderkit-fixed-team":
            from encoderkit.native.team import TeamSize

            TeamSize.pick = lambda self, tokens, wanted: wanted  # the whole team, every call
        embedder = Embedder.from_pretrained(dtype="fp32")
        encode = embedder.encode
    for i in range(20):
        encode(texts[i % len(texts)])
    seconds = []
    for i in range(calls):
        start = time.perf_counter()
        encode(texts[i % len(texts)])
        seconds.append(time.perf_counter() - start)
    return seconds


def onnx_encoder(onnx_path: str):
    """One text -> its vector on ONNX Runtime: bench/peers.py's contender on its O3 graph (the BERT optimizer's
    fusions, GELU approximated), session (2 intra-op threads, sequential), tokenizer and pooling."""
    from encoderkit import default_model_path
    from peers import PeerTokenizer, ort_contender

    return ort_contender("ONNX Runtime O3", "fp32", Path(onnx_path), PeerTokenizer(default_model_path()), "").one


def export_onnx() -> str | None:
    """bench/peers.py's O3 graph of the default model (made once, cached), or None (why is printed) where
    onnxruntime is not installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        print(f"onnxruntime: not run ({exc})")
        return None
    from encoderkit import default_model_path
    from peers import export_onnx as export, optimize_onnx

    return str(optimize_onnx(export(default_model_path()), gelu_approximation=True))


@contextlib.contextmanager
def busy_processes(count: int, seconds: float) -> Iterator[None]:
    """``count`` processes busy-looping at this process's priority for at most ``seconds``, stopped on leaving."""
    processes = [subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=seconds)]) for _ in range(count)]
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in processes:
            p.kill()
            p.wait()


def run_one(name: str, texts_file: Path, calls: int, onnx_path: str) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1" if name == "encoderkit-1-thread" else "2"}
    out = subprocess.run([sys.executable, __file__, "--worker", name, "--texts-file", str(texts_file),
                          "--calls", str(calls), "--onnx-path", onnx_path], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{name} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ms(seconds: list[float], q: float) -> float:
    """The ``q``th percentile of ``seconds``, in milliseconds."""
    return 1e3 * float(np.percentile(seconds, q))


def verdicts(rows: dict[str, dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    goals = []
    busy, quiet = rows.get("busy", {}), rows.get("quiet", {})
    ours = busy.get("encoderkit", {}).get("p50_ms")
    if ours is not None:
        one = busy["encoderkit-1-thread"]["p50_ms"]
        goals.append({"goal": "busy: encoderkit's single-text p50 at most 1.25x its one-thread p50",
                      "measured": f"{ours:.2f} against {one:.2f} ms ({ours / one:.2f}x)", "met": ours <= 1.25 * one})
        if "onnxruntime" in busy:
            peer = busy["onnxruntime"]["p50_ms"]
            goals.append({"goal": "busy: encoderkit's single-text p50 no worse than ONNX Runtime's",
                          "measured": f"{ours:.2f} against {peer:.2f} ms", "met": ours <= peer})
    if "encoderkit" in quiet:
        ours, fixed = quiet["encoderkit"]["p50_ms"], quiet["encoderkit-fixed-team"]["p50_ms"]
        goals.append({"goal": "quiet: encoderkit's single-text p50 at most 1.05x the fixed whole team's",
                      "measured": f"{ours:.2f} against {fixed:.2f} ms ({ours / fixed:.2f}x)", "met": ours <= 1.05 * fixed})
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=smoke_size(200, 10), help="timed calls per contender and round")
    parser.add_argument("--rounds", type=int, default=smoke_size(3, 1))
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes (default: the cores)")
    parser.add_argument("--smoke", action="store_true", help="10 calls, one round (a test)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--texts-file", help=argparse.SUPPRESS)
    parser.add_argument("--onnx-path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        texts = Path(args.texts_file).read_text(encoding="utf-8").splitlines()
        print(json.dumps(worker(args.worker, texts, args.calls, args.onnx_path)))
        return
    if args.smoke:
        args.calls, args.rounds = 10, 1
    from peers import short_texts

    sentences = require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    seconds: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="latency-contention-") as work:
        texts_file = Path(work) / "texts.txt"
        texts_file.write_text("\n".join(short_texts(sentences)) + "\n", encoding="utf-8")
        onnx_path = export_onnx()
        names = [n for n in CONTENDERS if n != "onnxruntime" or onnx_path]
        for condition in ("quiet", "busy"):
            seconds[condition] = {n: [] for n in names}
            for round_index in range(args.rounds):
                for name in rotated(names, round_index):
                    load = busy_processes(args.busy, 600) if condition == "busy" else contextlib.nullcontext()
                    with load:
                        seconds[condition][name] += run_one(name, texts_file, args.calls, onnx_path or "")
                    print(f"{condition} round {round_index + 1} {name:22s} p50 "
                          f"{ms(seconds[condition][name], 50):.2f} ms", flush=True)
    rows = {condition: {name: {"p50_ms": ms(v, 50), "p90_ms": ms(v, 90), "p99_ms": ms(v, 99), "calls": len(v)}
                        for name, v in per.items()}
            for condition, per in seconds.items()}
    goals = verdicts(rows)
    for goal in goals:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'NOT MET'}")
    write_result("latency_contention", {"calls": args.calls, "rounds": args.rounds, "busy_processes": args.busy,
                                        "rows": rows, "goals": goals,
                                        "onnxruntime": onnx_path is not None})


def render(r: dict[str, Any]) -> list[str]:
    lines = ["## Single-text latency beside busy processes (`bench/latency_contention.py`)", "",
             f"all-MiniLM-L6-v2, fp32, one short text a call; {r['calls']} timed calls per contender, condition and "
             f"round, {r['rounds']} rounds, each contender in its own process, in turns; busy: {r['busy_processes']} "
             "busy-looping processes at the same priority. `encoderkit` picks its kernel's team size by measuring "
             "calls (`encoderkit.native.team`); `encoderkit-fixed-team` always runs the whole team (the kernel "
             "before that).", ""]
    table = []
    for condition, per in r["rows"].items():
        for name, row in per.items():
            table.append([condition, name, f"{row['p50_ms']:.2f}", f"{row['p90_ms']:.2f}", f"{row['p99_ms']:.2f}"])
    lines += ["| condition | contender | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table] + [""]
    lines += [f"- {goal['goal']}: {goal['measured']}: **{'met' if goal['met'] else 'not met'}**" for goal in r["goals"]]
    return lines + [""]


if __name__ == "__main__":
    main()
