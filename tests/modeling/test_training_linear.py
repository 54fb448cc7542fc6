"""Training linears on oneDNN: the same products as F.linear (float64 reference), gradients included."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from encoderkit import EncoderConfig, EncoderForSequenceClassification
from encoderkit.modeling import training_linear
from encoderkit.modeling.training_linear import TrainingLinear, for_training, linear, onednn_linear_available

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear")


def _reference(x, weight, bias, grad):
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, weight, bias))
    out = torch.nn.functional.linear(x64, w64, b64)
    out.backward(grad.double())
    return out, x64.grad, w64.grad, b64.grad


@needs_onednn
@pytest.mark.parametrize("shape", [(37, 48), (3, 11, 48)])
def test_products_and_gradients_match_float64(shape) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator, requires_grad=True)
    weight = torch.randn(64, 48, generator=generator, requires_grad=True)
    bias = torch.randn(64, generator=generator, requires_grad=True)
    grad = torch.randn(*shape[:-1], 64, generator=generator)
    calls = []
    original = training_linear._OneDnnLinear.apply
    with pytest.MonkeyPatch.context() as patch:  # prove the oneDNN path ran, not the F.linear fallback
        patch.setattr(training_linear._OneDnnLinear, "apply", lambda *a: calls.append(1) or original(*a))
        patch.setattr(training_linear, "onednn_for_training", lambda: True)  # whatever this CPU's vendor
        out = linear(x, weight, bias)
    assert calls and out.shape == (*shape[:-1], 64)
    out.backward(grad)
    ref_out, ref_x, ref_w, ref_b = _reference(x, weight, bias, grad)
    for ours, reference in ((out, ref_out), (x.grad, ref_x), (weight.grad, ref_w), (bias.grad, ref_b)):
        assert (ours.double() - reference).abs().max() <= 1e-4 * max(1.0, float(reference.detach().abs().max()))


def test_inference_and_other_dtypes_keep_f_linear() -> None:
    x, weight = torch.randn(5, 8), torch.randn(3, 8)
    with torch.no_grad():  # no gradient wanted: F.linear itself, bit for bit
        assert torch.equal(linear(x, weight), torch.nn.functional.linear(x, weight))
    x64, w64 = x.double(), weight.double().requires_grad_()
    assert torch.equal(linear(x64, w64), torch.nn.functional.linear(x64, w64))
    assert not training_linear._use_onednn(x.bfloat16(), weight.bfloat16().requires_grad_(), None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not training_linear._use_onednn(x, weight.requires_grad_(), None)


def test_for_training_swaps_plain_linears_in_place() -> None:
    config = EncoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=24, max_position_embeddings=16, id2label={0: "a", 1: "b"})
    model = EncoderForSequenceClassification(config)
    class OwnLinear(nn.Linear):  # a user's own subclass
        pass

    model.extra = OwnLinear(4, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(1, 50, (2, 7))
    model.eval()
    with torch.no_grad():
        expected = model(ids).logits
    for_training(model)
    assert type(model.extra) is OwnLinear  # subclasses are left alone
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not model.extra]
    assert linears and all(type(m) is TrainingLinear for m in linears)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.train()
    out = model(ids, labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert all(p.grad is not None for p in model.classifier.parameters())
    model.eval()
    torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_training_products_use_onednn_except_on_intel_cpus(monkeypatch) -> None:
    """oneDNN serves the training products where it is the faster kernel: not on Intel CPUs, where MKL is."""
    for vendor, expected in (("GenuineIntel", False), ("AuthenticAMD", onednn_linear_available())):
        training_linear.onednn_for_training.cache_clear()
        monkeypatch.setattr("encoderkit.precision.cpu_vendor", lambda: vendor)
        try:
            assert training_linear.onednn_for_training() is expected
            x, weight = torch.randn(5, 8), torch.randn(3, 8, requires_grad=True)
            assert training_linear._use_onednn(x, weight, None) is expected
        finally:
            training_linear.onednn_for_training.cache_clear()
