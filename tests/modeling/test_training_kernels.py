"""The native kernels of a training step's layers (issue 22, fine-tuning speed): one group's attention in one autograd
function (``modeling.attention._TrainingAttention``: softmax, padding mask and the dropout of the probabilities in one
native pass each way) and a post-norm layer's LayerNorm(residual + dropout(y)) (``modeling.dropout.add_norm``).

References: the same arithmetic in plain torch ops, with the dropout mask of ``native_keep_mask`` (the same seed and
element order, itself tested against Philox's published answers in test_dropout.py); torch's LayerNorm. Whole models of
every post-norm family give the same loss and gradients with the kernels as without them, dropout on; and the kernels
step aside where they do not apply."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from encoderkit import EncoderConfig, build_model, native
from encoderkit.modeling import attention as attention_module
from encoderkit.modeling import dropout as dropout_module
from encoderkit.modeling.attention import _TrainingAttention
from encoderkit.modeling.dropout import Dropout, add_norm, draw_mask, native_keep_mask, training_kernels
from test_engine import FAMILY_CONFIGS

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no native library: {native.status()}")


def attention_reference(grid, valid, heads, scale, mask):
    """softmax(q k^T * scale, padding keys masked) dropped by the native mask of ``mask``'s seed, times v."""
    count, length, width = grid.shape
    dim = width // (3 * heads)
    q, k, v = grid.view(count, length, 3, heads, dim).permute(2, 0, 3, 1, 4).unbind(0)
    scores = q @ k.transpose(-1, -2) * scale
    if valid is not None:
        real = torch.arange(length)[None, :] < valid[:, None]
        scores = scores.masked_fill(~real[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1)
    seed, dropped, keep_scale = mask
    if dropped:
        probs = probs * native_keep_mask(seed, probs.numel(), dropped).view(probs.shape) * keep_scale
    return probs @ v


CASES = [(3, 37, 4, 8, [37, 20, 5]), (2, 70, 4, 16, None), (5, 128, 12, 32, [128, 100, 64, 3, 128]),
         (1, 1, 2, 16, None)]


@pytest.mark.parametrize("count,length,heads,dim,valid", CASES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
def test_training_attention_equals_its_products(count, length, heads, dim, valid, p) -> None:
    torch.manual_seed(0)
    grid = torch.randn(count, length, 3 * heads * dim, requires_grad=True)
    valid = None if valid is None else torch.tensor(valid)
    mask = draw_mask(p) if p else (0, 0, 1.0)
    scale = 1 / math.sqrt(dim)
    out = _TrainingAttention.apply(grid, valid, heads, scale, mask)
    weights = torch.randn_like(out)
    if valid is not None:  # a padding query's output is dropped by the layer: its gradient is zero
        weights = weights * (torch.arange(length)[None, :] < valid[:, None])[:, None, :, None]
    (out * weights).sum().backward()
    ours = grid.grad.clone()
    grid.grad = None
    reference = attention_reference(grid, valid, heads, scale, mask)
    (reference * weights).sum().backward()
    real = 1.0 if valid is None else (torch.arange(length)[None, :] < valid[:, None])[:, None, :, None]
    assert torch.allclose((out * real).detach(), (reference * real).detach(), atol=2e-6)
    assert torch.allclose(ours, grid.grad, atol=2e-6)
    if p:  # the mask did drop something (and not everything)
        dropped_share = (native_keep_mask(mask[0], count * heads * length * length, mask[1]) == 0).float().mean()
        assert count * heads * length * length < 100 or abs(float(dropped_share) - p) < 0.05


def test_training_attention_gives_the_same_numbers_on_one_thread_and_two() -> None:
    torch.manual_seed(0)
    grid = torch.randn(4, 96, 3 * 4 * 16, requires_grad=True)  # 4 * 4 * 96 * 96 scores: the threaded branch
    valid, mask, threads = torch.tensor([96, 50, 96, 7]), draw_mask(0.1), torch.get_num_threads()
    results = []
    for count in (1, 2):
        torch.set_num_threads(count)
        try:
            out = _TrainingAttention.apply(grid, valid, 4, 0.25, mask)
            out.sum().backward()
        finally:
            torch.set_num_threads(threads)
        results.append((out.detach(), grid.grad.clone()))
        grid.grad = None
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("rows,width", [(5, 32), (700, 384), (64, 48), (6, 40)])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_add_norm_equals_layer_norm_of_the_sum(rows, width, p, bias) -> None:
    torch.manual_seed(0)
    norm = nn.LayerNorm(width, eps=1e-12, bias=bias)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        if bias:
            norm.bias.normal_()
    drop = Dropout(p)
    residual = torch.randn(rows, width, requires_grad=True)
    y = torch.randn(rows, width, requires_grad=True)
    weights = torch.randn(rows, width)
    tensors = [residual, y, norm.weight] + ([norm.bias] if bias else [])
    state = torch.get_rng_state()
    calls = []
    fused = add_norm(residual, y, _Spy(drop, calls), norm)
    (fused * weights).sum().backward()
    ours = [t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    torch.set_rng_state(state)  # the same seed for the reference's dropout (modeling.dropout's own, same mask)
    reference = norm(residual + dropout_module.dropout(y, p, True))
    (reference * weights).sum().backward()
    # the kernel takes rows of a multiple of 16 values (the dropout module is not called); others run torch's ops
    assert (calls == []) == (width % 16 == 0)
    assert torch.allclose(fused, reference, atol=5e-6, rtol=1e-5)
    for mine, theirs in zip(ours, [t.grad for t in tensors]):
        assert torch.allclose(mine, theirs, atol=2e-5, rtol=1e-5)


class _Spy(nn.Dropout):
    """A dropout module that records being called as a module (the fused path reads its ``p`` only)."""

    def __init__(self, inner: Dropout, calls: list) -> None:
        super().__init__(inner.p)
        self.inner, self.calls = inner, calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape)
        return self.inner(x)


POST_NORM = sorted(f for f in FAMILY_CONFIGS if f != "modernbert")  # DeBERTa: LayerNorm's kernel, not attention's


def tagger(family: str):
    torch.manual_seed(0)
    config = EncoderConfig(**{**dict(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=64,
                                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                              **FAMILY_CONFIGS[family]}).with_labels(3)
    return build_model(config, "token-classification").train()


def tagged_batch():
    torch.manual_seed(1)
    ids = torch.randint(5, 120, (4, 11))
    mask = torch.ones(4, 11, dtype=torch.long)
    mask[1, 7:], mask[2, 3:], mask[3, 10:] = 0, 0, 0
    labels = torch.randint(0, 3, (4, 11)).masked_fill(mask == 0, -100)
    return ids, mask, labels


def counted(monkeypatch) -> dict[str, int]:
    counts = {"attention": 0, "add_norm": 0}
    attention_apply, norm_apply = _TrainingAttention.apply, dropout_module._AddDropoutNorm.apply

    def attention(*args):
        counts["attention"] += 1
        return attention_apply(*args)

    def norm(*args):
        counts["add_norm"] += 1
        return norm_apply(*args)

    monkeypatch.setattr(attention_module._TrainingAttention, "apply", attention)
    monkeypatch.setattr(dropout_module._AddDropoutNorm, "apply", norm)
    return counts


@pytest.mark.parametrize("family", POST_NORM)
@pytest.mark.parametrize("full_grid", [False, True], ids=["unpadded", "padded-grid"])
def test_layers_with_the_kernels_equal_the_layers_without(family, full_grid, monkeypatch) -> None:
    """Dropout on: the kernels draw their seeds where the modules did, so the masks, the loss and every gradient
    are the same."""
    if full_grid:
        monkeypatch.setattr("encoderkit.modeling.encoder.UNPAD_MIN_PADDING", 0.9)
    model = tagger(family)
    ids, mask, labels = tagged_batch()
    results = []
    for on in (True, False):
        with monkeypatch.context() as patch, training_kernels(on):
            counts = counted(patch)
            torch.manual_seed(7)
            model.zero_grad(set_to_none=True)
            out = model(ids, mask, labels=labels)
            out.loss.backward()
            layers = len(model.encoder.layer_schedule())
            if on:  # every layer, each of its attention groups (not DeBERTa's relative attention)
                assert (counts["attention"] >= layers) == (family != "deberta-v2")
                assert counts["add_norm"] == 2 * layers
            else:
                assert counts == {"attention": 0, "add_norm": 0}
            results.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                if p.grad is not None}))
    (loss, grads), (loss_off, grads_off) = results
    assert torch.allclose(loss, loss_off, atol=1e-6)
    assert grads.keys() == grads_off.keys()
    for name in grads:
        assert torch.allclose(grads[name], grads_off[name], atol=2e-5, rtol=1e-4), name


