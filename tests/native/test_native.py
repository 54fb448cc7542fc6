"""The native kernel for few tokens (``encoderkit.native``): the same states as transformers, and the PyTorch layers
wherever it does not apply.

Each family's tiny random model (tests/parity/test_families.py's configs, weights perturbed) is run through
encoderkit's engine, which takes the native path for batches of at most ``MAX_TOKENS`` tokens, and compared
sequence by sequence with transformers' model on that sequence alone (fp32, the parity tolerance 1e-5).
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from encoderkit import load_model, native
from encoderkit.engine import engine_for
from parity.test_families import CONFIGS, STEMS, TOL, VOCAB, perturb

transformers = pytest.importorskip("transformers")
THREADS_BEFORE = torch.get_num_threads()

# The families whose layers the kernel runs (MPNet's with its bias by relative position); not the rotary ones nor
# the pre-norm ones (test_rotary_families_stay_on_pytorch)
DECLINED = {"nomic_bert": "rotary or relative positions",
            "gte": "rotary or relative positions", "eurobert": "pre-norm layers (ModernBERT, EuroBERT)",
            "jina_embeddings_v3": "rotary or relative positions"}
KERNEL_FAMILIES = [family for family in CONFIGS if family not in DECLINED]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    if native.library() is None:
        pytest.skip(f"encoderkit's native kernel is not available here: {native.status()}")


def reference_and_ours(family: str, tmp_path, **overrides):
    torch.manual_seed(0)
    config = CONFIGS[family]()
    for key, value in overrides.items():
        setattr(config, key, value)
    reference = getattr(transformers, STEMS[family] + "Model")._from_config(config, attn_implementation="eager")
    reference.eval()
    perturb(reference)
    reference.save_pretrained(tmp_path)
    return config, reference, load_model(tmp_path)


def sequences(config, lengths, seed: int = 3):
    generator = np.random.default_rng(seed)
    ids = [list(generator.integers(5, VOCAB, n)) for n in lengths]
    types = None
    if getattr(config, "type_vocab_size", 0) > 1:
        types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    return ids, types


def expected_states(reference, config, ids, types) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for i, row in enumerate(ids):
            inputs = {"input_ids": torch.tensor([row])}
            if types is not None:
                inputs["token_type_ids"] = torch.tensor([types[i]])
            out.append(reference(**inputs).last_hidden_state[0])
    return out


def engine_states(engine, ids, types) -> list[torch.Tensor]:
    states: list[torch.Tensor | None] = [None] * len(ids)
    for indices, hidden, packing in engine.run(ids, types):
        starts = packing.cu_seqlens.tolist()
        for k, index in enumerate(indices):
            states[index] = hidden[starts[k]:starts[k + 1]]
    return states


def assert_states(expected, actual, label: str) -> None:
    for i, (want, got) in enumerate(zip(expected, actual)):
        diff = float((want - got).abs().max())
        assert diff <= TOL, f"{label}: sequence {i} differs from transformers by {diff:.3g}"


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_native_states_equal_transformers(family, tmp_path):
    """One sequence, and a batch of four of different lengths (13, 9, 6 and 1 tokens), through the native kernel:
    the embeddings natively where they have no projection (BERT, RoBERTa, DistilBERT), in PyTorch before it where
    they do (ALBERT, ELECTRA), ALBERT's shared layers by its schedule, its tanh GELU, RoBERTa's positions."""
    config, reference, model = reference_and_ours(family, tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [13, 9, 6, 1])
    expected = expected_states(reference, config, ids, types)
    for batch in ([0], [0, 1, 2, 3]):
        got = engine_states(engine, [ids[i] for i in batch], None if types is None else [types[i] for i in batch])
        assert_states([expected[i] for i in batch], got, f"{family}, {len(batch)} sequence(s)")
    plan = native.kernel_of(model)
    assert plan is not None, "the native kernel did not run"
    assert plan.native_embeddings == (family in ("bert", "roberta", "xlm-roberta", "camembert", "distilbert",
                                                 "mpnet"))


def test_native_attention_over_longer_sequences_equals_transformers(tmp_path):
    """The kernel's softmax in vectors over rows of keys: a whole number of vectors (32, 64 keys), and rows with
    columns past the last key (45 and 19 keys), whose probabilities must be 0, up to MAX_TOKENS."""
    config, reference, model = reference_and_ours("bert", tmp_path, max_position_embeddings=128)
    engine = engine_for(model, "fp32")
    for lengths in ([native.MAX_TOKENS], [32, 32], [45, 19]):
        ids, types = sequences(config, lengths, seed=len(lengths))
        assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types),
                      f"lengths {lengths}")
    assert native.kernel_of(model) is not None, "the native kernel did not run"


def test_a_relative_position_bias_over_every_bucket_equals_transformers(tmp_path, monkeypatch):
    """MPNet's bias by relative position in the whole kernel: sequences long enough to reach every bucket (exact
    ones up to 8 apart, logarithmic ones to 128, the last beyond it, in both directions) and lengths whose layouts
    differ (spans of 16, 256), in one batch and alone: transformers' states; the table follows changed weights."""
    config, reference, model = reference_and_ours("mpnet", tmp_path, max_position_embeddings=512)
    monkeypatch.setattr(native, "fp32_max_tokens", lambda: native.BATCH_MAX_TOKENS)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [200, 37, 9, 1])
    expected = expected_states(reference, config, ids, types)
    for batch in ([0, 1, 2, 3], [2], [1, 3]):
        got = engine_states(engine, [ids[i] for i in batch], None)
        assert_states([expected[i] for i in batch], got, f"mpnet, sequences {batch}")
    plan = native.kernel_of(model)
    assert plan is not None, "the native kernel did not run"
    assert sorted(plan.bias_tables) == [16, 64, 256]
    with torch.no_grad():
        for ours, theirs in ((model.position_bias.table.weight,
                              reference.encoder.relative_attention_bias.weight),):
            ours.mul_(-2.0)
            theirs.mul_(-2.0)
    assert_states(expected_states(reference, config, ids[1:2], types), engine_states(engine, ids[1:2], None),
                  "mpnet, changed bias")


