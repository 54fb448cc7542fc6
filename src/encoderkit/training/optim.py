"""The optimizer side of a training step: AdamW's parameter groups (weight decay on matrices only), the learning-rate
schedule (warm-up then linear or cosine decay, transformers' rule), gradient clipping, and AdamW's step of an
embedding table whose gradient is a few rows (``EmbeddingRows``, ``optimizer_step`` with ``rows``)."""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from .. import native
from ..errors import InputError
from .config import TrainingConfig


def parameter_groups(model: nn.Module, weight_decay: float, learning_rate: float | None = None) -> list[dict[str, Any]]:
    """Weight decay on matrices only: never on biases, LayerNorm weights or embeddings' norms. Parameters
    under a prefix of ``model.learning_rate_multipliers`` (e.g. a CRF) get their own groups with a scaled rate."""
    multipliers = dict(getattr(model, "learning_rate_multipliers", {}) or {})
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{name}" if module_name else name
            scale = next((m for prefix, m in multipliers.items() if full_name.startswith(prefix)), 1.0)
            no_decay = isinstance(module, nn.LayerNorm) or name == "bias" or param.dim() < 2
            groups.setdefault((no_decay, scale), []).append(param)
    result = []
    for (no_decay, scale), params in sorted(groups.items()):
        group: dict[str, Any] = {"params": params, "weight_decay": 0.0 if no_decay else weight_decay}
        if scale != 1.0:
            if learning_rate is None:
                raise InputError("learning-rate multipliers need the base learning rate")
            group["lr"] = learning_rate * scale
        result.append(group)
    return result


def lr_lambda(config: TrainingConfig) -> Callable[[int], float]:
    """The learning-rate factor of each step. Warm-up rises from 0 at the first update, as in BERT's code and
    transformers' schedules, so a run here and a transformers Trainer run take the same steps (tested)."""
    warmup, total = config.warmup, config.max_steps

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return step / warmup
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if config.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(0.0, 1.0 - progress)

    return factor


def make_optimizer(model: nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where this PyTorch build offers it for the parameters' device (CPU and
    CUDA in torch >= 2.4): one fused update costs a fraction of the per-tensor loop's."""
    groups = parameter_groups(model, config.weight_decay, config.learning_rate)
    options = dict(lr=config.learning_rate, betas=config.adam_betas, eps=config.adam_eps)
    params = [p for group in groups for p in group["params"]]
    fusable = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16)
                                   for p in params)
    if fusable:
        try:
            return torch.optim.AdamW(groups, fused=True, **options)
        except (RuntimeError, TypeError, ValueError):  # an older build without the fused kernel for this device
            pass
    return torch.optim.AdamW(groups, **options)


def gradient_norm(grads: list[torch.Tensor]) -> float:
    """The 2-norm of all of ``grads`` together. Contiguous fp32 CPU gradients: one pass of the native library
    (``native.sum_of_squares``, summed in double); torch's ``get_total_norm`` (a norm per tensor, then their norm)
    otherwise. One pass is faster than a norm per tensor (bench/training_kernels.py), and summing in double keeps
    it close to the float64 norm, where fp32 sums lose precision over the word table's millions of elements."""
    if grads and all(g.device.type == "cpu" and g.dtype == torch.float32 and g.layout == torch.strided
                     and g.is_contiguous() for g in grads):
        squares = native.sum_of_squares(grads)
        if squares is not None:
            return math.sqrt(squares)
    return float(torch.nn.utils.get_total_norm(grads))


def scales_in_step(optimizer: torch.optim.Optimizer | None) -> bool:
    """Whether ``optimizer`` is fused Adam or AdamW, whose kernel divides each gradient by ``optimizer.grad_scale``
    as it reads it (the attribute torch's GradScaler sets): the clipping then costs no pass of its own."""
    return isinstance(optimizer, torch.optim.Adam) and bool(optimizer.defaults.get("fused"))


def clip_gradients(parameters: Iterator[nn.Parameter], max_norm: float,
                   optimizer: torch.optim.Optimizer | None = None,
                   rows: dict[int, torch.Tensor] | None = None) -> float:
    """``torch.nn.utils.clip_grad_norm_``, without its multiplication by 1.0: the gradients are scaled only when their
    total norm is over ``max_norm``, by torch's coefficient max_norm / (norm + 1e-6) (the same gradients either way;
    torch scales every one, each step, so that the GPU need not wait for the norm). Returns the total norm before
    clipping. With a fused Adam(W) ``optimizer`` (``scales_in_step``) the gradients are left as they are and the
    optimizer's next step divides them by the inverse of the coefficient (``optimizer.grad_scale``; take that step
    with ``optimizer_step``, which removes it): one pass over the gradients less, the same steps to fp32 rounding.
    ``rows`` (``EmbeddingRows.rows``: id(parameter) -> its rows whose gradient may be non-zero) lets the norm read
    those rows of a table alone."""
    with_grads = [p for p in parameters if p.grad is not None]
    if not with_grads:
        return 0.0
    rows = rows or {}
    with torch.profiler.record_function("encoderkit::gradient_norm"):
        total = gradient_norm([p.grad.index_select(0, rows[id(p)]) if id(p) in rows else p.grad for p in with_grads])
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1.0:  # torch's coefficient, clamped at 1
        if scales_in_step(optimizer):
            optimizer.grad_scale = torch.tensor(1.0 / coefficient, dtype=torch.float32)
        else:
            torch.nn.utils.clip_grads_with_norm_(with_grads, max_norm, torch.tensor(total))
    return total


