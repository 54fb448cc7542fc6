"""encoderkit's CUDA path against its CPU path and against the peers on the same GPU, for a machine with one.

Nothing in encoderkit needs a GPU, and CI has none: this script is the check that the GPU path computes what the CPU
path computes, and what it costs there. Four parts, each written to the JSON as it finishes:

- ``parity``: every family and head of the parity tests (tests/parity: BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA,
  ModernBERT, DeBERTa-v2/v3; tiny random transformers models, perturbed): encoderkit on the GPU against encoderkit
  on the CPU (the unpadded path and the padded explicit one), and against transformers on the same GPU. fp32 with
  TF32 off, so that the GPU's products are fp32 products. The largest difference over every output.
- ``embed``: all-MiniLM-L6-v2 on ../shared/bench/sentences.txt (2,000 texts): encoderkit fp32 and bf16 on the GPU
  against sentence-transformers fp32, bf16 and fp16 on the GPU, 3 interleaved rounds, texts/s (tokenising
  included), the largest difference to encoderkit's CPU fp32 vectors, and STS-B dev Spearman.
- ``budget``: texts/s of encoderkit on the GPU by tokens per batch (10,000 texts), which sets
  ``precision.GPU_BUDGET_FACTOR``.
- ``train``: fine-tuning all-MiniLM-L6-v2 on SST-2: with dropout off, the losses of the same steps on the CPU and the
  GPU; then one epoch of 8,000 examples with each of encoderkit's Trainer and transformers' Trainer with
  length-grouped batches, fp32 and bf16 autocast, on the GPU: examples/s and validation accuracy.

    python bench/gpu.py [--model DIR] [--shared DIR] [--parts parity,embed,budget,train] [--out FILE]

``--model``: the all-MiniLM-L6-v2 directory (default: the installed default model); one whose weights are fp16 (to
carry it to a GPU machine in half the bytes) is widened to fp32 first, so every contender reads the same weights.
``--device cpu`` runs the same code with the CPU in the GPU's place (a check of this script, nothing more); so does a
smoke run on a machine without CUDA, on a few texts, cases and steps.
Writes bench/results/gpu.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import common
import smoke
from common import RESULTS, ROOT, SMOKE, machine, median, smoke_size, timed, widened
from turns import TrainerPlayer

ROUNDS = smoke_size(3, 1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_facts(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"gpu": None}
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False)}


# ---------------------------------------------------------------------------------------------
# parity: every family and head, GPU against CPU and against transformers on the GPU
# ---------------------------------------------------------------------------------------------
def max_difference(expected: dict, actual: dict, mask: torch.Tensor) -> float:
    """The largest absolute difference over the outputs both have, real tokens only (attention maps: real query
    rows)."""
    real = mask.bool().cpu()
    worst = 0.0
    for name in set(expected) & set(actual):
        want, got = expected[name], actual[name]
        pairs = list(zip(want, got)) if isinstance(want, tuple) else [(want, got)]
        for w, g in pairs:
            w, g = w.float().cpu(), g.float().cpu()
            if name == "attentions":
                w, g = w.permute(0, 2, 1, 3)[real], g.permute(0, 2, 1, 3)[real]
            elif w.dim() >= 2 and w.shape[:2] == real.shape:
                w, g = w[real], g[real]
            worst = max(worst, (w - g).abs().max().item())
    return worst


def parity(device: torch.device, work: Path) -> dict[str, Any]:
    from encoderkit import load_model

    sys.path.insert(0, str(ROOT / "tests" / "parity"))
    import test_families as classic
    import test_modern_families as modern
    import transformers

    transformers.utils.logging.disable_progress_bar()

    rows = []
    for module, cases in ((classic, classic.CASES), (modern, modern.CASES)):
        for variant, task in cases[::smoke_size(1, 6)]:  # a smoke run: every 6th case
            config, reference = module.build_reference(variant, task)
            directory = work / "parity" / f"{variant}-{task}"
            reference.save_pretrained(directory)
            ours = load_model(directory).eval()
            inputs = classic.make_batch(config, config.pad_token_id)
            mask = inputs["attention_mask"]
            on_device = {k: v.to(device) for k, v in inputs.items()}
            with torch.no_grad():
                cpu_unpadded = classic.our_outputs(ours, inputs, attentions=False)
                cpu_explicit = classic.our_outputs(ours, inputs)
                ours.to(device)
                reference.to(device)
                unpadded = classic.our_outputs(ours, on_device, attentions=False)
                explicit = classic.our_outputs(ours, on_device)
                theirs = classic.hf_outputs(reference, on_device)
            rows.append({"variant": variant, "task": task,
                         "unpadded_vs_cpu": max_difference(cpu_unpadded, unpadded, mask),
                         "explicit_vs_cpu": max_difference(cpu_explicit, explicit, mask),
                         "vs_transformers_same_device": max(max_difference(theirs, unpadded, mask),
                                                            max_difference(theirs, explicit, mask))})
            print(f"  {variant:28s} {task:26s} GPU-CPU {rows[-1]['unpadded_vs_cpu']:.2e} (explicit "
                  f"{rows[-1]['explicit_vs_cpu']:.2e}), GPU-transformers {rows[-1]['vs_transformers_same_device']:.2e}",
                  flush=True)
    worst = {key: max(r[key] for r in rows) for key in ("unpadded_vs_cpu", "explicit_vs_cpu",
                                                        "vs_transformers_same_device")}
    return {"cases": len(rows), "rows": rows, "worst": worst, "tolerance": classic.TOL,
            "within_tolerance": all(v <= classic.TOL for v in worst.values())}


# ---------------------------------------------------------------------------------------------
# embed: encoderkit against sentence-transformers on the GPU
# ---------------------------------------------------------------------------------------------
def sentences(shared: Path, limit: int | None) -> list[str]:
    return (shared / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()[:limit]


def embed(device: torch.device, model: Path, shared: Path, limit: int | None) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    from encoderkit import Embedder
    from encoderkit.tasks.sts import spearman
    from peers import normalized, sts_dev

    texts = sentences(shared, limit)
    sts = shared / "data" / "stsb" / "sts-dev.csv"
    first, second, gold = (smoke.few(part, 8) for part in sts_dev(sts)) if sts.exists() else (None, None, None)
    reference = Embedder.from_pretrained(model, device="cpu").encode(texts)
    contenders: dict[str, Callable[[list[str]], np.ndarray]] = {}
    for dtype in ("fp32", "bf16"):
        embedder = Embedder.from_pretrained(model, dtype=dtype, device=device)
        contenders[f"encoderkit {dtype}"] = embedder.encode
        contenders[f"encoderkit {dtype}, batches of 32"] = lambda t, e=embedder: e.encode(t, batch_size=32)
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        st = SentenceTransformer(str(model), device=str(device), model_kwargs={"torch_dtype": dtype})
        contenders[f"sentence-transformers {label}"] = lambda t, s=st: s.encode(t, batch_size=32)
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for encode in contenders.values():
        encode(texts[:256])  # warm-up: kernels chosen, memory pools grown
    for _ in range(ROUNDS):  # every contender returns numpy arrays: the GPU has finished when it returns
        for name, encode in contenders.items():
            seconds[name].append(timed(lambda: encode(texts))[0])
    rows = []
    st_rate = len(texts) / median(seconds["sentence-transformers fp32"])
    for name, encode in contenders.items():
        vectors = np.asarray(encode(texts), dtype=np.float32)
        rate = len(texts) / median(seconds[name])
        sts_spearman = None if gold is None else \
            float(spearman(gold, (normalized(encode(first)) * normalized(encode(second))).sum(1)))
        rows.append({"contender": name, "texts_per_s": rate, "vs_sentence_transformers_fp32": rate / st_rate,
                     "max_abs_diff_vs_cpu_fp32": float(np.abs(vectors - reference).max()),
                     "stsb_dev_spearman": sts_spearman})
        print(f"  {name:40s} {rate:9.1f} texts/s ({rows[-1]['vs_sentence_transformers_fp32']:.2f}x ST fp32), "
              f"max diff {rows[-1]['max_abs_diff_vs_cpu_fp32']:.2e}, STS-B {rows[-1]['stsb_dev_spearman']}",
              flush=True)
    return {"texts": len(texts), "rounds": ROUNDS, "rows": rows}


def budget(device: torch.device, model: Path, shared: Path, limit: int | None) -> dict[str, Any]:
    from encoderkit import Embedder

    texts = sentences(shared, limit) * smoke_size(5, 1)
    rows = []
    for dtype in ("fp32", "bf16"):
        for tokens in smoke.few([2048, 4096, 8192, 16384, 32768, 65536], 2):
            embedder = Embedder.from_pretrained(model, dtype=dtype, device=device, token_budget=tokens)
            embedder.encode(texts[:512])
            times = [timed(lambda: embedder.encode(texts))[0] for _ in range(ROUNDS)]
            rows.append({"dtype": dtype, "token_budget": tokens, "texts_per_s": len(texts) / median(times),
                         "texts_per_s_rounds": [len(texts) / t for t in times]})
            print(f"  {dtype} {tokens:6d} tokens a batch: {rows[-1]['texts_per_s']:9.1f} texts/s", flush=True)
    return {"texts": len(texts), "rows": rows}


# ---------------------------------------------------------------------------------------------
# train: the same steps on both devices; then encoderkit's Trainer against transformers' on the GPU
# ---------------------------------------------------------------------------------------------
def sst2_setup(rows: list[tuple[str, str]], work: Path, model: Path, device: torch.device, bf16: bool = False):
    """bench/finetune.py's SST-2 set-up (its recipe, length-grouped batches) on ``rows``, ``model`` and ``device``."""
    from finetune import prepare

    return prepare("sst2", work, group_by_length=True, bf16=bf16, model=model, device=str(device), rows=rows)