@pytest.mark.parametrize("family", ["nomic_bert", "gte", "eurobert", "jina_embeddings_v3"])
def test_rotary_families_stay_on_pytorch(family, tmp_path):
    """Rotary positions (and EuroBERT's pre-norm, RMSNorm, grouped-query layers) have no place in the kernel: it
    declines them, with the reason, and the engine's states still equal transformers'."""
    config, reference, model = reference_and_ours(family, tmp_path)
    assert native.eligible(model) == DECLINED[family]
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [13, 9, 6, 1])
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), family)
    assert native.kernel_of(model) is None


@pytest.mark.parametrize("overrides", [
    {"hidden_act": "relu"},
    {"hidden_act": "gelu_new"},
    # 36 columns: panels of 16 (AVX-512) or 8 (AVX2) leave a partial one and an odd count; head_dim 12 is not a
    # multiple of the vector width either
    {"hidden_size": 36, "num_attention_heads": 3, "intermediate_size": 50},
], ids=["relu", "gelu-tanh", "odd-sizes"])
def test_native_activations_and_sizes(overrides, tmp_path):
    config, reference, model = reference_and_ours("bert", tmp_path, **overrides)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [17, 5, 3], seed=4)
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), str(overrides))
    assert native.kernel_of(model) is not None


@pytest.mark.parametrize("threads", [1, 2])
def test_native_thread_counts_agree(threads, tmp_path, monkeypatch):
    config, reference, model = reference_and_ours("bert", tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [20, 11])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = engine_states(engine, ids, types)
    finally:
        torch.set_num_threads(before)
    assert_states(expected_states(reference, config, ids, types), got, f"{threads} thread(s)")


def test_native_follows_changed_weights(tmp_path):
    """A weight changed in place after the first call (a training step, a user's edit) is packed again."""
    config, reference, model = reference_and_ours("bert", tmp_path)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [12])
    engine_states(engine, ids, types)
    with torch.no_grad():
        model.layers[1].ffn_in.weight.mul_(1.5)
        reference.encoder.layer[1].intermediate.dense.weight.mul_(1.5)
        model.embeddings.word.weight[ids[0][0]].add_(0.25)
        reference.embeddings.word_embeddings.weight[ids[0][0]].add_(0.25)
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), "after the change")


REPLACED_BY = ["load_state_dict(assign=True)", "setattr", "Module._apply"]


def _replace_weights(model, how: str, row: int) -> None:
    """Layer 1's ffn_in weight times 1.5 and word ``row`` plus 0.25, other than in place: as new Parameter objects
    (``load_state_dict(assign=True)``, or setting the module's attribute), or as new data for the same ones through
    ``Module._apply`` (what ``to`` and ``half`` run: ``.data =``, version counters unchanged)."""
    layer, word = model.layers[1], model.embeddings.word
    weight = layer.ffn_in.weight.detach() * 1.5
    table = word.weight.detach().clone()
    table[row] += 0.25
    if how == "load_state_dict(assign=True)":
        layer.ffn_in.load_state_dict({"weight": weight, "bias": layer.ffn_in.bias.detach().clone()}, assign=True)
        word.load_state_dict({"weight": table}, assign=True)
    elif how == "setattr":
        layer.ffn_in.weight = torch.nn.Parameter(weight)
        word.weight = torch.nn.Parameter(table)
    else:
        new = {id(layer.ffn_in.weight): weight, id(word.weight): table}
        model._apply(lambda t: new.get(id(t), t))


@pytest.mark.parametrize("how", REPLACED_BY)
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "pytorch layers"])
def test_weights_replaced_after_the_first_call_are_used(how, kernel, tmp_path):
    """Parameters replaced after the first call, by new ones or with new data (``_replace_weights``: either way the
    version counters that the check of changes in place reads do not move) keep no stale packed copy, on the kernel
    and on the PyTorch layers: the states equal transformers' with the same change."""
    config, reference, model = reference_and_ours("bert", tmp_path)
    engine = engine_for(model, "fp32")
    if not kernel:
        native.disable(model)
    ids, types = sequences(config, [12, 30, 30])  # one sequence, then 72 tokens: past MAX_TOKENS
    engine_states(engine, ids, types)
    engine_states(engine, ids[:1], types[:1])
    _replace_weights(model, how, ids[0][0])
    with torch.no_grad():
        reference.encoder.layer[1].intermediate.dense.weight.mul_(1.5)
        reference.embeddings.word_embeddings.weight[ids[0][0]].add_(0.25)
    expected = expected_states(reference, config, ids, types)
    assert_states(expected[:1], engine_states(engine, ids[:1], types[:1]), f"{how}: one sequence")
    assert_states(expected, engine_states(engine, ids, types), f"{how}: a batch")
    assert (native.kernel_of(model) is not None) == kernel


def test_pytorch_layers_where_the_kernel_does_not_apply(tmp_path):
    """More tokens than MAX_TOKENS in a sequence longer than the attention's limit, and a bad id: the PyTorch
    layers, with their results and errors."""
    longest = native.attention_max_length() + 10
    config, reference, model = reference_and_ours("bert", tmp_path, max_position_embeddings=longest + 10)
    engine = engine_for(model, "fp32")
    ids, types = sequences(config, [longest])
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), "long")
    assert native.kernel_of(model) is None  # never asked for: no batch was small enough

    bad = [[5, VOCAB + 3, 7]]
    engine_states(engine, [[5, 6, 7]], None)  # the kernel is built and used
    assert native.kernel_of(model) is not None
    with pytest.raises(IndexError) as native_error:
        engine_states(engine, bad, None)
    with torch.inference_mode():
        with pytest.raises(IndexError) as torch_error:
            model.embeddings.word(torch.tensor(bad[0]))
    assert str(native_error.value) == str(torch_error.value)


