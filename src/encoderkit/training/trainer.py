"""One Trainer for pre-training and fine-tuning.

AdamW without weight decay on biases and LayerNorm weights; linear warmup then linear or cosine
decay; gradient clipping; gradient accumulation; optional bf16 autocast; periodic evaluation;
checkpoints every N steps holding model (HF format), optimiser, scheduler, RNG states and data
position, so a resumed run continues exactly; keep-last-K; the best model by a chosen evaluation
metric kept in ``best/``, with optional early stopping; length-grouped batches; a guard that stops
on a NaN/inf loss with a clear message and a usable checkpoint; JSONL metrics; a loss-curve PNG;
a progress line.

Data order is a function of (seed, epoch) only, and each step's loss is normalised by the number
of targets in the whole step (all micro-batches, all processes), so accumulation and DDP give the
same updates as one big batch.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .. import native
from ..distributed import world_and_rank
from ..errors import EncoderkitError, InputError
from ..memory import keep_freed_memory
from ..modeling.training_linear import for_training
from ..progress import Progress

log = logging.getLogger(__name__)


class TrainingError(EncoderkitError):
    """Training cannot go on (a NaN/inf loss, a checkpoint that does not match the run)."""


@dataclass
class TrainingConfig:
    output_dir: str
    max_steps: int
    batch_size: int = 32  # per process and micro-batch
    grad_accumulation: int = 1
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    warmup_ratio: float = 0.06
    warmup_steps: int | None = None  # overrides warmup_ratio
    schedule: str = "linear"  # linear | cosine | constant
    max_grad_norm: float | None = 1.0
    bf16: bool = False  # autocast the forward pass to bf16 (CPU or CUDA)
    eval_every: int = 0  # steps; 0 = only at the end
    save_every: int = 0  # steps; 0 = only at the end
    keep_last: int = 3
    log_every: int = 10
    seed: int = 0
    show_progress: bool = True
    device: str = "cpu"  # "cuda" puts the model and batches on the (local) GPU
    time_budget_s: float | None = None  # also stop (and save) once this much training time has passed
    group_by_length: bool = False  # batches of similar lengths (needs the examples' lengths): less padding
    drop_last: bool = True  # drop an epoch's last partial batch (pre-training) or keep it (fine-tuning)
    shuffle: bool = True  # False: the examples in their given order each epoch (a caller that shuffles them itself)
    metric_for_best: str | None = None  # an evaluation metric (e.g. "f1"): its best model is kept in best/
    greater_is_better: bool = True
    early_stopping_patience: int | None = None  # stop after this many evaluations without improvement
    save_final: bool = True  # write the last weights to final/ (HF format)

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accumulation"):
            if getattr(self, name) <= 0:
                raise InputError(f"{name} must be positive, found {getattr(self, name)}")
        if self.schedule not in ("linear", "cosine", "constant"):
            raise InputError(f"schedule must be linear, cosine or constant, found {self.schedule!r}")
        if self.learning_rate <= 0:
            raise InputError(f"learning_rate must be positive, found {self.learning_rate}")
        if self.early_stopping_patience is not None and (self.early_stopping_patience <= 0 or not self.metric_for_best):
            raise InputError("early stopping needs metric_for_best and a positive patience")
        self.adam_betas = tuple(self.adam_betas)  # type: ignore[assignment]

    @property
    def warmup(self) -> int:
        """Warm-up steps: ``warmup_steps``, else ``warmup_ratio`` of the run rounded up (transformers' rule)."""
        return self.warmup_steps if self.warmup_steps is not None else math.ceil(self.warmup_ratio * self.max_steps)


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
    CUDA in torch >= 2.4): one update of all-MiniLM-L6-v2 takes 18 ms fused vs 110 ms in the per-tensor loop."""
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
    otherwise. On all-MiniLM-L6-v2's gradients (Intel Xeon, 2 threads): 6.5 ms against torch's 14.6, and closer to
    the float64 norm (relative error 6e-9 against torch's 2.4e-4, which loses precision summing the 11.7 million
    elements of the word table in fp32)."""
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


