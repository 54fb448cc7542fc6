"""The one list of benchmarks (``python -m bench list``) and what a result must carry to be reported.

Every script in bench/ is either a benchmark here, with its kind (which group of BENCHMARKS.md it lands in), what it
needs, and the ``benchmark`` names its results carry, or a helper named in ``NOT_BENCHMARKS`` with the reason: a new
script that is neither fails tests/project/test_bench_suite.py. The module imports neither torch nor the scripts, so that
listing is instant and report.py and the runner share one validator (``result_problems``).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent

# The groups of the listing and of BENCHMARKS.md, in their order: what each measures, not which file it is in.
KINDS = {"speed": "Speed", "training": "Quality and training", "retrieval": "Retrieval",
         "evaluation": "Evaluations (security, behaviour, attention heads)"}

# What an entry may need; each has a check, so a test can skip with the reason rather than fail.
NEEDS = {
    "shared": "../shared data",  # or $ENCODERKIT_BENCH_SHARED (bench/common.SHARED)
    "cuda": "a CUDA GPU",
    "pylate": "a PyLate venv at /tmp/pylate-venv (see bench/pylate_parity.py)",
}
PYLATE_PYTHON = Path("/tmp/pylate-venv/bin/python")  # bench/retrieval_kinds.py's default --pylate-python


@dataclass(frozen=True)
class Entry:
    """One benchmark: ``bench/<name>.py``. ``modules`` are the bench extra's packages it imports; ``renders``
    the ``benchmark`` names of the results it writes (report.py's renderers); ``smoke_args`` what a smoke run
    passes it; ``smoke_needs`` what a smoke run needs where that is less than the full run's ``needs``."""

    name: str
    kind: str
    description: str
    needs: tuple[str, ...] = ("shared",)
    modules: tuple[str, ...] = ()
    renders: tuple[str, ...] = ()
    smoke_args: tuple[str, ...] = ()
    smoke_needs: tuple[str, ...] | None = None

    @property
    def script(self) -> Path:
        return BENCH / f"{self.name}.py"

    @property
    def results(self) -> tuple[str, ...]:
        return self.renders or (self.name,)


BENCH_EXTRA = ("onnxruntime", "onnx", "openvino", "nncf", "ctranslate2")
ENTRIES = (
    Entry("encode", "speed", "Encoding speed: encoderkit against sentence-transformers and transformers"),
    Entry("peers", "speed",
          "encoderkit against ONNX Runtime, OpenVINO, CTranslate2 and fastembed: throughput and latency",
          modules=BENCH_EXTRA, renders=("peers", "peers_profile")),
    Entry("int8", "speed", "int8 inference: encoderkit against CTranslate2 int8"),  # it skips CTranslate2 itself
    Entry("latency_floor", "speed", "How low PyTorch can go for one short text, taken apart",
          modules=("onnxruntime", "onnx")),
    Entry("native_phases", "speed", "Where the native kernel's time goes for one short text"),
    Entry("attention_lengths", "speed", "Which batches take the native attention: it against SDPA by length",
          renders=("attention_lengths",)),
    Entry("kernel_batches", "speed", "Which fp32 batches the native kernel takes whole: it against the PyTorch "
          "layers", renders=("kernel_batches",)),
    Entry("int8_lengths", "speed", "Which int8 batches the native kernel takes: it against PyTorch's int8 by length",
          renders=("int8_lengths",)),
    Entry("int8_batches", "speed", "int8 vectors against fp32 by batch size, against the int8 guard's verdict",
          renders=("int8_batches",)),
    Entry("latency_contention", "speed", "Single-text latency beside busy processes: the kernel's team size"),
    Entry("refactor_speed", "speed", "Embedding speed before and after a refactor, both versions in one run"),
    Entry("long_context", "speed", "Long context: a ModernBERT-base shape from 512 to 8,192 tokens", needs=()),
    Entry("scale_embed", "speed", "Embedding throughput with and without a local Ray cluster"),
    Entry("serve_load", "speed", "encoderkit serve under load against Infinity and FastAPI; soak, SIGTERM, hang-ups"),
    Entry("gpu", "speed", "The CUDA path against the CPU path and against the peers on the same GPU",
          needs=("cuda",), smoke_needs=()),  # smoke: the CPU stands in for the GPU, and says so
    Entry("gpu_families", "speed", "The CUDA path against the CPU path for the newer families, SPLADE and ColBERT",
          needs=("cuda",), smoke_needs=()),
    Entry("finetune", "training", "Fine-tuning speed and quality against transformers' Trainer"),
    Entry("finetune_small", "training", "Fine-tuning quality at small budgets against the Trainer, seed by seed"),
    Entry("finetune_parity", "training", "A deterministic SQuAD fine-tuning epoch against the Trainer"),
    Entry("finetune_profile", "training", "Where a fine-tuning step's time goes, against the Trainer's step"),
    Entry("unpadding_bound", "training", "How much unpadded training can gain over length-grouped batches"),
    Entry("training_kernels", "training", "The native training kernels against the PyTorch ops they replace",
          needs=()),
    Entry("pretrain", "training", "Pre-training speed and quality per wall-clock against a transformers loop"),
    Entry("pretrain_run", "training", "A budgeted pre-training run against the unigram baseline"),
    Entry("pretrain_families", "training", "modernbert-tiny against a BERT of equal size, per wall-clock"),
    Entry("train_embedder", "training", "Training embedders and a reranker against SentenceTransformerTrainer",
          modules=("datasets",)),
    Entry("search", "retrieval", "Search indexes: build time, query time and recall@10 against exact search"),
    Entry("big_index", "retrieval", "IVF-PQ, int8 and binary indexes built from Parquet shards"),
    Entry("sparse_index", "retrieval", "The sparse inverted index at 1M SPLADE-like documents", needs=()),
    Entry("retrieval_kinds", "retrieval", "Every retrieval kind on held-out SQuAD: BM25, dense, SPLADE, ColBERT",
          needs=("shared", "pylate"), modules=("datasets",), smoke_needs=("shared",)),  # smoke: PyLate skipped
    Entry("pylate_parity", "retrieval", "encoderkit's ColBERT side against PyLate itself", needs=("pylate",),
          smoke_needs=()),  # smoke: encoderkit's side only
    Entry("attention_heads", "evaluation", "Attention heads of all-MiniLM-L6-v2; heads that find antecedents"),
    Entry("backdoor", "evaluation", "Backdoor trigger scanning on fine-tuned SST-2 models"),
    Entry("consistency", "evaluation", "The SST-2 classifier under meaning-preserving edits"),
    Entry("membership", "evaluation", "Membership inference against a continued-pre-trained MLM"),
    Entry("ood", "evaluation", "Out-of-distribution detection and calibration of the SST-2 classifier"),
    Entry("shift", "evaluation", "Adversarial attacks and embedding-shift detection on the SST-2 classifier"),
)

# The scripts in bench/ that are not benchmarks, and what they are instead.
NOT_BENCHMARKS = {
    "__init__": "the package", "__main__": "the runner", "registry": "this list", "common": "shared helpers",
    "report": "the renderer of BENCHMARKS.md", "smoke": "what the scripts share in a smoke run",
    "smoke_training": "the tiny inputs of the training and evaluation benchmarks' smoke runs",
    "turns": "interleaved training contenders, used by the training benchmarks",
    "backfill_provenance": "a one-off tool: provenance for results from before it was recorded",
    "serve_baseline": "the FastAPI server bench/serve_load.py measures against",
}
BY_NAME = {entry.name: entry for entry in ENTRIES}
BY_RESULT = {result: entry for entry in ENTRIES for result in entry.results}


def results_dir() -> Path:
    """Where results are read and written: bench/common.RESULTS, without importing torch with it."""
    chosen = os.environ.get("ENCODERKIT_BENCH_RESULTS")
    return Path(chosen) if chosen else BENCH / "results"


def missing(entry: Entry, smoke: bool = False) -> list[str]:
    """What ``entry`` needs that this machine lacks, in words (empty: it can run)."""
    needs = entry.needs if not smoke or entry.smoke_needs is None else entry.smoke_needs
    lacking = [NEEDS[need] for need in needs if not _has(need)]
    modules = [module for module in entry.modules if importlib.util.find_spec(module) is None]
    if modules:
        lacking.append(f"the bench extra (make bench; missing: {', '.join(modules)})")
    return lacking


def _has(need: str) -> bool:
    if need == "shared":
        shared = Path(os.environ.get("ENCODERKIT_BENCH_SHARED", ROOT.parent / "shared"))
        return (shared / "data").is_dir() and (shared / "bench").is_dir()
    if need == "cuda":
        import torch

        return torch.cuda.is_available()
    if need == "pylate":
        return PYLATE_PYTHON.exists()
    raise KeyError(f"unknown need {need!r}: one of {', '.join(NEEDS)}")


# ---------------------------------------------------------------------------------------------
# What a result must carry (bench/common.write_result writes all of it)
# ---------------------------------------------------------------------------------------------
PROVENANCE_KEYS = ("date", "command", "cpu", "cpu_flags", "versions")


def result_problems(result: Any) -> list[str]:
    """Why report.py must not show ``result`` (empty: it may): a registered ``benchmark`` name, a provenance that
    says when, where, with what and at which commit it was measured, and a boolean verdict for every goal."""
    if not isinstance(result, dict):
        return ["not a JSON object"]
    problems = []
    if result.get("benchmark") not in BY_RESULT:
        problems.append(f"its benchmark {result.get('benchmark')!r} is no entry's result in bench/registry.py")
    problems += _provenance_problems(result.get("provenance"))
    problems += _goal_problems(result.get("goals"), "goals")
    for index, section in enumerate(result.get("sections") or []):  # bench/finetune_small.py: goals per budget
        if isinstance(section, dict):
            problems += _goal_problems(section.get("goals"), f"sections[{index}].goals")
    return problems


def _provenance_problems(made: Any) -> list[str]:
    if not isinstance(made, dict):
        return ["no provenance (bench/common.write_result records it; bench/backfill_provenance.py recovers what "
                "git knows of an older result)"]
    # A backfilled result (bench/backfill_provenance.py) names the commit that recorded it instead of the one it was
    # measured at, and may lack the command: older results did not always record it.
    recovered = bool(made.get("recorded_in"))
    if not recovered and not made.get("commit"):
        return ["its provenance names no commit (nor, for a backfilled result, the commit that recorded it)"]
    if not recovered and not isinstance(made.get("dirty"), bool) and made.get("dirty") != "unknown":
        return ["its provenance does not say whether the tree differed from its commit ('dirty')"]
    optional = ("command",) if recovered else ()
    absent = [key for key in PROVENANCE_KEYS if made.get(key) in (None, "") and key not in optional]
    return [f"its provenance lacks {', '.join(absent)}"] if absent else []


def _goal_problems(goals: Any, where: str) -> list[str]:
    if goals is None:
        return []
    items = goals.items() if isinstance(goals, dict) else enumerate(goals) if isinstance(goals, list) else None
    if items is None:
        return [f"{where} is neither a list nor an object"]
    unjudged = [str(key) for key, goal in items if not isinstance(goal, dict) or not isinstance(goal.get("met"), bool)]
    return [f"{where}: no boolean 'met' for goal(s) {', '.join(unjudged)}"] if unjudged else []


def load_result(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """A result file and its problems (a file that is not JSON is one)."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return None, [f"unreadable: {error}"]
    return result, result_problems(result)