def test_bf16_small_batches_take_the_fp32_kernel(tmp_path):
    """A bf16 model's batches of at most MAX_TOKENS tokens run the kernel in fp32 (faster there than bf16 products,
    see encoderkit.native): transformers' fp32 states to the parity tolerance. A longer batch keeps its bf16 products:
    close to transformers, but not to fp32 rounding."""
    config, reference, _ = reference_and_ours("bert", tmp_path, max_position_embeddings=native.MAX_TOKENS + 20)
    model = load_model(tmp_path)
    engine = engine_for(model, "bf16")
    long_ids, _ = sequences(config, [native.MAX_TOKENS + 10], seed=5)
    long_want = expected_states(reference, config, long_ids, None)[0]
    long_got = engine_states(engine, long_ids, None)[0]
    assert native.kernel_of(model) is None  # no batch small enough yet
    long_diff = float((long_got - long_want).abs().max())
    assert 1e-4 < long_diff < 0.1, f"a long bf16 batch differs from fp32 by {long_diff:.3g}: not bf16 products?"

    ids, types = sequences(config, [13, 9, 6], seed=6)
    assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types), "bf16, small")
    assert native.kernel_of(model) is not None


def test_modern_families_are_not_eligible():
    from encoderkit.config import EncoderConfig
    from encoderkit.modeling.encoder import EncoderModel
    modern = transformers.ModernBertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                           sep_token_id=2)
    deberta = transformers.DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=37, max_position_embeddings=40, relative_attention=True,
                                           pos_att_type="p2c|c2p", position_buckets=8, type_vocab_size=0)
    for config in (modern, deberta):
        model = EncoderModel(EncoderConfig.from_hf_dict(config.to_dict()))
        assert native.eligible(model) is not None, config.model_type
    bert = EncoderModel(EncoderConfig.from_hf_dict(CONFIGS["bert"]().to_dict()))
    assert native.eligible(bert) is None


def test_turned_off_by_the_environment():
    code = "from encoderkit import native; print(native.status())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENCODERKIT_NATIVE": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "off: turned off by ENCODERKIT_NATIVE=0"


def test_fp32_product_is_within_its_rounding_bound_for_every_block_size():
    """The kernel's fp32 product for every row count from 1 to 40: its blocks of rows (one per count up to what the
    registers hold, which differs between 256- and 512-bit builds) and both panel paths (70 outputs: an odd count of
    panels with 8 or 16 lanes, the last one partial). Each sum of 37 products is within the a-priori bound of fp32
    sums of that length (37 unit roundoffs of the sum of the terms' magnitudes) of the float64 product."""
    generator = np.random.default_rng(0)
    weight = generator.standard_normal((70, 37)).astype(np.float32)
    bias = generator.standard_normal(70).astype(np.float32)
    for rows in range(1, 41):
        x = generator.standard_normal((rows, 37)).astype(np.float32)
        got = native.fp32_product(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)).numpy()
        want = x.astype(np.float64) @ weight.astype(np.float64).T + bias
        bound = 38 * 2.0**-24 * (np.abs(x) @ np.abs(weight).T + np.abs(bias))
        assert np.all(np.abs(got - want) <= bound), f"{rows} rows: off by {np.abs(got - want).max():.3g}"


@pytest.mark.parametrize("inputs", [37, 100])
def test_fp32_product_of_many_rows_is_each_row_alone_bit_for_bit(inputs):
    """Every row of a product of 1 to 60 rows equals the product of that row alone, to the bit: however the rows are
    blocked (several blocks summed slice by slice of k on 256-bit builds, EK_KSLICE; the blocks' sizes; chunks),
    each output is the same sum in the same order. 100 inputs make slices of 32 with a partial last one."""
    generator = np.random.default_rng(2)
    weight = torch.from_numpy(generator.standard_normal((70, inputs)).astype(np.float32))
    bias = torch.from_numpy(generator.standard_normal(70).astype(np.float32))
    x = torch.from_numpy(generator.standard_normal((60, inputs)).astype(np.float32))
    alone = torch.cat([native.fp32_product(x[row:row + 1], weight, bias) for row in range(60)])
    for rows in range(1, 61):
        together = native.fp32_product(x[:rows], weight, bias)
        assert torch.equal(together, alone[:rows]), f"{rows} rows: off by {(together - alone[:rows]).abs().max():.3g}"


def test_fp32_product_in_several_chunks_of_rows_is_within_its_rounding_bound():
    """Rows enough for several of the products' chunks of rows (``EK_CHUNK_BYTES`` of inputs each: tens of rows of
    1,536 inputs), the last one partial: every row within the fp32 bound of the float64 product, as one chunk's are."""
    generator = np.random.default_rng(1)
    weight = generator.standard_normal((70, 1536)).astype(np.float32)
    bias = generator.standard_normal(70).astype(np.float32)
    x = generator.standard_normal((301, 1536)).astype(np.float32)
    got = native.fp32_product(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias)).numpy()
    want = x.astype(np.float64) @ weight.astype(np.float64).T + bias
    bound = 1537 * 2.0**-24 * (np.abs(x) @ np.abs(weight).T + np.abs(bias))
    assert np.all(np.abs(got - want) <= bound), f"off by {np.abs(got - want).max():.3g}"


