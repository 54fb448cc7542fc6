"""int8 inference: encoderkit ``dtype="int8"`` vs CTranslate2 int8 (and encoderkit fp32), interleaved in one process.

On ../shared/bench/sentences.txt (2,000 texts), all-MiniLM-L6-v2, 2 threads, truncation to 256 tokens,
length-sorted batches of 32, texts/s including tokenisation (both tokenise with the model's tokenizer.json).
Each repeat times every contender once, in turn; ratios are per repeat, the median reported. Accuracy:
STS-B dev Spearman, and the cosine of each text's vector to encoderkit fp32's. A torch.profiler table of one
int8 pass shows where its time goes.

CTranslate2's model is converted from the local model directory (ct2-transformers-converter, int8) into a
temporary directory; ``pip install ctranslate2`` first.

    python bench/int8.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import SHARED, SMOKE, median, require, smoke_size, timed, write_result
from smoke import few
from smoke_training import skip


def ct2_contender(model_dir: Path, tokenizer, out_dir: Path):
    """CTranslate2's Encoder (int8), length-sorted batches of 32, mean pooling, L2 normalisation."""
    import ctranslate2

    converter = Path(sys.executable).with_name("ct2-transformers-converter")
    subprocess.run([str(converter), "--model", str(model_dir), "--output_dir", str(out_dir), "--quantization",
                    "int8", "--force"], check=True, capture_output=True)
    encoder = ctranslate2.Encoder(str(out_dir), device="cpu", compute_type="int8", intra_threads=2)

    def encode(texts: list[str]) -> np.ndarray:
        ids = tokenizer.encode_ids(texts, max_length=256)[0]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for start in range(0, len(order), 32):
            rows = order[start:start + 32]
            batch = [ids[i] for i in rows]
            hidden = np.asarray(encoder.forward_batch(batch).last_hidden_state)
            lengths = np.array([len(b) for b in batch])
            mask = (np.arange(hidden.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
            vectors = (hidden * mask[..., None]).sum(1) / lengths[:, None]
            out[rows] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return out

    return encode, ctranslate2.__version__


def sts_spearman(encode) -> float:
    from encoderkit.data.readers import read_sts
    from encoderkit.tasks.sts import spearman

    pairs = few(read_sts(require(SHARED / "data" / "stsb" / "sts-dev.csv")), 8)
    a, b = encode([p.sentence1 for p in pairs]), encode([p.sentence2 for p in pairs])
    return spearman(np.array([p.score for p in pairs]), (a * b).sum(1))


def profile_table(encode, sentences: list[str]) -> list[dict]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        encode(sentences)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total,
             "calls": e.count} for e in events[:15]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=smoke_size(5, 1))
    args = parser.parse_args()
    torch.set_num_threads(2)

    from encoderkit import Embedder, default_model_path

    model_dir = default_model_path()
    sentences = few(require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines(), 16)
    fp32 = Embedder.from_pretrained(model_dir, dtype="fp32", normalize=True)
    int8 = Embedder.from_pretrained(model_dir, dtype="int8", normalize=True)
    with tempfile.TemporaryDirectory() as tmp:
        contenders, ct2_version = {}, None
        if SMOKE and importlib.util.find_spec("ctranslate2") is None:
            skip("the CTranslate2 contender", "ctranslate2 is not installed (pip install ctranslate2)")
        else:
            ct2, ct2_version = ct2_contender(model_dir, fp32.tokenizer, Path(tmp) / "ct2")
            contenders["CTranslate2 int8"] = ct2
        contenders.update({
            "encoderkit int8": lambda texts: int8.encode(texts, batch_size=32),
            "encoderkit int8 (token budget)": lambda texts: int8.encode(texts),
            "encoderkit fp32": lambda texts: fp32.encode(texts, batch_size=32),
        })
        outputs = {name: fn(sentences) for name, fn in contenders.items()}  # warm-up, and the vectors compared
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for repeat in range(args.repeats):
            for name, fn in contenders.items():
                seconds, _ = timed(lambda: fn(sentences))
                times[name].append(seconds)
            print(f"repeat {repeat + 1}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()), flush=True)
        sts = {name: sts_spearman(fn) for name, fn in contenders.items() if "token budget" not in name}
    profile = profile_table(lambda texts: int8.encode(texts, batch_size=32), sentences)
    reference, baseline = outputs["encoderkit fp32"], times.get("CTranslate2 int8")
    rows = []
    for name, seconds in times.items():
        cosine = (outputs[name] * reference).sum(1)
        rows.append({
            "contender": name, "median_seconds": median(seconds), "seconds": seconds,
            "texts_per_second": len(sentences) / median(seconds),
            "speedup_vs_ctranslate2_int8": median([b / s for b, s in zip(baseline, seconds)]) if baseline else None,
            "cosine_to_fp32_mean": float(cosine.mean()), "cosine_to_fp32_min": float(cosine.min()),
            "sts_dev_spearman": sts.get(name),
        })
    print(f"\n{'contender':32s} {'texts/s':>8s} {'vs CT2':>7s} {'cos mean':>9s} {'cos min':>8s} {'STS rho':>8s}")
    for row in rows:
        rho = row["sts_dev_spearman"]
        speedup = "" if row["speedup_vs_ctranslate2_int8"] is None else f"{row['speedup_vs_ctranslate2_int8']:6.2f}x"
        print(f"{row['contender']:32s} {row['texts_per_second']:8.0f} {speedup:>7} "
              f"{row['cosine_to_fp32_mean']:9.5f} {row['cosine_to_fp32_min']:8.5f} "
              f"{'' if rho is None else f'{100 * rho:8.3f}'}")
    print("\nwhere encoderkit int8's time goes (torch.profiler, one pass):")
    for entry in profile:
        print(f"  {entry['op']:50s} {entry['self_ms']:9.1f} ms {100 * entry['share']:5.1f}%  x{entry['calls']}")
    report = int8.quantization
    write_result("int8", {
        "texts": len(sentences), "repeats": args.repeats, "batch_size": 32, "max_length": 256,
        "ctranslate2": ct2_version, "rows": rows, "profile_int8": profile,
        "guard": {"mean_cosine": report.mean_cosine, "worst_cosine": report.worst_cosine, "texts": report.texts,
                  "smoothing": report.smoothing, "layer_errors": report.layer_errors},
    })


if __name__ == "__main__":
    main()