def test_kernels_step_aside_where_they_do_not_apply(monkeypatch) -> None:
    model = tagger("bert")
    ids, mask, labels = tagged_batch()
    counts = counted(monkeypatch)
    with torch.no_grad():
        model(ids, mask, labels=labels)  # no gradient
    model.eval()
    model(ids, mask, labels=labels)  # evaluation
    assert counts == {"attention": 0, "add_norm": 0}
    model.train()
    model.encoder(ids, mask, output_attentions=True)  # probabilities asked for
    model.encoder(ids, mask, attention_bias=torch.zeros(1, 1, 11, 11))  # a mask beyond the padding
    monkeypatch.setattr("encoderkit.modeling.encoder.UNPAD_MIN_PADDING", 0.9)
    model.encoder(ids, mask.flip(1))  # one padded grid, padded on the left: the real keys are not each row's first
    assert counts["attention"] == 0
    assert counts["add_norm"] == 3 * 6  # LayerNorm(residual + dropout) runs on rows, wherever the padding was
    model.encoder(ids, mask)  # the same grid padded on the right: the kernel's padding mask is each row's real keys
    assert counts["attention"] == 3
    for layer in model.encoder.layers:  # a dropout module of the user's own runs as it is
        layer.output_dropout = nn.Sequential(layer.output_dropout)
    counts["add_norm"] = 0
    model.encoder(ids, mask)
    assert counts["add_norm"] == 3
    modern = tagger("modernbert")
    counts["attention"] = counts["add_norm"] = 0
    modern(ids, mask, labels=labels).loss.backward()  # rotary positions, pre-norm layers
    assert counts == {"attention": 0, "add_norm": 0}