def float64_attention(qkv: np.ndarray, starts: list[int], heads: int, scale: float,
                      bias: np.ndarray | None = None) -> np.ndarray:
    """softmax(q k^T * scale + bias) v of each sequence and head, in float64: the definition, for the kernel's
    attention; ``bias[h, span - 1 + i - j]`` for query i and key j (span: ``bias``'s centre + 1), or none."""
    hidden = qkv.shape[1] // 3
    dim = hidden // heads
    out = np.zeros((qkv.shape[0], hidden))
    for first, last in zip(starts[:-1], starts[1:]):
        for h in range(heads):
            q, k, v = (qkv[first:last, part * hidden + h * dim:part * hidden + (h + 1) * dim].astype(np.float64)
                       for part in range(3))
            scores = q @ k.T * scale
            if bias is not None:
                n, center = last - first, (bias.shape[1] - 1) // 2
                scores = scores + bias[h][center + np.arange(n)[:, None] - np.arange(n)[None, :]]
            probs = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[first:last, h * dim:(h + 1) * dim] = probs / probs.sum(axis=1, keepdims=True) @ v
    return out


@pytest.mark.parametrize("dim", [32, 64, 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_equals_float64_attention(dim, threads):
    """The kernel's attention of packed sequences (``native.attention``, the PyTorch layers' inference attention)
    against its definition in float64, sequence by sequence: lengths that fill whole 8 x 8 tiles and whole vectors
    of 8 and 16 lanes (16, 64) and lengths that leave an edge of each (1, 7, 9, 17, 33, 100), up to the build's
    ``attention_max_length()``; head sizes of whole vectors (32, 64) and not (20: the edges of the transposition
    and of the output done element by element); 3 heads; on 1 and 2 threads. Scores of about 3 standard deviations make
    peaked and flat rows. Within 1e-5: fp32 rounding is about 1e-6 here, and a wrong row, head or key is off by
    the values' scale (about 1)."""
    heads, generator = 3, np.random.default_rng(dim)
    lengths = [16, 1, 7, 64, 9, 17, 33, 100, native.attention_max_length()]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    qkv = generator.standard_normal((starts[-1], 3 * heads * dim)).astype(np.float32)
    scale = 3.0 / dim**0.5
    torch.set_num_threads(threads)
    try:
        got = native.attention(torch.from_numpy(qkv), torch.tensor(starts), heads, scale, max(lengths))
    finally:
        torch.set_num_threads(THREADS_BEFORE)
    assert got is not None, f"the kernel's attention declined: {native.status()}"
    want = float64_attention(qkv, starts, heads, scale)
    for first, last, n in zip(starts[:-1], starts[1:], lengths):
        diff = np.abs(got.numpy()[first:last] - want[first:last]).max()
        assert diff <= 1e-5, f"a sequence of {n} tokens (head size {dim}): off by {diff:.3g}"


def test_attention_with_a_bias_by_relative_position_equals_its_definition():
    """A bias by query - key (MPNet's kind; random values per head and distance, so a wrong sign or offset is off)
    added to the scores, against the float64 definition; a table too short for the longest sequence is refused,
    whether the caller says the true length or a shorter one."""
    heads, dim, generator = 3, 20, np.random.default_rng(11)
    lengths = [1, 9, 33, 100]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    qkv = generator.standard_normal((starts[-1], 3 * heads * dim)).astype(np.float32)
    span = 128
    values = generator.standard_normal((heads, 2 * span - 1)).astype(np.float32)
    width = native.library().ek_vector_width()
    table = torch.from_numpy(np.pad(values, ((0, 0), (0, width))))  # bias_layout's layout: the lanes after
    got = native.attention(torch.from_numpy(qkv), torch.tensor(starts), heads, 0.4, max(lengths), table)
    assert got is not None, f"the kernel's attention declined: {native.status()}"
    want = float64_attention(qkv, starts, heads, 0.4, values.astype(np.float64))
    assert np.abs(got.numpy() - want).max() <= 1e-5, f"off by {np.abs(got.numpy() - want).max():.3g}"
    short = torch.from_numpy(np.pad(values[:, span - 64:span + 63], ((0, 0), (0, width))))  # span 64 < 100
    assert native.attention(torch.from_numpy(qkv), torch.tensor(starts), heads, 0.4, max(lengths), short) is None
    assert native.attention(torch.from_numpy(qkv), torch.tensor(starts), heads, 0.4, 50, short) is None


def test_attention_output_dimensions_are_the_same_sums_wherever_they_lie():
    """Each output dimension is sum_j p_ij v_j[d], summed in key order with fused multiply-adds, whether it falls in
    the vectors' blocks or in the edge done element by element (head size 20: 16 or 4 dimensions past whole vectors
    of 8 or 16 lanes). So moving the values' dimensions within each head (the edge's to the front) moves the output's
    with them, to the bit."""
    heads, dim, generator = 3, 20, np.random.default_rng(7)
    lengths = [1, 9, 33, 100]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    qkv = generator.standard_normal((starts[-1], 3 * heads * dim)).astype(np.float32)
    order = np.roll(np.arange(dim), 4)  # 16..19 first, then 0..15
    columns = np.arange(heads * dim).reshape(heads, dim)[:, order].ravel()
    moved = qkv.copy()
    moved[:, 2 * heads * dim:] = qkv[:, 2 * heads * dim:][:, columns]
    got, got_moved = (native.attention(torch.from_numpy(x), torch.tensor(starts), heads, 0.5, max(lengths))
                      for x in (qkv, moved))
    assert got is not None, f"the kernel's attention declined: {native.status()}"
    assert torch.equal(got_moved, got[:, columns]), f"off by {(got_moved - got[:, columns]).abs().max():.3g}"


def test_attention_declines_what_it_does_not_compute():
    """Past ``attention_max_length()`` (where SDPA's kernel is the faster), in bf16, with a gradient to keep, or rows
    that are not whole heads of q | k | v: None, and the caller runs SDPA."""
    longest = native.attention_max_length()
    qkv = torch.randn(longest + 1, 3 * 2 * 8)
    assert native.attention(qkv, torch.tensor([0, longest + 1]), 2, 0.3, longest + 1) is None
    assert native.attention(qkv[:longest], torch.tensor([0, longest]), 2, 0.3, longest) is not None
    assert native.attention(qkv.bfloat16(), torch.tensor([0, longest + 1]), 2, 0.3, 10) is None
    assert native.attention(qkv.requires_grad_(), torch.tensor([0, longest + 1]), 2, 0.3, 10) is None
    assert native.attention(torch.randn(4, 50), torch.tensor([0, 4]), 2, 0.3, 4) is None


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_batches_past_the_kernel_take_its_attention_and_equal_transformers(family, tmp_path, monkeypatch):
    """A batch that the whole kernel does not take (here: more than MAX_TOKENS, with ``fp32_max_tokens()`` set to it)
    runs the PyTorch layers; their attention runs natively (one call a layer run) where its longest sequence has at
    most ``attention_max_length()`` tokens, and SDPA past it: the states equal
    transformers' either way (ALBERT's shared layers, RoBERTa's positions, each family's scale), and no training or
    gradient path takes it."""
    from encoderkit.modeling import kernels

    config, reference, model = reference_and_ours(family, tmp_path, max_position_embeddings=1024)
    engine = engine_for(model, "fp32")
    calls: list[bool] = []  # per call: whether it ran natively
    original = kernels.native_attention

    def counted(*args):
        out = original(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(kernels, "native_attention", counted)
    monkeypatch.setattr(native, "fp32_max_tokens", lambda: native.MAX_TOKENS)
    longest = native.attention_max_length()
    for lengths, natively in (([70, 45, 45, 19], True), ([longest + 7, 12], False)):
        calls.clear()
        ids, types = sequences(config, lengths, seed=len(lengths))
        assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types),
                      f"lengths {lengths}")
        assert calls == [natively] * len(model.layer_schedule()), (lengths, calls)
    calls.clear()
    model.train()
    model(torch.tensor([ids[1]])).last_hidden_state.sum().backward()
    assert calls == [], "the training path took the inference attention"


def test_fp32_batches_of_short_sequences_take_the_whole_kernel(tmp_path, monkeypatch):
    """fp32 batches past MAX_TOKENS, up to ``fp32_max_tokens()`` (set here on either build), whose sequences have at
    most ``attention_max_length()`` tokens run the whole kernel in one call, with transformers' states; a batch with a
    longer sequence, or with more tokens, runs the PyTorch layers (transformers' states too); a bf16 model's large
    batches keep their bf16 products."""
    monkeypatch.setattr(native, "fp32_max_tokens", lambda: 120)
    monkeypatch.setattr(native, "attention_max_length", lambda: 16)
    config, reference, model = reference_and_ours("bert", tmp_path, max_position_embeddings=64)
    engine = engine_for(model, "fp32")
    bf16_model = load_model(tmp_path)
    bf16_engine = engine_for(bf16_model, "bf16")
    batches = []
    original = native.NativeEncoder.__call__
    monkeypatch.setattr(native.NativeEncoder, "__call__",
                        lambda self, ids, *rest: batches.append(len(ids)) or original(self, ids, *rest))
    for lengths, whole in (([40, 30], False), ([16] * 8, False), ([16, 15, 12, 9, 16, 14, 11, 3], True)):
        batches.clear()
        ids, types = sequences(config, lengths, seed=len(lengths))
        assert_states(expected_states(reference, config, ids, types), engine_states(engine, ids, types),
                      f"lengths {lengths}")
        assert batches == ([sum(lengths)] if whole else []), (lengths, batches)
    assert sum(lengths) > native.MAX_TOKENS
    batches.clear()
    engine_states(bf16_engine, ids, types)
    assert batches == [] and native.kernel_of(bf16_model) is None


# ---------------------------------------------------------------------------------------------------------------
# int8 (VNNI: exact sums of any codes; AVX2 or AVX512BW: pairs summed in 16 bits, codes within +-63)
# ---------------------------------------------------------------------------------------------------------------
needs_int8 = pytest.mark.skipif("not native.int8_available()", reason="the native int8 product needs AVX2 or AVX-512, "
                                "which this CPU lacks (int8 models' small batches then run the kernel in fp32)")


@pytest.fixture
def kernel_codes(monkeypatch):
    """Int8 weights with codes the kernel sums exactly. They are already, but where PyTorch sums 8-bit codes exactly
    (VNNI) and this build adds pairs in 16 bits (built with -mno-avx512vnni on that CPU: the AVX512BW tier): there the
    engine runs int8 layers in the fp32 kernel (test_int8_the_kernel_cannot_sum_runs_small_batches_in_fp32), and
    these tests give the weights the kernel's 7-bit codes so that its pair sums run."""
    from encoderkit.modeling import inference

    if inference.int8_weight_levels() > native.int8_weight_limit():
        monkeypatch.setattr(inference, "int8_weight_levels", lambda device="cpu": native.int8_weight_limit())


def int8_by_formula(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, bias: np.ndarray,
                    inverse: np.ndarray | None) -> np.ndarray:
    """The int8 product written out from its definition, in numpy: rows (times the inverse smoothing, in fp32)
    quantised to uint8, each row with its own scale (its range / 255, the range widened to include 0) and zero
    point, rounded half to even; exact integer dot products with the codes; then scaled, in float64."""
    rows = x if inverse is None else (x * inverse).astype(np.float32)
    low = np.minimum(rows.min(axis=1, keepdims=True), 0.0).astype(np.float64)
    high = np.maximum(rows.max(axis=1, keepdims=True), 0.0).astype(np.float64)
    scale = np.maximum(high - low, 1e-12) / 255
    zero = np.clip(np.rint(-low / scale), 0, 255)
    quantised = np.clip(np.rint(rows * (1.0 / scale).astype(np.float32)) + zero, 0, 255).astype(np.int64)
    sums = (quantised - zero.astype(np.int64)) @ codes.astype(np.int64).T
    return sums * scale.astype(np.float32).astype(np.float64) * scales.astype(np.float64) + bias


@needs_int8
@pytest.mark.parametrize("rows, inputs", [(1, 37), (5, 37), (17, 37), (40, 37), (700, 1537)])
@pytest.mark.parametrize("smoothed", [False, True])
def test_int8_product_equals_its_formula(rows, inputs, smoothed):
    """One product: 37 inputs (not a multiple of 4), 70 outputs (a partial panel and an odd count of panels with
    16 or 8 lanes), more rows than one block holds, skewed inputs as after GELU, with and without smoothing; and
    rows enough for several of the products' chunks of rows (``EK_CHUNK_BYTES`` of codes each)."""
    generator = np.random.default_rng(rows)
    x = (generator.standard_normal((rows, inputs)) * 2 + 0.7).astype(np.float32)
    limit = native.int8_weight_limit()  # the codes this build sums exactly (what int8 weights get on this CPU)
    codes = generator.integers(-limit, limit + 1, (70, inputs)).astype(np.int8)
    scales = generator.uniform(1e-3, 2e-2, 70).astype(np.float32)
    bias = generator.standard_normal(70).astype(np.float32)
    inverse = generator.uniform(0.25, 4.0, inputs).astype(np.float32) if smoothed else None
    got = native.int8_product(torch.from_numpy(x), torch.from_numpy(codes), torch.from_numpy(scales),
                              torch.from_numpy(bias), None if inverse is None else torch.from_numpy(inverse)).numpy()
    want = int8_by_formula(x, codes, scales, bias, inverse)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@needs_int8
@pytest.mark.parametrize("sign", [1, -1])
def test_int8_product_is_exact_at_the_largest_codes(sign):
    """Every activation code 255 against weight codes at this build's limit, all of one sign: the pair sums that
    saturate a 16-bit accumulator with 8-bit codes. The product still equals its formula."""
    limit = native.int8_weight_limit()
    x = np.full((3, 64), 4.0, dtype=np.float32)
    x[:, 0] = 0.0  # min 0: zero point 0, every other value codes to 255
    codes = np.full((24, 64), sign * limit, dtype=np.int8)
    scales, bias = np.full(24, 0.01, dtype=np.float32), np.zeros(24, dtype=np.float32)
    got = native.int8_product(*(torch.from_numpy(a) for a in (x, codes, scales, bias))).numpy()
    want = int8_by_formula(x, codes, scales, bias, None)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@needs_int8
def test_int8_product_refuses_codes_its_sums_cannot_hold():
    """A pair-sum build (AVX2, AVX512BW) sums codes within +-63 exactly; larger codes are refused, never rounded."""
    if native.int8_weight_limit() == 127:
        pytest.skip("this build sums every int8 code exactly (VNNI)")
    codes = torch.full((8, 16), 100, dtype=torch.int8)
    with pytest.raises(ValueError, match="within \\+-63"):
        native.int8_product(torch.ones(2, 16), codes, torch.ones(8), torch.zeros(8))


@needs_int8
@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_native_int8_model(family, tmp_path, monkeypatch, kernel_codes):
    """A whole int8 model through the native kernel, after the int8 guard's calibration has smoothed its layers (it
    runs the PyTorch layers, which observe the activations). Each product on the real activations of the PyTorch
    int8 forward equals its formula; the native model's states are as near fp32 (transformers) as PyTorch's int8
    kernels' are. Not closer to those than that: fp32 rounding in the layers before flips a rounding tie of an
    activation now and then, a step of its int8 grid, as between PyTorch's own two int8 kernels."""
    from encoderkit.engine import Engine
    from encoderkit.modeling import inference
    from encoderkit.precision import Precision

    config, reference, model = reference_and_ours(family, tmp_path)
    ids, types = sequences(config, [13, 9, 6, 1])
    calibration = sequences(config, [30, 24, 17, 11, 8], seed=5)[0]
    native_engine = Engine(model, Precision.resolve("int8", "task"), calibration=calibration)
    assert all(layer.observed is not None for layer in inference.int8_layers(model)), \
        "calibration did not run the PyTorch layers"
    assert any(alpha is not None for alpha in native_engine.quantization.smoothing.values())
    torch_model = load_model(tmp_path)
    torch_engine = Engine(torch_model, Precision.resolve("int8", "task"), calibration=calibration)
    native.disable(torch_model)

    products = []
    original = inference.Int8Prepacked.__call__

    def spy(self, x):
        inverse = None if self.inverse_smoothing is None else self.inverse_smoothing.numpy()
        got = native.int8_product(x, self.quantized, self.scales, self.bias, self.inverse_smoothing).numpy()
        want = int8_by_formula(x.numpy(), self.quantized.numpy(), self.scales.numpy(), self.bias.numpy(), inverse)
        products.append(float(np.abs(got - want).max() / np.abs(want).max()))
        return original(self, x)

    monkeypatch.setattr(inference.Int8Prepacked, "__call__", spy)
    expected = expected_states(reference, config, ids, types)
    for batch in ([0], [0, 1, 2, 3]):
        pick = (lambda values: None if values is None else [values[i] for i in batch])
        got = engine_states(native_engine, pick(ids), pick(types))
        want = engine_states(torch_engine, pick(ids), pick(types))
        for i, (ours, theirs, exact) in enumerate(zip(got, want, pick(expected))):
            ours_error, their_error = float((ours - exact).norm()), float((theirs - exact).norm())
            assert ours_error <= 1.5 * their_error + 1e-5, f"{family}: sequence {i}: {ours_error} against {their_error}"
            assert float(torch.nn.functional.cosine_similarity(ours, exact, dim=-1).min()) > 0.99
    assert len(products) == 2 * 4 * len(model.layer_schedule()) and max(products) <= 1e-5
    plan = native.kernel_of(model)
    assert plan is not None and len(plan.int8) == 4 * len(model.layers)
    assert native.kernel_of(torch_model) is None


@needs_int8
def test_native_int8_keeps_fp32_layers_and_follows_changes(tmp_path, kernel_codes):
    """Layers kept in fp32 (``fp32_layers``) run in fp32 beside the int8 ones; a weight changed in place is
    quantised and packed again."""
    from encoderkit.engine import Engine
    from encoderkit.precision import Precision

    config, reference, model = reference_and_ours("bert", tmp_path)
    ids, types = sequences(config, [12, 5])
    kept = ("layers.0.ffn_out", "layers.1.attention.qkv")
    precision = Precision.quantized("task", fp32_layers=kept, smoothing=False)
    engine = Engine(model, precision)
    torch_model = load_model(tmp_path)
    torch_engine = Engine(torch_model, precision)
    native.disable(torch_model)

    def compare(label: str) -> None:  # no smoothing, 17 rows: no rounding tie flips here (see above)
        for a, b in zip(engine_states(engine, ids, types), engine_states(torch_engine, ids, types)):
            assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), label

    compare("fp32 layers kept")
    plan = native.kernel_of(model)
    assert sorted(f"layers.{index}.{'attention.' if name in ('qkv', 'output') else ''}{name}"
                  for index, name in plan.int8) == sorted(
        f"layers.{i}.{n}" for i in range(len(model.layers)) for n in ("attention.qkv", "attention.output", "ffn_in",
                                                                       "ffn_out") if f"layers.{i}.{n}" not in kept)
    with torch.no_grad():
        for m in (model, torch_model):
            m.layers[1].ffn_in.weight.mul_(-1.5)
    compare("after the change")


