"""How low can PyTorch go for one short text? The single-text latency of issue 22, taken apart (issue 22, point 6).

bench/peers.py measures encoderkit's single-text p50 against ONNX Runtime's with the BERT optimizer (O3). This
script asks where the gap is, all in one process, 2 threads, interleaved in blocks, from token ids (no tokenising)
to a normalised mean-pooled vector, on the same 5 short texts as peers.py (all-MiniLM-L6-v2):

- ``ONNX Runtime O3`` and ``ONNX Runtime O2``: peers.py's optimized graphs, with GELU approximated by tanh and
  exact (its cache, made by peers.py when missing); the faster is the one to beat (peers.py's goal names the best);
- ``encoderkit``: the engine's path for one sequence (``Embedder.encode_tokens``: packing, the layers, pooling),
  which runs the embeddings and every layer in one call of encoderkit's native kernel (``encoderkit.native``);
- ``native kernel alone``: that one call, from token ids to the last layer's states, without the engine around it;
- ``encoderkit, PyTorch layers``: the same engine with the native kernel turned off (``native.disable``): what
  every single text ran before it;
- ``PyTorch floor``: the least PyTorch can do for this model: a hand-written loop over the same pre-packed MKL
  weights (the fused query/key/value product, SDPA, the output product plus residual, LayerNorm, the first FFN
  product with GELU in place, the second plus residual, LayerNorm), no modules, no packing, no checks. No
  PyTorch forward of this model takes fewer ops: it bounds what removing overhead around PyTorch's ops can buy,
  and the native kernel is what it takes to go below it;
- the 24 matrix products alone, at one text's shape (rows = the text's tokens), on MKL's packed GEMM (the
  PyTorch layers' kernel for few rows) against the same 24 MatMul+Add in an ONNX Runtime graph;
- int8: ``ONNX Runtime int8 (dynamic)`` (peers.py's quantised graph) against ``encoderkit int8`` (the engine with
  ``dtype="int8"``, calibrated and smoothed by its accuracy guard; the native kernel runs its int8 products where
  the CPU has AVX512-VNNI or AVX-VNNI) and the same with the native kernel off (PyTorch's int8 kernels).

    flock -x /tmp/bench.lock python bench/latency_floor.py [--calls 300] [--threads 2] [--model DIR]
        [--shared DIR] [--result latency_floor]

``--model``/``--shared``: the model directory and the shared folder where the defaults are absent (a borrowed
machine; fp16 weights are widened to fp32 first, ``common.widened``); ``--result``: the file under bench/results/,
so that a run on another CPU does not replace this one's. Writes bench/results/latency_floor.json.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from common import SHARED, require, smoke_size, widened, write_result
from peers import MAX_LENGTH, THREADS, export_onnx, optimize_onnx, ort_session, quantize_onnx, short_texts


def p50_interleaved(contenders: dict[str, Callable[[int], Any]], inputs: int, calls: int, block: int = 10,
                    settle_s: float = 0.2) -> dict[str, list[float]]:
    """Seconds per call of each contender on input ``i % inputs``, in blocks of ``block`` calls taken in turn.
    Each block waits ``settle_s`` first (bench/peers.py's rule): ONNX Runtime's threads spin after a call and
    torch's OpenMP threads wait actively for a while, so a block that starts right after another runtime's shares
    the two cores with that runtime's spinning threads."""
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for run in contenders.values():  # warm-up
        for i in range(4 * inputs):
            run(i % inputs)
    for r in range(calls // block):
        for name, run in contenders.items():
            time.sleep(settle_s)
            for k in range(3):
                run((r + k) % inputs)
            for i in range(block):
                started = time.perf_counter()
                run((r * block + i) % inputs)
                seconds[name].append(time.perf_counter() - started)
    return seconds


class Floor:
    """The least PyTorch forward of a BERT-shaped encoder: pre-packed MKL products and the functional ops, in a
    plain loop, with encoderkit's weights (the same numbers, checked against encoderkit's vectors)."""

    def __init__(self, encoder) -> None:
        state = {k: v.detach() for k, v in encoder.state_dict().items()}
        config = encoder.config
        self.heads, self.hidden, self.eps = config.num_attention_heads, config.hidden_size, config.layer_norm_eps
        self.head_dim = self.hidden // self.heads
        pack = lambda w: (w.contiguous(), torch.ops.mkl._mkl_reorder_linear_weight(w.contiguous(), 32))  # noqa: E731
        self.layers = []
        for i in range(config.num_hidden_layers):
            p = f"layers.{i}."
            get = lambda name: state[p + name]  # noqa: E731
            qkv = pack(torch.cat([get("attention.query.weight"), get("attention.key.weight"),
                                  get("attention.value.weight")]))
            qkv_bias = torch.cat([get("attention.query.bias"), get("attention.key.bias"), get("attention.value.bias")])
            self.layers.append((qkv, qkv_bias, pack(get("attention.output.weight")), get("attention.output.bias"),
                                get("attention_norm.weight"), get("attention_norm.bias"), pack(get("ffn_in.weight")),
                                get("ffn_in.bias"), pack(get("ffn_out.weight")), get("ffn_out.bias"),
                                get("ffn_norm.weight"), get("ffn_norm.bias")))
        self.word, self.position = state["embeddings.word.weight"], state["embeddings.position.weight"]
        self.token_type = state["embeddings.token_type.weight"][0]
        self.norm = state["embeddings.norm.weight"], state["embeddings.norm.bias"]

    def __call__(self, ids: list[int]) -> torch.Tensor:
        n, hidden, product = len(ids), (self.hidden,), torch.ops.mkl._mkl_linear
        with torch.inference_mode():
            x = F.layer_norm(self.word[torch.tensor(ids)] + self.position[:n] + self.token_type, hidden, *self.norm,
                             self.eps)
            for (qkv, qkv_bias, out, out_bias, norm1, bias1, ffn_in, in_bias, ffn_out, out2_bias, norm2,
                 bias2) in self.layers:
                q, k, v = product(x, qkv[1], qkv[0], qkv_bias, n).view(n, 3, self.heads, self.head_dim) \
                    .permute(1, 2, 0, 3)
                attended = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(n, self.hidden)
                x = F.layer_norm(product(attended, out[1], out[0], out_bias, n).add_(x), hidden, norm1, bias1,
                                 self.eps)
                inner = torch.ops.aten.gelu_(product(x, ffn_in[1], ffn_in[0], in_bias, n))
                x = F.layer_norm(product(inner, ffn_out[1], ffn_out[0], out2_bias, n).add_(x), hidden, norm2, bias2,
                                 self.eps)
            pooled = x.mean(0)
            return pooled / pooled.norm()


def products_only(floor: Floor, rows: int, threads: int) -> tuple[Callable[[int], Any], Callable[[int], Any]]:
    """The forward's 24 products at ``rows`` rows: MKL's packed GEMM, and ONNX Runtime's MatMul+Add."""
    from onnx import TensorProto, helper, numpy_helper

    products = []
    for layer in floor.layers:
        products += [(layer[0], layer[1]), (layer[2], layer[3]), (layer[6], layer[7]), (layer[8], layer[9])]
    inputs = {size: torch.randn(rows, size) for size in {w[0].shape[1] for w, _ in products}}

    def torch_products(_: int) -> None:
        for (weight, packed), bias in products:
            torch.ops.mkl._mkl_linear(inputs[weight.shape[1]], packed, weight, bias, rows)

    nodes, initializers, outputs = [], [], []
    for i, ((weight, _), bias) in enumerate(products):
        initializers += [numpy_helper.from_array(weight.T.contiguous().numpy(), f"w{i}"),
                         numpy_helper.from_array(bias.numpy(), f"b{i}")]
        nodes += [helper.make_node("MatMul", [f"x{weight.shape[1]}", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "products", [helper.make_tensor_value_info(f"x{size}", TensorProto.FLOAT,
                                                                                [None, size]) for size in inputs],
                              outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {f"x{size}": x.numpy() for size, x in inputs.items()}
    return torch_products, lambda _: session.run(None, feed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=smoke_size(300, 10))
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--model", type=Path, help="the all-MiniLM-L6-v2 directory (default: the installed model)")
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--result", default="latency_floor")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from encoderkit import Embedder, default_model_path, native
    from encoderkit.modeling.packing import Packing

    work = tempfile.TemporaryDirectory()
    model_dir = widened(args.model, Path(work.name)) if args.model else default_model_path()
    embedder = Embedder.from_pretrained(model_dir, dtype="fp32")
    sentences = require(args.shared / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    texts = short_texts(sentences)
    ids = embedder.tokenizer.encode_ids(texts, max_length=MAX_LENGTH)[0]
    plain = export_onnx(model_dir)
    session = ort_session(optimize_onnx(plain, gelu_approximation=True), threads=args.threads)
    o2_session = ort_session(optimize_onnx(plain, gelu_approximation=False), threads=args.threads)
    int8_session = ort_session(quantize_onnx(optimize_onnx(plain, gelu_approximation=False)), threads=args.threads)
    try:
        floor = Floor(embedder.engine.encoder)
    except (RuntimeError, AttributeError) as error:  # a torch without MKL: no floor, no MKL products
        print(f"no PyTorch floor here: {error}")
        floor = None
    torch_layers = Embedder.from_pretrained(model_dir, dtype="fp32")
    native.disable(torch_layers.engine.encoder)
    int8 = Embedder.from_pretrained(model_dir, dtype="int8")
    int8_torch_layers = Embedder.from_pretrained(model_dir, dtype="int8")
    native.disable(int8_torch_layers.engine.encoder)
    for one in (embedder, int8):
        one.encode_tokens([ids[0]], None)
    kernel = native.kernel_of(embedder.engine.encoder)
    if kernel is None:
        raise SystemExit(f"encoderkit's native kernel did not run: {native.status()}")
    int8_native = native.kernel_of(int8.engine.encoder) is not None
    packed = [(torch.tensor(x), Packing.from_lengths([len(x)], overhead=0)) for x in ids]

    def kernel_alone(i: int) -> torch.Tensor:
        with torch.inference_mode():
            hidden = kernel(packed[i][0], None, packed[i][1].positions, packed[i][1].cu_seqlens)
            pooled = hidden.mean(0)
            return pooled / pooled.norm()

    def ort_vector(session) -> Callable[[int], np.ndarray]:
        def run(i: int) -> np.ndarray:
            row = np.array([ids[i]], dtype=np.int64)
            hidden = session.run(None, {"input_ids": row, "attention_mask": np.ones_like(row),
                                        "token_type_ids": np.zeros_like(row)})[0][0]
            pooled = hidden.mean(0)
            return pooled / np.linalg.norm(pooled)
        return run

    def engine_vector(one) -> Callable[[int], torch.Tensor]:
        return lambda i: torch.nn.functional.normalize(one.encode_tokens([ids[i]], None), dim=1)[0]

    contenders = {"ONNX Runtime O3": ort_vector(session), "ONNX Runtime O2": ort_vector(o2_session),
                  "encoderkit (engine, one sequence)": engine_vector(embedder),
                  "native kernel alone (ids to states, one call)": kernel_alone,
                  "encoderkit, PyTorch layers (native kernel off)": engine_vector(torch_layers),
                  "ONNX Runtime int8 (dynamic)": ort_vector(int8_session),
                  "encoderkit int8 (engine, one sequence)": engine_vector(int8),
                  "encoderkit int8, PyTorch layers (native kernel off)": engine_vector(int8_torch_layers)}
    if floor is not None:
        contenders["PyTorch floor (hand-written loop)"] = lambda i: floor(ids[i])
    reference = [embedder.encode(t) for t in texts]
    differences = {name: max(float(np.abs(np.asarray(run(i)) - reference[i]).max()) for i in range(len(texts)))
                   for name, run in contenders.items()}
    rows = int(np.median([len(x) for x in ids]))
    if floor is not None:
        mkl, onnx_products = products_only(floor, rows, args.threads)
        contenders.update({f"24 products, {rows} rows: MKL packed (the PyTorch layers')": mkl,
                           f"24 products, {rows} rows: ONNX Runtime MatMul+Add": onnx_products})
    seconds = p50_interleaved(contenders, len(texts), args.calls)
    table = []
    for name, values in seconds.items():
        ms = np.array(values) * 1e3
        table.append({"contender": name, "calls": len(ms), "p50_ms": float(np.percentile(ms, 50)),
                      "p99_ms": float(np.percentile(ms, 99)), "max_abs_diff_vs_encoderkit": differences.get(name)})
        print(f"  {name:52s} p50 {table[-1]['p50_ms']:6.2f} ms  p99 {table[-1]['p99_ms']:6.2f} ms", flush=True)
    command = f"python bench/latency_floor.py --calls {args.calls}" + (
        f" --threads {args.threads}" if args.threads != THREADS else "")
    write_result(args.result, {"texts": texts, "tokens": [len(x) for x in ids], "rows": table, "settle_s": 0.2,
                               "threads": args.threads, "native": native.status(), "int8_native": int8_native,
                               "command": command}, benchmark="latency_floor")


def render(r: dict[str, Any]) -> list[str]:
    from report import _machine, _table

    by_name = {row["contender"]: row for row in r["rows"]}
    # the faster of ONNX Runtime's fp32 graphs (runs before O2 was added have O3 alone)
    ort_p50 = min(by_name[name]["p50_ms"] for name in ("ONNX Runtime O3", "ONNX Runtime O2") if name in by_name)
    threads = r.get("threads", 2)
    flags = r["machine"].get("cpu_flags", {})
    features = "AMX" if flags.get("amx_bf16") else "AVX-512" if flags.get("avx512f") else "AVX2"
    title = f"## Single-text latency taken apart (`bench/latency_floor.py`): {threads} threads, {features}"
    lines = [title, "", _machine(r), "",
             f"One process, {threads} threads, interleaved in blocks of 10 (each after a "
             f"{r.get('settle_s', 0)} s pause, so that the previous runtime's spinning threads have gone to sleep), "
             f"{r['rows'][0]['calls']} calls each, from token ids "
             f"to a normalised mean-pooled vector; {len(r['texts'])} short texts of {min(r['tokens'])}-"
             f"{max(r['tokens'])} tokens (bench/peers.py's). encoderkit's engine runs the embeddings and every layer "
             "of one short text in one call of its native kernel (`encoderkit.native`, built with the machine's C++ "
             "compiler); the row with the kernel off is the same engine on its PyTorch layers. The PyTorch floor is a "
             "hand-written loop over MKL's pre-packed weights, with none of encoderkit's modules, packing or checks: "
             "no PyTorch forward of this model takes fewer ops. The int8 rows: encoderkit with `dtype=\"int8\"` "
             "(its native kernel's int8 products, summed exactly by VNNI, or in 16-bit pairs of 7-bit weight codes "
             "on AVX2; " + ("it ran here" if r.get("int8_native", True) else "not here") + "), and the same with the "
             "kernel off, against ONNX Runtime's dynamic int8 graph.", ""]
    ort_products = next((row["p50_ms"] for row in r["rows"] if row["contender"].endswith("ONNX Runtime MatMul+Add")),
                        None)
    ort_int8 = by_name.get("ONNX Runtime int8 (dynamic)", {}).get("p50_ms")

    def base(row: dict[str, Any]) -> float:
        if row["contender"].startswith("24 products"):
            return ort_products
        return ort_int8 if "int8" in row["contender"] else ort_p50

    lines += _table(["contender", "p50 ms", "p99 ms", "p50 vs ONNX Runtime's (the whole model: its faster fp32 graph, "
                     "int8 rows its int8 one; the products: its products)", "max abs diff to encoderkit"],
                    [[row["contender"], f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
                      f"{row['p50_ms'] / base(row):.2f}x",
                      "" if row["max_abs_diff_vs_encoderkit"] is None else f"{row['max_abs_diff_vs_encoderkit']:.1e}"]
                     for row in r["rows"]])
    return lines


if __name__ == "__main__":
    main()
