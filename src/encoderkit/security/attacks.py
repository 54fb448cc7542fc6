"""Black-box word-level adversarial attacks on a text classifier, used to test robustness and to produce the
adversarial examples that the shift detector is evaluated on.

Two greedy attacks, both in the manner of TextFooler (Jin et al., 2020):

* **substitute**: rank the words by importance (how much deleting each one lowers the probability of the
  true label), then, most important first, try the word's nearest neighbours in the model's own input
  word-embedding space and keep the substitute that lowers the true-label probability most, until the
  prediction flips or a limit is reached.
* **insert**: the same ranking; next to each important word, try inserting its neighbours (and any words of
  a user-given candidate list) just before or just after it, and keep the insertion that lowers the
  true-label probability most.

Every text the classifier scores counts against the per-text query budget (the original text, each
leave-one-out text, each candidate), and at most ``max_perturbed_rate`` of a text's words may change.
The candidates of one step go to the classifier in one ``Classifier.logits`` call (the packed fast path).

Limitation, stated plainly: input-embedding neighbours are "related words", not synonyms; antonyms sit
close ("good" ~ "bad"), so a successful attack may change the meaning of the text, not only its form.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import DataError, InputError
from ..reports import Report, markdown_table

if TYPE_CHECKING:
    from ..tasks.classify import Classifier

METHODS = ("substitute", "insert")

# Function words are never attacked nor offered as substitutes: changing them rarely keeps a sentence
# grammatical and says nothing about the model's robustness to content words.
STOP_WORDS = frozenset("""
a about above after again against all am an and any are aren as at be because been before being below between
both but by can cannot could couldn did didn do does doesn doing don down during each few for from further had
hadn has hasn have haven having he her here hers herself him himself his how i if in into is isn it its itself
just ll me more most mustn my myself no nor not now of off on once only or other our ours ourselves out over own
re same shan she should shouldn so some such than that the their theirs them themselves then there these they
this those through to too under until up ve very was wasn we were weren what when where which while who whom
why will with won would wouldn you your yours yourself yourselves
""".split())

# A word is a run of word characters, with inner apostrophes kept ("can't", "n't"); the rest of the text
# (spaces, punctuation) is kept verbatim between words, so edits leave the text's layout as it was.
WORD_PATTERN = re.compile(r"\w+(?:'\w+)*")


# ---------------------------------------------------------------------------------------------
# Texts as words
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WordSequence:
    """A text as ``gaps[0] + words[0] + gaps[1] + ... + words[-1] + gaps[-1]``; ``origins[i]`` is the index of
    word ``i`` in the original text (None for an inserted word)."""

    words: tuple[str, ...]
    gaps: tuple[str, ...]
    origins: tuple[int | None, ...]

    @classmethod
    def from_text(cls, text: str) -> "WordSequence":
        words, gaps, end = [], [], 0
        for match in WORD_PATTERN.finditer(text):
            gaps.append(text[end:match.start()])
            words.append(match.group())
            end = match.end()
        gaps.append(text[end:])
        return cls(tuple(words), tuple(gaps), tuple(range(len(words))))

    def text(self) -> str:
        return "".join(gap + word for gap, word in zip(self.gaps, self.words)) + self.gaps[-1]

    def __len__(self) -> int:
        return len(self.words)

    def replaced(self, position: int, word: str) -> "WordSequence":
        words = list(self.words)
        words[position] = word
        return WordSequence(tuple(words), self.gaps, self.origins)

    def without(self, position: int) -> "WordSequence":
        """The text with one word deleted (its surrounding gaps merged, a doubled space collapsed)."""
        before, after = self.gaps[position], self.gaps[position + 1]
        merged = before + after if not (before.endswith(" ") and after.startswith(" ")) else before + after[1:]
        gaps = self.gaps[:position] + (merged,) + self.gaps[position + 2:]
        return WordSequence(self.words[:position] + self.words[position + 1:], gaps,
                            self.origins[:position] + self.origins[position + 1:])

    def inserted(self, position: int, word: str) -> "WordSequence":
        """The text with ``word`` inserted as the new word number ``position`` (0: first, len: last)."""
        if position < len(self.words):  # before an existing word: "<gap>new <word>"
            gaps = self.gaps[:position + 1] + (" ",) + self.gaps[position + 1:]
        else:  # after the last word: "<word> new<trailing gap>"
            gaps = self.gaps[:position] + (" ",) + self.gaps[position:]
        return WordSequence(self.words[:position] + (word,) + self.words[position:], gaps,
                            self.origins[:position] + (None,) + self.origins[position:])


def is_attackable(word: str) -> bool:
    """Content words only: alphabetic, two letters or more, not a stop-word."""
    return word.isalpha() and len(word) >= 2 and word.lower() not in STOP_WORDS


def match_case(template: str, word: str) -> str:
    """``word`` written in the case pattern of ``template`` (UPPER, Title or as is)."""
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


# ---------------------------------------------------------------------------------------------
# Nearest neighbours in the input word-embedding space
# ---------------------------------------------------------------------------------------------
def whole_word(token: str | None, kind: str) -> str | None:
    """The word a vocabulary token stands for when it is a whole alphabetic word, else None. WordPiece marks
    continuation pieces with '##'; byte-level BPE and SentencePiece mark word starts with 'Ġ' / '▁'."""
    if not token:
        return None
    if kind == "wordpiece":
        word = None if token.startswith("##") else token
    elif token[:1] in ("Ġ", "▁"):
        word = token[1:]
    else:
        word = None  # a BPE / unigram piece inside a word
    return word if word and word.isalpha() and len(word) >= 2 else None


class EmbeddingNeighbours:
    """Cosine nearest neighbours of a word among the whole-word, alphabetic, non-stop-word vocabulary tokens,
    over the rows of an input word-embedding matrix."""

    def __init__(self, embeddings: np.ndarray, vocabulary: Sequence[str | None], *, kind: str = "wordpiece",
                 lowercase: bool = True, stop_words: frozenset[str] = STOP_WORDS,
                 piece_ids=None) -> None:
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(vocabulary):
            raise InputError(f"embeddings must be (vocabulary, dim) with one row per token; got {embeddings.shape} "
                             f"for {len(vocabulary)} tokens")
        self.embeddings = embeddings
        self.lowercase = lowercase
        self.stop_words = stop_words
        self._piece_ids = piece_ids  # word -> token ids, for words that are not one vocabulary token
        self.token_ids: dict[str, int] = {}
        for token_id, token in enumerate(vocabulary):
            word = whole_word(token, kind)
            if word is not None and word.lower() not in stop_words:
                self.token_ids.setdefault(word, token_id)
        self.candidate_words = list(self.token_ids)
        self.candidate_ids = np.fromiter(self.token_ids.values(), dtype=np.int64, count=len(self.token_ids))
        rows = embeddings[self.candidate_ids]
        self.unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        self._cache: dict[tuple[str, int], list[tuple[str, float]]] = {}

    @classmethod
    def from_classifier(cls, classifier: "Classifier") -> "EmbeddingNeighbours":
        tokenizer = classifier.tokenizer
        weight = classifier.model.encoder.embeddings.word.weight.detach().float().cpu().numpy()
        vocabulary = tokenizer.convert_ids_to_tokens(range(weight.shape[0]))
        lowercase = tokenizer.lowercase if tokenizer.lowercase is not None else tokenizer.kind == "wordpiece"

        def piece_ids(word: str) -> list[int]:
            return tokenizer.encode(word, add_special_tokens=False, truncation=False).input_ids

        return cls(weight, vocabulary, kind=tokenizer.kind, lowercase=bool(lowercase), piece_ids=piece_ids)

    def vector(self, word: str) -> np.ndarray | None:
        """The word's embedding: its vocabulary row, or the mean of its pieces' rows when it is split."""
        key = word.lower() if self.lowercase else word
        if key in self.token_ids:
            return self.embeddings[self.token_ids[key]]
        if self._piece_ids is None:
            return None
        ids = [i for i in self._piece_ids(key) if 0 <= i < len(self.embeddings)]
        return self.embeddings[ids].mean(axis=0) if ids else None

    def nearest(self, word: str, count: int) -> list[tuple[str, float]]:
        """Up to ``count`` (neighbour, cosine) pairs, most similar first, never the word itself."""
        key = (word.lower() if self.lowercase else word, count)
        if key in self._cache:
            return self._cache[key]
        vector = self.vector(word)
        if vector is None or count <= 0 or not self.candidate_words:
            return []
        cosines = self.unit @ (vector / max(float(np.linalg.norm(vector)), 1e-12))
        wanted = min(count + 1, len(cosines))  # one extra: the word itself is usually first
        top = np.argpartition(-cosines, wanted - 1)[:wanted]  # the best few without sorting the whole vocabulary
        found = []
        for index in top[np.argsort(-cosines[top], kind="stable")]:
            candidate = self.candidate_words[index]
            if candidate.lower() != key[0].lower():
                found.append((candidate, float(cosines[index])))
            if len(found) == count:
                break
        self._cache[key] = found
        return found


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass
class Perturbation:
    """One changed word: ``position`` is its index among the adversarial text's words; ``original`` is the
    word it replaced (None for an inserted word)."""

    position: int
    original: str | None
    replacement: str


@dataclass
class AttackRecord:
    """The attack on one text. ``status``: "success" (prediction flipped), "failed" (budget or word limit
    reached first) or "skipped" (the classifier was already wrong on the original text)."""

    index: int
    original: str
    adversarial: str
    label: str
    original_prediction: str
    adversarial_prediction: str
    original_probability: float  # probability of the true label, before and after
    adversarial_probability: float
    status: str
    queries: int
    words: int
    perturbations: list[Perturbation] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.status == "success"

    @property
    def perturbed_rate(self) -> float:
        return len(self.perturbations) / self.words if self.words else 0.0


@dataclass
class AttackResult(Report):
    """Per-text attack records and the aggregates: success rate among the texts the classifier got right,
    mean perturbed-word rate of the successful attacks, mean queries per attacked text."""

    method: str
    query_budget: int
    max_perturbed_rate: float
    neighbours: int
    records: list[AttackRecord]
    texts: int = 0
    attacked: int = 0  # texts the classifier classified correctly: the ones an attack is tried on
    successes: int = 0
    success_rate: float = 0.0
    mean_perturbed_rate: float = 0.0  # over successful attacks
    mean_queries: float = 0.0  # over attacked texts
    accuracy_before: float = 0.0
    accuracy_after: float = 0.0

    def __post_init__(self) -> None:
        attacked = [r for r in self.records if r.status != "skipped"]
        won = [r for r in attacked if r.success]
        self.texts, self.attacked, self.successes = len(self.records), len(attacked), len(won)
        self.success_rate = len(won) / len(attacked) if attacked else 0.0
        self.mean_perturbed_rate = float(np.mean([r.perturbed_rate for r in won])) if won else 0.0
        self.mean_queries = float(np.mean([r.queries for r in attacked])) if attacked else 0.0
        self.accuracy_before = len(attacked) / len(self.records) if self.records else 0.0
        self.accuracy_after = (len(attacked) - len(won)) / len(self.records) if self.records else 0.0

    def to_dict(self) -> dict:
        data = super().to_dict()
        for row, record in zip(data["records"], self.records):
            row["success"] = record.success
            row["perturbed_rate"] = record.perturbed_rate
        return data

    def successful(self) -> list[AttackRecord]:
        return [r for r in self.records if r.success]

    def markdown(self) -> str:
        summary = markdown_table(["quantity", "value"], [
            ("method", self.method), ("query budget per text", self.query_budget),
            ("max perturbed-word rate", self.max_perturbed_rate), ("neighbours tried per word", self.neighbours),
            ("texts", self.texts), ("attacked (initially correct)", self.attacked),
            ("successful attacks", self.successes), ("attack success rate", self.success_rate),
            ("mean perturbed-word rate (successes)", self.mean_perturbed_rate),
            ("mean queries (attacked)", self.mean_queries),
            ("accuracy before / after", f"{self.accuracy_before:.4f} / {self.accuracy_after:.4f}"),
        ])
        examples = [(r.index, r.original, r.adversarial, f"{r.label} -> {r.adversarial_prediction}", r.queries)
                    for r in self.successful()[:10]]
        text = f"# Adversarial attack ({self.method})\n\n{summary}\n"
        if examples:
            text += "\n## Successful examples (first 10)\n\n" + markdown_table(
                ["#", "original", "adversarial", "label -> prediction", "queries"], examples) + "\n"
        return text


# ---------------------------------------------------------------------------------------------
# The attack
# ---------------------------------------------------------------------------------------------
class _QueryCounter:
    """The classifier behind a per-text query budget: every text scored costs one query."""

    def __init__(self, classifier: "Classifier", budget: int) -> None:
        self.classifier, self.budget, self.used = classifier, budget, 0

    @property
    def left(self) -> int:
        return self.budget - self.used

    def probabilities(self, texts: list[str]) -> np.ndarray:
        from ..tasks.pipeline import softmax

        if len(texts) > self.left:
            raise AssertionError("caller must trim candidates to the query budget")  # a bug, not a user error
        self.used += len(texts)
        return softmax(np.asarray(self.classifier.logits(texts), dtype=np.float64))


class WordAttack:
    """Greedy word substitution or insertion against a single-label ``Classifier``.

    ``WordAttack(classifier, method="substitute", query_budget=500, max_perturbed_rate=0.25).attack(texts, labels)``
    -> ``AttackResult``. Labels are label names of the classifier (or their indices).
    """

    def __init__(self, classifier: "Classifier", *, method: str = "substitute", query_budget: int = 500,
                 max_perturbed_rate: float = 0.25, neighbours: int = 20, min_similarity: float = 0.0,
                 insert_candidates: Sequence[str] = (), neighbour_index: EmbeddingNeighbours | None = None) -> None:
        if method not in METHODS:
            raise InputError(f"unknown attack method {method!r}; choose from {', '.join(METHODS)}")
        if query_budget < 2:
            raise InputError(f"query budget must be at least 2 (the original text and one candidate), found {query_budget}")
        if not 0.0 < max_perturbed_rate <= 1.0:
            raise InputError(f"max perturbed-word rate must be in (0, 1], found {max_perturbed_rate}")
        if neighbours < 1:
            raise InputError(f"neighbours must be at least 1, found {neighbours}")
        if getattr(classifier.model, "task", None) != "sequence-classification":
            raise InputError("the attack needs a single-task sequence classifier")
        if classifier.config.problem_type == "multi_label_classification":
            raise InputError("the attack needs a single-label classifier (softmax), not a multi-label one")
        bad = [w for w in insert_candidates if not WORD_PATTERN.fullmatch(w)]
        if bad:
            raise InputError(f"insertion candidates must be single words, found {bad[:5]}")
        self.classifier = classifier
        self.method = method
        self.query_budget = int(query_budget)
        self.max_perturbed_rate = float(max_perturbed_rate)
        self.neighbours = int(neighbours)
        self.min_similarity = float(min_similarity)
        self.insert_candidates = list(dict.fromkeys(insert_candidates))
        self.labels = list(classifier.config.labels)
        self.index = neighbour_index or EmbeddingNeighbours.from_classifier(classifier)

    # ----- public API --------------------------------------------------------------------------
    def label_index(self, label: str | int) -> int:
        if isinstance(label, (int, np.integer)) and not isinstance(label, bool):
            if 0 <= int(label) < len(self.labels):
                return int(label)
        elif str(label) in self.labels:
            return self.labels.index(str(label))
        elif str(label).isdigit() and int(str(label)) < len(self.labels):
            return int(str(label))
        raise InputError(f"label {label!r} is not one of the classifier's labels {self.labels} (nor their index)")

    def max_perturbed_words(self, words: int) -> int:
        """The most words an attack may change in a text of ``words`` words (a hard cap: floor(rate * words))."""
        return int(math.floor(self.max_perturbed_rate * words + 1e-9))

    def attack(self, texts: Sequence[str], labels: Sequence[str | int]) -> AttackResult:
        if isinstance(texts, str):
            raise InputError("pass a list of texts, not one string")
        if len(texts) == 0:
            raise InputError("no texts to attack")
        if len(texts) != len(labels):
            raise InputError(f"{len(texts)} texts but {len(labels)} labels; give one label per text")
        for number, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise InputError(f"text {number} is empty or not a string")
        targets = [self.label_index(label) for label in labels]
        from ..progress import Progress

        records = []
        with Progress(len(texts), f"attack ({self.method})", "texts") as progress:
            for i, (text, target) in enumerate(zip(texts, targets)):
                records.append(self.attack_one(text, target, index=i))
                progress.advance(status=f"{sum(r.success for r in records)} flipped")
        return AttackResult(self.method, self.query_budget, self.max_perturbed_rate, self.neighbours, records)

    def attack_one(self, text: str, label: int, *, index: int = 0) -> AttackRecord:
        """Attack one text whose true label has index ``label``."""
        queries = _QueryCounter(self.classifier, self.query_budget)
        sequence = WordSequence.from_text(text)
        first = queries.probabilities([text])[0]
        record = AttackRecord(index, text, text, self.labels[label], self.labels[int(first.argmax())],
                              self.labels[int(first.argmax())], float(first[label]), float(first[label]),
                              "skipped", 0, len(sequence))
        if int(first.argmax()) != label:
            record.queries = queries.used
            return record
        limit = self.max_perturbed_words(len(sequence))
        ranked = self._rank_words(sequence, label, float(first[label]), queries) if limit > 0 else []
        step = self._substitute if self.method == "substitute" else self._insert
        current, probabilities, changed = sequence, first, 0
        for position in ranked:
            if changed >= limit or queries.left <= 0:
                break
            found = step(current, position, label, probabilities, queries)
            if found is None:
                continue
            current, probabilities = found
            changed += 1
            if int(probabilities.argmax()) != label:
                break
        record.adversarial = current.text()
        record.adversarial_prediction = self.labels[int(probabilities.argmax())]
        record.adversarial_probability = float(probabilities[label])
        record.status = "success" if int(probabilities.argmax()) != label else "failed"
        record.queries = queries.used
        record.perturbations = _perturbations(sequence, current)
        return record

    # ----- the steps ---------------------------------------------------------------------------
    def _rank_words(self, sequence: WordSequence, label: int, probability: float, queries: _QueryCounter
                    ) -> list[int]:
        """Attackable word positions, most important first: importance = drop of the true-label probability
        when the word is deleted."""
        positions = [i for i, word in enumerate(sequence.words) if is_attackable(word)]
        positions = positions[:max(queries.left - 1, 0)]  # keep at least one query for a candidate
        if not positions:
            return []
        deleted = queries.probabilities([sequence.without(i).text() for i in positions])[:, label]
        drops = probability - deleted
        return [positions[i] for i in np.argsort(-drops, kind="stable")]

    def _neighbour_words(self, word: str) -> list[str]:
        return [match_case(word, n) for n, cosine in self.index.nearest(word, self.neighbours)
                if cosine >= self.min_similarity]

    def _best(self, candidates: list[WordSequence], label: int, probabilities: np.ndarray, queries: _QueryCounter
              ) -> tuple[WordSequence, np.ndarray] | None:
        """Score the candidates in one classifier call; the one with the lowest true-label probability, when it
        is lower than the current text's."""
        candidates = candidates[:queries.left]
        if not candidates:
            return None
        scored = queries.probabilities([c.text() for c in candidates])
        best = int(np.argmin(scored[:, label]))
        if scored[best, label] >= probabilities[label]:
            return None
        return candidates[best], scored[best]

    def _substitute(self, current: WordSequence, position: int, label: int, probabilities: np.ndarray,
                    queries: _QueryCounter) -> tuple[WordSequence, np.ndarray] | None:
        word = current.words[position]
        candidates = [current.replaced(position, n) for n in self._neighbour_words(word)]
        return self._best(candidates, label, probabilities, queries)

    def _insert(self, current: WordSequence, origin: int, label: int, probabilities: np.ndarray,
                queries: _QueryCounter) -> tuple[WordSequence, np.ndarray] | None:
        # ``origin`` indexes the original words; earlier insertions have shifted positions since.
        position = current.origins.index(origin)
        word = current.words[position]
        new_words = list(dict.fromkeys([n.lower() for n in self._neighbour_words(word)] + self.insert_candidates))
        candidates = [current.inserted(where, new) for new in new_words for where in (position, position + 1)]
        return self._best(candidates, label, probabilities, queries)


def _perturbations(original: WordSequence, adversarial: WordSequence) -> list[Perturbation]:
    changes = []
    for position, (word, origin) in enumerate(zip(adversarial.words, adversarial.origins)):
        if origin is None:
            changes.append(Perturbation(position, None, word))
        elif word != original.words[origin]:
            changes.append(Perturbation(position, original.words[origin], word))
    return changes


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def read_labelled_texts(path: str | Path) -> tuple[list[str], list[str]]:
    """A TSV file of ``text<TAB>label`` lines (an optional first line ``text<TAB>label`` is a header)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"texts file not found: {path}")
    texts, labels = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.rsplit("\t", 1)
        if len(parts) != 2 or not parts[1].strip():
            raise DataError(f"{path}:{number}: expected `text<TAB>label`, found {line[:80]!r}")
        text, label = parts[0].strip(), parts[1].strip()
        if number == 1 and label.lower() == "label":
            continue  # header
        texts.append(text)
        labels.append(label)
    if not texts:
        raise DataError(f"{path} holds no `text<TAB>label` lines")
    return texts, labels
