"""Behaviour consistency: does a classifier keep its prediction when a text is edited without changing
its meaning?

Five kinds of edit, each meaning-preserving by construction and seeded (the same seed, edit and text
give the same edited text on every machine and in every order):

- ``case``: the whole text upper-cased, lower-cased, or title-cased word by word;
- ``whitespace``: some gaps between words widened to several spaces, or turned into tabs;
- ``punctuation``: a final period added (when the text has no final punctuation) or removed, or the
  quotation marks swapped (``"`` <-> ``'``, PTB-style `````` / ``''`` -> ``"``). A final ``!`` or ``?``
  is never touched: it changes tone or turns a statement into a question;
- ``name``: first names (found with a built-in list, since there is no NER here) replaced by other
  names of the same list, so pronouns still agree; every occurrence of a name gets the same
  replacement, and its capitalisation is kept. Names that are also common words (Will, Mark, Grace,
  Hope, June ...) are not in the lists;
- ``typo``: in a limited number of words of at least four letters, two adjacent inner letters swapped
  or one inner letter deleted (first and last letter kept, the classic readable typo); the validator
  rejects typos that spell another word of the tokenizer's vocabulary ("good" -> "god").

``BehaviorConsistencyValidator(classifier).validate(texts)`` classifies every original and edited text
and reports, per edit, the consistency rate (share of edited texts whose predicted label did not
change), the mean and largest probability shift, per-variant rates, and every failing case.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import InputError
from ..reports import Report, markdown_table, new_figure, save_figure

EDITS = ("case", "whitespace", "punctuation", "name", "typo")
_ALIASES = {"names": "name", "typos": "typo", "spaces": "whitespace", "punct": "punctuation"}

MALE_NAMES = (
    "james", "john", "robert", "michael", "david", "richard", "joseph", "thomas", "charles", "christopher", "daniel",
    "matthew", "anthony", "steven", "paul", "andrew", "joshua", "kenneth", "kevin", "brian", "george", "timothy",
    "ronald", "jason", "edward", "jeffrey", "ryan", "jacob", "gary", "nicholas", "eric", "jonathan", "stephen",
    "larry", "justin", "scott", "brandon", "benjamin", "samuel", "gregory", "alexander", "patrick", "dennis",
    "jerry", "tyler", "aaron", "henry", "adam", "peter", "nathan", "zachary", "kyle", "walter", "harold", "carl",
    "jeremy", "keith", "roger", "harry", "oliver", "william", "tom", "steve", "jim", "joe", "mike", "dave", "tony",
    "ben", "sam", "nick", "alan", "simon", "martin", "philip", "louis", "howard", "eddie", "johnny",
)
FEMALE_NAMES = (
    "mary", "patricia", "jennifer", "linda", "elizabeth", "barbara", "susan", "jessica", "sarah", "karen", "nancy",
    "lisa", "margaret", "sandra", "ashley", "kimberly", "emily", "donna", "michelle", "amanda", "melissa", "deborah",
    "stephanie", "rebecca", "laura", "sharon", "cynthia", "kathleen", "helen", "amy", "shirley", "angela", "anna",
    "brenda", "emma", "nicole", "catherine", "samantha", "christine", "rachel", "carolyn", "janet", "maria",
    "heather", "diane", "julie", "victoria", "christina", "lauren", "joan", "evelyn", "judith", "megan", "cheryl",
    "andrea", "hannah", "martha", "gloria", "teresa", "sara", "kathryn", "janice", "alice", "julia", "abigail",
    "sophia", "olivia", "natalie", "diana", "jane", "kate", "susie", "annie", "lucy", "sally", "nora", "claire",
)
_NAME_LISTS = (MALE_NAMES, FEMALE_NAMES)
_NAME_INDEX = {name: group for group in _NAME_LISTS for name in group}

_WORD = re.compile(r"[^\W\d_]+")  # runs of letters
_TYPO_WORD = re.compile(r"\b[A-Za-z]{4,}\b")  # ASCII words of at least four letters
_GAP = re.compile(r"[ \t]+")
_FINAL_PUNCTUATION = ".!?;:…"


# ---------------------------------------------------------------------------------------------
# The edits: (text, rng) -> (variant, edited text), or None when the edit does not apply
# ---------------------------------------------------------------------------------------------
Edit = Callable[[str, random.Random], "tuple[str, str] | None"]


def _choose(options: list[tuple[str, str]], text: str, rng: random.Random) -> tuple[str, str] | None:
    """One of the variants that actually change the text."""
    changed = [(variant, edited) for variant, edited in options if edited != text]
    return rng.choice(changed) if changed else None


def case_edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    def title(word: str) -> str:
        return word[:1].upper() + word[1:].lower()

    return _choose([("upper", text.upper()), ("lower", text.lower()),
                    ("title", re.sub(r"\S+", lambda m: title(m.group()), text))], text, rng)


def whitespace_edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    gaps = list(_GAP.finditer(text.strip()))
    offset = len(text) - len(text.lstrip())
    if not gaps:  # one word: pad it instead
        return _choose([("extra spaces", f"  {text}  "), ("tabs", f"\t{text}\t")], text, rng)
    count = max(1, round(0.3 * len(gaps)))
    chosen = sorted(rng.sample(range(len(gaps)), count))
    variant = rng.choice(["extra spaces", "tabs"])
    pieces, last = [], 0
    for index in chosen:
        start, end = gaps[index].start() + offset, gaps[index].end() + offset
        pieces += [text[last:start], " " * rng.randint(2, 4) if variant == "extra spaces" else "\t"]
        last = end
    return variant, "".join(pieces) + text[last:]


def punctuation_edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    stripped = text.rstrip()
    options = []
    if stripped and stripped[-1] not in _FINAL_PUNCTUATION and not stripped.endswith(("''", '"', "'", ")")):
        options.append(("add final period", stripped + "."))
    if stripped.endswith(".") and not stripped.endswith(".."):
        options.append(("remove final period", stripped[:-1].rstrip()))
    if "``" in text or "''" in text:
        options.append(("swap quotes", text.replace("``", '"').replace("''", '"')))
    elif '"' in text:
        options.append(("swap quotes", text.replace('"', "'")))
    elif "“" in text or "”" in text:
        options.append(("swap quotes", text.replace("“", '"').replace("”", '"')))
    return _choose(options, text, rng)


def _same_case(template: str, word: str) -> str:
    if len(template) > 1 and template.isupper():
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def name_edit(text: str, rng: random.Random) -> tuple[str, str] | None:
    found = [m for m in _WORD.finditer(text) if m.group().lower() in _NAME_INDEX]
    if not found:
        return None
    names = list(dict.fromkeys(m.group().lower() for m in found))
    replacement: dict[str, str] = {}
    for name in names:  # distinct names stay distinct, so who-did-what is kept
        group = _NAME_INDEX[name]
        taken = set(names) | set(replacement.values())
        replacement[name] = rng.choice([other for other in group if other not in taken])
    edited = _WORD.sub(lambda m: _same_case(m.group(), replacement[m.group().lower()])
                       if m.group().lower() in replacement else m.group(), text)
    return "name swap", edited


def _typo(word: str, rng: random.Random) -> tuple[str, str]:
    inner_pairs = [i for i in range(1, len(word) - 2) if word[i] != word[i + 1]]
    if inner_pairs and rng.random() < 0.5:
        i = rng.choice(inner_pairs)
        return "swap", word[:i] + word[i + 1] + word[i] + word[i + 2:]
    i = rng.randrange(1, len(word) - 1)
    return "delete", word[:i] + word[i + 1:]


def typo_edit(text: str, rng: random.Random, count: int = 1,
              known_words: frozenset[str] | None = None) -> tuple[str, str] | None:
    """Typos in ``count`` words of four letters or more. With ``known_words`` (e.g. the tokenizer's whole-word
    vocabulary), a typo that spells another real word ("good" -> "god") is rejected and another is tried."""
    words = list(_TYPO_WORD.finditer(text))
    order = rng.sample(range(len(words)), len(words))
    made: dict[int, tuple[str, str]] = {}
    for index in order:
        if len(made) == count:
            break
        for _ in range(8):
            kind, typo = _typo(words[index].group(), rng)
            if known_words is None or typo.lower() not in known_words:
                made[index] = (kind, typo)
                break
    if not made:
        return None
    pieces, last = [], 0
    for index in sorted(made):
        match = words[index]
        pieces += [text[last:match.start()], made[index][1]]
        last = match.end()
    return "+".join(sorted({kind for kind, _ in made.values()})), "".join(pieces) + text[last:]


def edit_functions(typos: int = 1, known_words: frozenset[str] | None = None) -> dict[str, Edit]:
    return {"case": case_edit, "whitespace": whitespace_edit, "punctuation": punctuation_edit, "name": name_edit,
            "typo": lambda text, rng: typo_edit(text, rng, typos, known_words)}


def parse_edits(edits: str | Sequence[str] | None) -> list[str]:
    """Edit names from a list or a comma-separated string (plural aliases accepted), validated."""
    if edits is None:
        return list(EDITS)
    names = [e.strip().lower() for e in (edits.split(",") if isinstance(edits, str) else edits) if e.strip()]
    names = [_ALIASES.get(name, name) for name in names]
    unknown = [name for name in names if name not in EDITS]
    if unknown or not names:
        raise InputError(f"unknown edit(s) {unknown or edits!r}; choose from {', '.join(EDITS)}")
    return list(dict.fromkeys(names))


def apply_edit(edit: str, text: str, seed: int = 0, typos: int = 1,
               known_words: frozenset[str] | None = None) -> tuple[str, str] | None:
    """(variant, edited text) of one edit, or None when it does not apply. The random choices depend only on
    (seed, edit, text): a string-seeded ``random.Random`` is the same on every platform and Python run.
    ``known_words``: real words a typo must not spell (see ``typo_edit``)."""
    [name] = parse_edits([edit])
    return edit_functions(typos, known_words)[name](text, random.Random(f"{seed}|{name}|{text}"))


def vocabulary_words(tokenizer: Any) -> frozenset[str]:
    """The whole words of a tokenizer's vocabulary (WordPiece entries, BPE entries without the space mark),
    lower-cased: a typo that lands on one of them is a different word, not a typo."""
    vocabulary = tokenizer.backend.get_vocab()
    return frozenset(token.removeprefix("Ġ").lower() for token in vocabulary if token.removeprefix("Ġ").isalpha())


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
@dataclass
class FailingCase:
    """An edited text whose predicted label differs from the original's."""

    index: int  # position of the original in the input texts
    variant: str
    original: str
    edited: str
    original_label: Any
    edited_label: Any
    original_scores: dict[str, float]
    edited_scores: dict[str, float]


