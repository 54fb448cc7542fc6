"""AdamW's step of an embedding table whose gradient is a few rows (training/optim.optimizer_step with ``rows``,
native ``ek_adamw_rows``) against torch's AdamW on the same dense gradients: the same weights and state step after
step, with weight decay and without, with the clipping scale, around a checkpoint and around steps of torch's own."""
from __future__ import annotations

import pytest
import torch

from encoderkit import native
from encoderkit.training.optim import clip_gradients, optimizer_step

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"native library: {native.status()}")

ROWS = 700


def parameters(width: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(ROWS, width, generator=generator)),  # the table
            torch.nn.Parameter(torch.randn(24, width, generator=generator)),  # a dense weight
            torch.nn.Parameter(torch.randn(width, generator=generator))]  # a bias, no decay


def adamw(params: list[torch.nn.Parameter], weight_decay: float, fused: bool = True) -> torch.optim.AdamW:
    groups = [{"params": params[:2], "weight_decay": weight_decay}, {"params": params[2:], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-2, betas=(0.9, 0.98), eps=1e-6, fused=fused, foreach=False if not fused
                             else None)


def gradients(step: int, width: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A step's gradients: the table's non-zero on a few rows among the first 400 (rows 400 on are never touched),
    scaled up now and then so that the clipping scales them."""
    generator = torch.Generator().manual_seed(100 + step)
    ids = torch.unique(torch.randint(0, 400, (30,), generator=generator))
    table = torch.zeros(ROWS, width)
    table[ids] = torch.randn(len(ids), width, generator=generator) * (5.0 if step % 3 == 2 else 0.1)
    return [table, torch.randn(24, width, generator=generator) * 0.1, torch.randn(width, generator=generator)], ids


def take(params, grads) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()


def close(ours, theirs, ours_opt, their_opt) -> None:
    for p, q in zip(ours, theirs):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (p - q).abs().max()
        for key in ("exp_avg", "exp_avg_sq"):
            a, b = ours_opt.state[p][key], their_opt.state[q][key]
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-9), (key, (a - b).abs().max())
        assert float(ours_opt.state[p]["step"]) == float(their_opt.state[q]["step"])


@pytest.mark.parametrize("width", [32, 37])
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("fused", [True, False])
def test_row_steps_equal_torch_adamw(width, weight_decay, fused) -> None:
    ours, theirs = parameters(width), parameters(width)
    ours_opt, their_opt = adamw(ours, weight_decay, fused), adamw(theirs, weight_decay, fused)
    untouched = ours[0].detach()[400:].clone()
    for step in range(8):
        grads, ids = gradients(step, width)
        take(ours, grads), take(theirs, grads)
        rows = {id(ours[0]): ids}
        norm = clip_gradients(iter(ours), 1.0, ours_opt, rows)
        assert norm == pytest.approx(float(torch.nn.utils.clip_grad_norm_(theirs, 1.0)), rel=1e-6)
        optimizer_step(ours_opt, rows)
        their_opt.step()
        close(ours, theirs, ours_opt, their_opt)
        assert ours[0].grad is not None  # handed back after torch's step of the others
    assert torch.count_nonzero(ours_opt.state[ours[0]]["exp_avg"][400:]) == 0
    factor = 1.0
    for _ in range(8):
        factor *= 1.0 - 3e-2 * weight_decay
    assert torch.allclose(ours[0].detach()[400:], untouched * factor, rtol=1e-6)  # the decay alone


def test_torch_steps_between_and_a_checkpoint() -> None:
    """A step of torch's own (no rows) changes m and v of rows the native step took as never touched: the marks are
    found again. A state loaded from a checkpoint steps on in either."""
    width = 32
    ours, theirs = parameters(width), parameters(width)
    ours_opt, their_opt = adamw(ours, 0.01), adamw(theirs, 0.01)
    for step in range(9):
        grads, ids = gradients(step, width)
        if step == 3:  # this step's table gradient reaches rows 400 on too, through torch's step
            grads[0][400:] = 0.05
        take(ours, grads), take(theirs, grads)
        optimizer_step(ours_opt, None if step == 3 else {id(ours[0]): ids})
        their_opt.step()
        close(ours, theirs, ours_opt, their_opt)
        if step == 5:  # ours continues from a checkpoint of its state
            saved = ours_opt.state_dict()
            ours_opt = adamw(ours, 0.01)
            ours_opt.load_state_dict(saved)


def test_one_thread_and_two_give_the_same_numbers() -> None:
    width, results = 48, []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            params = [torch.nn.Parameter(torch.randn(4000, width, generator=torch.Generator().manual_seed(3)))]
            opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
            for step in range(3):
                ids = torch.arange(step, 4000, 7)
                params[0].grad = torch.zeros(4000, width)
                params[0].grad[ids] = 1.0 + step
                optimizer_step(opt, {id(params[0]): ids})
            results.append(params[0].detach().clone())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_without_the_library_torch_steps(monkeypatch) -> None:
    monkeypatch.setattr(native, "library", lambda: None)
    width = 32
    ours, theirs = parameters(width), parameters(width)
    ours_opt, their_opt = adamw(ours, 0.01), adamw(theirs, 0.01)
    for step in range(3):
        grads, ids = gradients(step, width)
        take(ours, grads), take(theirs, grads)
        optimizer_step(ours_opt, {id(ours[0]): ids})
        their_opt.step()
        for p, q in zip(ours, theirs):
            assert torch.equal(p, q)  # torch's kernel both times