def optimizer_step(optimizer: torch.optim.Optimizer, rows: dict[int, torch.Tensor] | None = None) -> None:
    """``optimizer.step()``, then the clipping scale ``clip_gradients`` handed it removed (it was for this step).

    ``rows`` (``EmbeddingRows.rows``: id(parameter) -> the rows of a table whose gradient may be non-zero): where the
    optimizer is torch's AdamW and the native library is built, those tables step in ``ek_adamw_rows`` and the rest
    in ``optimizer.step()``, with the same state in the same places (a checkpoint loads in torch's AdamW, and back).
    A row never touched since the start has m = v = 0 and a zero gradient, so its AdamW step is the weight decay
    alone: the kernel reads and writes the row's weights, and neither its gradient, m nor v. That is most of a
    word table in fine-tuning (two thirds of all-MiniLM-L6-v2's rows, on average over an epoch of SST-2 or CoNLL),
    and the table is half the model's parameters."""
    tables = _row_tables(optimizer, rows) if rows else []
    try:
        held = [(param, param.grad) for param, _, _ in tables]
        for param, _ in held:
            param.grad = None  # torch's step leaves a parameter without a gradient as it is
        try:
            optimizer.step()
        finally:
            for param, grad in held:
                param.grad = grad
        scale = getattr(optimizer, "grad_scale", None)
        with torch.profiler.record_function("encoderkit::adamw_rows"):  # the native pass, named in a profile
            for param, group, ids in tables:
                _adamw_rows(optimizer, param, group, ids, 1.0 if scale is None else 1.0 / float(scale))
    finally:
        optimizer.__dict__.pop("grad_scale", None)


def _row_tables(optimizer: torch.optim.Optimizer,
                rows: dict[int, torch.Tensor]) -> list[tuple[nn.Parameter, dict[str, Any], torch.Tensor]]:
    """The (parameter, group, rows) that ``optimizer_step`` hands to the native AdamW: plain AdamW groups (no
    amsgrad, maximize or differentiable step), 2-D contiguous fp32 CPU weights, gradients and state."""
    if not isinstance(optimizer, torch.optim.AdamW) or native.library() is None:
        return []
    found = []
    for group in optimizer.param_groups:
        if group.get("amsgrad") or group.get("maximize") or group.get("differentiable"):
            continue
        for param in group["params"]:
            ids = rows.get(id(param))
            grad = param.grad
            if ids is None or grad is None or param.dim() != 2:
                continue
            state = optimizer.state.get(param, {})
            tensors = [param, grad, *(state[k] for k in ("exp_avg", "exp_avg_sq") if k in state)]
            if all(t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided
                   and t.is_contiguous() and t.shape == param.shape for t in tensors):
                found.append((param, group, ids))
    return found


def _active_rows(optimizer: torch.optim.Optimizer, param: nn.Parameter, state: dict[str, Any]) -> torch.Tensor:
    """The rows of a table whose m or v may be non-zero (uint8 marks). ``_adamw_rows`` keeps them on the optimizer
    between its steps; they are found again from m and v when they may no longer be right: the state is another
    (loaded), its step count moved without ``_adamw_rows`` (a step of torch's: its fused kernel leaves tensor versions
    as they are) or a version moved (an in-place change)."""
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    known = optimizer.__dict__.get("_encoderkit_row_marks", {}).get(id(param))
    if known is not None and known[0]() is exp_avg and known[2] == (float(state["step"]), exp_avg._version,
                                                                     exp_avg_sq._version):
        return known[1]
    return ((exp_avg != 0).any(1) | (exp_avg_sq != 0).any(1)).to(torch.uint8)


def _adamw_rows(optimizer: torch.optim.Optimizer, param: nn.Parameter, group: dict[str, Any], ids: torch.Tensor,
                inv_scale: float) -> None:
    state = optimizer.state[param]
    if "exp_avg" not in state:  # as torch's fused AdamW lays its state out
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    active = _active_rows(optimizer, param, state)
    touched = torch.zeros(param.shape[0], dtype=torch.uint8)
    touched[ids] = 1
    state["step"] += 1
    step = float(state["step"])
    beta1, beta2 = group["betas"]
    lr = float(group["lr"])
    native.adamw_rows(param.detach(), param.grad, exp_avg, exp_avg_sq, active, touched,
                      decay=1.0 - lr * group["weight_decay"], betas=(beta1, beta2),
                      step_size=lr / (1.0 - beta1 ** step), bc2_sqrt=math.sqrt(1.0 - beta2 ** step), eps=group["eps"],
                      inv_scale=inv_scale)
    active |= touched
    marks = optimizer.__dict__.setdefault("_encoderkit_row_marks", {})  # not in the state dict: found again on load
    marks[id(param)] = (weakref.ref(exp_avg), active, (step, exp_avg._version, exp_avg_sq._version))


