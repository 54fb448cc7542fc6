"""bench/peers.py: the peers' pipeline (tokenizer.json, padding, mean pooling, normalisation, batches sorted by
length and put back in input order) gives sentence-transformers' vectors, so the benchmark times equal work;
an encoderkit dtype that does not exist is reported as not available rather than failing the run."""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import numpy as np
import pytest
from conftest import bench_module


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    module = bench_module("peers")
    module.PEER_CACHE = tmp_path_factory.mktemp("peer-cache")  # exports go here, not into bench/.cache
    return module


@pytest.fixture(scope="module")
def texts(bench_sentences) -> list[str]:
    """A mix of lengths (one past 256 tokens, so truncation counts), in an order that is not sorted."""
    long = max(bench_sentences, key=len)
    return [bench_sentences[0], long, "ok", *bench_sentences[1:40]]


@pytest.fixture(scope="module")
def reference(minilm_dir, texts) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, batch_size=32, normalize_embeddings=True)


pytestmark = pytest.mark.data


def test_onnx_runtime_contender_equals_sentence_transformers(peers, minilm_dir, texts, reference):
    pytest.importorskip("onnxruntime")
    contender = peers.ort_contender("ONNX Runtime", "fp32", peers.export_onnx(minilm_dir),
                                    peers.PeerTokenizer(minilm_dir), "")
    vectors = contender.encode(texts)
    assert vectors.shape == reference.shape
    assert np.abs(vectors - reference).max() < 1e-5
    assert np.abs(contender.one(texts[1]) - reference[1]).max() < 1e-5


def test_ctranslate2_contender_equals_sentence_transformers(peers, minilm_dir, texts, reference):
    pytest.importorskip("ctranslate2")
    contender = peers.ct2_contender("CTranslate2 float32", "float32", peers.convert_ct2(minilm_dir),
                                    peers.PeerTokenizer(minilm_dir), "")
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
    with contender.turn():
        assert np.abs(contender.encode(texts) - reference).max() < 1e-5
    assert contender.details["compute_type"] == "float32"
    with pytest.raises(IndexError):  # the encoder is held during a turn only
        contender.one(texts[0])
    if threads is not None:  # its worker thread is gone with it
        deadline = time.monotonic() + 5
        while len(os.listdir("/proc/self/task")) > threads and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(os.listdir("/proc/self/task")) <= threads


def test_fastembed_contenders_equal_sentence_transformers(peers, minilm_dir, texts, reference):
    """fastembed from the local folder peers.py makes (nothing downloaded), in its latency mode and in its worker
    processes: sentence-transformers' vectors in input order, the text past 256 tokens truncated as the model's
    max_seq_length says."""
    pytest.importorskip("fastembed")
    name = peers.fastembed_name(minilm_dir)
    assert name == "sentence-transformers/all-MiniLM-L6-v2"
    folder = peers.fastembed_folder(minilm_dir, peers.export_onnx(minilm_dir))
    many = texts * 2  # more batches of 32 than worker processes
    for throughput in (False, True):
        contender = peers.fastembed_contender("fastembed", name, folder, "", throughput=throughput)
        assert contender.mode == ("throughput" if throughput else "latency")
        with contender.turn():
            assert np.abs(contender.encode(many) - np.concatenate([reference] * 2)).max() < 1e-5
    assert np.abs(contender.one(texts[1]) - reference[1]).max() < 1e-5


def test_a_model_fastembed_does_not_register_is_not_available(peers, tmp_path):
    pytest.importorskip("fastembed")
    other = tmp_path / "all-mpnet-base-v2"
    other.mkdir()
    assert peers.fastembed_name(other) is None


def test_unknown_encoderkit_dtype_is_not_available(peers, minilm_dir):
    from encoderkit import Embedder

    assert peers.encoderkit_embedder(minilm_dir, "fp16x") is None
    assert isinstance(peers.encoderkit_embedder(minilm_dir, "fp32"), Embedder)


def test_throughput_modes_give_the_same_vectors_in_input_order(peers, minilm_dir, texts, reference):
    """Each peer's throughput mode (parallel lanes: ONNX Runtime sessions, OpenVINO's AsyncInferQueue,
    CTranslate2's inter-op threads) puts every batch's vectors back in input order: sentence-transformers' vectors."""
    tokenizer = peers.PeerTokenizer(minilm_dir)
    many = texts * 2  # 86 texts: more batches (of 32) than lanes, so lanes take turns
    want = np.concatenate([reference] * 2)
    built = []
    if importlib.util.find_spec("onnxruntime"):
        built.append(peers.ort_lanes_contender("ONNX Runtime O2, throughput", "fp32",
                                               peers.optimize_onnx(peers.export_onnx(minilm_dir), False), tokenizer, ""))
    if importlib.util.find_spec("openvino"):
        built.append(peers.openvino_contender("OpenVINO f32, throughput", peers.export_onnx(minilm_dir), tokenizer,
                                              "f32", "", throughput=True))
    if importlib.util.find_spec("ctranslate2"):
        built.append(peers.ct2_contender("CTranslate2 float32, throughput", "float32", peers.convert_ct2(minilm_dir),
                                         tokenizer, "", throughput=True))
    if not built:
        pytest.skip("no peer runtime installed (the bench extra)")
    for contender in built:
        assert contender.mode == "throughput"
        with contender.turn():
            assert np.abs(contender.encode(many) - want).max() < 1e-5, contender.name


