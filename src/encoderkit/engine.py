"""The inference engine: plan batches -> pack -> run -> hand back with their order. Every pipeline, scanner and
(the coming) server runs its encoder through it, so batching and packing are written once.

Sequences (token ids, already tokenised by the caller, who knows about pairs, windows and truncation) are
sorted longest first, cut into batches of at most ``token_budget`` padded tokens, packed back to back without
padding (``modeling.packing``) and run through the model's one forward (``EncoderModel.forward_packed``) in
the chosen precision, on the model prepared in place by ``for_inference``. Each batch comes back with the
indices of its sequences, so the caller restores input order.
"""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .errors import InputError
from .modeling.encoder import EncoderModel
from .modeling.inference import for_inference, prepack
from .modeling.packing import MAX_BATCH_SIZE, Packing, plan_batches, pool_packed
from .precision import Precision, resolve_device
from .progress import Progress


class Engine:
    """Runs an encoder on many sequences in packed, length-sorted batches."""

    def __init__(self, encoder: EncoderModel, precision: Precision, *, max_batch_size: int = MAX_BATCH_SIZE,
                 calibration: Sequence[Sequence[int]] | None = None) -> None:
        """``calibration``: token ids the int8 accuracy guard compares int8 with fp32 on (``precision.int8``
        only; ``self.quantization`` then holds its ``QuantizationReport``)."""
        self.encoder = encoder
        self.precision = precision
        self.max_batch_size = max_batch_size
        self._one_packings: dict[tuple[int, torch.device], Packing] = {}  # ``_pooled_one``'s, by length and device
        self.quantization = None
        for_inference(encoder, precision.dtype, int8=precision.int8, fp32_layers=precision.fp32_layers)
        if precision.int8 and calibration:
            from .quantization import measure_int8

            self.quantization = measure_int8(self, [list(x) for x in calibration])

    def pooled(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
               pooling: str = "mean", max_batch_size: int | None = None,
               progress: Callable[[int], None] | None = None, lanes: int | None = 1) -> torch.Tensor:
        """(sequences, hidden) fp32 pooled final states (``pooling``: a ``modeling.packing.pool_packed`` mode),
        in input order; ``progress`` is called with each batch's sequence count.

        ``lanes``: run the batches on that many threads sharing torch's threads (``in_lanes``) instead of on this
        thread with all of them. torch's thread count is process-wide, so it is the lanes' share while they run,
        and restored after: for jobs that own the process (``encoderkit embed``, a Ray actor). ``None``: two lanes
        where ``owns_process()`` says no other Python thread could see the change and the model is on the CPU,
        else one."""
        if len(ids) == 1 and progress is None:  # one text (the serving case): no batching to plan, no lanes
            return self._pooled_one(ids[0], None if types is None else types[0], pooling)
        out = torch.zeros(len(ids), self.encoder.config.hidden_size, dtype=torch.float32)
        if not len(ids):
            return out

        reporting = threading.Lock()  # lanes report from their own threads

        def pool_into(indices: np.ndarray, hidden: torch.Tensor, packing: Packing) -> None:
            pooled = pool_packed(hidden, packing, pooling).to(out.device)  # a GPU's vectors come to the CPU here
            out[torch.from_numpy(indices)] = pooled  # each lane its own rows
            if progress is not None:
                with reporting:
                    progress(len(indices))

        if lanes is None:  # lanes share CPU threads: on an accelerator the batches queue on one device anyway
            on_cpu = _device_of(self.encoder).type == "cpu"
            lanes = lanes_for(torch.get_num_threads()) if on_cpu and owns_process() else 1
        self.in_lanes(ids, types, lanes, pool_into, max_batch_size=max_batch_size)
        return out

    def _pooled_one(self, ids: Sequence[int], types: Sequence[int] | None, pooling: str) -> torch.Tensor:
        """``pooled`` of one sequence: its one batch (whatever its length: the token budget never splits a
        sequence), without planning, output rows, lanes or progress around it.

        Why a path of its own: a served text spends a few milliseconds in the encoder, and each Python step around
        it runs after the encoder's weights have passed through the caches, so it costs several times what it
        costs alone. The packing of one sequence depends only on its length, so it is made once per length and
        kept (packings are never written to)."""
        length = len(ids)
        if not length:
            raise ValueError("every sequence needs at least one token")
        device = _device_of(self.encoder)
        packing = self._one_packings.get((length, device))
        if packing is None:
            packing = Packing.from_lengths([length], overhead=0, device=device, mask_dtype=self.precision.dtype)
            self._one_packings[(length, device)] = packing  # at most one per length the model takes
        types = self._segments(types)
        with _inference():
            flat_ids = torch.as_tensor(ids, dtype=torch.int64).to(device)
            flat_types = None if types is None else torch.as_tensor(types, dtype=torch.int64).to(device)
            hidden = self.encoder.forward_packed(flat_ids, packing, flat_types)
            return pool_packed(hidden, packing, pooling).to(device="cpu", dtype=torch.float32)

    def in_lanes(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None, lanes: int,
                 consume: Callable[[np.ndarray, torch.Tensor, Packing], None], *,
                 max_batch_size: int | None = None) -> None:
        """``run``'s batches dealt in turn (longest first) to ``lanes`` threads, each with an equal share of torch's
        threads (one at least); each lane hands its batches to ``consume`` (indices into ``ids``, states,
        packing), from its own thread. One lane: on this thread, with torch's threads as they are.

        Why: with two torch threads, every op of a forward pass ends at a barrier where one thread waits for the
        other, so a thread that another process preempts stalls both. Lanes wait for nobody (bench/peers.py and
        bench/scale_embed.py measure it, BENCHMARKS.md)."""
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise InputError(f"lanes must be a positive integer, found {lanes!r}")
        lengths, batches = self._plan(ids, max_batch_size)
        lanes = min(lanes, len(batches), torch.get_num_threads())
        # one batch, one thread, or another job's lanes running in this process (whose thread count this one
        # would capture and restore): this thread, with torch's threads as they are
        if lanes < 2 or not _LANES.acquire(blocking=False):
            for batch in self._batches(ids, types, lengths, batches):
                consume(*batch)
            return
        threads = torch.get_num_threads()

        def lane(dealt: list[np.ndarray]) -> None:
            torch.set_num_threads(max(1, threads // lanes))
            for batch in self._batches(ids, types, lengths, dealt):
                consume(*batch)

        try:
            prepack(self.encoder)  # packed weights made once, here, rather than by the lanes at once
            with ThreadPoolExecutor(lanes, thread_name_prefix="encoderkit-lane") as pool:
                for done in [pool.submit(lane, batches[first::lanes]) for first in range(lanes)]:
                    done.result()
        finally:
            torch.set_num_threads(threads)
            _LANES.release()

    def run(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
            max_batch_size: int | None = None, progress: str | None = None
            ) -> Iterator[tuple[np.ndarray, torch.Tensor, Packing]]:
        """Yields (the batch's sequence indices, their packed fp32 final states (tokens, hidden), the packing).
        ``types``: segment ids (None: all 0). ``progress``: a label to show a progress bar under."""
        lengths, batches = self._plan(ids, max_batch_size)
        with Progress(len(ids), progress or "encoding", "sequences", enabled=progress is not None) as bar:
            for batch in self._batches(ids, types, lengths, batches):
                yield batch
                bar.advance(len(batch[0]))

    def _plan(self, ids: Sequence[Sequence[int]], max_batch_size: int | None
              ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The sequences' lengths, and their batches (indices into ``ids``, longest first) within the token budget."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        if len(lengths) and lengths.min() <= 0:
            raise ValueError("every sequence needs at least one token")
        budget = max(self.precision.token_budget, int(lengths.max(initial=1)))
        return lengths, plan_batches(lengths, budget, max_batch_size or self.max_batch_size)

    def _segments(self, types):
        """``types`` where the encoder has segment embeddings to tell apart; None where it has one (or none),
        whatever the tokenizer says."""
        return None if self.encoder.config.type_vocab_size < 2 else types

    def _batches(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None, lengths: np.ndarray,
                 batches: Sequence[np.ndarray]) -> Iterator[tuple[np.ndarray, torch.Tensor, Packing]]:
        """Each of ``batches`` packed and run through the encoder, as ``run`` yields them."""
        types = self._segments(types)
        device = _device_of(self.encoder)
        with _inference():
            for indices in batches:
                packing = Packing.from_lengths(lengths[indices], overhead=0, device=device,
                                               mask_dtype=self.precision.dtype)
                flat_ids = _flatten([ids[i] for i in indices], device)
                flat_types = None if types is None else _flatten([types[i] for i in indices], device)
                yield indices, self.encoder.forward_packed(flat_ids, packing, flat_types), packing


def lanes_for(threads: int) -> int:
    """The lanes a job that owns the process embeds in (``Engine.in_lanes``): two where torch has two threads or
    more: on 2 CPUs two lanes of one thread outran one lane of two threads (bench/peers.py, BENCHMARKS.md)."""
    return 2 if threads >= 2 else 1


def owns_process() -> bool:
    """Whether this is the only Python thread alive, so that no other one could see torch's thread count change
    while lanes run (a script, a job; not a server, a notebook kernel or an application with threads of its
    own)."""
    return threading.current_thread() is threading.main_thread() and threading.active_count() == 1


_LANES = threading.Lock()  # one lane job at a time changes torch's thread count


def _inference() -> contextlib.AbstractContextManager:
    """Inference mode, with an autocast region of the caller's turned off: it would change the layers' dtypes
    (turned off only where one is on: entering costs)."""
    return _without_autocast() if torch.is_autocast_enabled("cpu") else torch.inference_mode()


@contextlib.contextmanager
def _without_autocast() -> Iterator[None]:
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        yield


def _device_of(model: nn.Module) -> torch.device:
    word = getattr(getattr(model, "embeddings", None), "word", None)
    if isinstance(word, nn.Embedding):  # an encoder: no walk over its modules (a served text asks every time)
        return word.weight.device
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def _flatten(rows: list[Sequence[int]], device: torch.device) -> torch.Tensor:
    total = sum(len(row) for row in rows)
    flat = np.fromiter((t for row in rows for t in row), dtype=np.int64, count=total)
    return torch.from_numpy(flat).to(device)


def engine_for(model: nn.Module, dtype: str | torch.dtype | Precision = "fp32", purpose: str = "task",
               token_budget: int | None = None, at_least: int = 0, tokenizer=None,
               device: str | torch.device | None = None) -> Engine:
    """An engine on ``model``'s encoder (a bare encoder or a task model's), precision resolved once here.
    ``tokenizer``: for int8, the accuracy guard's calibration texts are tokenised with it (none: no guard).
    ``device``: "cpu", "cuda" or "cuda:N", where the whole model is moved first (None: where it is)."""
    if device is not None:
        model.to(resolve_device(device))
    precision = Precision.resolve(dtype, purpose, token_budget, at_least, device=_device_of(model))
    calibration = None
    if precision.int8 and tokenizer is not None:
        from .quantization import CALIBRATION_TEXTS

        limit = min(128, getattr(model, "config", model).max_sequence_length)
        calibration = tokenizer.encode_ids(list(CALIBRATION_TEXTS), max_length=limit)[0]
    return Engine(getattr(model, "encoder", model), precision, calibration=calibration)


__all__ = ["Engine", "engine_for", "lanes_for", "owns_process"]