@dataclass
class _Table:
    module: nn.Embedding
    grad: torch.Tensor | None = None  # the kept dense gradient
    touched: list[torch.Tensor] | None = None  # the ids looked up since the rows were last zeroed
    handles: tuple[Any, ...] = ()
    dense: bool = False  # a dense gradient reached the weight: another use of it, so every row may be written


class EmbeddingRows:
    """The gradient of a large embedding table, kept between steps and cleared row by row.

    A step's batch looks up a few hundred of the vocabulary's rows, but torch's embedding backward writes a dense
    gradient of the whole table, zeroed first: all-MiniLM-L6-v2's 30,522 x 384 words, 45 MiB a step. Here the
    table's module returns a sparse gradient (its rows), which autograd adds into a dense gradient kept attached to
    the weight; after the optimizer has read it, only the rows looked up since are zeroed again. The optimizer and
    the clipping see the same dense gradient as before (the rows summed in another order). A step then touches the
    rows a batch looked up, not the whole table (bench/training_kernels.py measures both).

    Applies to ``nn.Embedding`` modules of at least ``MIN_ROWS`` rows whose weight is trained, on the CPU, held by that
    module alone (a weight tied to an output layer, such as the MLM decoder, gets dense gradients), in one process
    (DDP reduces dense gradients). Should a dense gradient reach the weight anyway (a use of it outside the
    module), a hook sees it and the table goes back to torch's dense gradients, the whole kept gradient cleared.
    ``attach`` before each step's first forward; ``close`` gives the modules back as they were."""

    MIN_ROWS = 4096

    def __init__(self, model: nn.Module, enabled: bool) -> None:
        self.tables: list[_Table] = []
        if not enabled:
            return
        holders: dict[int, int] = {}
        for module in model.modules():
            for param in module.parameters(recurse=False):
                holders[id(param)] = holders.get(id(param), 0) + 1
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if (type(module) is nn.Embedding and weight.requires_grad and weight.device.type == "cpu"
                    and weight.shape[0] >= self.MIN_ROWS and holders.get(id(weight)) == 1 and not module.sparse
                    and module.max_norm is None):
                self.tables.append(_Table(module))

    def attach(self) -> None:
        """Zero the rows looked up since the last call, and attach the kept gradient to each weight without one."""
        for table in self.tables:
            module = table.module
            if table.touched is None:  # first call: the module returns sparse gradients from now on
                table.touched, table.grad = [], torch.zeros_like(module.weight)
                table.handles = (module.register_forward_pre_hook(self._recorder(table)),
                                 module.weight.register_hook(self._checker(table)))
                module.sparse = True
            if table.dense:
                self._release(table)
                continue
            if table.touched:
                table.grad.index_fill_(0, torch.unique(torch.cat(table.touched)), 0.0)
                table.touched.clear()
            if module.weight.grad is None:
                module.weight.grad = table.grad
        self.tables = [table for table in self.tables if not table.dense]

    def rows(self) -> dict[int, torch.Tensor]:
        """id(weight) -> the rows looked up since ``attach`` (unique, sorted), outside which that weight's gradient
        is zero; for ``clip_gradients`` and ``optimizer_step``. A table whose gradient went dense is left out."""
        found = {}
        for table in self.tables:
            if table.dense or table.touched is None or table.module.weight.grad is not table.grad:
                continue
            ids = torch.unique(torch.cat(table.touched)) if table.touched else torch.zeros(0, dtype=torch.long)
            table.touched[:] = [ids]  # attach zeroes these rows again without finding them anew
            found[id(table.module.weight)] = ids
        return found

    @staticmethod
    def _recorder(table: _Table):
        def record(module: nn.Module, args: tuple) -> None:
            if torch.is_grad_enabled():
                table.touched.append(args[0].detach().reshape(-1))
        return record

    @staticmethod
    def _checker(table: _Table):
        def check(grad: torch.Tensor) -> None:
            if not grad.is_sparse:
                table.dense = True
        return check

    def _release(self, table: _Table) -> None:
        for handle in table.handles:
            handle.remove()
        table.module.sparse = False
        if table.grad is not None and table.module.weight.grad is table.grad:
            table.module.weight.grad = None  # it may hold rows of earlier steps: torch's next gradient replaces it
        table.grad, table.touched, table.handles = None, None, ()

    def close(self) -> None:
        for table in self.tables:
            self._release(table)