def test_runs_are_kept_per_tier_of_cpu(peers, tmp_path, monkeypatch):
    """A run on another tier of CPU is kept beside the new one (an AVX-512 run must not remove the AVX2 run)."""
    import json

    avx2 = {"native_bf16": False, "cpu_flags": {"avx2": True, "avx512f": False}}
    avx512 = {"native_bf16": False, "cpu_flags": {"avx2": True, "avx512f": True}}
    bf16 = {"native_bf16": True, "cpu_flags": {"avx2": True, "avx512f": True, "avx512_bf16": True}}
    assert [peers.cpu_tier(m) for m in (avx2, avx512, bf16)] == ["avx2", "avx512", "native_bf16"]
    # a bigger CPU limited to AVX2 by the instruction variables is a tier of its own, whatever its flags
    assert peers.cpu_tier(bf16, {"ENCODERKIT_NATIVE_FLAGS": "-mno-avx512f"}) == "avx2_imitated"
    assert peers.cpu_tier(avx512, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) == "avx2_imitated"
    assert peers.cpu_tier(bf16, {"ENCODERKIT_NATIVE_FLAGS": "-O2"}) == "native_bf16"
    monkeypatch.setattr(peers, "RESULTS", tmp_path)
    (tmp_path / "peers.json").write_text(json.dumps({"date": "earlier", "machine": avx2}))
    monkeypatch.setitem(sys.modules, "common", type(sys)("common"))
    sys.modules["common"].machine = lambda: avx512
    sys.modules["common"].instruction_environment = lambda: {
        name: os.environ[name] for name in ("ENCODERKIT_NATIVE_FLAGS", "ONEDNN_MAX_CPU_ISA") if os.environ.get(name)}
    monkeypatch.delenv("ENCODERKIT_NATIVE_FLAGS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    peers.keep_other_tier_run()
    kept = json.loads((tmp_path / "peers_avx2.json").read_text())
    assert kept["kept_as"] == "avx2" and kept["machine"] == avx2
    (tmp_path / "peers_avx512.json").write_text("{}")  # an older run of this tier: superseded
    peers.keep_other_tier_run()
    assert not (tmp_path / "peers_avx512.json").exists() and (tmp_path / "peers_avx2.json").exists()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert peers.this_tier() == "avx2_imitated"  # such a run is written as peers_avx2_imitated.json, beside these


def _profiled_kinds(peers, minilm_dir, texts) -> tuple[dict[str, float], float]:
    result = peers.profile_encoderkit(minilm_dir, texts)
    kinds = result["seconds_by_kind"]
    assert all(seconds >= 0 for seconds in kinds.values())
    return kinds, result["profiled_seconds"]


def test_profile_charges_the_native_kernel_its_time(peers, minilm_dir, texts, monkeypatch):
    """The native kernel runs no torch op: its calls are charged to it, not to "Python and dispatch" (a run on an
    AVX2 CPU, where every batch took the kernel, once showed 99% of encoderkit's time as Python)."""
    from encoderkit import native

    if native.library() is None:
        pytest.skip(f"no native kernel here: {native.status()}")
    monkeypatch.setattr(peers, "BATCH", 1)  # one short text a batch: within the kernel's MAX_TOKENS on every build
    short = [text for text in texts if len(text) < 120][:12]
    kinds, profiled = _profiled_kinds(peers, minilm_dir, short)
    kernel = kinds[peers.NATIVE_SCOPES["ek::native"]]
    assert kernel > kinds["Python and dispatch (not in any op)"]
    assert kernel < profiled and abs(sum(kinds.values()) - profiled) < 1e-6 * profiled + 1e-9
    assert not any(kind.startswith("linear") for kind in kinds)  # no product ran outside the kernel


def test_profile_names_each_linear_layer_of_the_pytorch_layers(peers, minilm_dir, texts, monkeypatch):
    """Without the native kernel, each product is charged to its layer (the inference products take the module
    after the plan, so a position-based lookup once charged them all to "other")."""
    from encoderkit import native

    monkeypatch.setattr(native, "library", lambda: None)
    kinds, profiled = _profiled_kinds(peers, minilm_dir, texts[:40])
    linear = {kind for kind in kinds if kind.startswith("linear")}
    assert linear == {f"linear (matmul): {name}" for name in ("qkv", "attention output", "ffn in", "ffn out")}
    assert not any(kind.startswith("native") for kind in kinds)
    assert abs(sum(kinds.values()) - profiled) < 1e-6 * profiled + 1e-9
