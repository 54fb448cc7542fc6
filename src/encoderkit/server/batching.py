"""Dynamic batching: the sequences of concurrent requests run together, in length-sorted batches under a token
budget, on a worker thread, so the event loop keeps answering while the model computes.

Each request puts its items (one per sequence: a text, a pair, a question with its context) on the queue of a
``Batcher`` (one per model and endpoint kind), each with its cost in tokens, and awaits their futures. The
batcher's task takes the queued items, sorts them longest first and cuts them where ``items x longest`` would
exceed the budget (``modeling.packing.plan_batches``, the engine's own planner, so a batch is one forward pass);
it runs the batch that holds the oldest item, so no item waits behind an endless stream of others. The run
function (a task pipeline call, through ``encoderkit.engine``) goes to the executor: one worker thread, shared
by every batcher, so the CPU runs one batch at a time. An item whose future was cancelled (its client hung up,
or its request timed out) is dropped before it runs.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..modeling.packing import MAX_BATCH_SIZE, plan_batches
from .metrics import Metrics

log = logging.getLogger(__name__)

MAX_BATCH_ITEMS = MAX_BATCH_SIZE  # the engine's


@dataclass
class _Item:
    payload: Any
    cost: int  # tokens
    future: asyncio.Future


class Batcher:
    """Batches the items of one model's one kind of work. ``run(payloads) -> results`` (same length and order)
    runs on ``executor``; ``token_budget``: padded tokens (items x the longest) per batch."""

    def __init__(self, name: str, run: Callable[[list[Any]], Sequence[Any]], *, token_budget: int,
                 executor: Executor, metrics: Metrics, labels: dict[str, str] | None = None) -> None:
        self.name = name
        self.run = run
        self.token_budget = token_budget
        self.executor = executor
        self.metrics = metrics
        self.labels = labels or {}
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.batches = 0  # batches run (for tests and /metrics)

    # ----- the request side ---------------------------------------------------------------------
    async def submit(self, payloads: Sequence[Any], costs: Sequence[int]) -> list[Any]:
        """Queue the items and wait for their results; cancelling the wait cancels the items not yet run."""
        loop = asyncio.get_running_loop()
        items = [_Item(p, max(1, int(c)), loop.create_future()) for p, c in zip(payloads, costs)]
        self._pending.extend(items)
        self._set_depth()
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*(item.future for item in items)))
        finally:  # cancelled, failed or done: what is still queued is dropped at the next batch
            for item in items:
                item.future.cancel()

    # ----- the batching task ---------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher {self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for item in self._pending:
            item.future.cancel()
        self._pending.clear()

    @property
    def depth(self) -> int:
        return len(self._pending)

    def _set_depth(self) -> None:
        self.metrics.queue_depth.set(self.depth, **self.labels)

    def _next_batch(self) -> list[_Item]:
        """The length-sorted batch (under the budget) that holds the oldest live item; cancelled items leave."""
        cancelled = sum(item.future.done() for item in self._pending)
        if cancelled:
            self._pending = [item for item in self._pending if not item.future.done()]
            self.metrics.cancelled.inc(cancelled, **self.labels)
        if not self._pending:
            return []
        costs = np.fromiter((item.cost for item in self._pending), dtype=np.int64, count=len(self._pending))
        batches = plan_batches(costs, max(self.token_budget, int(costs.max())), MAX_BATCH_ITEMS)
        chosen = next(b for b in batches if 0 in b)  # position 0 is the oldest item
        taken = set(chosen.tolist())
        batch = [self._pending[i] for i in chosen]
        self._pending = [item for i, item in enumerate(self._pending) if i not in taken]
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while True:
                batch = self._next_batch()
                self._set_depth()
                if not batch:
                    break
                self.metrics.batch_size.observe(len(batch), **self.labels)
                self.metrics.batch_tokens.observe(len(batch) * max(item.cost for item in batch), **self.labels)
                await self._run_isolating(loop, batch)

    async def _run_isolating(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> None:
        """Runs ``batch``; where it fails, runs its halves, and so on down to single items, so that an item the
        model cannot take fails its own request alone while the others get their results (log2(n) extra runs
        to find one bad item among n)."""
        self.batches += 1
        try:
            results = await loop.run_in_executor(self.executor, self.run, [item.payload for item in batch])
        except asyncio.CancelledError:
            for item in batch:
                item.future.cancel()
            raise
        except Exception as exc:
            live = [item for item in batch if not item.future.done()]
            if len(live) <= 1:  # this item's own failure: its request fails, the batcher goes on
                log.debug("an item failed in %s", self.name, exc_info=True)
                for item in live:
                    item.future.set_exception(exc)
                return
            log.debug("batch of %d failed in %s; retrying it by halves", len(live), self.name, exc_info=True)
            half = len(live) // 2
            await self._run_isolating(loop, live[:half])
            await self._run_isolating(loop, live[half:])
            return
        orphaned = 0
        for item, result in zip(batch, results):
            if item.future.done():  # its request went away while the batch ran
                orphaned += 1
            else:
                item.future.set_result(result)
        if orphaned:
            self.metrics.orphaned.inc(orphaned, **self.labels)
