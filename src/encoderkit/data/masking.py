"""Masked-language-model masking: BERT's 15% with 80/10/10, static or dynamic, token or whole-word.

Each example is masked by its own random generator, seeded from (seed, example index) for static
masking (the same mask every epoch, as in BERT) or (seed, epoch, example index) for dynamic masking
(a new mask every epoch, as in RoBERTa). Masks therefore depend on neither the batch an example
lands in nor the process that reads it, which makes resumed and distributed runs reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import InputError

IGNORE_INDEX = -100


@dataclass
class MaskingConfig:
    rate: float = 0.15  # share of maskable tokens (or words) selected
    mask_fraction: float = 0.8  # of the selected: replaced by [MASK]
    random_fraction: float = 0.1  # of the selected: replaced by a random token; the rest stay unchanged
    whole_word: bool = False
    dynamic: bool = True  # RoBERTa: a new mask each epoch; False = BERT's static masks

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise InputError(f"masking rate must be in (0, 1), found {self.rate}")
        if self.mask_fraction < 0 or self.random_fraction < 0 or self.mask_fraction + self.random_fraction > 1:
            raise InputError("mask_fraction and random_fraction must be >= 0 and add up to at most 1")


class Masker:
    def __init__(self, config: MaskingConfig, *, vocab_size: int, mask_token_id: int, special_token_ids: Sequence[int],
                 seed: int = 0) -> None:
        if mask_token_id is None:
            raise InputError("the tokenizer has no mask token; MLM needs one")
        self.config = config
        self.mask_token_id = int(mask_token_id)
        self.seed = seed
        special = np.zeros(vocab_size, dtype=bool)
        special[[i for i in special_token_ids if i is not None and 0 <= i < vocab_size]] = True
        self.special = special
        self.replacement_ids = np.flatnonzero(~special)  # random replacements are never special tokens

    def fixed(self, seed: int) -> "Masker":
        """A static copy (same rates, vocabulary and special tokens) with its own seed: evaluation masks."""
        copy = Masker.__new__(Masker)
        copy.__dict__.update(self.__dict__)
        copy.config = MaskingConfig(**{**self.config.__dict__, "dynamic": False})
        copy.seed = seed
        return copy

    def rng(self, index: int, epoch: int) -> np.random.Generator:
        entropy = [self.seed, epoch, index] if self.config.dynamic else [self.seed, index]
        return np.random.default_rng(entropy)

    def mask(self, ids: np.ndarray, index: int, epoch: int = 0, word_ids: Sequence[int | None] | None = None,
             ) -> tuple[np.ndarray, np.ndarray]:
        """(masked ids, labels) for one example; labels are IGNORE_INDEX where nothing was selected."""
        ids = np.asarray(ids, dtype=np.int64)
        rng = self.rng(index, epoch)
        maskable = ~self.special[ids]
        if self.config.whole_word:
            if word_ids is None:
                raise InputError("whole-word masking needs the word ids of each example")
            selected = self._select_words(maskable, word_ids, rng)
        else:
            selected = maskable & (rng.random(len(ids)) < self.config.rate)
        labels = np.where(selected, ids, IGNORE_INDEX)
        draw = rng.random(len(ids))
        to_mask = selected & (draw < self.config.mask_fraction)
        to_random = selected & (draw >= self.config.mask_fraction) & (
            draw < self.config.mask_fraction + self.config.random_fraction)
        masked = ids.copy()
        masked[to_mask] = self.mask_token_id
        if to_random.any():
            masked[to_random] = rng.choice(self.replacement_ids, size=int(to_random.sum()))
        return masked, labels

    def _select_words(self, maskable: np.ndarray, word_ids: Sequence[int | None], rng: np.random.Generator) -> np.ndarray:
        # A word is the run of maskable tokens sharing a word id (and a segment: ids restart in a pair).
        words = np.full(len(maskable), -1, dtype=np.int64)
        current, previous = -1, object()
        for position, word in enumerate(word_ids):
            if word is None or not maskable[position]:
                previous = object()
                continue
            if word != previous:
                current += 1
                previous = word
            words[position] = current
        if current < 0:
            return np.zeros(len(maskable), dtype=bool)
        chosen = rng.random(current + 1) < self.config.rate
        return (words >= 0) & chosen[np.maximum(words, 0)]

    def collate(self, examples: Sequence[dict], epoch: int = 0, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
        """Pad and mask a batch. Each example: {"index", "input_ids", optional "token_type_ids", "word_ids"}."""
        width = max(len(e["input_ids"]) for e in examples)
        batch = len(examples)
        input_ids = np.full((batch, width), pad_token_id, dtype=np.int64)
        labels = np.full((batch, width), IGNORE_INDEX, dtype=np.int64)
        types = np.zeros((batch, width), dtype=np.int64)
        mask = np.zeros((batch, width), dtype=np.int64)
        for row, example in enumerate(examples):
            length = len(example["input_ids"])
            word_ids = example.get("word_ids")
            if word_ids is None and self.config.whole_word and example.get("word_starts") is not None:
                word_ids = np.cumsum(example["word_starts"]).tolist()
            masked, example_labels = self.mask(example["input_ids"], example["index"], epoch, word_ids)
            input_ids[row, :length] = masked
            labels[row, :length] = example_labels
            mask[row, :length] = 1
            if example.get("token_type_ids") is not None:
                types[row, :length] = example["token_type_ids"]
        out = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask),
               "token_type_ids": torch.from_numpy(types), "labels": torch.from_numpy(labels)}
        if "pair_label" in examples[0]:
            out["pair_labels"] = torch.tensor([e["pair_label"] for e in examples], dtype=torch.long)
        return out