def length_grouped(order: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                   mega_batches: int = 50) -> np.ndarray:
    """A random order in which each run of ``batch_size`` examples has similar lengths.

    The shuffled examples are cut into mega-batches of 50 batches, each sorted by length and cut into
    batches; the full batches are shuffled, except that the longest goes first (a memory error shows at
    once, not hours in), and a short remainder stays last so every later batch keeps its boundaries."""
    size = batch_size * mega_batches
    regrouped = np.concatenate([chunk[np.argsort(-lengths[chunk], kind="stable")]
                                for chunk in np.split(order, range(size, len(order), size))])
    full = len(regrouped) // batch_size * batch_size
    batches = np.split(regrouped[:full], range(batch_size, full, batch_size)) if full else []
    remainder = regrouped[full:]
    if not batches:
        return regrouped
    longest = int(np.argmax([lengths[b].max() for b in batches]))
    rest = [b for i, b in enumerate(batches) if i != longest]
    shuffled = [rest[i] for i in rng.permutation(len(rest))]
    return np.concatenate([batches[longest], *shuffled, remainder])


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Labelled items in a batch: tokens with a label for token tasks, examples otherwise."""
    for key in ("labels", "start_positions"):
        labels = batch.get(key)
        if labels is not None:
            return int((labels != -100).sum()) if labels.dim() >= 2 and labels.dtype == torch.long else labels.shape[0]
    return int(batch["input_ids"].shape[0])


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
    the clipping see the same dense gradient as before (the rows summed in another order). Measured on that table
    and an SST-2 batch (32 x 14 ids; Intel Xeon, 2 threads): 0.9 ms a step against 4.7 ms for the dense gradient.

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


class Trainer:
    def __init__(self, model: nn.Module, config: TrainingConfig, train_data: Sequence[Any],
                 collate: Callable[[list[Any], int], dict[str, torch.Tensor]], *,
                 evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
                 forward_kwargs: dict[str, Any] | None = None, tokenizer: Any = None,
                 lengths: Sequence[int] | None = None) -> None:
        if len(train_data) == 0:
            raise InputError("the training data is empty")
        if config.group_by_length and (lengths is None or len(lengths) != len(train_data)):
            raise InputError("group_by_length needs the length of every training example")
        self.lengths = np.asarray(lengths) if lengths is not None else None
        self.model = model
        self.config = config
        self.train_data = train_data
        self.collate = collate
        self.evaluate_fn = evaluate
        self.forward_kwargs = forward_kwargs or {}
        self.tokenizer = tokenizer
        self.output_dir = Path(config.output_dir)
        self.world_size, self.rank = world_and_rank()
        self.device = torch.device(config.device)
        if self.device.type == "cuda" and self.world_size > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        model.to(self.device)
        for_training(model)  # oneDNN products while training in fp32 on CPU (modeling/training_linear.py)
        self.optimizer = make_optimizer(model, config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config))
        self.step = 0
        self.epoch = 0
        self.position = 0  # micro-batches consumed in this epoch (global, across processes)
        self.history: list[dict[str, Any]] = []
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.evaluations_without_improvement = 0
        self.ddp_model = model
        self.embedding_rows = EmbeddingRows(model, enabled=self.world_size == 1)
        if self.world_size > 1 and getattr(model, "ddp_compatible", True):
            self.ddp_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        elif self.world_size > 1:
            # A model whose backward fills a parameter's gradient several times (GradCache's replay of its
            # mini-batches) trips DDP's one-hook-per-parameter bookkeeping: start every process from rank 0's
            # weights, as DDP would, and average the gradients after the step's last backward.
            for tensor in [*model.parameters(), *model.buffers()]:
                torch.distributed.broadcast(tensor.data, 0)

    @property
    def averages_gradients(self) -> bool:
        """True where this Trainer, not DDP, averages the gradients over the processes."""
        return self.world_size > 1 and self.ddp_model is self.model

    # ----- data order -------------------------------------------------------------------------
    @property
    def micro_batches_per_epoch(self) -> int:
        global_batch = self.config.batch_size * self.world_size
        if self.config.drop_last:
            return max(1, len(self.train_data) // global_batch)
        return -(-len(self.train_data) // global_batch)

    def _order(self, epoch: int) -> np.ndarray:
        if getattr(self, "_order_epoch", None) != epoch:
            rng = np.random.default_rng([self.config.seed, epoch])
            order = rng.permutation(len(self.train_data)) if self.config.shuffle else np.arange(len(self.train_data))
            if self.config.group_by_length:
                order = length_grouped(order, self.lengths, self.config.batch_size * self.world_size, rng)
            self._order_cache, self._order_epoch = order, epoch
        return self._order_cache

    def _next_micro_batch(self) -> dict[str, torch.Tensor]:
        if self.position >= self.micro_batches_per_epoch:
            self.epoch += 1
            self.position = 0
        order = self._order(self.epoch)
        global_batch = self.config.batch_size * self.world_size
        start = self.position * global_batch + self.rank * self.config.batch_size
        indices = order[start:start + self.config.batch_size]
        if len(indices) == 0:  # a short last batch left this process nothing: repeat one example, as
            indices = order[self.rank % len(order):][:1]  # torch's DistributedSampler pads
        self.position += 1
        batch = self.collate([self.train_data[int(i)] for i in indices], self.epoch)
        return {key: value.to(self.device) for key, value in batch.items()}

    # ----- training ---------------------------------------------------------------------------
    def begin(self, resume: bool = True) -> Path:
        """Get ready to train (resume from the latest checkpoint, seed, training mode); returns the metrics
        file. ``train`` calls it; a caller driving ``train_step`` itself (a benchmark) calls it first."""
        unapplied = keep_freed_memory()  # each step reuses the last one's memory: no page faults (encoderkit.memory)
        if unapplied:
            log.debug("freed memory is left to the C library: %s", unapplied)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self._resume()
        if self.step == 0:  # a resumed run restores the RNG states of its checkpoint instead
            _seed_everything(self.config.seed + self.rank)
        metrics_path = self.output_dir / "metrics.jsonl"
        if self.is_main and self.step == 0:
            metrics_path.write_text("", encoding="utf-8")
        self.model.train()
        return metrics_path

    def train(self, resume: bool = True) -> dict[str, Any]:
        config = self.config
        metrics_path = self.begin(resume)
        started = time.perf_counter()
        tokens_done = examples_done = 0
        try:
            with Progress(config.max_steps, "training", "steps", enabled=config.show_progress and self.is_main) as bar:
                bar.skip(self.step)
                while self.step < config.max_steps:
                    if config.time_budget_s is not None and time.perf_counter() - started >= config.time_budget_s:
                        log.warning("time budget of %.0f s reached at step %d", config.time_budget_s, self.step)
                        break
                    record = self.train_step()
                    tokens_done += record.pop("tokens")
                    examples_done += record.pop("examples")
                    elapsed = time.perf_counter() - started
                    record["elapsed_s"] = elapsed
                    record["tokens_per_s"] = tokens_done * self.world_size / elapsed if elapsed > 0 else 0.0
                    record["examples_per_s"] = examples_done * self.world_size / elapsed if elapsed > 0 else 0.0
                    step_loss = record["loss"]
                    stop = False
                    if config.eval_every and self.step % config.eval_every == 0 and self.step < config.max_steps:
                        evaluation = self._evaluate()
                        record.update(evaluation)
                        stop = self._track_best(evaluation)
                    self.history.append(record)
                    if self.is_main:
                        with open(metrics_path, "a", encoding="utf-8") as handle:
                            handle.write(json.dumps(record) + "\n")
                    bar.advance(1, status=f"loss {step_loss:.4f}, {record['tokens_per_s']:,.0f} tok/s")
                    due = config.save_every and self.step % config.save_every == 0 and self.step < config.max_steps
                    if stop or due:
                        self.save_checkpoint()
                    if stop:
                        log.warning("early stopping at step %d: %s has not improved for %d evaluations (best %.4f at "
                                    "step %s)", self.step, config.metric_for_best, self.evaluations_without_improvement,
                                    self.best_metric, self.best_step)
                        break
        finally:
            self.embedding_rows.close()  # the embedding modules as they were (dense gradients)
        evaluated = self.history[-1] if self.history and self.history[-1]["step"] == self.step else {}
        final = {k: v for k, v in evaluated.items() if k.startswith("eval_")}
        if not final:  # not evaluated at this step yet
            final = self._evaluate()
            self._track_best(final)
            if final and self.is_main:
                with open(metrics_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"step": self.step, **final}) + "\n")
        self.save_checkpoint()
        if self.is_main:
            if config.save_final:
                self.model.save_pretrained(self.output_dir / "final", tokenizer=self.tokenizer)
            plot_losses(metrics_path, self.output_dir / "loss.png")
        return {"step": self.step, "history": self.history, "final": final, "best_metric": self.best_metric,
                "best_step": self.best_step}

    def train_step(self) -> dict[str, Any]:
        """One optimizer step (``grad_accumulation`` micro-batches); returns its record (loss, lr, tokens)."""
        config = self.config
        batches = [self._next_micro_batch() for _ in range(config.grad_accumulation)]
        total_targets = self._all_reduce_sum(sum(count_targets(b) for b in batches))
        self.embedding_rows.attach()
        loss_sum, tokens, examples = 0.0, 0, 0
        part_sums: dict[str, float] = {}  # an objective's named losses (ELECTRA/DeBERTa: mlm, rtd), logged beside
        for index, batch in enumerate(batches):
            weight = count_targets(batch) * self.world_size / max(total_targets, 1)
            with self._autocast():
                output = self.ddp_model(**batch, **self.forward_kwargs)
            loss = output.loss.float()
            if not torch.isfinite(loss):
                self._stop_on_bad_loss(loss)
            sync = index == len(batches) - 1 or self.world_size == 1
            with _maybe_no_sync(self.ddp_model, sync):
                (loss * weight).backward()
            loss_sum += float(loss.detach()) * weight / self.world_size
            for name, value in (getattr(output, "parts", None) or {}).items():
                part_sums[name] = part_sums.get(name, 0.0) + float(value) * weight / self.world_size
            tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else 0
            examples += int(batch["input_ids"].shape[0])
        if self.averages_gradients:
            self._average_gradients()
        record: dict[str, Any] = {"step": self.step + 1, "loss": self._all_reduce_sum(loss_sum)}
        record.update({name: self._all_reduce_sum(value) for name, value in part_sums.items()})
        rows = self.embedding_rows.rows()
        if config.max_grad_norm:
            record["grad_norm"] = clip_gradients(self.model.parameters(), config.max_grad_norm, self.optimizer, rows)
        optimizer_step(self.optimizer, rows)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        record.update({"lr": self.scheduler.get_last_lr()[0], "epoch": self.epoch, "tokens": tokens,
                       "examples": examples})
        return record

    def _track_best(self, evaluation: dict[str, float]) -> bool:
        """Keep the best model by ``metric_for_best`` in best/; True when early stopping should stop now."""
        name = self.config.metric_for_best
        if not name or not evaluation:
            return False
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in evaluation:
            raise TrainingError(f"metric_for_best {name!r} is not among the evaluation metrics "
                                f"{sorted(k[5:] for k in evaluation)}")
        value = evaluation[key]
        better = self.best_metric is None or (value > self.best_metric if self.config.greater_is_better
                                              else value < self.best_metric)
        if better:
            self.best_metric, self.best_step = value, self.step
            self.evaluations_without_improvement = 0
            if self.is_main:
                tmp = self.output_dir / "best.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                self.model.save_pretrained(tmp, tokenizer=self.tokenizer)
                shutil.rmtree(self.output_dir / "best", ignore_errors=True)
                tmp.replace(self.output_dir / "best")
            self._barrier()
            return False
        self.evaluations_without_improvement += 1
        patience = self.config.early_stopping_patience
        return patience is not None and self.evaluations_without_improvement >= patience

    def _evaluate(self) -> dict[str, float]:
        if self.evaluate_fn is None:
            return {}
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                return {f"eval_{k}": float(v) for k, v in self.evaluate_fn(self.model).items()}
        finally:
            self.model.train()

    def _autocast(self):
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=self.config.bf16)

    def _stop_on_bad_loss(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        path = self.save_checkpoint(suffix="-before-nan")  # weights from before the bad step: still usable
        raise TrainingError(
            f"the loss became {float(loss.detach())} at step {self.step + 1}; training stopped. The weights before "
            f"that step are saved in {path}. Lower the learning rate, keep gradient clipping on, or train in fp32."
        )

    # ----- checkpoints ------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def save_checkpoint(self, suffix: str = "") -> Path:
        path = self.output_dir / f"checkpoint-{self.step:07d}{suffix}"
        if self.is_main:
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            self.model.save_pretrained(tmp, tokenizer=self.tokenizer)
            torch.save({
                "step": self.step, "epoch": self.epoch, "position": self.position,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": _rng_state(), "world_size": self.world_size, "config": _plain(asdict(self.config)),
                "best_metric": self.best_metric, "best_step": self.best_step,
                "evaluations_without_improvement": self.evaluations_without_improvement,
            }, tmp / "trainer_state.pt")
            shutil.rmtree(path, ignore_errors=True)
            tmp.replace(path)
            self._prune()
        self._barrier()
        return path

    def _prune(self) -> None:
        checkpoints = sorted(p for p in self.output_dir.glob("checkpoint-*") if p.name[11:].isdigit())
        for old in checkpoints[:-self.config.keep_last] if self.config.keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        checkpoints = sorted(p for p in self.output_dir.glob("checkpoint-*")
                             if p.name[11:].isdigit() and (p / "trainer_state.pt").is_file())
        return checkpoints[-1] if checkpoints else None

    def _resume(self) -> None:
        checkpoint = self.latest_checkpoint()
        if checkpoint is None:
            return
        from ..modeling.models import load_weights

        state = torch.load(checkpoint / "trainer_state.pt", map_location="cpu", weights_only=True)
        if state.get("world_size", 1) != self.world_size:
            raise TrainingError(f"{checkpoint} was written by {state['world_size']} processes, this run has "
                                f"{self.world_size}; resume with the same number")
        if hasattr(self.model, "load_checkpoint"):  # several networks (ELECTRA, distillation)
            self.model.load_checkpoint(checkpoint)
        else:
            load_weights(self.model, checkpoint)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.epoch, self.position = state["step"], state["epoch"], state["position"]
        self.best_metric, self.best_step = state.get("best_metric"), state.get("best_step")
        self.evaluations_without_improvement = state.get("evaluations_without_improvement", 0)
        _set_rng_state(state["rng"])
        metrics_path = self.output_dir / "metrics.jsonl"
        if self.is_main and metrics_path.is_file():  # drop records written after that checkpoint
            kept = [line for line in metrics_path.read_text(encoding="utf-8").splitlines()
                    if line and json.loads(line)["step"] <= self.step]
            metrics_path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        log.warning("resumed from %s (step %d)", checkpoint, self.step)

    # ----- distributed helpers ----------------------------------------------------------------
    def _all_reduce_sum(self, value: float) -> float:
        if self.world_size == 1:
            return value
        tensor = torch.tensor([float(value)], dtype=torch.float64,
                              device=self.device if self.device.type == "cuda" else "cpu")
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())

    def _average_gradients(self) -> None:
        """What DDP does to the gradients, in one all-reduce: their mean over the processes (a parameter without
        a gradient on every process counts as zero there)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        torch.distributed.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def _barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def init_distributed(device: str | None = None) -> bool:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1): gloo on CPU, nccl on GPU (``device``:
    where the job will train; None: a GPU when there is one)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        on_gpu = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
        backend = "nccl" if on_gpu else "gloo"
        torch.distributed.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return True


@contextmanager
def distributed_run(device: str | None = None) -> Iterator[None]:
    """The body of a training entry point: in the process group under torchrun (``init_distributed``), left
    when the body ends, however it ends."""
    joined = init_distributed(device)
    try:
        yield
    finally:
        if joined:
            torch.distributed.destroy_process_group()


class _maybe_no_sync:
    def __init__(self, model: nn.Module, sync: bool) -> None:
        self.context = model.no_sync() if not sync and hasattr(model, "no_sync") else None

    def __enter__(self):
        return self.context.__enter__() if self.context is not None else None

    def __exit__(self, *exc):
        return self.context.__exit__(*exc) if self.context is not None else False


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:])}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def plot_losses(metrics_path: Path, out_path: Path) -> Path | None:
    """The training (and evaluation) loss curve as PNG."""
    records = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines() if line]
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evaluation = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    axis.plot(*zip(*train), label="training loss", linewidth=1)
    if evaluation:
        axis.plot(*zip(*evaluation), "o-", label="evaluation loss")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(out_path)
    plt.close(figure)
    return out_path
