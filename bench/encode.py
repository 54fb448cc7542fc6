"""Encode speed: encoderkit vs sentence-transformers vs transformers, interleaved in one process.

On ../shared/bench/sentences.txt (2,000 texts), 2 threads, the default model (all-MiniLM-L6-v2,
max 256 tokens). Each repeat times every contender once, in turn, so drifts in machine speed hit
all of them alike; ratios are taken per repeat and the median reported. Accuracy: max abs
difference of the embeddings from sentence-transformers', and STS-B dev Spearman.

    python bench/encode.py [--repeats 5] [--no-compile]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from common import SHARED, SMOKE, median, require, smoke_size, timed, write_result
from smoke import few, matmul_peak
from smoke_training import skip


def load_sentences() -> list[str]:
    return few(require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines(), 16)


def sorted_batches(sentences: list[str], embed_batch) -> callable:
    """A contender that embeds length-sorted batches of 32 with ``embed_batch(texts) -> (n, 384) tensor``."""
    order = np.argsort([-len(s) for s in sentences], kind="stable")

    def run() -> np.ndarray:
        out = np.zeros((len(sentences), 384), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), 32):
                rows = order[start:start + 32]
                out[rows] = F.normalize(embed_batch([sentences[i] for i in rows]), dim=1).numpy()
        return out

    return run


def transformers_contender(model_dir, sentences):
    """transformers BertModel (sdpa), length-sorted batches of 32, mean pooling, L2 normalisation."""
    import transformers

    from encoderkit.tasks.embed import pool

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()

    def embed_batch(texts: list[str]) -> torch.Tensor:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        return pool(model(**batch).last_hidden_state, batch["attention_mask"], "mean")

    return sorted_batches(sentences, embed_batch)


def encoderkit_compiled(model_dir, sentences):
    """encoderkit's plain padded model under torch.compile(dynamic=True), length-sorted batches of 32."""
    from encoderkit import load_model, Tokenizer
    from encoderkit.tasks.embed import pool

    model = load_model(model_dir, task="base")
    tokenizer = Tokenizer.from_pretrained(model.source.tokenizer_dir)
    compiled = torch.compile(model, dynamic=True)

    def embed_batch(texts: list[str]) -> torch.Tensor:
        batch = tokenizer.encode_batch(texts, max_length=256)
        hidden = compiled(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
        return pool(hidden, batch.attention_mask, "mean")

    return sorted_batches(sentences, embed_batch)


def int8_embedder(model_dir):
    """The engine's model with its linear layers replaced by PyTorch dynamic int8 quantised ones: query, key and
    value as one fused projection (as the fp32 path runs them), the attention output and both feed-forward ones.
    The native kernel is turned off for it: it reads the fp32 weights of the layers it replaces, which are gone."""
    from encoderkit import Embedder, native

    embedder = Embedder.from_pretrained(model_dir)  # fp32; its engine has made its inference plan

    def quantised(*linears: torch.nn.Linear) -> torch.nn.Module:
        """One dynamic-int8 linear computing ``linears`` side by side (outputs concatenated)."""
        has_bias = linears[0].bias is not None
        linear = torch.nn.Linear(linears[0].in_features, sum(x.out_features for x in linears), bias=has_bias)
        with torch.no_grad():
            linear.weight.copy_(torch.cat([x.weight.float() for x in linears]))
            if has_bias:
                linear.bias.copy_(torch.cat([x.bias.float() for x in linears]))
        return torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                      dtype=torch.qint8)[0]

    plan = embedder.engine.encoder.inference_plan
    for layer in embedder.model.layers:
        attention = layer.attention
        if hasattr(attention, "qkv"):
            attention.qkv = quantised(attention.qkv)
        else:  # the plan runs the three as one fused projection: this one in its place
            plan.set_projection(attention, quantised(attention.query, attention.key, attention.value))
        attention.output = quantised(attention.output)
        layer.ffn_in, layer.ffn_out = quantised(layer.ffn_in), quantised(layer.ffn_out)
    native.disable(embedder.engine.encoder)
    return embedder


def sts_spearman(encode) -> float:
    from encoderkit.data.readers import read_sts
    from encoderkit.tasks.sts import spearman

    pairs = few(read_sts(require(SHARED / "data" / "stsb" / "sts-dev.csv")), 8)
    a = encode([p.sentence1 for p in pairs])
    b = encode([p.sentence2 for p in pairs])
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return spearman(np.array([p.score for p in pairs]), (a * b).sum(1))


def add_compiled(contenders: dict, model_dir, sentences: list[str]) -> float | str | None:
    """Add the torch.compile contender to ``contenders``: the seconds of its first pass (which compiles), or why it
    failed (reported, not hidden). A smoke run leaves it out: compiling costs the same at any input size."""
    if SMOKE:
        skip("the torch.compile contender", "compiling costs the same at any input size: too long for a smoke run")
        return None
    try:
        run = encoderkit_compiled(model_dir, sentences)
        compile_seconds, _ = timed(run)  # the first pass compiles
        contenders["encoderkit fp32 torch.compile"] = run
        return compile_seconds
    except Exception as exc:  # report, do not hide
        print(f"torch.compile failed: {type(exc).__name__}: {exc}")
        return f"failed: {type(exc).__name__}"