def without_dropout(model: Path, work: Path) -> Path:
    target = work / "model-no-dropout"
    shutil.copytree(model, target)
    config = json.loads((target / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (target / "config.json").write_text(json.dumps(config))
    return target


def hf_run(setup, model: Path, device: torch.device, bf16: bool, out: Path) -> tuple[float, dict[str, float]]:
    """transformers' Trainer with length-grouped batches on the same rows and recipe (bench/finetune.py's):
    (seconds, quality)."""
    from finetune import hf_trainer, transformers_quality

    trainer, _, tokenizer = hf_trainer("sst2", setup, "group_by_length", out, model=model, bf16=bf16,
                                       use_cpu=device.type == "cpu")
    synchronize(device)
    seconds, _ = timed(trainer.train)
    synchronize(device)
    return seconds, transformers_quality(setup, trainer.model.float().cpu().eval(), tokenizer, out / "final")


def train(device: torch.device, model: Path, shared: Path, work: Path, examples: int, steps: int) -> dict[str, Any]:
    common.SHARED = shared
    rows = common.sst2_rows(count=examples)
    # the same steps on both devices, dropout off: the losses and the weights after them
    plain = without_dropout(model, work)
    losses, weights = {}, {}
    for where in (torch.device("cpu"), device):
        setup = sst2_setup(rows[: steps * 32 * 2], work / f"parity-{where.type}", plain, where)
        setup.trainer.begin(resume=False)
        losses[where.type] = [float(setup.trainer.train_step()["loss"]) for _ in range(steps)]
        weights[where.type] = {k: v.detach().float().cpu() for k, v in setup.model.state_dict().items()}
    cpu_losses, gpu_losses = losses["cpu"], losses[device.type]
    parity_row = {"steps": steps, "losses_cpu": cpu_losses, "losses_device": gpu_losses,
                  "max_loss_relative_diff": max(abs(a - b) / abs(a) for a, b in zip(cpu_losses, gpu_losses)),
                  "max_weight_abs_diff": max((weights["cpu"][k] - weights[device.type][k]).abs().max().item()
                                             for k in weights["cpu"])}
    print(f"  {steps} steps, dropout off: losses differ by at most {parity_row['max_loss_relative_diff']:.2e} "
          f"(relative), weights by {parity_row['max_weight_abs_diff']:.2e}", flush=True)

    runs = []
    for bf16 in (False, True):
        setup = sst2_setup(rows, work / f"ek-{bf16}", model, device, bf16=bf16)
        trainer = setup.trainer
        player = TrainerPlayer(trainer)  # each step ends reading its loss: the GPU has finished it
        player.run(trainer.config.max_steps)
        seconds = player.seconds
        quality = setup.evaluate(setup.model.eval(), dtype="fp32")
        runs.append({"contender": "encoderkit" + (" bf16" if bf16 else ""), "seconds": seconds,
                     "examples_per_s": len(setup.train_features) / seconds, "accuracy": quality["accuracy"],
                     "steps": trainer.config.max_steps})
        print(f"  {runs[-1]['contender']:34s} {seconds:7.1f} s, {runs[-1]['examples_per_s']:8.1f} examples/s, "
              f"accuracy {quality['accuracy']:.4f}", flush=True)
        seconds, quality = hf_run(setup, model, device, bf16, work / f"hf-{bf16}")
        runs.append({"contender": "transformers Trainer, grouped" + (" bf16" if bf16 else ""), "seconds": seconds,
                     "examples_per_s": len(setup.train_features) / seconds, "accuracy": quality["accuracy"]})
        print(f"  {runs[-1]['contender']:34s} {seconds:7.1f} s, {runs[-1]['examples_per_s']:8.1f} examples/s, "
              f"accuracy {quality['accuracy']:.4f}", flush=True)
    for run in runs:
        peer = next(r for r in runs if r["contender"].startswith("transformers")
                    and r["contender"].endswith("bf16") == run["contender"].endswith("bf16"))
        run["speedup_vs_grouped_trainer"] = run["examples_per_s"] / peer["examples_per_s"]
    return {"examples": len(rows), "parity": parity_row, "runs": runs}


def profile(device: torch.device, model: Path, shared: Path, work: Path, steps: int = 20) -> dict[str, Any]:
    """Where a fine-tuning step's time goes on the device, fp32 and bf16 autocast: steady-state steps/s after
    warm-up steps, and torch.profiler's top ops by self device time and by self CPU time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    common.SHARED = shared
    rows = common.sst2_rows(count=steps * 32 * 4)
    out = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for bf16 in (False, True):
        setup = sst2_setup(rows, work / f"profile-{bf16}", model, device, bf16=bf16)
        trainer = setup.trainer
        player = TrainerPlayer(trainer)
        player.run(steps)  # warm-up
        player.seconds = 0.0
        player.run(steps)
        steady = steps / player.seconds
        with profiler(activities=activities) as prof:
            for _ in range(steps):
                trainer.train_step()
            synchronize(device)
        table = prof.key_averages()
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        label = "bf16" if bf16 else "fp32"
        out[label] = {"steady_steps_per_s": steady,
                      "by_device_time": table.table(sort_by=sort, row_limit=20),
                      "by_cpu_time": table.table(sort_by="self_cpu_time_total", row_limit=20)}
        print(f"  {label}: {steady:.1f} steps/s after {steps} warm-up steps", flush=True)
        print(out[label]["by_device_time"], flush=True)
        print(out[label]["by_cpu_time"], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--shared", type=Path, default=common.SHARED)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="parity,embed,budget,train")
    parser.add_argument("--train-examples", type=int, default=smoke_size(8000, 64))
    parser.add_argument("--parity-steps", type=int, default=smoke_size(10, 2))
    parser.add_argument("--texts", type=int, default=16 if SMOKE else None,
                        help="the first N sentences only (a quick check)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    args = parser.parse_args()
    from encoderkit import default_model_path

    device = torch.device(smoke.device(args.device))
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products in fp32, as on the CPU
    torch.backends.cudnn.allow_tf32 = False
    result: dict[str, Any] = {"benchmark": "gpu", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "machine": machine(), "device": str(device), **gpu_facts(device),
                              "transformers": __import__("transformers").__version__,
                              "sentence_transformers": __import__("sentence_transformers").__version__,
                              "provenance": common.provenance(),
                              "command": "cd bench && PYTHONPATH=../src python3 gpu.py " + " ".join(
                                  "DIR" if previous in ("--model", "--shared") else arg
                                  for previous, arg in zip([""] + sys.argv[1:], sys.argv[1:]))}
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = widened(args.model or default_model_path(), work)
        parts = {"parity": lambda: parity(device, work), "embed": lambda: embed(device, model, args.shared, args.texts),
                 "budget": lambda: budget(device, model, args.shared, args.texts),
                 "train": lambda: train(device, model, args.shared, work, args.train_examples, args.parity_steps),
                 "profile": lambda: profile(device, model, args.shared, work)}
        for name in args.parts.split(","):
            print(f"{name}:", flush=True)
            started = time.perf_counter()
            try:
                result[name] = parts[name]()
            except Exception as error:  # one part's failure is reported, and the others still run
                import traceback

                traceback.print_exc()
                result[name] = {"error": f"{type(error).__name__}: {error}"}
            result[name]["seconds"] = time.perf_counter() - started
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()


def _parity_lines(p: dict[str, Any]) -> list[str]:
    date = f" ({p['date']})" if "date" in p else ""
    return [f"**Parity**{date}: {p['cases']} cases, every family and head of tests/parity, tiny random "
            f"transformers models. Largest difference, GPU against CPU: {p['worst']['unpadded_vs_cpu']:.2e} "
            f"(unpadded path), {p['worst']['explicit_vs_cpu']:.2e} (padded explicit path); encoderkit against "
            f"transformers, both on the GPU: {p['worst']['vs_transformers_same_device']:.2e}. Tolerance "
            f"{p['tolerance']:g}: {'all within' if p['within_tolerance'] else 'NOT all within'}.", ""]


def _embed_lines(e: dict[str, Any]) -> list[str]:
    from report import _table

    return [f"**Embedding** {e['texts']:,} texts (../shared/bench/sentences.txt), median of {e['rounds']} "
            "interleaved rounds, tokenising included; differences against encoderkit's CPU fp32 vectors:", ""] + \
        _table(["contender", "texts/s", "vs sentence-transformers fp32", "max abs diff", "STS-B dev Spearman"],
               [[row["contender"], f"{row['texts_per_s']:,.0f}", f"{row['vs_sentence_transformers_fp32']:.2f}x",
                 f"{row['max_abs_diff_vs_cpu_fp32']:.1e}", f"{row['stsb_dev_spearman']:.4f}"] for row in e["rows"]])


def render(r: dict[str, Any]) -> list[str]:
    """BENCHMARKS.md's section (bench/report.py)."""
    from report import _table

    gpu = r.get("gpu") or "no GPU: the CPU in its place (a check of the script)"
    if r.get("gpu"):
        gpu += f" ({r['gpu_memory_gib']} GiB, CUDA {r['cuda']}, bf16 {'yes' if r['bf16'] else 'no'})"
    facts = (f"{gpu}, torch {r['machine']['torch']}, transformers {r['transformers']}, sentence-transformers "
             f"{r['sentence_transformers']}; host CPU {r['machine']['cpu']}, {r['machine']['cores']} cores")
    complete = all(part in r for part in ("parity", "train", "embed", "budget", "with_cudnn_attention"))
    title = "## On a GPU: the CUDA path against the CPU path and the peers (bench/gpu.py)"
    if not complete:  # a check of some parts (a later run on another GPU)
        title += f": {', '.join(p for p in ('parity', 'embed', 'budget', 'train') if p in r)}, {r.get('gpu') or 'CPU'}"
    lines = [title, "",
             f"_{r['date']}: {facts}. Command: `{r.get('command', 'python bench/gpu.py (options not recorded)')}` "
             "(the model: all-MiniLM-L6-v2 carried to the GPU "
             "machine with fp16 weights and widened to fp32 there, so every contender reads the same weights). "
             "TF32 off: fp32 products are fp32 products. CI has no GPU; nothing in encoderkit needs one._", ""]
    if not complete:  # a run of some parts: those of them this section shows
        return lines + (_parity_lines(r["parity"]) if "parity" in r else []) + \
            (_embed_lines(r["embed"]) if "embed" in r else [])
    lines += _parity_lines(r["parity"])
    t = r["train"]
    lines += [f"**Fine-tuning parity**: {t['parity']['steps']} steps of SST-2 with dropout off, the same batches on "
              f"the CPU and the GPU: losses differ by at most {t['parity']['max_loss_relative_diff']:.1e} "
              f"(relative), the weights after them by {t['parity']['max_weight_abs_diff']:.1e}.", ""]
    lines += _embed_lines(r["embed"])
    steps = next(row["steps"] for row in t["runs"] if "steps" in row)
    lines += ["", f"**Fine-tuning speed**: {t['examples']:,} SST-2 rows, a tenth held out, one epoch of the rest "
              f"({steps} steps of 32, the same recipe on both sides), against transformers' Trainer with "
              "length-grouped batches; accuracy on the held-out tenth, scored by the same code:", ""]
    before = {row["contender"]: row for row in r["with_cudnn_attention"]["train_runs"]}
    lines += _table(["contender", "examples/s", "vs the grouped Trainer (same precision)", "accuracy",
                     "examples/s with cuDNN's attention (first run)"],
                    [[row["contender"], f"{row['examples_per_s']:,.0f}", f"{row['speedup_vs_grouped_trainer']:.2f}x",
                      f"{row['accuracy']:.4f}", f"{before[row['contender']]['examples_per_s']:,.0f}"]
                     for row in t["runs"]])
    w = r["with_cudnn_attention"]
    steady = {k: r["profile"][k]["steady_steps_per_s"] for k in ("fp32", "bf16")}
    lines += ["", "**What the profile found.** With bf16 autocast, PyTorch's SDPA chose cuDNN's attention, whose calls "
              "cost milliseconds of host time against microseconds of GPU time. cuDNN builds an execution plan for "
              "each new input shape, and packed batches bring new shapes at nearly every step (the likely cause; "
              "not measured apart). In 20 profiled steps: " + "; ".join(f"{row.split()[0]} {row.split()[2]} of CPU time ({row.split()[5]} a "
                                                     f"call over {row.split()[-1]} calls)"
                                                     for row in w["profile_bf16_cudnn_rows"])
              + ". Steady state after 20 warm-up steps: bf16 "
              f"{w['profile_steady_steps_per_s']['bf16']:.1f} steps/s against fp32's "
              f"{w['profile_steady_steps_per_s']['fp32']:.1f}. encoderkit's attention now runs SDPA on a GPU "
              f"without the cuDNN backend (`modeling.attention.sdpa`): bf16 {steady['bf16']:.1f} steps/s, fp32 "
              f"{steady['fp32']:.1f}. What is left is launch-bound: a step's kernels take a few milliseconds of GPU "
              "time and the host's launches the rest. transformers' Trainer with bf16 ran slower than with fp32 in "
              "both runs; its attention was not profiled here.", ""]
    budgets = {}
    for row in r["budget"]["rows"]:
        budgets.setdefault(row["token_budget"], {})[row["dtype"]] = row["texts_per_s"]
    earlier = {}
    for row in w["budget_rows"]:
        earlier.setdefault(row["token_budget"], {})[row["dtype"]] = row["texts_per_s"]
    lines += [f"**Tokens per batch on the GPU** ({r['budget']['texts']:,} texts, median of 3; the earlier run's "
              "bf16 column still had cuDNN's attention). `precision.GPU_BUDGET_FACTOR` sets a GPU's batches to 8x "
              "the CPU's budget (fp32 16,384 tokens, bf16 32,768):", ""]
    lines += _table(["tokens a batch", "fp32 texts/s", "bf16 texts/s", "earlier run: fp32", "earlier run: bf16"],
                    [[f"{tokens:,}", f"{v['fp32']:,.0f}", f"{v['bf16']:,.0f}", f"{earlier[tokens]['fp32']:,.0f}",
                      f"{earlier[tokens]['bf16']:,.0f}"] for tokens, v in sorted(budgets.items())])
    return lines
