"""Extractive question answering: the best answer spans of a context, read in overlapping windows.

Each (question, context) becomes windows of at most ``max_length`` tokens, the whole question plus a
piece of the context, overlapping by ``doc_stride`` tokens, so an answer anywhere in a long context
is inside some window. In every window the ``n_best`` highest start and end logits over context
tokens give candidate spans with end >= start and at most ``max_answer_length`` tokens; a span's
score is start logit + end logit (the SQuAD reference procedure), compared across windows. The
reported ``score`` is a probability: the softmax of those scores over all candidates of the question.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ..data.features import qa_features
from ..data.tasks import QAExample
from ..errors import InputError
from .pipeline import TaskPipeline, softmax, split_packed


@dataclass
class Answer:
    text: str
    start: int  # character offsets in the context: context[start:end]
    end: int
    score: float


@dataclass
class _Candidate:
    logit: float
    start: int
    end: int


class QuestionAnswerer(TaskPipeline):
    tasks = ("question-answering",)

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, doc_stride: int | None = None,
                 max_answer_length: int | None = None, max_question_tokens: int = 64, n_best: int = 20,
                 **options: Any) -> None:
        options.setdefault("max_length", None)
        super().__init__(model, tokenizer, **options)
        if options["max_length"] is None and not self.settings.get("max_length"):
            self.max_length = min(384, self.max_length)  # BERT's SQuAD setting
        self.doc_stride = doc_stride if doc_stride is not None else int(self.settings.get("doc_stride", 128))
        self.max_answer_length = max_answer_length or int(self.settings.get("max_answer_length", 30))
        self.max_question_tokens = max_question_tokens
        self.n_best = n_best

    def __call__(self, questions: str | Sequence[str], contexts: str | Sequence[str], *,
                 top_k: int = 1) -> list[Answer] | list[list[Answer]]:
        """The ``top_k`` best answers of each question (a list for one question, a list of lists for several)."""
        single = isinstance(questions, str)
        if single:
            questions = [questions]
            contexts = [contexts] if isinstance(contexts, str) else contexts
        if isinstance(contexts, str) or len(questions) != len(contexts):
            raise InputError("give one context per question")
        for index, (question, context) in enumerate(zip(questions, contexts)):
            if not isinstance(question, str) or not question.strip():
                raise InputError(f"question {index} is empty")
            if not isinstance(context, str) or not context.strip():
                raise InputError(f"context {index} is empty")
        if top_k <= 0:
            raise InputError(f"top_k must be positive, found {top_k}")
        examples = [QAExample(str(i), q, c, [], []) for i, (q, c) in enumerate(zip(questions, contexts))]
        answers = self.answer(examples, top_k=top_k)
        return answers[0] if single else answers

    def answer(self, examples: Sequence[QAExample], *, top_k: int = 1) -> list[list[Answer]]:
        features = qa_features(self.tokenizer, examples, max_length=self.max_length, stride=self.doc_stride,
                               max_question_tokens=self.max_question_tokens, with_answers=False)
        candidates: list[list[_Candidate]] = [[] for _ in examples]
        ids, types = [f["input_ids"] for f in features], [f["token_type_ids"] for f in features]
        with torch.inference_mode():
            for indices, hidden, batch in self._encode(ids, types):
                start_all, end_all = self.model.span_head(hidden)
                for index, start, end in zip(indices, split_packed(start_all, batch), split_packed(end_all, batch)):
                    feature = features[index]
                    candidates[feature["example"]].extend(
                        best_spans(start.float().cpu().numpy(), end.float().cpu().numpy(), feature["offsets"], self.n_best,
                                   self.max_answer_length))
        results = []
        for example, found in zip(examples, candidates):
            if not found:
                results.append([])
                continue
            found.sort(key=lambda c: -c.logit)
            unique: dict[tuple[int, int], _Candidate] = {}
            for candidate in found:  # overlapping windows find the same span twice: keep its best score
                unique.setdefault((candidate.start, candidate.end), candidate)
            ranked = list(unique.values())
            probabilities = softmax(np.array([c.logit for c in ranked], dtype=np.float64))
            results.append([Answer(example.context[c.start:c.end], c.start, c.end, float(p))
                            for c, p in zip(ranked[:top_k], probabilities[:top_k])])
        return results


def best_spans(start_logits: np.ndarray, end_logits: np.ndarray, offsets: Sequence[tuple[int, int] | None],
               n_best: int, max_answer_length: int) -> list[_Candidate]:
    """Candidate spans of one window: among the ``n_best`` best starts and ends over context tokens, every
    pair with start <= end < start + max_answer_length, scored start logit + end logit; character spans."""
    context = np.array([o is not None for o in offsets])
    if not context.any():
        return []
    masked_start = np.where(context, start_logits, -np.inf)
    masked_end = np.where(context, end_logits, -np.inf)
    count = min(n_best, int(context.sum()))
    starts = np.argsort(-masked_start, kind="stable")[:count]
    ends = np.argsort(-masked_end, kind="stable")[:count]
    spans = []
    for s in starts:
        for e in ends:
            if s <= e < s + max_answer_length:
                spans.append(_Candidate(float(start_logits[s] + end_logits[e]), offsets[s][0], offsets[e][1]))
    return spans