def print_rows(rows: list[dict]) -> None:
    """The table of every contender: speed, share of the matmul peak, against sentence-transformers, accuracy."""
    print(f"\n{'contender':32s} {'texts/s':>8s} {'tokens/s':>9s} {'GFLOP/s':>8s} {'peak%':>6s} {'vs ST':>6s} "
          f"{'max|diff|':>9s} {'STS rho':>8s}")
    for row in rows:
        print(f"{row['contender']:32s} {row['texts_per_second']:8.0f} {row['tokens_per_second']:9.0f} "
              f"{row['gflops_per_second']:8.1f} {100 * (row['share_of_mm_peak'] or 0):5.0f}% "
              f"{row['speedup_vs_sentence_transformers']:5.2f}x {row['max_abs_diff_vs_sentence_transformers']:9.1e} "
              f"{row.get('sts_dev_spearman', float('nan')):8.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=smoke_size(5, 1))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile contender")
    args = parser.parse_args()
    torch.set_num_threads(2)

    from sentence_transformers import SentenceTransformer

    from encoderkit import Embedder, default_model_path, Tokenizer

    model_dir = default_model_path()
    sentences = load_sentences()
    tokenizer = Tokenizer.from_pretrained(model_dir)
    lengths = np.array([len(x) for x in tokenizer.encode_ids(sentences, max_length=256)[0]])
    tokens = int(lengths.sum())
    layers, hidden, inner = 6, 384, 1536
    # FLOPs: dense layers 2*(4H^2 + 2HI) per token per layer; attention 4*L*H per token per layer.
    flops = float(layers * (tokens * 2 * (4 * hidden**2 + 2 * hidden * inner) + (4 * lengths**2 * hidden).sum()))
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    print(f"{len(sentences)} texts, {tokens:,} real tokens, {flops / 1e12:.2f} TFLOP per pass; "
          f"torch.mm peak fp32 {peaks['fp32']:.0f} GFLOP/s, bf16 {peaks['bf16']:.0f} GFLOP/s")

    st_model = SentenceTransformer(str(model_dir), device="cpu")
    fp32 = Embedder.from_pretrained(model_dir, dtype="fp32")
    bf16 = Embedder.from_pretrained(model_dir, dtype="bf16")
    int8 = int8_embedder(model_dir)
    contenders = {
        "sentence-transformers": lambda: st_model.encode(sentences, batch_size=32),
        "transformers": transformers_contender(model_dir, sentences),
        "encoderkit fp32": lambda: fp32.encode(sentences),
        "encoderkit bf16": lambda: bf16.encode(sentences),
        "encoderkit int8 (dynamic)": lambda: int8.encode(sentences),
    }
    compile_seconds = None if args.no_compile else add_compiled(contenders, model_dir, sentences)

    outputs = {name: fn() for name, fn in contenders.items()}  # warm-up, and the vectors compared below
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for repeat in range(args.repeats):
        for name, fn in contenders.items():
            seconds, _ = timed(fn)
            times[name].append(seconds)
        print(f"repeat {repeat + 1}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()))

    reference = outputs["sentence-transformers"]
    baseline = times["sentence-transformers"]
    sts = {
        "sentence-transformers": sts_spearman(lambda t: st_model.encode(t, batch_size=32)),
        "encoderkit fp32": sts_spearman(fp32.encode),
        "encoderkit bf16": sts_spearman(bf16.encode),
        "encoderkit int8 (dynamic)": sts_spearman(int8.encode),
    }
    rows = []
    for name, seconds in times.items():
        dtype = "bf16" if "bf16" in name else "int8" if "int8" in name else "fp32"
        t = median(seconds)
        row = {
            "contender": name, "median_seconds": t, "seconds": seconds,
            "texts_per_second": len(sentences) / t, "tokens_per_second": tokens / t,
            "gflops_per_second": flops / t / 1e9,
            "share_of_mm_peak": flops / t / 1e9 / peaks[dtype] if dtype in peaks else None,
            "speedup_vs_sentence_transformers": median([b / s for b, s in zip(baseline, seconds)]),
            "max_abs_diff_vs_sentence_transformers": float(np.abs(outputs[name] - reference).max()),
        }
        if name in sts:
            row["sts_dev_spearman"] = sts[name]
        rows.append(row)
    print_rows(rows)
    write_result("encode", {
        "texts": len(sentences), "tokens": tokens, "tflop_per_pass": flops / 1e12, "repeats": args.repeats,
        "mm_peak_gflops": peaks, "compile_first_pass_seconds": compile_seconds, "rows": rows,
    })


if __name__ == "__main__":
    main()