@needs_int8
@pytest.mark.parametrize("how", REPLACED_BY)
def test_native_int8_follows_replaced_weights(how, tmp_path, kernel_codes):
    """int8 weights replaced rather than changed in place (``_replace_weights``) are quantised and packed again, on
    the kernel and on PyTorch's int8 layers: the states equal those of the same change made in place."""
    from encoderkit.engine import Engine
    from encoderkit.precision import Precision

    config, _, model = reference_and_ours("bert", tmp_path)
    ids, types = sequences(config, [12, 5])
    models = {"kernel": model, "pytorch": load_model(tmp_path), "in place": load_model(tmp_path)}
    engines = {name: Engine(m, Precision.quantized("task", smoothing=False)) for name, m in models.items()}
    native.disable(models["pytorch"])
    for engine in engines.values():
        engine_states(engine, ids, types)
    for name in ("kernel", "pytorch"):
        _replace_weights(models[name], how, ids[0][0])
    with torch.no_grad():
        models["in place"].layers[1].ffn_in.weight.mul_(1.5)
        models["in place"].embeddings.word.weight[ids[0][0]].add_(0.25)
    want = engine_states(engines["in place"], ids, types)
    for name in ("kernel", "pytorch"):
        for a, b in zip(engine_states(engines[name], ids, types), want):
            assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), f"{how}, {name}"
    assert native.kernel_of(models["kernel"]) is not None and native.kernel_of(models["pytorch"]) is None


