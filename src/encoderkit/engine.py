"""The inference engine: plan batches -> pack -> run -> hand back with their order. Every pipeline, scanner and
(the coming) server runs its encoder through it, so batching and packing are written once.

Sequences (token ids, already tokenised by the caller, who knows about pairs, windows and truncation) are
sorted longest first, cut into batches of at most ``token_budget`` padded tokens, packed back to back without
padding (``modeling.packing``) and run through the model's one forward (``EncoderModel.forward_packed``) in
the chosen precision, on the model prepared in place by ``for_inference``. Each batch comes back with the
indices of its sequences, so the caller restores input order.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from .modeling.encoder import EncoderModel
from .modeling.inference import for_inference
from .modeling.packing import Packing, plan_batches, pool_packed
from .precision import Precision
from .progress import Progress


class Engine:
    """Runs an encoder on many sequences in packed, length-sorted batches."""

    def __init__(self, encoder: EncoderModel, precision: Precision, *, max_batch_size: int = 512,
                 calibration: Sequence[Sequence[int]] | None = None) -> None:
        """``calibration``: token ids the int8 accuracy guard compares int8 with fp32 on (``precision.int8``
        only; ``self.quantization`` then holds its ``QuantizationReport``)."""
        self.encoder = encoder
        self.precision = precision
        self.max_batch_size = max_batch_size
        self.quantization = None
        for_inference(encoder, precision.dtype, int8=precision.int8, fp32_layers=precision.fp32_layers)
        if precision.int8 and calibration:
            from .quantization import measure_int8

            self.quantization = measure_int8(self, [list(x) for x in calibration])

    def pooled(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
               pooling: str = "mean", max_batch_size: int | None = None,
               progress: Callable[[int], None] | None = None) -> torch.Tensor:
        """(sequences, hidden) fp32 pooled final states (``pooling``: a ``modeling.packing.pool_packed`` mode),
        in input order; ``progress`` is called with each batch's sequence count."""
        out = torch.zeros(len(ids), self.encoder.config.hidden_size, dtype=torch.float32)
        if len(ids):
            for indices, hidden, packing in self.run(ids, types, max_batch_size=max_batch_size):
                out[torch.from_numpy(indices)] = pool_packed(hidden, packing, pooling)
                if progress is not None:
                    progress(len(indices))
        return out

    def run(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
            max_batch_size: int | None = None, progress: str | None = None
            ) -> Iterator[tuple[np.ndarray, torch.Tensor, Packing]]:
        """Yields (the batch's sequence indices, their packed fp32 final states (tokens, hidden), the packing).
        ``types``: segment ids (None: all 0). ``progress``: a label to show a progress bar under."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        if len(lengths) and lengths.min() <= 0:
            raise ValueError("every sequence needs at least one token")
        if self.encoder.config.type_vocab_size < 2:  # one segment embedding (or none), whatever the tokenizer says
            types = None
        budget = max(self.precision.token_budget, int(lengths.max(initial=1)))
        device = self.encoder.embeddings.word.weight.device
        with torch.inference_mode(), torch.autocast("cpu", enabled=False), \
                Progress(len(ids), progress or "encoding", "sequences", enabled=progress is not None) as bar:
            for indices in plan_batches(lengths, budget, max_batch_size or self.max_batch_size):
                packing = Packing.from_lengths(lengths[indices], overhead=0, device=device,
                                               mask_dtype=self.precision.dtype)
                flat_ids = _flatten([ids[i] for i in indices], device)
                flat_types = None if types is None else _flatten([types[i] for i in indices], device)
                yield indices, self.encoder.forward_packed(flat_ids, packing, flat_types), packing
                bar.advance(len(indices))


def _flatten(rows: list[Sequence[int]], device: torch.device) -> torch.Tensor:
    total = sum(len(row) for row in rows)
    flat = np.fromiter((t for row in rows for t in row), dtype=np.int64, count=total)
    return torch.from_numpy(flat).to(device)


def engine_for(model: nn.Module, dtype: str | torch.dtype | Precision = "fp32", purpose: str = "task",
               token_budget: int | None = None, at_least: int = 0, tokenizer=None) -> Engine:
    """An engine on ``model``'s encoder (a bare encoder or a task model's), precision resolved once here.
    ``tokenizer``: for int8, the accuracy guard's calibration texts are tokenised with it (none: no guard)."""
    precision = Precision.resolve(dtype, purpose, token_budget, at_least)
    calibration = None
    if precision.int8 and tokenizer is not None:
        from .quantization import CALIBRATION_TEXTS

        limit = min(128, getattr(model, "config", model).max_sequence_length)
        calibration = tokenizer.encode_ids(list(CALIBRATION_TEXTS), max_length=limit)[0]
    return Engine(getattr(model, "encoder", model), precision, calibration=calibration)


__all__ = ["Engine", "engine_for"]
