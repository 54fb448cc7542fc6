"""encoderkit's CPU dropout (modeling/dropout.py): the native masks against Philox4x32-10 written out here (checked
against Random123's known answers), the drop chance, scale and gradient of the formula, masks that repeat under
torch.manual_seed, independent elements, both with the native library and without it (numpy's masks), and the
attention path it takes in training."""
from __future__ import annotations

import math

import pytest
import torch

from encoderkit import native
from encoderkit.modeling import attention as attention_module
from encoderkit.modeling import dropout as dropout_module
from encoderkit.modeling.dropout import LEVELS, Dropout, dropout, native_keep_mask, training_kernels

N = 1 << 20
needs_native = pytest.mark.skipif(native.library() is None, reason=f"no native library: {native.status()}")


def philox4x32_10(counter: list[int], key: list[int]) -> list[int]:
    """Philox4x32-10 of one counter (Salmon, Moraes, Dror and Shaw, SC 2011), in plain integers."""
    m0, m1, w0, w1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
    c, (k0, k1) = list(counter), key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + w0) % 2**32, (k1 + w1) % 2**32
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 % 2**32, (p0 >> 32) ^ c[3] ^ k1, p0 % 2**32]
    return c


def test_reference_philox_gives_random123s_known_answers() -> None:
    ones = 0xFFFFFFFF
    assert philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32_10([ones] * 4, [ones] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def reference_bits(seed: int, stop: int, start: int = 0) -> list[int]:
    """training.cpp's bits of elements start..stop-1: element 16k + j of group g takes word k / 2 of counter
    16g + j (its low half for an even k)."""
    bits = []
    for index in range(start, stop):
        group, rest = divmod(index, 128)
        k, j = divmod(rest, 16)
        number = 16 * group + j
        word = philox4x32_10([number % 2**32, number >> 32, 0, 0], [seed % 2**32, seed >> 32])[k // 2]
        bits.append(word >> 16 if k % 2 else word & 0xFFFF)
    return bits


@needs_native
@pytest.mark.parametrize("seed", [0, 1, 2**62 - 1, 0x0123456789ABCDEF % 2**62])
def test_native_masks_are_philox_bits_over_the_threshold(seed: int) -> None:
    dropped = round(0.1 * LEVELS)
    count = 128 * 3 + 37  # whole groups, a group's partial vectors and a partial vector
    expected = torch.tensor([b >= dropped for b in reference_bits(seed, count)])
    assert torch.equal(native_keep_mask(seed, count, dropped), expected)
    x = torch.randn(count)
    scale = LEVELS / (LEVELS - dropped)
    assert torch.equal(dropout_module._apply(x, seed, dropped, scale), x * expected * scale)


@needs_native
def test_native_masks_drawn_by_several_threads_equal_one_threads() -> None:
    """Past 65,536 elements the groups are shared between torch's threads: the same masks, and the same elements
    (sampled) as the reference."""
    count, dropped, seed = 300_001, round(0.3 * LEVELS), 99
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = native_keep_mask(seed, count, dropped)
        torch.set_num_threads(max(2, threads))
        shared = native_keep_mask(seed, count, dropped)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, shared)
    for start in (150_000, count - 300):  # where two threads' shares meet, and the last groups (a partial one)
        expected = torch.tensor([b >= dropped for b in reference_bits(seed, start + 300, start)])
        assert torch.equal(shared[start:start + 300], expected)


@needs_native
def test_native_dropout_propagates_nan_and_bf16_takes_the_same_mask() -> None:
    x = torch.full((4096,), float("nan"))
    assert torch.isnan(dropout_module._apply(x, 5, 6554, 1.1)).all()  # dropped NaNs stay NaN (x * 0), as torch's
    y = torch.randn(4096)
    scale = LEVELS / (LEVELS - 6554)
    fp32 = dropout_module._apply(y, 5, 6554, scale)
    bf16 = dropout_module._apply(y.bfloat16(), 5, 6554, scale)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16 == 0, fp32 == 0)


@needs_native
@pytest.mark.parametrize("seed", [0, 5, 2**62 - 1, 0x0123456789ABCDEF % 2**62])
@pytest.mark.parametrize("count", [1, 127, 128 * 3 + 37, 100_003])
def test_the_same_masks_with_the_library_and_without(seed: int, count: int) -> None:
    """numpy's Philox (the fallback without a compiler) draws the native library's masks, bit for bit, so one seed
    trains the same on a machine without g++."""
    from encoderkit.modeling.dropout import philox_bits

    bits = philox_bits(seed, count)
    if count <= 128 * 3 + 37:
        assert bits.tolist() == reference_bits(seed, count)
    for p in (0.1, 0.5):
        dropped = round(p * LEVELS)
        assert torch.equal(native_keep_mask(seed, count, dropped), torch.from_numpy(bits >= dropped))


def test_dropout_equals_with_and_without_the_library(monkeypatch) -> None:
    if native.library() is None:
        pytest.skip(f"no native library: {native.status()}")
    x = torch.randn(37, 300)
    torch.manual_seed(11)
    with_library = dropout(x, 0.1)
    monkeypatch.setattr(native, "library", lambda: None)
    torch.manual_seed(11)
    assert torch.equal(dropout(x, 0.1), with_library)


@pytest.fixture(params=["native", "numpy"])
def masks(request, monkeypatch) -> str:
    """Each test below runs with the native masks and with numpy's (the library taken away)."""
    if request.param == "native" and native.library() is None:
        pytest.skip(f"no native library: {native.status()}")
    if request.param == "numpy":
        monkeypatch.setattr(native, "library", lambda: None)
    return request.param


@pytest.mark.parametrize("p", [0.1, 0.5, 0.02])
def test_drop_share_and_scale_follow_the_formula(p: float, masks: str) -> None:
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


def test_gradient_is_the_mask_times_the_scale(masks: str) -> None:
    torch.manual_seed(1)
    x = torch.randn(300, 384, requires_grad=True)
    weights = torch.randn(300, 384)
    out = dropout(x, 0.1)
    (out * weights).sum().backward()
    keep = out.detach() != 0
    scale = LEVELS / (LEVELS - round(0.1 * LEVELS))
    assert torch.allclose(out.detach(), x.detach() * keep * scale)
    assert torch.allclose(x.grad, weights * keep * scale)


def test_masks_repeat_under_manual_seed_and_differ_between_calls(masks: str) -> None:
    x = torch.ones(64, 64)
    torch.manual_seed(7)
    first, second = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.1), first)
    assert not torch.equal(first, second)


def test_neighbouring_elements_are_independent(masks: str) -> None:
    """Elements that share a draw (eight a Philox block, sixteen a vector's counters) must not correlate, nor any
    neighbours'."""
    torch.manual_seed(3)
    keep = (dropout(torch.ones(N), 0.5) != 0).float()
    for lag in (1, 2, 3, 4, 5, 8, 16, 128):
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
    """In training with attention dropout on the CPU, attention runs the explicit products with this dropout (where
    the native training kernel does not: test_training_kernels.py); with a dropout that keeps everything it must
    equal SDPA's attention."""
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
    with training_kernels(False):
        explicit = model(ids, mask).last_hidden_state
    assert calls == [0.1, 0.1]  # one per layer: the explicit path ran
    monkeypatch.setattr(attention_module, "dropout", dropout)
    for layer in model.layers:
        layer.attention.dropout_p = 0.0  # SDPA without dropout
    reference = model(ids, mask).last_hidden_state
    assert torch.allclose(explicit * mask[..., None], reference * mask[..., None], atol=1e-5)
