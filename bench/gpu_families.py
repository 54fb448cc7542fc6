"""The CUDA path against the CPU path for the families and encoders added since bench/gpu.py's parity run: every
head of NomicBERT, GTE, EuroBERT and jina-embeddings-v3 (tests/parity/test_new_families.py's variants: rotary
theta, linear rope scaling, 1/2/4 key/value heads, the three EuroBERT poolings), MPNet and XLM-RoBERTa
(tests/parity/test_families.py's), and the SPLADE and ColBERT encoders.

Two steps, because the GPU machine's transformers may predate these families' classes:

    python bench/gpu_families.py prepare DIR          # here: tiny perturbed transformers checkpoints, saved
    python bench/gpu_families.py check DIR            # on the GPU machine: encoderkit on the CPU and on the GPU

``check`` loads each checkpoint with encoderkit and compares the GPU's outputs (unpadded and padded explicit paths,
fp32) with the CPU's on a padded batch of mixed lengths; the CPU path equals transformers' to 1e-5 in the test
suite, so a GPU within 1e-5 of the CPU is within 2e-5 of transformers. SparseEmbedder and MultiVectorEmbedder are
compared the same way (vectors, CPU against GPU). Writes bench/results/gpu_families.json. A smoke run without a step
takes both in a temporary folder, the CPU in the GPU's place where CUDA is absent (a check of the script).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.", "Sparse retrieval expands queries with related terms", "a",
         "Two dogs run across a snowy field while their owner throws a red ball for them again and again."]


def _tests_on_path() -> None:
    for folder in ("tests", "tests/parity", "tests/embeddings"):  # helpers, the parity cases, test_sparse
        if str(ROOT / folder) not in sys.path:
            sys.path.insert(0, str(ROOT / folder))


def prepare(directory: Path) -> None:
    """Save every case's perturbed transformers checkpoint and the encoders' directories under ``directory``."""
    _tests_on_path()
    import test_families as classic
    import test_new_families as new

    from encoderkit import default_model_path
    from encoderkit.embeddings.multi_vector import MultiVectorModel
    from encoderkit.embeddings.sparse import SparseModel
    from helpers import tiny_bert_dir
    from test_sparse import _perturb

    cases = [("new", v, t) for v, t in new.CASES]
    cases += [("classic", f, t) for f, t in classic.CASES if f in ("mpnet", "xlm-roberta")]
    for origin, variant, task in cases:
        target = directory / "families" / f"{variant}--{task}"
        if origin == "new":
            config, reference = new.VARIANTS[variant](), None
            reference = classic.perturbed_reference(new.hf_class(variant, task), config, task)
        else:
            config, reference = classic.build_reference(variant, task)
        reference.save_pretrained(target)
        (target / "encoderkit-case.json").write_text(json.dumps({"variant": variant, "task": task}))
    minilm = default_model_path()
    mlm = _perturb(tiny_bert_dir(directory / "encoders" / "mlm", minilm, task="masked-lm"), scale=0.1)
    SparseModel.from_pretrained(mlm).save_pretrained(directory / "encoders" / "splade")
    MultiVectorModel.from_pretrained(tiny_bert_dir(directory / "encoders" / "base", minilm), dimension=16) \
        .save_pretrained(directory / "encoders" / "colbert")
    print(f"prepared {len(cases)} checkpoints and 2 encoders in {directory}")


def _max_difference(a: dict, b: dict, mask: torch.Tensor) -> float:
    worst = 0.0
    for key, value in a.items():
        other = b[key]
        values = value if isinstance(value, (tuple, list)) else [value]
        others = other if isinstance(other, (tuple, list)) else [other]
        for x, y in zip(values, others):
            x, y = x.float().cpu(), y.float().cpu()
            if x.dim() >= 2 and x.shape[:2] == mask.shape:
                x, y = x[mask.bool()], y[mask.bool()]
            worst = max(worst, float((x - y).abs().max()))
    return worst


def check(directory: Path, device: str) -> dict[str, Any]:
    _tests_on_path()
    import test_families as classic

    from encoderkit import load_model

    rows = []
    for case in sorted((directory / "families").iterdir()):
        facts = json.loads((case / "encoderkit-case.json").read_text())
        ours = load_model(case).eval()
        config = ours.config
        inputs = classic.make_batch(config, config.pad_token_id)
        inputs["input_ids"] = inputs["input_ids"].clamp(max=config.vocab_size - 1)
        if config.type_vocab_size < 2:
            inputs.pop("token_type_ids", None)
        mask = inputs["attention_mask"]
        with torch.no_grad():
            cpu_unpadded = classic.our_outputs(ours, inputs, attentions=False)
            cpu_explicit = classic.our_outputs(ours, inputs)
            ours.to(device)
            on_device = {k: v.to(device) for k, v in inputs.items()}
            gpu_unpadded = classic.our_outputs(ours, on_device, attentions=False)
            gpu_explicit = classic.our_outputs(ours, on_device)
        rows.append({**facts, "unpadded_vs_cpu": _max_difference(cpu_unpadded, gpu_unpadded, mask),
                     "explicit_vs_cpu": _max_difference(cpu_explicit, gpu_explicit, mask)})
        print(f"  {facts['variant']:40s} {facts['task']:24s} unpadded {rows[-1]['unpadded_vs_cpu']:.2e} "
              f"explicit {rows[-1]['explicit_vs_cpu']:.2e}", flush=True)
    encoders = {}
    from encoderkit.embeddings.multi_vector import MultiVectorEmbedder
    from encoderkit.embeddings.sparse import SparseEmbedder

    cpu = SparseEmbedder.from_pretrained(directory / "encoders" / "splade").encode(TEXTS).to_dense()
    gpu = SparseEmbedder.from_pretrained(directory / "encoders" / "splade", device=device).encode(TEXTS).to_dense()
    encoders["splade"] = float(abs(cpu - gpu).max())
    worst = 0.0
    for is_query in (True, False):
        cpu_vectors = MultiVectorEmbedder.from_pretrained(directory / "encoders" / "colbert").encode(
            TEXTS, is_query=is_query)
        gpu_vectors = MultiVectorEmbedder.from_pretrained(directory / "encoders" / "colbert", device=device).encode(
            TEXTS, is_query=is_query)
        worst = max(worst, max(float(abs(a - b).max()) for a, b in zip(cpu_vectors, gpu_vectors)))
    encoders["colbert"] = worst
    print(f"  SPLADE {encoders['splade']:.2e}, ColBERT {encoders['colbert']:.2e}")
    tolerance = classic.TOL
    worst_case = {key: max(r[key] for r in rows) for key in ("unpadded_vs_cpu", "explicit_vs_cpu")}
    goals = [{"goal": f"every case and encoder on the GPU within {tolerance:g} of the CPU",
              "measured": f"families {max(worst_case.values()):.2e}, SPLADE {encoders['splade']:.2e}, "
                          f"ColBERT {encoders['colbert']:.2e}",
              "met": max(*worst_case.values(), *encoders.values()) <= tolerance}]
    for goal in goals:
        print(f"{goal['goal']}: {goal['measured']}: {'met' if goal['met'] else 'NOT MET'}")
    return {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else device,
            "torch": torch.__version__, "cases": len(rows), "rows": rows, "worst": worst_case,
            "encoders": encoders, "tolerance": tolerance, "goals": goals}


def render(r: dict[str, Any]) -> list[str]:
    lines = ["## CUDA against CPU: the newer families and encoders (bench/gpu_families.py)", "",
             f"{r['cases']} family/head cases on {r['device']} (torch {r['torch']}), fp32, largest difference from "
             "encoderkit on the CPU (which equals transformers to 1e-5 in the test suite):", "",
             "| family variant | heads | unpadded | explicit |", "|---|---|---|---|"]
    by_variant: dict[str, list[dict]] = {}
    for row in r["rows"]:
        by_variant.setdefault(row["variant"], []).append(row)
    for variant, rows in by_variant.items():
        lines.append(f"| {variant} | {len(rows)} | {max(x['unpadded_vs_cpu'] for x in rows):.1e} | "
                     f"{max(x['explicit_vs_cpu'] for x in rows):.1e} |")
    lines += ["", f"- SparseEmbedder (SPLADE) vectors: {r['encoders']['splade']:.1e}; MultiVectorEmbedder (ColBERT) "
              f"token vectors: {r['encoders']['colbert']:.1e}"]
    lines += [f"- {g['goal']}: {g['measured']}: **{'met' if g['met'] else 'not met'}**" for g in r["goals"]] + [""]
    return lines


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import smoke
    from common import SMOKE, write_result

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    both = "?" if SMOKE else None  # a smoke run without a step takes both, in a temporary folder
    parser.add_argument("step", choices=("prepare", "check"), nargs=both)
    parser.add_argument("directory", type=Path, nargs=both)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.directory)
        return
    if args.step is None:
        with tempfile.TemporaryDirectory(prefix="gpu-families-") as scratch:
            prepare(Path(scratch))
            result = check(Path(scratch), smoke.device(args.device))
    else:
        result = check(args.directory, args.device)
    write_result("gpu_families", result)


if __name__ == "__main__":
    main()
