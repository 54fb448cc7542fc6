"""One Trainer for pre-training and fine-tuning: the loop. Its settings are ``training.config``; the optimizer,
schedule and clipping ``training.optim``; data parallelism ``training.ddp``; the loss plot ``training.plots``.

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
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..distributed import world_and_rank
from ..errors import EncoderkitError, InputError
from ..memory import keep_freed_memory
from ..modeling.training_linear import for_training
from ..progress import Progress
from .config import TrainingConfig
from .ddp import _maybe_no_sync
from .optim import EmbeddingRows, clip_gradients, lr_lambda, make_optimizer, optimizer_step
from .plots import plot_losses

log = logging.getLogger(__name__)


class TrainingError(EncoderkitError):
    """Training cannot go on (a NaN/inf loss, a checkpoint that does not match the run)."""


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