@pytest.mark.parametrize("kernel", ["no int8 product", "16-bit pair sums, 8-bit codes"])
def test_int8_the_kernel_cannot_sum_runs_small_batches_in_fp32(kernel, tmp_path, monkeypatch, caplog):
    """Where the kernel cannot sum an int8 model's codes exactly (a build without int8 instructions, or one that adds
    pairs in 16 bits while PyTorch's kernels gave the weights 8-bit codes): an int8 model's batches of at most
    MAX_TOKENS tokens take the kernel in fp32 (the fp32 engine's states exactly, said once in the log), larger ones
    PyTorch's int8 kernels (their states, not fp32's), and the guard's calibration still measures the int8 layers
    (no kernel while it runs)."""
    import logging

    from encoderkit.engine import Engine
    from encoderkit.precision import Precision

    if kernel == "no int8 product":
        monkeypatch.setattr(native.library(), "ek_int8", lambda: 0)
        assert not native.int8_available() and "int8 needs AVX2 or AVX-512" in native.status()
    else:
        monkeypatch.setattr(native.library(), "ek_int8", lambda: 2)
        monkeypatch.setattr("encoderkit.modeling.inference.int8_weight_levels", lambda device="cpu": 127)
        assert native.int8_weight_limit() == 63
    monkeypatch.setattr(native, "_said", set())
    config, reference, model = reference_and_ours("bert", tmp_path)
    small, large = sequences(config, [9]), sequences(config, [40, 31])  # 9 tokens; 71 > MAX_TOKENS
    fp32_engine = engine_for(model, "fp32")
    int8_model = load_model(tmp_path)
    with caplog.at_level(logging.INFO, logger="encoderkit.native"):
        int8_engine = Engine(int8_model, Precision.quantized("task", smoothing=False))
        int8_small = engine_states(int8_engine, *small)
    plan = native.kernel_of(int8_model)
    assert plan is not None and plan.int8_in_fp32 and not plan.int8 and len(plan.quantized) == 4 * len(model.layers)
    assert "int8 without 8-bit dot products" in caplog.text and caplog.text.count("int8 without") == 1
    for a, b in zip(int8_small, engine_states(fp32_engine, *small)):
        assert torch.equal(a, b)  # the fp32 kernel, exactly
    torch_int8 = load_model(tmp_path)
    torch_engine = Engine(torch_int8, Precision.quantized("task", smoothing=False))
    native.disable(torch_int8)
    for a, b, c in zip(engine_states(int8_engine, *large), engine_states(torch_engine, *large),
                       engine_states(fp32_engine, *large)):
        assert torch.equal(a, b) and float((a - c).abs().max()) > 1e-4  # PyTorch's int8 kernels, not fp32
    for product in plan.quantized:
        product.observing = True
    assert plan.calibrating()

    def not_while_calibrating(*args, **kwargs):
        raise AssertionError("the kernel ran while the int8 layers were being calibrated")

    monkeypatch.setattr(native.NativeEncoder, "__call__", not_while_calibrating)
    engine_states(int8_engine, *small)  # the PyTorch layers, which observe


