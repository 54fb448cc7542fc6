"""int8 inference (``--dtype int8``): int8 linear layers on the one model, prepared in place by for_inference,
checked against the same model in fp32; the accuracy guard that compares them on calibration texts."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from encoderkit import Embedder, InputError
from encoderkit.engine import Engine, engine_for
from encoderkit.modeling.inference import Int8Prepacked, for_inference, int8_layers, int8_weight_levels
from encoderkit.precision import Precision, resolve_dtype
from encoderkit.quantization import MEAN_COSINE_MIN, WORST_COSINE_MIN

from conftest import shared_file
from test_cli import invoke
from test_engine import FAMILY_CONFIGS, padded, random_model, random_sequences

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest

# fp32 STS-B dev Spearman of all-MiniLM-L6-v2 (equal to sentence-transformers' evaluator: tests/tasks/test_sts.py)
FP32_STS_SPEARMAN = 0.867163


def pooled(model, ids, types, dtype) -> torch.Tensor:
    engine = engine_for(model, dtype, token_budget=256)
    out = torch.zeros(len(ids), model.config.hidden_size)
    for indices, hidden, packing in engine.run(ids, types):
        for row, states in zip(indices, hidden.split(packing.lengths.tolist())):
            out[row] = states.mean(0)
    return out


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_int8_matches_fp32_closely_for_every_family(family) -> None:
    model = random_model(family)
    ids, types = random_sequences(model.config, [9, 23, 4, 17, 17])
    exact = pooled(model, ids, types, "fp32")
    int8 = pooled(model, ids, types, "int8")
    layers = int8_layers(model)
    assert len(layers) >= 4 * len(model.layers)  # qkv, attention output, ffn_in, ffn_out  # DeBERTa's position projections are int8 too
    cosine = F.cosine_similarity(int8, exact, dim=1)
    assert cosine.min() > 0.995, cosine
    assert (int8 - exact).abs().max() > 1e-6  # it did run in int8


def fake_quantised(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, levels: int) -> torch.Tensor:
    """The int8 product written out in fp32: weights per output channel (symmetric, codes -levels..levels),
    activations per row (asymmetric uint8, each row's scale and zero point from its min and max, widened to
    include 0)."""
    w_scale = weight.abs().amax(1, keepdim=True) / levels
    w_q = torch.round(weight / w_scale).clamp(-levels, levels) * w_scale
    rows = []
    for row in x:
        low, high = min(float(row.min()), 0.0), max(float(row.max()), 0.0)
        scale = (high - low) / 255
        zero = round(-low / scale)
        rows.append((torch.clamp(torch.round(row / scale) + zero, 0, 255) - zero) * scale)
    return F.linear(torch.stack(rows), w_q, bias)


@pytest.mark.parametrize("rows", [14, 300])
def test_int8_products_equal_a_fake_quantised_reference(rows) -> None:
    """The kernel's product equals its own arithmetic written out in fp32, to fp32 rounding, on every CPU: 8-bit
    weight codes where the kernel sums exactly, 7-bit ones where it adds pairs in 16 bits."""
    torch.manual_seed(0)
    x = torch.randn(rows, 64) * 3 + 1
    x[:, 7] *= 8
    weight, bias = torch.randn(96, 64) * 0.1, torch.randn(96)
    layer = Int8Prepacked([weight], [bias], "test")
    got = layer(x)
    assert layer.levels == int8_weight_levels()
    expected = fake_quantised(x, weight, bias, layer.levels)
    assert (got - expected).abs().max() < 1e-4 * expected.abs().max()
    assert (got - F.linear(x, weight, bias)).abs().max() > 1e-3  # not the fp32 product


@pytest.mark.parametrize("rows", [1, 14, 300])
def test_int8_products_do_not_saturate_at_the_largest_codes(rows) -> None:
    """Every activation code 255 against weights of one sign at their largest code: the pair sums that
    saturate a 16-bit accumulator (AVX2's vpmaddubsw) with 8-bit weights. The product stays exact."""
    x = torch.rand(rows, 384) * 0.01 + 4.0  # min 0 (the zero point), the largest values code to 255
    weight = torch.rand(40, 384) * 0.01 + 0.5  # one sign: nothing cancels
    layer = Int8Prepacked([weight], [None], "worst")
    got = layer(x)
    expected = fake_quantised(x, weight, None, layer.levels)
    assert (got - expected).abs().max() < 1e-4 * expected.abs().max()


def test_the_weight_levels_follow_the_kernels_sums(monkeypatch) -> None:
    """7-bit weight codes exactly where the product kernel would saturate 8-bit ones, so that a CPU with VNNI keeps
    its extra bit; and a layer built where sums saturate has codes within -63..63."""
    from encoderkit.modeling import inference

    exact = inference._sums_exactly()
    assert int8_weight_levels() == (127 if exact or not inference._int8_kernel_available() else 63)
    monkeypatch.setattr(inference, "_sums_exactly", lambda: False)
    torch.manual_seed(3)
    layer = Int8Prepacked([torch.randn(32, 48)], [None], "seven")
    x = torch.randn(5, 48)
    got = layer(x)
    if inference._int8_kernel_available():
        assert layer.levels == 63 and int(layer.quantized.abs().max()) == 63
    assert (got - fake_quantised(x, layer.weight, None, layer.levels)).abs().max() < 1e-4 * got.abs().max()


def test_int8_products_of_a_row_do_not_depend_on_the_other_rows() -> None:
    """Each row is quantised with its own scale and zero point: a row's product is the same alone, beside ordinary
    rows, and beside a row of outliers a thousand times larger (which one scale for the matrix would let take the
    resolution of every row), on the kernel this CPU takes and in the fp32 arithmetic."""
    from encoderkit.modeling import inference

    torch.manual_seed(2)
    weight, bias = torch.randn(48, 64) * 0.1, torch.randn(48)
    layer = Int8Prepacked([weight], [bias], "rows")
    x = torch.randn(6, 64)
    outlier = torch.randn(1, 64) * 1000
    alone = torch.cat([layer(row[None]) for row in x])
    together = layer(torch.cat([x[:3], outlier, x[3:]]))
    assert (together[[0, 1, 2, 4, 5, 6]] - alone).abs().max() <= 1e-6 * alone.abs().max()
    exact = F.linear(x, weight, bias)
    assert (alone - exact).abs().max() < 0.02 * exact.abs().max()  # the int8 error of ordinary rows
    codes, scale, zero = inference.int8_rows.uint8_rows(x, None)
    assert codes.min() == 0 and codes.max() == 255 and scale.shape == zero.shape == (6, 1)  # each row's full range


@pytest.mark.parametrize("native", [True, False])
def test_int8_rows_are_quantised_alike_natively_and_in_torch(native, monkeypatch) -> None:
    """The native library's quantisation and rescaling (one pass each) give what the torch ops give, with
    smoothing, on rows as skewed as after GELU; the torch ops run where the library is not built."""
    from encoderkit.modeling import int8_rows

    if not native:
        monkeypatch.setattr(int8_rows, "_native", lambda: None)
    elif int8_rows._native() is None:
        pytest.skip("the native library is not built here (no compiler, or ENCODERKIT_NATIVE=0)")
    torch.manual_seed(4)
    x = torch.randn(37, 96) * 2 + 0.7
    x[5] *= 40
    inverse = torch.rand(96) * 3 + 0.25
    codes, scale, zero = int8_rows.quantize_rows(x, inverse)
    want, want_scale, want_zero = int8_rows.uint8_rows(x, inverse)
    assert codes.dtype == torch.uint8 and torch.equal(codes.float(), want)
    assert torch.equal(scale, want_scale.view(-1)) and torch.equal(zero.float(), want_zero.view(-1))
    products, sums, bias = torch.randn(37, 24) * 50, torch.randn(24), torch.randn(24)
    got = int8_rows.rescale_rows(products.clone(), scale, zero, sums, bias)
    expected = (products - zero.double()[:, None] * sums.double()) * scale.double()[:, None] + bias.double()
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("kernel", [True, False])
def test_int8_vectors_do_not_depend_on_their_batch(kernel) -> None:
    """A text's int8 states are the same encoded alone and in a batch of others (per-row activation scales), on
    the native kernel and on the PyTorch int8 layers. With one scale per packed batch they moved by the int8 error
    of whichever text had the widest range."""
    from encoderkit import native

    model = random_model("bert")
    ids, types = random_sequences(model.config, [9, 23, 4, 17, 30, 12])
    engine = engine_for(model, "int8", token_budget=256)
    if not kernel:
        native.disable(model)

    def states(picked: list[int]) -> list[torch.Tensor]:
        out = {}
        for indices, hidden, packing in engine.run([ids[i] for i in picked], [types[i] for i in picked]):
            out.update(zip(indices, hidden.split(packing.lengths.tolist())))
        return [out[i] for i in range(len(picked))]

    together = states(list(range(len(ids))))
    if kernel and native.kernel_of(model) is None:
        pytest.skip(f"the native kernel did not take the batch here: {native.status()}")
    for i, batched in enumerate(together):
        alone = states([i])[0]
        assert (alone - batched).abs().max() <= 1e-5 * batched.abs().max(), i
    assert (native.kernel_of(model) is None) != kernel


def test_int8_prepared_model_still_trains_exactly_and_saves_the_same_state() -> None:
    """Prepared for int8, the model saves the same state; a product that wants a gradient runs in fp32."""
    model, fresh = random_model("bert"), random_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids, types = random_sequences(model.config, [11, 6])
    pooled(model, ids, types, "int8")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    input_ids, mask, type_ids = padded(ids, types, model.config.pad_token_id)
    real = mask.bool()
    with torch.no_grad():
        reference = fresh(input_ids, mask, type_ids).last_hidden_state[real]
        inferred = model(input_ids, mask, type_ids).last_hidden_state[real]  # int8 products
    states = model(input_ids, mask, type_ids).last_hidden_state[real]  # with gradients: fp32 products
    assert (states - reference).abs().max() < 1e-5 < (inferred - reference).abs().max()
    states.pow(2).mean().backward()
    assert model.layers[0].attention.query.weight.grad is not None


def test_fp32_layers_stay_exact_and_unknown_names_are_an_error() -> None:
    model = random_model("bert")
    names = [f"layers.{i}.{part}" for i in range(len(model.layers))
             for part in ("attention.qkv", "attention.output", "ffn_in", "ffn_out")]
    ids, types = random_sequences(model.config, [9, 5])
    exact = pooled(model, ids, types, "fp32")
    all_fp32 = pooled(model, ids, types, Precision.quantized(fp32_layers=names))
    assert (all_fp32 - exact).abs().max() < 1e-5 and not int8_layers(model)
    pooled(model, ids, types, Precision.quantized(fp32_layers=["layers.0.ffn_out"]))
    assert "layers.0.ffn_out" not in {layer.name for layer in int8_layers(model)}
    assert "layers.0.ffn_in" in {layer.name for layer in int8_layers(model)}
    with pytest.raises(InputError, match="fp32_layers names no linear layer.*layers.9.ffn_out"):
        for_inference(model, int8=True, fp32_layers=("layers.9.ffn_out",))


def test_int8_is_for_inference_only_and_unknown_dtypes_are_named() -> None:
    with pytest.raises(InputError, match="int8 is for inference only.*fp32, bf16 or auto"):
        resolve_dtype("int8")
    with pytest.raises(InputError, match="unknown dtype 'int4'.*fp32, bf16, auto.*int8, for inference"):
        Precision.resolve("int4")
    with pytest.raises(InputError, match="int8 linear layers run with the rest of the model in fp32"):
        for_inference(random_model("bert"), torch.bfloat16, int8=True)
    assert Precision.resolve("int8").name == "int8" and Precision.resolve("auto").name in ("fp32", "bf16")


def test_cli_refuses_int8_for_training_and_unknown_dtypes(tmp_path) -> None:
    result = invoke("finetune", "--task", "classify", "--train", tmp_path / "t.tsv", "--out", tmp_path / "o",
                    "--dtype", "int8")
    assert result.exit_code == 2 and "'int8' is not one of 'fp32', 'bf16', 'auto'" in result.output
    result = invoke("eval-sts", tmp_path / "x.csv", "--dtype", "fp16")
    assert result.exit_code == 2 and "'fp16' is not one of 'fp32', 'bf16', 'int8', 'auto'" in result.output


def broken_model(factor: float = 1000.0):
    """A random BERT computing the same function in fp32, but whose second layer's attention output projection reads
    one channel ``factor`` times larger than the rest (its value row scaled up, the output column scaled down):
    per-matrix int8 activations then keep almost no resolution for the other channels."""
    model = random_model("bert")
    attention = model.layers[1].attention
    with torch.no_grad():
        attention.value.weight[5] *= factor
        attention.value.bias[5] *= factor
        attention.output.weight[:, 5] /= factor
    return model


def test_guard_fires_on_huge_activation_outliers_and_names_the_layers(caplog) -> None:
    model = broken_model()
    ids, _ = random_sequences(model.config, [12, 30, 7, 19] * 4)
    with caplog.at_level(logging.WARNING):
        engine = Engine(model, Precision.quantized(smoothing=False), calibration=ids)
    report = engine.quantization
    assert not report.ok and report.texts == 16
    assert report.mean_cosine < MEAN_COSINE_MIN or report.worst_cosine < WORST_COSINE_MIN
    assert report.worst_layers(1) == ["layers.1.attention.output"]  # the layer reading the outlier
    assert "int8 changes this model's outputs more than expected" in caplog.text
    assert "--dtype fp32" in caplog.text and "fp32_layers" in caplog.text
    # Its own advice, followed, brings it back within the thresholds.
    healthy = Engine(broken_model(), Precision.quantized(fp32_layers=report.worst_layers(1), smoothing=False),
                     calibration=ids)
    assert healthy.quantization.ok, healthy.quantization
    # SmoothQuant moves this outlier into the weights: with it (the default) the guard is satisfied too.
    smoothed = Engine(broken_model(), Precision.quantized(), calibration=ids).quantization
    assert smoothed.ok and smoothed.smoothing["layers.1.attention.output"] is not None, smoothed
    exact = pooled(broken_model(), ids, None, "fp32")  # the fp32 function is the unbroken model's
    assert (exact - pooled(random_model("bert"), ids, None, "fp32")).abs().max() < 1e-4


@pytest.fixture(scope="module")
def minilm_int8(minilm_dir):
    return Embedder.from_pretrained(minilm_dir, dtype="int8")


def test_guard_passes_minilm_and_reports_its_numbers(minilm_int8) -> None:
    report = minilm_int8.quantization
    assert report.ok and report.texts == 40
    assert report.mean_cosine > 0.99 and report.worst_cosine > 0.97
    assert len(report.layer_errors) == 24 and all(0 < e < 0.2 for e in report.layer_errors.values())


@pytest.mark.data
def test_int8_minilm_embeddings_are_close_to_fp32(minilm_dir, minilm_int8, bench_sentences) -> None:
    texts = bench_sentences[:400]
    exact = Embedder.from_pretrained(minilm_dir).encode(texts, normalize=True)
    int8 = minilm_int8.encode(texts, normalize=True)
    cosine = (exact * int8).sum(1)
    assert cosine.mean() > MEAN_COSINE_MIN and cosine.min() > WORST_COSINE_MIN, (cosine.mean(), cosine.min())


@pytest.mark.data
def test_cli_eval_sts_int8_within_three_tenths_of_fp32(capsys) -> None:
    path = shared_file("data", "stsb", "sts-dev.csv")
    from encoderkit.cli import main

    assert main(["eval-sts", str(path), "--dtype", "int8"]) == 0
    printed = dict(line.split(": ") for line in capsys.readouterr().out.strip().splitlines())
    assert abs(float(printed["spearman"]) - FP32_STS_SPEARMAN) * 100 <= 0.3, printed


def test_task_pipelines_run_int8(tiny_classifier_dir) -> None:
    from encoderkit import Classifier

    # more tokens than the native kernel's small batches (MAX_TOKENS), which run in fp32 where it has no int8
    texts = ["a first sentence", "and a second, longer one with more words", "third"] * 8
    exact = Classifier.from_pretrained(tiny_classifier_dir).logits(texts)
    int8 = Classifier.from_pretrained(tiny_classifier_dir, dtype="int8")
    assert int8.quantization is not None and int8.quantization.texts == 40
    got = int8.logits(texts)
    assert np.abs(got - exact).max() < 0.02 * np.abs(exact).max() and np.abs(got - exact).max() > 0