@dataclass
class EditConsistency:
    """How one edit kind fared."""

    edit: str
    texts: int  # texts the edit applied to (e.g. only those with a first name, for "name")
    consistent: int
    consistency_rate: float | None  # consistent / texts
    mean_probability_shift: float | None  # mean over texts of the largest change of any label's probability
    max_probability_shift: float | None
    same_tokens: int = 0  # edited texts the tokenizer turns into the original's token ids (invariant by construction)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant -> texts, consistent, rate
    failures: list[FailingCase] = field(default_factory=list)


@dataclass
class ConsistencyReport(Report):
    """Prediction invariance of a classifier under meaning-preserving edits."""

    model: str
    texts: int
    seed: int
    typos_per_text: int
    edits: list[EditConsistency]

    def rate(self, edit: str) -> float | None:
        return next(e.consistency_rate for e in self.edits if e.edit == edit)

    @property
    def failures(self) -> int:
        return sum(len(e.failures) for e in self.edits)

    def markdown(self, examples: int = 5) -> str:
        rows = [(e.edit, e.texts, e.same_tokens, e.consistent, _percent(e.consistency_rate),
                 _round(e.mean_probability_shift), _round(e.max_probability_shift)) for e in self.edits]
        lines = [f"# Behaviour consistency of `{self.model}`", "",
                 f"{self.texts} texts, seed {self.seed}, {self.typos_per_text} typo(s) per text. A text is consistent "
                 "when its edited version gets the same predicted label; \"same tokens\" counts edited texts the "
                 "tokenizer maps to the original's token ids (the model cannot tell them apart).", "",
                 markdown_table(["edit", "texts edited", "same tokens", "consistent", "consistency", "mean prob. shift",
                                 "max prob. shift"], rows), ""]
        variant_rows = [(e.edit, variant, v["texts"], _percent(v["consistency_rate"]))
                        for e in self.edits for variant, v in e.variants.items()]
        if variant_rows:
            lines += ["## By variant", "",
                      markdown_table(["edit", "variant", "texts", "consistency"], variant_rows), ""]
        for e in self.edits:
            if e.failures:
                lines += [f"## Failing cases: {e.edit} ({len(e.failures)}, first {min(examples, len(e.failures))})", "",
                          markdown_table(["original", "edited", "labels"],
                                         [(f.original, f.edited, f"{f.original_label} -> {f.edited_label}")
                                          for f in e.failures[:examples]]), ""]
        return "\n".join(lines)

    def figures(self, out_dir: Path) -> list[Path]:
        shown = [e for e in self.edits if e.consistency_rate is not None]
        if not shown:
            return []
        figure, axis = new_figure(6.5, 3.8)
        rates = [100 * e.consistency_rate for e in shown]
        bars = axis.bar([e.edit for e in shown], rates, color="#4c72b0")
        for bar, e in zip(bars, shown):
            axis.annotate(f"{100 * e.consistency_rate:.1f}%\n(n={e.texts})", (bar.get_x() + bar.get_width() / 2,
                          bar.get_height()), ha="center", va="bottom", fontsize=8)
        low = min(rates)
        axis.set_ylim(max(0.0, low - max(5.0, (100 - low) * 0.6)), 100 + max(2.0, (100 - low) * 0.35))
        axis.set_yticks([tick for tick in axis.get_yticks() if tick <= 100])
        axis.set_ylabel("consistency (% of edited texts, same label)")
        axis.set_title(f"Prediction consistency under meaning-preserving edits ({self.texts} texts)", fontsize=9)
        return [save_figure(figure, Path(out_dir) / "consistency.png")]


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _round(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


# ---------------------------------------------------------------------------------------------
# The validator
# ---------------------------------------------------------------------------------------------
class BehaviorConsistencyValidator:
    """``BehaviorConsistencyValidator(classifier).validate(texts, edits=["case", "typo"], seed=0)``."""

    def __init__(self, classifier: Any, *, typos: int = 1) -> None:
        if getattr(getattr(classifier, "model", None), "task", None) != "sequence-classification":
            raise InputError("BehaviorConsistencyValidator needs a single-head sequence classifier "
                             "(encoderkit.Classifier of a model fine-tuned for sequence classification)")
        if typos < 1:
            raise InputError(f"typos per text must be at least 1, found {typos}")
        self.classifier = classifier
        self.typos = typos
        self.known_words = vocabulary_words(classifier.tokenizer)  # typos must not spell these

    @classmethod
    def from_pretrained(cls, path: str | Path | None, *, dtype: str = "fp32", typos: int = 1
                        ) -> BehaviorConsistencyValidator:
        from ..tasks.classify import Classifier

        return cls(Classifier.from_pretrained(path, dtype=dtype), typos=typos)

    def edited_texts(self, texts: Sequence[str], edit: str, seed: int = 0) -> list[tuple[str, str] | None]:
        """(variant, edited) for each text, or None where the edit does not apply."""
        return [apply_edit(edit, text, seed, self.typos, self.known_words) for text in texts]

    def predict(self, texts: Sequence[str]) -> tuple[list[Any], np.ndarray]:
        """Predicted labels (a tuple of labels for multi-label models) and every label's probability."""
        from ..tasks.classify import is_multi_label, predictions_from_logits

        if not texts:
            return [], np.zeros((0, self.classifier.config.num_labels))
        logits = self.classifier.logits(list(texts))
        predictions = predictions_from_logits(logits, self.classifier.config.labels,
                                              is_multi_label(self.classifier.config))
        labels = [tuple(p.label) if isinstance(p.label, list) else p.label for p in predictions]
        probabilities = np.array([[p.scores[name] for name in self.classifier.config.labels] for p in predictions])
        return labels, probabilities

    def _predict_distinct(self, texts: list[str]) -> tuple[list[Any], np.ndarray, list[int]]:
        """Predictions of texts, running the model once per distinct token sequence.

        Texts with the same token ids are the same model input, so they get the same prediction by
        definition; reusing it keeps batch-dependent rounding (bf16) from posing as a behaviour change."""
        encodings = self.classifier.tokenizer.encode_raw(texts, max_length=self.classifier.max_length)
        first_of: dict[tuple[int, ...], int] = {}
        keys = [first_of.setdefault(tuple(e.ids), len(first_of)) for e in encodings]
        distinct = [None] * len(first_of)
        for text, key in zip(texts, keys):
            if distinct[key] is None:
                distinct[key] = text
        labels, probabilities = self.predict(distinct)
        return [labels[k] for k in keys], probabilities[keys], keys

    def validate(self, texts: Sequence[str], edits: str | Sequence[str] | None = None, *, seed: int = 0,
                 model_name: str | None = None) -> ConsistencyReport:
        if isinstance(texts, str):
            raise InputError("pass a list of texts, not one string")
        texts = list(texts)
        if not texts:
            raise InputError("no texts to edit: give at least one")
        if not all(isinstance(t, str) for t in texts):
            raise InputError("every text must be a string")
        names = parse_edits(edits)
        edited = {name: self.edited_texts(texts, name, seed) for name in names}
        # One classifier pass over the originals and every edited text (the packed path sorts by length).
        batch = list(texts) + [e[1] for name in names for e in edited[name] if e is not None]
        labels, probabilities, token_keys = self._predict_distinct(batch)
        label_names = self.classifier.config.labels
        position = len(texts)
        results = []
        for name in names:
            shifts, consistent, same_tokens, failures = [], 0, 0, []
            variants: dict[str, dict[str, Any]] = {}
            for index, item in enumerate(edited[name]):
                if item is None:
                    continue
                variant, text = item
                same = labels[position] == labels[index]
                same_tokens += int(token_keys[position] == token_keys[index])
                shifts.append(float(np.abs(probabilities[position] - probabilities[index]).max()))
                stats = variants.setdefault(variant, {"texts": 0, "consistent": 0})
                stats["texts"] += 1
                stats["consistent"] += int(same)
                consistent += int(same)
                if not same:
                    failures.append(FailingCase(
                        index, variant, texts[index], text, _plain(labels[index]), _plain(labels[position]),
                        dict(zip(label_names, map(float, probabilities[index]))),
                        dict(zip(label_names, map(float, probabilities[position])))))
                position += 1
            for stats in variants.values():
                stats["consistency_rate"] = stats["consistent"] / stats["texts"]
            count = len(shifts)
            results.append(EditConsistency(
                edit=name, texts=count, consistent=consistent, consistency_rate=consistent / count if count else None,
                mean_probability_shift=float(np.mean(shifts)) if count else None,
                max_probability_shift=float(np.max(shifts)) if count else None, same_tokens=same_tokens,
                variants=dict(sorted(variants.items())), failures=failures))
        model = model_name or str(getattr(getattr(self.classifier.model, "source", None), "root", "classifier"))
        return ConsistencyReport(model=model, texts=len(texts), seed=seed, typos_per_text=self.typos, edits=results)


def _plain(label: Any) -> Any:
    return list(label) if isinstance(label, tuple) else label


def read_texts(path: str | Path, text_field: str | None = None) -> list[str]:
    """Texts from a file: one per line (.txt), or the text column/field of a .tsv/.csv/.jsonl; blanks skipped."""
    from ..data.readers import read_texts as read

    return read(path, text_field=text_field, field_option="--text-field")
