"""Long context (issue 19): ModernBERT-base-shaped encoder, encoderkit against transformers, 512 to 8,192 tokens.

One random ModernBERT-base-shaped model (22 layers, hidden 768, 12 heads, GeGLU 1152, global attention every
3rd layer, local window 128, rotary thetas 160,000 / 10,000) is built with transformers, saved in the HF format
and loaded by both sides from that directory: transformers' ``ModernBertModel`` (sdpa) and encoderkit's
``load_model(dir, task="base")``, run through encoderkit's inference engine (packed, pre-packed linears, fp32):
the faster of its two paths here (``--encoderkit-path model`` measures plain ``model(...)`` under inference mode).
Their outputs are checked to agree before timing and again at every length.

Each (contender, length) measurement runs in a fresh subprocess, in the order encoderkit, transformers,
transformers, encoderkit for each length, so drifts hit both alike. In each subprocess: load the model, read the
resident set size, reset the peak (``/proc/self/clear_refs``), run one untimed warm-up forward and then the timed
ones on one sequence of random ids (batch of one, no padding), and read ``getrusage(RUSAGE_SELF).ru_maxrss``: the
absolute peak, and its increase over the loaded model ("loaded": after loading and one 16-token forward, so
transformers' memory-mapped weights are paged in and encoderkit's pre-packed weight copies exist). The parent never
loads a model (a child's ru_maxrss starts at its parent's high-water mark). Time per forward: the median over both
subprocesses.

    python bench/long_context.py [--lengths 512 2048 8192] [--repeats 5 3 3] [--encoderkit-path engine]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import RESULTS, SMOKE, median, smoke_size, write_result

THREADS = 2
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni")
CONTENDERS = {"encoderkit": "encoderkit (engine, fp32)", "transformers": "transformers ModernBertModel (sdpa, fp32)"}
# A smoke run builds the same kind of model at a tiny width and depth (a global layer, then a local one).
SHAPE = dict(vocab_size=50368, hidden_size=smoke_size(768, 64), num_hidden_layers=smoke_size(22, 2),
             num_attention_heads=smoke_size(12, 4), intermediate_size=smoke_size(1152, 96),
             global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0, local_rope_theta=10000.0,
             max_position_embeddings=8192)


def cpu_flags() -> dict[str, bool]:
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {flag: flag in flags for flag in FLAGS}


def rss_mib() -> float:
    """Current resident set size."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak() -> bool:
    """Reset the peak RSS to the current RSS (Linux: "5" to clear_refs resets the high-water mark)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def build_model_dir(directory: Path) -> Path:
    """A random transformers ModernBertModel of the base shape, saved in the HF format."""
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    model = ModernBertModel(ModernBertConfig(**SHAPE, attn_implementation="sdpa")).eval()
    model.save_pretrained(directory)
    return directory


def input_ids(length: int) -> torch.Tensor:
    return torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(length))


def load(contender: str, model_dir: Path, path: str = "engine"):
    """The contender's forward on (1, length) ids: returns (length, hidden) final states. ``path``: encoderkit's
    inference engine, or its plain ``model(input_ids, attention_mask)`` under inference mode."""
    if contender == "transformers":
        from transformers import ModernBertModel

        model = ModernBertModel.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
        assert model.config._attn_implementation == "sdpa"

        def forward(ids: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
        return forward

    import encoderkit
    from encoderkit.engine import engine_for

    model = encoderkit.load_model(model_dir, task="base").eval()
    if path == "model":
        def plain(ids: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return model(ids, torch.ones_like(ids)).last_hidden_state[0]
        return plain
    engine = engine_for(model, "fp32", token_budget=8192)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        return next(iter(engine.run([ids[0].tolist()])))[1]
    return forward


def vm_hwm_mib() -> float:
    """This process's own peak RSS (VmHWM: what ``reset_peak`` resets), a cross-check of ru_maxrss."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace) -> None:
    at_start = peak_mib()  # inherited from the parent: must stay below the loaded model's RSS
    torch.set_num_threads(THREADS)
    forward = load(args.worker, Path(args.model_dir), args.encoderkit_path)
    ids = input_ids(args.length)
    forward(input_ids(16))  # pages in mmapped weights, makes encoderkit's pre-packed copies: part of "loaded"
    gc.collect()
    load_peak, loaded = peak_mib(), rss_mib()
    reset = reset_peak()
    times, first = [], None
    for i in range(args.repeats + 1):
        start = time.perf_counter()
        out = forward(ids)
        elapsed = time.perf_counter() - start
        if i == 0:
            first = elapsed
        else:
            times.append(elapsed)
    peak, hwm = peak_mib(), vm_hwm_mib()
    np.save(args.out, out.float().numpy())
    print("RESULT " + json.dumps({"contender": args.worker, "length": args.length, "seconds": times,
                                  "first_seconds": first, "rss_after_load_mib": loaded,
                                  "peak_during_load_mib": load_peak, "peak_rss_mib": peak,
                                  "peak_increase_mib": peak - loaded, "peak_reset": reset,
                                  "ru_maxrss_at_start_mib": at_start, "vm_hwm_mib": hwm, "threads":
                                  torch.get_num_threads(), "loadavg_after": os.getloadavg()[0]}), flush=True)