def test_fp32_batches_past_max_tokens_take_the_kernel_on_256_bit_builds_only(monkeypatch):
    """Where the kernel's products beat oneDNN's (256-bit builds, AVX2) fp32 batches up to BATCH_MAX_TOKENS take the
    kernel; on 512-bit builds only those of at most MAX_TOKENS (bench/kernel_batches.py); without the library,
    MAX_TOKENS."""
    for lanes, tokens in ((8, native.BATCH_MAX_TOKENS), (16, native.MAX_TOKENS)):
        monkeypatch.setattr(native.library(), "ek_vector_width", lambda lanes=lanes: lanes)
        assert native.fp32_max_tokens() == tokens
    monkeypatch.setattr(native, "library", lambda: None)
    assert native.fp32_max_tokens() == native.MAX_TOKENS


def test_int8_length_limit_follows_the_kernels_int8_products(monkeypatch):
    """Exact 8-bit sums (VNNI) and pair sums (AVX2, AVX512BW) take int8 batches of sequences up to 256 tokens (as
    measured on each, bench/int8_lengths.py), a kernel without int8 products the shortest limit (its batches run in
    fp32 up to MAX_TOKENS anyway)."""
    from encoderkit.precision import EXACT_WEIGHT_LEVELS, PAIR_SUM_WEIGHT_LEVELS

    for limit, length in ((EXACT_WEIGHT_LEVELS, 256), (PAIR_SUM_WEIGHT_LEVELS, 256), (0, 256)):
        monkeypatch.setattr(native, "int8_weight_limit", lambda limit=limit: limit)
        assert native.int8_max_length() == length


