"""The inference engine (packed tokens, the model prepared in place by for_inference: fused QKV, pre-packed
linears) equals the plain padded path of the same model, for every family."""
from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from encoderkit import Embedder, EncoderConfig, Tokenizer, build_model, native
from encoderkit.engine import engine_for
from encoderkit.modeling.packing import Packing, plan_batches, pool_packed
from encoderkit.tasks.embed import POOLING_MODES, pool

FAMILY_CONFIGS = {
    "bert": dict(model_type="bert"),
    "roberta": dict(model_type="roberta", pad_token_id=1, type_vocab_size=1, max_position_embeddings=66),
    "distilbert": dict(model_type="distilbert", type_vocab_size=0),
    "albert": dict(model_type="albert", embedding_size=16, num_hidden_groups=1, inner_group_num=2,
                   hidden_act="gelu_new"),
    "electra": dict(model_type="electra", embedding_size=24),
    "modernbert": dict(model_type="modernbert", type_vocab_size=0, absolute_positions=False, norm_bias=False,
                       attention_bias=False, mlp_bias=False, layer_types=["full_attention", "sliding_attention",
                                                                          "sliding_attention"],
                       local_attention=8, global_rope_theta=1000.0, local_rope_theta=100.0),
    "deberta-v2": dict(model_type="deberta-v2", type_vocab_size=0, absolute_positions=False, relative_attention=True,
                       position_buckets=8, pos_att_type=["p2c", "c2p"], share_att_key=True,
                       norm_rel_ebd="layer_norm", conv_kernel_size=3),
}


def random_model(family: str):
    torch.manual_seed(0)
    config = EncoderConfig(**{**dict(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=64), **FAMILY_CONFIGS[family]})
    model = build_model(config, "base").eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model


