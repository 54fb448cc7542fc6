"""Cached multiple-negatives ranking loss (GradCache): a large batch of in-batch negatives in bounded memory,
with the gradients of the full batch.

Gao, Zhang, Han & Callan (2021), "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup",
RepL4NLP, arXiv:2101.06983, section 3. A contrastive loss L(f_1, ..., f_N) of N embeddings f_i = f(x_i; theta)
does not decompose over examples, but its gradient factors through the embeddings:

    dL/dtheta = sum_i (dL/df_i) . (df_i/dtheta).

So: (1) embed all N texts in mini-batches without keeping activations; (2) compute L on the N embeddings and
its gradients u_i = dL/df_i (the "representation gradient cache"); (3) embed each mini-batch again, this time
with activations, and back-propagate u_i through it (the gradient of sum_i u_i . f_i). Only one mini-batch's
activations are alive at a time. Step 3 replays the random state each mini-batch had in step 1, so dropout
draws the same masks and the result equals the plain loss's gradients on those same embeddings.

The embedding-level loss is ``MultipleNegativesRankingLoss`` unless another is given (``loss=``): any loss of
embeddings can be cached this way, e.g. ``MatryoshkaLoss(MultipleNegativesRankingLoss(), dims)``.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from ...errors import InputError
from ...tokenizer import BatchEncoding
from ..sentence_model import SentenceModel, batch_features, slice_features
from .mnrl import MultipleNegativesRankingLoss


class RandomState:
    """The CPU (and, for a CUDA batch, that device's) random state at one moment, to replay a forward."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = torch.get_rng_state()
        self.device = device if device.type == "cuda" else None
        self.cuda = torch.cuda.get_rng_state(device) if self.device is not None else None

    @contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block from this state, and leave the outer random state as it was."""
        devices = [self.device] if self.device is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


class CachedMultipleNegativesRankingLoss(nn.Module):
    """``forward(anchors, positives, *negatives, **loss_options)``: each argument a tokenised batch (a
    ``BatchEncoding`` from ``model.tokenize`` or a mapping of model inputs), all with one batch size. Returns the
    loss; its ``backward()`` fills the model's gradients, those of the plain loss on the whole batch.
    ``loss_options`` go to the embedding-level loss (e.g. ``duplicates=text_ids(...)``).
    """

    def __init__(self, model: SentenceModel, *, scale: float = 20.0, symmetric: bool = False,
                 mini_batch_size: int = 32, loss: nn.Module | None = None) -> None:
        super().__init__()
        if mini_batch_size <= 0:
            raise InputError(f"mini_batch_size must be positive, found {mini_batch_size}")
        self.model = model
        self.loss = loss if loss is not None else MultipleNegativesRankingLoss(scale=scale, symmetric=symmetric)
        self.mini_batch_size = mini_batch_size

    @property
    def compares_by_cosine(self) -> bool:
        return bool(getattr(self.loss, "compares_by_cosine", False))

    def _ranges(self, size: int) -> list[tuple[int, int]]:
        return [(begin, min(begin + self.mini_batch_size, size)) for begin in range(0, size, self.mini_batch_size)]

    def forward(self, *columns: BatchEncoding | Mapping[str, Any], **loss_options: Any) -> torch.Tensor:
        if len(columns) < 2:
            raise InputError(f"CachedMultipleNegativesRankingLoss needs anchors and positives, found "
                             f"{len(columns)} column(s)")
        features = [batch_features(column) for column in columns]
        size = features[0]["input_ids"].shape[0]
        for index, column in enumerate(features):
            if column["input_ids"].shape[0] != size:
                raise InputError(f"column {index} holds {column['input_ids'].shape[0]} texts, column 0 {size}")
        ranges = self._ranges(size)
        training = torch.is_grad_enabled()
        # (1) every mini-batch embedded without activations, its random state kept for the replay
        embeddings, states = [], []
        for column in features:
            parts, column_states = [], []
            for begin, end in ranges:
                piece = slice_features(column, begin, end)
                column_states.append(RandomState(piece["input_ids"].device) if training else None)
                with torch.no_grad():
                    parts.append(self.model(**piece))
            embeddings.append(torch.cat(parts))
            states.append(column_states)
        if not training:
            return self.loss(*embeddings, **loss_options)
        # (2) the loss on the whole batch, and its gradient with respect to each embedding
        leaves = [e.detach().requires_grad_() for e in embeddings]
        loss = self.loss(*leaves, **loss_options)
        cache = torch.autograd.grad(loss, leaves)
        # (3) runs when the returned loss is back-propagated: re-embed and push the cached gradients through
        loss = loss.detach().requires_grad_()
        loss.register_hook(partial(self._replay, features, ranges, states, cache))
        return loss

    def _replay(self, features: list[dict[str, torch.Tensor]], ranges: list[tuple[int, int]],
                states: list[list[RandomState]], cache: tuple[torch.Tensor, ...], grad_output: torch.Tensor) -> None:
        with torch.enable_grad():
            for column, column_states, gradient in zip(features, states, cache):
                for (begin, end), state in zip(ranges, column_states):
                    with state.replayed():
                        vectors = self.model(**slice_features(column, begin, end))
                    vectors.backward(gradient[begin:end] * grad_output)
