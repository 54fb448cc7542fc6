"""encoderkit's CPU dropout (modeling/dropout.py): the drop chance, scale and gradient of the formula, masks
that repeat under torch.manual_seed, independent elements, and the attention path it takes in training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from encoderkit.modeling import attention as attention_module
from encoderkit.modeling.dropout import LEVELS, Dropout, dropout, keep_mask

N = 1 << 20


@pytest.mark.parametrize("p", [0.1, 0.5, 0.02])
def test_drop_share_and_scale_follow_the_formula(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(N)
    out = dropout(x, p)
    chance = round(p * LEVELS) / LEVELS  # the chance of a drop on the 16-bit grid
    dropped = float((out == 0).float().mean())
    sigma = math.sqrt(chance * (1 - chance) / N)
    assert abs(dropped - chance) < 5 * sigma, (dropped, chance)
    kept = out[out != 0]
    assert torch.equal(kept, torch.full_like(kept, 1 / (1 - chance)))  # the inverse of the kept share
    assert abs(float(out.mean()) - 1.0) < 5 * sigma / (1 - chance)  # the expectation is kept


def test_gradient_is_the_mask_times_the_scale() -> None:
    torch.manual_seed(1)
    x = torch.randn(300, 384, requires_grad=True)
    weights = torch.randn(300, 384)
    out = dropout(x, 0.1)
    (out * weights).sum().backward()
    keep = out.detach() != 0
    scale = LEVELS / (LEVELS - round(0.1 * LEVELS))
    assert torch.allclose(out.detach(), x.detach() * keep * scale)
    assert torch.allclose(x.grad, weights * keep * scale)


def test_masks_repeat_under_manual_seed_and_differ_between_calls() -> None:
    torch.manual_seed(7)
    first, second = keep_mask((64, 64), 0.1)[0], keep_mask((64, 64), 0.1)[0]
    torch.manual_seed(7)
    assert torch.equal(keep_mask((64, 64), 0.1)[0], first)
    assert not torch.equal(first, second)


def test_neighbouring_elements_are_independent() -> None:
    """Four elements share each 64-bit draw: their keeps must not correlate (nor any neighbours')."""
    torch.manual_seed(3)
    keep = keep_mask((N,), 0.5)[0].float()
    for lag in (1, 2, 3, 4, 5):
        correlation = torch.corrcoef(torch.stack([keep[:-lag], keep[lag:]]))[0, 1]
        assert abs(float(correlation)) < 5 / math.sqrt(N), (lag, float(correlation))


def test_eval_mode_zero_and_one_and_the_module() -> None:
    x = torch.randn(10, 8)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # torch's own dropout for p = 1
    module = Dropout(0.1)
    assert isinstance(module, torch.nn.Dropout) and module.state_dict() == {}
    assert torch.equal(module.eval()(x), x)


def test_training_attention_with_dropout_equals_sdpa_when_nothing_is_dropped(monkeypatch) -> None:
    """In training with attention dropout on the CPU, attention runs the explicit products with this dropout;
    with a dropout that keeps everything it must equal SDPA's attention."""
    from encoderkit.config import EncoderConfig
    from encoderkit.modeling import Encoder

    config = EncoderConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    model = Encoder(config).train()
    ids = torch.randint(0, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    calls = []

    def keep_all(x, p, training=True):
        calls.append(p)
        return x

    monkeypatch.setattr(attention_module, "dropout", keep_all)
    explicit = model(ids, mask).last_hidden_state
    assert calls == [0.1, 0.1]  # one per layer: the explicit path ran
    monkeypatch.setattr(attention_module, "dropout", dropout)
    for layer in model.layers:
        layer.attention.dropout_p = 0.0  # SDPA without dropout
    reference = model(ids, mask).last_hidden_state
    assert torch.allclose(explicit * mask[..., None], reference * mask[..., None], atol=1e-5)