@needs_int8
def test_native_int8_takes_batches_of_short_sequences(tmp_path, monkeypatch, kernel_codes):
    """int8 batches beyond MAX_TOKENS whose sequences are all short (``int8_max_length()``) run natively, with the
    results of PyTorch's int8 kernels; a batch with a longer sequence runs those kernels."""
    from encoderkit.engine import Engine
    from encoderkit.precision import Precision

    monkeypatch.setattr(native, "BATCH_MAX_TOKENS", 120)
    monkeypatch.setattr(native, "int8_max_length", lambda: 16)
    config, reference, model = reference_and_ours("bert", tmp_path, max_position_embeddings=64)
    engine = Engine(model, Precision.quantized("task", smoothing=False))
    torch_model = load_model(tmp_path)
    torch_engine = Engine(torch_model, Precision.quantized("task", smoothing=False))
    native.disable(torch_model)
    long_ids, long_types = sequences(config, [40, 30])  # 70 tokens
    engine_states(engine, long_ids, long_types)  # a sequence over int8_max_length(): PyTorch's kernels
    assert native.kernel_of(model) is None
    ids, types = sequences(config, [16, 15, 12, 9, 16, 14, 11, 3], seed=6)  # 96 tokens, none over 16
    assert sum(map(len, ids)) > native.MAX_TOKENS
    expected = expected_states(reference, config, ids, types)
    batches = []
    original = native.NativeEncoder.__call__
    monkeypatch.setattr(native.NativeEncoder, "__call__",
                        lambda self, ids, *rest: batches.append(len(ids)) or original(self, ids, *rest))
    got, want = engine_states(engine, ids, types), engine_states(torch_engine, ids, types)
    assert batches == [96], batches  # the whole batch, natively
    for ours, theirs, exact in zip(got, want, expected):
        ours_error, their_error = float((ours - exact).norm()), float((theirs - exact).norm())
        assert ours_error <= 1.5 * their_error + 1e-5


def test_native_plan_is_made_once_under_concurrent_first_calls(tmp_path):
    """Two threads whose first batches arrive together (an embedding job's lanes, a server's workers) on a model
    whose kernel layout is not made yet: one makes it, the other waits for it, and neither computes with a layout
    being replaced (its tensors freed under the kernel's feet)."""
    import threading

    config, reference, model = reference_and_ours("bert", tmp_path, hidden_size=128, intermediate_size=512,
                                                  num_attention_heads=4)
    engine = engine_for(model, "fp32")
    batches = [sequences(config, [9 + i, 5], seed=10 + i)[0] for i in range(2)]
    expected = [engine.pooled(b) for b in batches]
    for attempt in range(10):
        native.reset(model)
        start, results = threading.Barrier(2), [None, None]

        def run(i: int) -> None:
            start.wait()
            results[i] = engine.pooled(batches[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for want, got in zip(expected, results):
            assert torch.equal(want, got), f"attempt {attempt}: a concurrent first call computed something else"