def random_sequences(config: EncoderConfig, lengths: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(3)
    ids = [torch.randint(5, config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    types = [[0] * (n // 2) + [1] * (n - n // 2) if config.type_vocab_size > 1 else [0] * n for n in lengths]
    return ids, types


def padded(ids: list[list[int]], types: list[list[int]], pad: int):
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad)
    type_ids = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, (seq, seq_types) in enumerate(zip(ids, types)):
        input_ids[row, :len(seq)] = torch.tensor(seq)
        type_ids[row, :len(seq)] = torch.tensor(seq_types)
        mask[row, :len(seq)] = 1
    return input_ids, mask, type_ids


def run_engine(model, ids, types, dtype="fp32", token_budget=64):
    """The engine's packed states restored to input order: a list of (length, hidden) tensors."""
    engine = engine_for(model, dtype, token_budget=token_budget)
    out = [None] * len(ids)
    packings = []
    for indices, hidden, packing in engine.run(ids, types):
        packings.append(packing)
        for index, states in zip(indices, hidden.split(packing.lengths.tolist())):
            out[index] = states
    return out, packings


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
def test_engine_fp32_equals_plain_path(family: str) -> None:
    model = random_model(family)
    lengths = [17, 17, 9, 9, 9, 4, 1, 30]  # runs of equal lengths and singletons; longer than the local window
    ids, types = random_sequences(model.config, lengths)
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    with torch.no_grad():
        plain = model(input_ids, mask, type_ids).last_hidden_state
    packed, packings = run_engine(model, ids, types)
    assert len(packings) > 1  # the budget split the sequences into several batches
    for row, states in enumerate(packed):
        assert (states - plain[row, :lengths[row]]).abs().max() <= 1e-5, row
    packing = Packing.from_lengths(lengths)
    flat = torch.cat(packed)
    for mode in POOLING_MODES:
        want = pool(plain, mask, mode)
        assert (pool_packed(flat, packing, mode) - want).abs().max() <= 1e-5, mode


@pytest.mark.parametrize("family", ["bert", "albert", "modernbert", "deberta-v2"])
def test_engine_bf16_stays_close(family: str) -> None:
    model = random_model(family)
    lengths = [20, 12, 12, 5]
    ids, types = random_sequences(model.config, lengths)
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    with torch.no_grad():
        plain = pool(model(input_ids, mask, type_ids).last_hidden_state, mask, "mean")
    packed, _ = run_engine(model, ids, types, dtype="bf16", token_budget=1024)
    fast = torch.stack([states.mean(0) for states in packed])
    cosine = F.cosine_similarity(fast, plain, dim=1)
    assert fast.dtype == torch.float32 and cosine.min() > 0.999


def test_for_inference_changes_nothing_the_model_saves_or_trains(tmp_path) -> None:
    """for_inference works in place: the state dict is the same, gradients still flow, and after an optimizer
    step the engine computes with the new weights, not a stale packed copy."""
    model = random_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, types = random_sequences(model.config, [11, 6])
    run_engine(model, ids, types)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    model.train()
    loss = model(input_ids, mask, type_ids).last_hidden_state.pow(2).mean()
    loss.backward()
    assert model.layers[0].attention.query.weight.grad is not None
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    model.eval()
    with torch.no_grad():
        plain = model(input_ids, mask, type_ids).last_hidden_state
    packed, _ = run_engine(model, ids, types)
    assert (packed[0] - plain[0, :11]).abs().max() <= 1e-5


def test_plan_batches_respects_the_token_budget() -> None:
    lengths = np.array([5, 300, 40, 41, 40, 7, 7, 7, 128])
    batches = plan_batches(lengths, token_budget=256, max_batch_size=4)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch) * lengths[batch].max() <= 256
        assert list(lengths[batch]) == sorted(lengths[batch], reverse=True)


@pytest.fixture(scope="module")
def minilm_embedder(minilm_dir):
    return Embedder.from_pretrained(minilm_dir)


def test_long_text_is_truncated_with_a_warning(minilm_embedder, caplog) -> None:
    long_text = "encoders read text in both directions " * 20_000  # ~780k characters
    with caplog.at_level(logging.WARNING):
        vector = minilm_embedder.encode([long_text, "short"])
    assert "1 of 2 texts are longer than 256 tokens" in caplog.text
    head = " ".join(long_text.split()[:400])
    assert np.abs(vector[0] - minilm_embedder.encode(head)).max() < 1e-5  # the same first 254 tokens


def test_window_mode_averages_overlapping_windows(minilm_dir) -> None:
    embedder = Embedder.from_pretrained(minilm_dir, max_length=16, long_text="window", window_stride=4,
                                        normalize=False)
    text = " ".join(f"word{i}" for i in range(30))
    tokenizer = embedder.tokenizer
    first = tokenizer.encode(text, max_length=16, stride=4, return_overflowing=True)
    windows = [first] + first.overflowing
    assert len(windows) >= 3
    model = embedder.model
    vectors, weights = [], []
    for window in windows:
        ids = torch.tensor([window.input_ids])
        with torch.no_grad():
            hidden = model(ids, torch.ones_like(ids)).last_hidden_state
        vectors.append(hidden[0].mean(0))
        weights.append(len(window.input_ids))
    expected = sum(w * v for w, v in zip(weights, vectors)) / sum(weights)
    got = embedder.encode([text, "a short text"])
    assert np.abs(got[0] - expected.numpy()).max() < 1e-5
    plain = Embedder.from_pretrained(minilm_dir, max_length=16, normalize=False)
    assert np.abs(got[1] - plain.encode("a short text")).max() < 1e-5  # short texts are one window


def test_empty_and_whitespace_texts_are_defined(minilm_embedder) -> None:
    vectors = minilm_embedder.encode(["", "   \t ", "\n", "text"])
    assert np.isfinite(vectors).all()
    # Whitespace normalises away: all three embed as "[CLS] [SEP]".
    assert np.abs(vectors[0] - vectors[1]).max() < 1e-6 and np.abs(vectors[0] - vectors[2]).max() < 1e-6
    assert minilm_embedder.encode([]).shape == (0, 384)


def test_dtype_choices(minilm_dir) -> None:
    from encoderkit import InputError
    from encoderkit.precision import cpu_has_native_bf16

    auto = Embedder.from_pretrained(minilm_dir, dtype="auto")
    assert auto.dtype == (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    assert Embedder.from_pretrained(minilm_dir).dtype == torch.float32  # exact unless asked otherwise
    with pytest.raises(InputError, match="unknown dtype"):
        Embedder.from_pretrained(minilm_dir, dtype="fp8")


def test_tokenizer_encode_ids_is_unpadded(minilm_dir) -> None:
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    ids, types = tokenizer.encode_ids(["one", "two words here"], ["pair", "x"])
    assert [len(x) for x in ids] == [len(tokenizer.encode("one", "pair")), len(tokenizer.encode("two words here", "x"))]
    assert types[0] == tokenizer.encode("one", "pair").token_type_ids


def test_one_text_is_tokenised_as_in_a_batch_and_settings_follow_each_call(minilm_dir, tmp_path) -> None:
    """encode_raw of one input calls the backend's single encode (no batch): the same ids, type ids and
    overflowing windows as that input in a batch, pairs and pre-tokenised words included; the truncation and
    padding the backend keeps between calls are those of each call, also after encode_batch and save."""
    tokenizer = Tokenizer.from_pretrained(minilm_dir)
    text = " ".join(f"word{i}" for i in range(40))
    cases = [dict(texts=[text], max_length=16, stride=4), dict(texts=["one text", text], pairs=["pair", "x"]),
             dict(texts=[["pre", "tokenised", "words"]], is_pretokenized=True)]
    for case in cases:
        together = tokenizer.encode_raw(case["texts"] * 2, case.get("pairs") and case["pairs"] * 2,
                                        **{k: v for k, v in case.items() if k not in ("texts", "pairs")})
        for index in range(len(case["texts"])):
            alone = tokenizer.encode_raw(case["texts"][index:index + 1],
                                         case.get("pairs") and case["pairs"][index:index + 1],
                                         **{k: v for k, v in case.items() if k not in ("texts", "pairs")})[0]
            assert alone.ids == together[index].ids and alone.type_ids == together[index].type_ids
            assert [w.ids for w in alone.overflowing] == [w.ids for w in together[index].overflowing]
    assert len(tokenizer.encode_raw([text], max_length=16)[0].ids) == 16
    batch = tokenizer.encode_batch(["a", text], max_length=12, pad_to_multiple_of=8)
    assert batch.input_ids.shape == (2, 16)  # padded by this call's settings
    assert len(tokenizer.encode_raw(["a"], max_length=12)[0].ids) == 3  # and unpadded again by this one's
    assert len(tokenizer.encode_raw([text], max_length=12)[0].ids) == 12
    tokenizer.save(tmp_path)  # the backend's settings cleared for the file
    assert len(tokenizer.encode_raw([text], max_length=12)[0].ids) == 12


def test_one_text_path_equals_the_batch_path_at_each_length(minilm_embedder) -> None:
    """Engine._pooled_one keeps one packing per length: texts of different and repeated lengths, with their
    segment ids, give each the vector the batch path gives them, and normalised as F.normalize does."""
    from encoderkit.tasks.embed import unit_rows

    texts = ["short", "a somewhat longer text than that", "short", "a somewhat longer text than this",
             "three words here"]
    ids, types, _ = minilm_embedder._tokenize(texts)
    engine = minilm_embedder.engine
    together = engine.pooled(ids, types, lanes=1)
    for index in range(len(texts)):
        alone = engine.pooled(ids[index:index + 1], types[index:index + 1])
        assert (alone - together[index]).abs().max() < 1e-6
    assert {len(x) for x in ids} <= {length for length, _ in engine._one_packings}
    vectors = minilm_embedder.encode(texts, lanes=1)
    for index, text in enumerate(texts):
        assert np.abs(minilm_embedder.encode(text) - vectors[index]).max() < 1e-6
    rows = torch.randn(4, 384, dtype=torch.float64)
    rows[2] = 0.0
    assert torch.equal(unit_rows(rows), F.normalize(rows, p=2, dim=1))


def test_for_inference_fuses_gelu_and_residual_adds() -> None:
    """After for_inference the exact GELU and the post-norm residual adds run inside the oneDNN products (no
    gelu or add op left in the layers), and one sequence alone, whose SDPA output is taken as the rows without
    a copy, still equals the plain path. (40 tokens: more rows than MKL's products of few rows take.)"""
    from encoderkit.modeling.inference import SMALL_FP32_ROWS, _onednn_available

    if not _onednn_available():
        pytest.skip("this torch build has no oneDNN linear ops: nothing is fused")
    model = random_model("bert")
    ids, types = random_sequences(model.config, [SMALL_FP32_ROWS + 8])
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    with torch.no_grad():
        plain = model(input_ids, mask, type_ids).last_hidden_state[0]
    engine = engine_for(model, "fp32")
    native.disable(model)  # the PyTorch layers' kernels (the native one, which takes 40 tokens: tests/native/test_native.py)
    with torch.profiler.profile() as profiler:
        ((_, hidden, _),) = list(engine.run(ids, types))
    names = [event.name for event in profiler.events()]
    assert "aten::gelu" not in names
    assert names.count("aten::add") == 2  # the embeddings' position and segment terms; none in the 3 layers
    assert (hidden - plain).abs().max() <= 1e-5
    model.train()  # training takes the plain steps again: the same numbers without dropout
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
            if hasattr(module, "dropout_p"):  # the attention probabilities' dropout, inside SDPA
                module.dropout_p = 0.0
        trained = model(input_ids, mask, type_ids).last_hidden_state[0]
    assert (trained - plain).abs().max() <= 1e-5


def test_products_of_few_rows_run_on_mkl_where_it_is_the_faster_kernel(monkeypatch) -> None:
    """On an Intel CPU with MKL, fp32 products of at most SMALL_FP32_ROWS rows (one short text) run on MKL's packed
    GEMM, the GELU and the residual adds in place after them; longer inputs stay on oneDNN. Either way the states
    equal the plain path. Elsewhere (another vendor's CPU) no MKL product runs."""
    from encoderkit.modeling import inference

    model = random_model("bert")
    ids, types = random_sequences(model.config, [9])
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    with torch.no_grad():
        plain = model(input_ids, mask, type_ids).last_hidden_state[0]
    engine = engine_for(model, "fp32")
    native.disable(model)  # the PyTorch layers' kernels (the native one, which takes 9 tokens: tests/native/test_native.py)
    list(engine.run(ids, types))  # the packs are made at the first call, and MKL's own check runs once: unprofiled
    with torch.profiler.profile() as profiler:
        ((_, hidden, _),) = list(engine.run(ids, types))
    names = [event.name for event in profiler.events()]
    assert (hidden - plain).abs().max() <= 1e-5
    if inference.mkl_for_small_products():
        assert names.count("mkl::_mkl_linear") == 4 * 3  # qkv, attention output, ffn in and out in each of 3 layers
        assert "mkldnn::_linear_pointwise" not in names
        assert names.count("aten::gelu_") == 3 and names.count("aten::add_") == 2 * 3
        long_ids, long_types = random_sequences(model.config, [inference.SMALL_FP32_ROWS + 1])
        with torch.profiler.profile() as profiler:
            list(engine.run(long_ids, long_types))
        assert "mkl::_mkl_linear" not in [event.name for event in profiler.events()]
    else:
        assert "mkl::_mkl_linear" not in names
    inference.mkl_for_small_products.cache_clear()
    monkeypatch.setattr("encoderkit.precision.cpu_vendor", lambda: "AuthenticAMD")
    try:
        assert not inference.mkl_for_small_products()
    finally:
        inference.mkl_for_small_products.cache_clear()


def test_bf16_on_a_cpu_without_native_bf16_warns_and_names_the_better_choice(monkeypatch, caplog):
    import logging

    from encoderkit import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="encoderkit.precision"):
        assert precision.resolve_dtype("bf16") == torch.bfloat16
        assert precision.resolve_dtype("auto") == torch.float32  # auto never picks emulated bf16
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "emulated" in warnings[0] and "--dtype auto" in warnings[0]
    caplog.clear()
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    with caplog.at_level(logging.WARNING, logger="encoderkit.precision"):
        assert precision.resolve_dtype("bf16") == torch.bfloat16
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_lanes_give_the_same_vectors_and_give_torch_its_threads_back(minilm_embedder, monkeypatch) -> None:
    """Two lanes (Engine.in_lanes) embed what one does, every sequence once, on threads of their own, and torch's
    thread count is what it was before, also after a lane failed. The default takes lanes only where this is the
    only Python thread; one batch, or another lane job running, stays on the caller's thread."""
    import threading

    from encoderkit import engine

    texts = [f"sentence number {i} " + "word " * (i % 37) for i in range(150)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def run(**options) -> tuple[np.ndarray, set[str]]:
            names, counts = set(), []

            def progress(n: int) -> None:
                counts.append(n)
                names.add(threading.current_thread().name.split("_")[0])
            vectors = minilm_embedder.encode(texts, batch_size=16, progress=progress, **options)
            assert sum(counts) == len(texts) and len(counts) > 2
            assert torch.get_num_threads() == 2
            return vectors, names

        one, where = run(lanes=1)
        assert where == {"MainThread"}
        two, where = run(lanes=2)
        assert np.abs(one - two).max() <= 1e-6
        assert where == {"encoderkit-lane"}
        monkeypatch.setattr(engine, "owns_process", lambda: True)
        assert run()[1] == {"encoderkit-lane"}
        monkeypatch.setattr(engine, "owns_process", lambda: False)
        assert run()[1] == {"MainThread"}
        with engine._LANES:  # another job's lanes are running: this one keeps to its thread
            assert run(lanes=2)[1] == {"MainThread"}
        seen = []
        minilm_embedder.encode(texts[:3], lanes=2, progress=lambda n: seen.append(threading.current_thread().name))
        assert seen == ["MainThread"]  # one batch: no lane, torch's threads as they are
        with pytest.raises(ValueError):  # an empty sequence is refused before any lane starts
            minilm_embedder.engine.pooled([[101, 102], []], lanes=2, max_batch_size=1)

        def failing(indices, hidden, packing) -> None:
            raise ValueError(f"consumer failed in {threading.current_thread().name}")
        with pytest.raises(ValueError, match="encoderkit-lane"):  # a lane's error reaches the caller
            minilm_embedder.engine.in_lanes([[101, 102], [101, 7592, 102]], None, 2, failing, max_batch_size=1)
        assert torch.get_num_threads() == 2 and not engine._LANES.locked()
        with pytest.raises(Exception, match="lanes must be a positive integer"):
            minilm_embedder.engine.in_lanes([[101, 102]], None, 0, lambda *args: None)
    finally:
        torch.set_num_threads(threads)


def test_owns_process_only_as_the_one_python_thread() -> None:
    code = ("import threading\nfrom encoderkit.engine import owns_process\nalone = owns_process()\n"
            "stop = threading.Event()\nother = threading.Thread(target=stop.wait)\nother.start()\n"
            "beside = owns_process()\nstop.set()\nother.join()\nseen = []\n"
            "inside = threading.Thread(target=lambda: seen.append(owns_process()))\ninside.start()\n"
            "inside.join()\nprint(alone, beside, seen[0], owns_process())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False", "True"]
