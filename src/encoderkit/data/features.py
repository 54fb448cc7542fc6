"""Model inputs for fine-tuning: classification features, NER labels aligned to sub-tokens, QA windows,
and one dynamic-padding collator for all of them.

A feature is a plain dict (what the Trainer hands to ``collate``): ``input_ids`` and
``token_type_ids`` lists, plus the task's targets (``labels``, ``start_positions``/``end_positions``)
and bookkeeping for evaluation (``example``: the index of the source example; ``word_ids``,
``offsets``, ``context``).
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import DataError, InputError
from ..tokenizer import Tokenizer
from .tasks import ClassificationExample, QAExample, TaggedSentence

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------
def label_list(values: Sequence[Any]) -> list[str]:
    """The sorted label names of a data set (numerically when every name is an integer, as "0".."9", "10")."""
    names = set()
    for value in values:
        names.update(value if isinstance(value, list) else [value])
    if all(_is_int(n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def check_label_types(examples: Sequence[ClassificationExample], source: str) -> None:
    """One kind of label per file: all single labels or all label lists; all integer ids or all names."""
    first = examples[0]
    is_list = isinstance(first.label, list)
    for example in examples:
        if isinstance(example.label, list) != is_list:
            raise DataError(f"{source}:{example.line}: the label column mixes label lists and single labels "
                            f"(line {first.line} has {first.label!r}, this line {example.label!r})")
    values = [v for e in examples for v in (e.label if is_list else [e.label])]
    numeric = [_is_int(v) for v in values]
    if any(numeric) and not all(numeric):
        bad_value = values[numeric.index(not numeric[0])]
        bad = next(e for e in examples if bad_value in (e.label if is_list else [e.label]))
        raise DataError(f"{source}:{bad.line}: the label column mixes integer ids and names "
                        f"({values[0]!r} on line {first.line}, {bad_value!r} here); use one or the other")


def check_known_labels(examples: Sequence[ClassificationExample], labels: Sequence[str], source: str) -> None:
    """Every label of ``examples`` (validation data) must be one the model was trained with."""
    known = set(labels)
    for example in examples:
        for value in example.label if isinstance(example.label, list) else [example.label]:
            if value not in known:
                raise DataError(f"{source}:{example.line}: label {value!r} does not occur in the training data "
                                f"(known labels: {', '.join(labels)})")


# ---------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------
def classification_features(tokenizer: Tokenizer, examples: Sequence[ClassificationExample], labels: Sequence[str],
                            *, max_length: int, multi_label: bool = False) -> list[dict]:
    """Token ids (text, or text pair truncated longest-first) and the label as an id or a multi-hot row."""
    index = {name: i for i, name in enumerate(labels)}
    texts = [e.text for e in examples]
    pairs = [e.pair or "" for e in examples] if any(e.pair is not None for e in examples) else None
    encodings = tokenizer.encode_raw(texts, pairs, max_length=max_length)
    features = []
    for number, (example, encoding) in enumerate(zip(examples, encodings)):
        feature: dict[str, Any] = {"input_ids": encoding.ids, "token_type_ids": encoding.type_ids, "example": number}
        if example.label is not None:
            if multi_label:
                row = [0.0] * len(labels)
                for value in example.label if isinstance(example.label, list) else [example.label]:
                    row[index[value]] = 1.0
                feature["labels"] = row
            else:
                feature["labels"] = index[example.label]
        features.append(feature)
    return features


# ---------------------------------------------------------------------------------------------
# Token classification (NER)
# ---------------------------------------------------------------------------------------------
def ner_features(tokenizer: Tokenizer, sentences: Sequence[TaggedSentence], labels: Sequence[str], *,
                 max_length: int, label_all_subtokens: bool = False) -> list[dict]:
    """Sub-token ids of each sentence's words with the word's tag on its first sub-token; the other
    sub-tokens and the special tokens get IGNORE_INDEX (or, with ``label_all_subtokens``, the word's tag
    with B- turned into I-). Words cut off by ``max_length`` lose their labels (counted in a warning)."""
    index = {name: i for i, name in enumerate(labels)}
    encodings = tokenizer.encode_raw([s.tokens for s in sentences], max_length=max_length, is_pretokenized=True)
    features, dropped = [], 0
    for number, (sentence, encoding) in enumerate(zip(sentences, encodings)):
        token_labels, previous = [], None
        for word in encoding.word_ids:
            if word is None:
                token_labels.append(IGNORE_INDEX)
            elif word != previous:
                token_labels.append(index[sentence.tags[word]])
            elif label_all_subtokens:
                tag = sentence.tags[word]
                token_labels.append(index.get("I-" + tag[2:], index[tag]) if tag.startswith("B-") else index[tag])
            else:
                token_labels.append(IGNORE_INDEX)
            previous = word if word is not None else previous
        covered = len({w for w in encoding.word_ids if w is not None})
        dropped += len(sentence.tokens) - covered
        features.append({"input_ids": encoding.ids, "token_type_ids": encoding.type_ids, "labels": token_labels,
                         "word_ids": encoding.word_ids, "example": number})
    if dropped:
        log.warning("%d word(s) beyond max_length=%d lost their labels in training; raise max_length to keep them",
                    dropped, max_length)
    return features


# ---------------------------------------------------------------------------------------------
# Extractive QA
# ---------------------------------------------------------------------------------------------
def truncate_question(tokenizer: Tokenizer, question: str, max_tokens: int) -> str:
    """The question cut after its ``max_tokens``-th token (BERT's max_query_length), on a token boundary."""
    encoding = tokenizer.encode_raw([question], add_special_tokens=False, truncation=False)[0]
    if len(encoding.ids) <= max_tokens:
        return question
    return question[:encoding.offsets[max_tokens - 1][1]]


def qa_features(tokenizer: Tokenizer, examples: Sequence[QAExample], *, max_length: int = 384, stride: int = 128,
                max_question_tokens: int = 64, with_answers: bool = True) -> list[dict]:
    """Windows of (question, context) for each example: the question whole, the context in pieces of at
    most ``max_length`` tokens overlapping by ``stride`` tokens. With answers, each window's start/end
    positions point at the first answer's tokens, or at [CLS] (position 0) when the answer is not wholly
    inside the window. ``offsets`` keep, for context tokens only, their character span in the context."""
    if not 0 <= stride:
        raise InputError(f"doc stride must be >= 0, found {stride}")
    questions = [truncate_question(tokenizer, e.question.strip(), max_question_tokens) for e in examples]
    specials = len(tokenizer.encode_raw(["a"], ["b"])[0].ids) - 2
    longest_question = max(len(q) for q in tokenizer.encode_ids(questions)[0]) - 2 if questions else 0
    room = max_length - longest_question - specials
    if room <= stride:
        raise InputError(f"max_length {max_length} leaves {room} context tokens per window after the question "
                         f"({longest_question} tokens) and special tokens, not more than the stride {stride}: "
                         "raise max_length or lower the stride / max question length")
    encodings = tokenizer.encode_raw(questions, [e.context for e in examples], max_length=max_length,
                                     truncation="only_second", stride=stride)
    features = []
    for number, (example, encoding) in enumerate(zip(examples, encodings)):
        for window in [encoding, *encoding.overflowing]:
            context_offsets = [tuple(o) if s == 1 else None for o, s in zip(window.offsets, window.sequence_ids)]
            feature = {"input_ids": window.ids, "token_type_ids": window.type_ids, "offsets": context_offsets,
                       "example": number}
            if with_answers and example.answers:
                start_char = example.answer_starts[0]
                feature["start_positions"], feature["end_positions"] = answer_tokens(
                    context_offsets, start_char, start_char + len(example.answers[0]))
            features.append(feature)
    return features


def answer_tokens(offsets: Sequence[tuple[int, int] | None], start_char: int, end_char: int) -> tuple[int, int]:
    """(first, last) token of the character span [start_char, end_char) among the context tokens, or
    (0, 0) — the [CLS] position — when the span is not wholly inside this window's context."""
    context = [i for i, o in enumerate(offsets) if o is not None]
    if not context or offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return 0, 0
    first = next((i for i in context if offsets[i][1] > start_char), context[-1])
    last = next((i for i in reversed(context) if offsets[i][0] < end_char), context[0])
    return (first, last) if first <= last else (0, 0)


# ---------------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------------
def collate(features: Sequence[dict], pad_token_id: int, pad_to_multiple_of: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest sequence (dynamic padding) and stack the targets.

    ``labels`` may be one id per example (classification), a multi-hot row (multi-label), or one id per
    token (token classification, padded with IGNORE_INDEX). Keys used only for evaluation are dropped.
    """
    width = max(len(f["input_ids"]) for f in features)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    count = len(features)
    input_ids = np.full((count, width), pad_token_id, dtype=np.int64)
    types = np.zeros((count, width), dtype=np.int64)
    mask = np.zeros((count, width), dtype=np.int64)
    for row, feature in enumerate(features):
        length = len(feature["input_ids"])
        input_ids[row, :length] = feature["input_ids"]
        types[row, :length] = feature["token_type_ids"]
        mask[row, :length] = 1
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask),
             "token_type_ids": torch.from_numpy(types)}
    first = features[0]
    if "labels" in first:
        label = first["labels"]
        if isinstance(label, list) and label and isinstance(label[0], float):  # multi-hot rows
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float32)
        elif isinstance(label, list):  # one label per token
            labels = np.full((count, width), IGNORE_INDEX, dtype=np.int64)
            for row, feature in enumerate(features):
                labels[row, :len(feature["labels"])] = feature["labels"]
            batch["labels"] = torch.from_numpy(labels)
        else:
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    for key in ("start_positions", "end_positions", "task_ids"):
        if key in first:
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
    return batch