def measure(contender: str, length: int, repeats: int, model_dir: Path, out: Path, path: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", contender, "--length", str(length),
               "--repeats", str(repeats), "--encoderkit-path", path, "--model-dir", str(model_dir), "--out", str(out)]
    load_before = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{contender} at {length} tokens failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(lines[-1][len("RESULT "):])
    if result["ru_maxrss_at_start_mib"] >= result["rss_after_load_mib"]:
        sys.exit("a worker inherited a high-water mark above its loaded model's RSS: ru_maxrss would be wrong")
    return {**result, "loadavg_before": load_before}


def check_agreement(model_dir: Path, length: int = 512) -> float:
    """Max abs difference of the final states of both contenders on one sequence, in this process."""
    ids = input_ids(length)
    a = load("transformers", model_dir)(ids)
    b = load("encoderkit", model_dir)(ids)
    return float((a - b).abs().max())


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for contender, color in zip(CONTENDERS, ("tab:blue", "tab:orange")):
        mine = [r for r in rows if r["contender"] == contender]
        lengths = [r["length"] for r in mine]
        left.plot(lengths, [r["seconds_per_forward"] for r in mine], "o-", color=color, label=mine[0]["label"])
        right.plot(lengths, [r["peak_increase_mib"] for r in mine], "o-", color=color,
                   label=f"{contender}: increase over loaded model")
        right.plot(lengths, [r["peak_rss_mib"] for r in mine], "s--", color=color, alpha=0.6,
                   label=f"{contender}: absolute peak")
    for axis, title, unit in ((left, "time per forward", "seconds"), (right, "peak RSS", "MiB")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks([r["length"] for r in rows if r["contender"] == "encoderkit"])
        axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_xlabel("sequence length (tokens, batch of one)")
        axis.set_ylabel(unit)
        axis.set_title(f"ModernBERT-base shape: {title}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def judge(rows: list[dict[str, Any]], lengths: list[int]) -> list[dict[str, Any]]:
    """Issue 19's goals, with each encoderkit row's ratios to transformers' at its length filled in. Memory: the peak's
    increase over the loaded model, the goal's measure, and beside it the absolute peak, which also counts what
    loading left resident (encoderkit's pre-packed weight copies among it)."""
    by = {(r["contender"], r["length"]): r for r in rows}
    goals = []
    for length in lengths:
        ek, hf = by[("encoderkit", length)], by[("transformers", length)]
        ek["speedup_vs_transformers"] = hf["seconds_per_forward"] / ek["seconds_per_forward"]
        ek["memory_ratio_vs_transformers"] = ek["peak_increase_mib"] / hf["peak_increase_mib"]
        ek["peak_ratio_vs_transformers"] = ek["peak_rss_mib"] / hf["peak_rss_mib"]
    if 8192 in lengths:
        ek, hf = by[("encoderkit", 8192)], by[("transformers", 8192)]
        goals.append({"goal": "8,192 tokens: at least 2x faster", "value": f"{ek['speedup_vs_transformers']:.2f}x",
                      "met": ek["speedup_vs_transformers"] >= 2.0})
        goals.append({"goal": "8,192 tokens: at most half the peak memory (increase over loaded model)",
                      "value": f"{ek['memory_ratio_vs_transformers']:.2f} of transformers' increase; the absolute "
                               f"peak {ek['peak_rss_mib']:,.0f} MiB against {hf['peak_rss_mib']:,.0f}, "
                               f"{ek['peak_ratio_vs_transformers']:.2f} of it",
                      "met": ek["memory_ratio_vs_transformers"] <= 0.5})
    if 512 in lengths:
        ek = by[("encoderkit", 512)]
        goals.append({"goal": "512 tokens: no slower than transformers",
                      "value": f"{ek['speedup_vs_transformers']:.2f}x", "met": ek["speedup_vs_transformers"] >= 1.0})
    return goals


def print_table(rows: list[dict[str, Any]], goals: list[dict[str, Any]]) -> None:
    """The rows (encoderkit's with its ratios to transformers': speed, absolute peak, peak increase) and the goals."""
    print(f"\n{'length':>6}  {'contender':<12} {'s/forward':>10} {'tokens/s':>9} {'vs hf':>6} {'peak MiB':>9} "
          f"{'of hf':>6} {'+over load':>10} {'of hf':>6} {'max|diff|':>9}")
    for r in rows:
        speed, peak, increase = (f"{r[key]:.2f}" if key in r else "" for key in (
            "speedup_vs_transformers", "peak_ratio_vs_transformers", "memory_ratio_vs_transformers"))
        print(f"{r['length']:>6}  {r['contender']:<12} {r['seconds_per_forward']:>10.3f} "
              f"{r['tokens_per_second']:>9.0f} {speed + 'x' * bool(speed):>6} {r['peak_rss_mib']:>9.0f} {peak:>6} "
              f"{r['peak_increase_mib']:>10.0f} {increase:>6} {r['max_abs_diff_vs_transformers']:>9.1e}")
    for goal in goals:
        print(f"{'MET' if goal['met'] else 'NOT MET':>8}  {goal['goal']}: {goal['value']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192] if not SMOKE else [8192])
    parser.add_argument("--repeats", type=int, nargs="+", default=[5, 3, 3] if not SMOKE else [1],
                        help="timed forwards per subprocess, one per length (two subprocesses per contender)")
    parser.add_argument("--encoderkit-path", choices=("engine", "model"), default="engine",
                        help="encoderkit's inference engine (default) or its plain model(...) forward")
    parser.add_argument("--prepare", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.repeats = args.repeats[0]
        return worker(args)
    if args.prepare:
        torch.set_num_threads(THREADS)
        print(f"DIFF {check_agreement(build_model_dir(Path(args.prepare)))}")
        return None
    torch.set_num_threads(THREADS)
    repeats = dict(zip(args.lengths, args.repeats + [args.repeats[-1]] * len(args.lengths)))
    started = time.perf_counter()
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="long_context_") as tmp:
        # This process never loads a model: a child's ru_maxrss starts at its parent's high-water mark (the kernel
        # carries it over fork and exec), so the parent stays small and the model is built in a subprocess too.
        model_dir = Path(tmp) / "model"
        prepared = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", str(model_dir)],
                                  capture_output=True, text=True)
        lines = [line for line in prepared.stdout.splitlines() if line.startswith("DIFF ")]
        if prepared.returncode != 0 or not lines:
            sys.exit(f"building the model failed:\n{prepared.stdout}\n{prepared.stderr}")
        diff_512 = float(lines[-1].split()[1])
        print(f"max abs diff of the final states at 512 tokens: {diff_512:.2e}")
        if diff_512 > 1e-3:
            sys.exit("the two models disagree: nothing to compare")
        for length in args.lengths:
            runs: dict[str, list[dict[str, Any]]] = {"encoderkit": [], "transformers": []}
            for turn, contender in enumerate(("encoderkit", "transformers", "transformers", "encoderkit")):
                out = Path(tmp) / f"{contender}_{length}_{turn}.npy"
                result = measure(contender, length, repeats[length], model_dir, out, args.encoderkit_path)
                result["out"] = out
                runs[contender].append(result)
                print(f"  {length:>5} tokens  {contender:<12}  {', '.join(f'{s:.2f}' for s in result['seconds'])} s  "
                      f"peak {result['peak_rss_mib']:.0f} MiB (+{result['peak_increase_mib']:.0f})", flush=True)
            diff = float(np.abs(np.load(runs["encoderkit"][0]["out"]) - np.load(runs["transformers"][0]["out"])).max())
            for contender, results in runs.items():
                raw += [{k: v for k, v in r.items() if k != "out"} for r in results]
                seconds = [s for r in results for s in r["seconds"]]
                label = CONTENDERS[contender] if contender == "transformers" or args.encoderkit_path == "engine" \
                    else "encoderkit (model(...), fp32)"
                rows.append({"contender": contender, "label": label, "length": length,
                             "seconds_per_forward": median(seconds), "seconds": seconds,
                             "tokens_per_second": length / median(seconds),
                             "rss_after_load_mib": max(r["rss_after_load_mib"] for r in results),
                             "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
                             "peak_increase_mib": max(r["peak_increase_mib"] for r in results),
                             "max_abs_diff_vs_transformers": diff})
    goals = judge(rows, args.lengths)
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = RESULTS / "long_context.png"
    plot(rows, png)
    print_table(rows, goals)
    write_result("long_context", {
        "description": __doc__.split("\n\n")[1].replace("\n", " "),
        "shape": SHAPE, "threads": THREADS, "encoderkit_path": args.encoderkit_path, "cpu_flags": cpu_flags(),
        "order": "per length: encoderkit, transformers, transformers, encoderkit (a fresh subprocess each)",
        "repeats_per_subprocess": repeats, "warmup_per_subprocess": 1,
        "max_abs_diff_at_512": diff_512, "rows": rows, "goals": goals, "runs": raw,
        "plot": f"bench/results/{png.name}", "wall_minutes": (time.perf_counter() - started) / 60,
        "command": "python bench/long_context.py"})


if __name__ == "__main__":
    main()
