"""Membership inference against masked language models: was this text in the model's training data?

A model fits the texts it was trained on better than similar texts it never saw. Two per-text scores
measure the fit of an MLM (``EncoderForMaskedLM`` / ``EncoderForPreTraining``), both as a mean negative
log-likelihood per scored token, so for both LOWER = better predicted = more likely a member:

- ``loss``: the MLM loss under fixed masks. Each text is masked ``draws`` times (rate ``mask_rate``,
  every selected token replaced by the mask token: random or kept tokens, BERT's 10%/10%, would only add
  noise to a score) and the cross-entropy is averaged over all masked positions of all draws. Masks are
  seeded by (``seed``, draw, the token ids of the window), so the same text gets the same masks under
  every model: target and reference scores are comparable, and so are runs.
- ``pll``: the pseudo-log-likelihood of Salazar et al. (2020, "Masked Language Model Scoring"): mask
  each token in turn and add up log p(true token). One forward pass per token, so a text of n tokens
  costs n passes (batched: the one-token-masked copies of a window run together); ``pll_max_tokens``
  caps the tokens scored per text (the first ones, in order). The score is -PLL / tokens scored.

A text's own difficulty (rare words, numbers, lists) moves both scores far more than membership does.
The reference-calibrated score removes it (Carlini et al. 2021, "Extracting training data from large
language models"; Mireshghallah et al. 2022, "Quantifying privacy risks of masked language models
using membership inference attacks"): calibrated = target score - reference score, the per-token log
likelihood ratio of reference to target, where the reference is a model of the same kind not trained
on the candidate texts (e.g. the model the target was fine-tuned from).

Texts longer than ``max_length`` tokens are cut into consecutive windows of ``max_length - 2`` tokens,
each wrapped in [CLS] ... [SEP]; a text's score pools all its windows (``max_windows`` caps them).
Given member and non-member sets, ``MembershipInference.evaluate`` reports AUC and the true-positive
rate at 1% false-positive rate (members are the positives), a ROC curve and score histograms.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

from ..errors import DataError, InputError
from ..engine import engine_for
from ..reports import Report, markdown_table, new_figure, roc_auc, roc_curve, save_figure, tpr_at_fpr
from ..tokenizer import Tokenizer

SCORE_KINDS = ("loss", "pll")
DOCUMENT_MODES = ("blank-line", "line")
REPORT_FPR = 0.01  # TPR at 1% FPR: an attack must be right about the few texts it flags (Carlini et al. 2022)
MLM_TASKS = ("masked-lm", "pretraining")
_COPIES_PER_RUN = 2048  # masked copies gathered before one pass through the encoder: bounds memory


def read_texts(path: str | Path, documents: str = "blank-line") -> list[str]:
    """Texts of a file: documents separated by blank lines ("blank-line": a document's lines are joined
    by newlines) or one text per line ("line"). Empty documents and lines are skipped."""
    if documents not in DOCUMENT_MODES:
        raise InputError(f"documents must be one of {', '.join(DOCUMENT_MODES)}, found {documents!r}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"text file {path} does not exist (expected UTF-8 text: {_describe_mode(documents)})")
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text: {exc}") from exc
    lines = content.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if documents == "line":
        texts = [line.strip() for line in lines if line.strip()]
    else:
        texts, current = [], []
        for line in lines + [""]:
            if line.strip():
                current.append(line.strip())
            elif current:
                texts.append("\n".join(current))
                current = []
    if not texts:
        raise DataError(f"{path} holds no text ({_describe_mode(documents)})")
    return texts


def _describe_mode(documents: str) -> str:
    return "documents separated by blank lines" if documents == "blank-line" else "one text per line"


@dataclass
class TextScores:
    """One model's scores of some texts. ``values`` = ``nll_sums`` / ``token_counts``: the mean negative
    log-likelihood per scored token, LOWER = more likely a member. For ``kind == "pll"``, ``-nll_sums``
    is each text's pseudo-log-likelihood (over its first ``pll_max_tokens`` tokens)."""

    kind: str
    nll_sums: np.ndarray  # float64 (texts,)
    token_counts: np.ndarray  # int64 (texts,): masked positions (loss) or tokens scored (pll)

    @property
    def values(self) -> np.ndarray:
        return self.nll_sums / self.token_counts

    @property
    def pseudo_log_likelihoods(self) -> np.ndarray:
        if self.kind != "pll":
            raise InputError("pseudo-log-likelihoods come from kind='pll' scores")
        return -self.nll_sums


class MLMScorer:
    """Per-text loss and PLL scores of one masked language model, on the packed fast path.

    ``dtype="bf16"`` runs the matrix products in bf16 (faster on CPUs with native bf16, slower where it is emulated);
    scores then move by about 1e-2, far less than membership moves them after a few epochs of training,
    but use fp32 where exact numbers matter.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Tokenizer, *, dtype: str | torch.dtype = "fp32",
                 max_length: int = 128, mask_rate: float = 0.15, draws: int = 4, seed: int = 0,
                 max_windows: int | None = None, pll_max_tokens: int | None = 128,
                 token_budget: int | None = None) -> None:
        if getattr(model, "mlm_head", None) is None:
            raise InputError("membership scores need a masked language model (a model with an MLM head), found "
                             f"{getattr(model, 'task', type(model).__name__)}")
        if tokenizer.mask_token_id is None:
            raise InputError("the tokenizer has no mask token; MLM scores need one")
        cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
        if cls_id is None or sep_id is None:
            raise InputError("the tokenizer has no [CLS]/[SEP] (or <s>/</s>) tokens to wrap windows in")
        if not 0.0 < mask_rate < 1.0:
            raise InputError(f"mask_rate must be in (0, 1), found {mask_rate}")
        if draws <= 0:
            raise InputError(f"draws must be positive, found {draws}")
        if max_windows is not None and max_windows <= 0:
            raise InputError(f"max_windows must be positive (or None for all), found {max_windows}")
        if pll_max_tokens is not None and pll_max_tokens <= 0:
            raise InputError(f"pll_max_tokens must be positive (or None for every token), found {pll_max_tokens}")
        longest = model.config.max_sequence_length
        if not 3 <= max_length <= longest:
            raise InputError(f"max_length must be between 3 and the model's {longest} positions, found {max_length}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.engine = engine_for(model, dtype, "task", token_budget, at_least=max_length)
        self.dtype = self.engine.precision.dtype
        self.max_length = max_length
        self.mask_rate = mask_rate
        self.draws = draws
        self.seed = seed
        self.max_windows = max_windows
        self.pll_max_tokens = pll_max_tokens
        self.token_budget = self.engine.precision.token_budget
        self.cls_id, self.sep_id, self.mask_id = int(cls_id), int(sep_id), int(tokenizer.mask_token_id)
        roles = ("cls", "sep", "pad", "mask", "unk", "bos", "eos")
        self.special_ids = {int(i) for i in (tokenizer.token_id(role) for role in roles) if i is not None}

    @classmethod
    def from_pretrained(cls, path: str | Path, **options) -> "MLMScorer":
        from ..modeling.models import load_model
        from ..config import EncoderConfig
        from ..io.hub import resolve_model
        from ..modeling.models import task_from_architectures

        resolved = resolve_model(path)
        config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
        task = task_from_architectures(config)
        if task not in MLM_TASKS:
            raise InputError(f"{resolved.root} is a {task} model ({', '.join(config.architectures or ['no architectures'])})"
                             " without a trained MLM head; membership scores need a *ForMaskedLM or *ForPreTraining "
                             "checkpoint, e.g. the output of `encoderkit pretrain`")
        return cls(load_model(resolved, task=task), Tokenizer.from_pretrained(resolved.tokenizer_dir), **options)

    @property
    def settings(self) -> dict[str, object]:
        """What decides the masks and windows: two scorers with equal settings score the same positions."""
        return {"max_length": self.max_length, "mask_rate": self.mask_rate, "draws": self.draws, "seed": self.seed,
                "max_windows": self.max_windows, "pll_max_tokens": self.pll_max_tokens}

    # ----- tokens, windows, masks ---------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids, without special tokens and untruncated."""
        if isinstance(texts, str):
            raise InputError("give a list of texts, not one string")
        if len(texts) == 0:
            raise InputError("no texts to score")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"text {index} is a {type(text).__name__}, not a string")
        encodings = self.tokenizer.encode_raw(list(texts), add_special_tokens=False, truncation=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        for index, row in enumerate(ids):
            if len(row) == 0:
                raise InputError(f"text {index} has no tokens (empty or only whitespace): {texts[index][:80]!r}")
        return ids

    def windows(self, ids: np.ndarray) -> list[np.ndarray]:
        """[CLS] + up to max_length - 2 tokens + [SEP], consecutively, at most ``max_windows`` of them."""
        content = self.max_length - 2
        pieces = [ids[start:start + content] for start in range(0, len(ids), content)]
        if self.max_windows is not None:
            pieces = pieces[:self.max_windows]
        return [np.concatenate([[self.cls_id], piece, [self.sep_id]]).astype(np.int64) for piece in pieces]

    def masked_positions(self, window: np.ndarray, draw: int) -> np.ndarray:
        """Positions masked in draw ``draw`` of a window: each maskable (non-special) token with probability
        ``mask_rate``, at least one; seeded by (seed, draw, the window's ids), so the same for every model."""
        maskable = np.flatnonzero(~np.isin(window, list(self.special_ids)))
        if len(maskable) == 0:
            return maskable
        digest = int.from_bytes(hashlib.blake2b(window.tobytes(), digest_size=8).digest(), "little")
        rng = np.random.default_rng([self.seed, draw, digest])
        chosen = maskable[rng.random(len(maskable)) < self.mask_rate]
        return chosen if len(chosen) else maskable[[int(rng.integers(len(maskable)))]]

    def masked_copies(self, ids: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The loss score's inputs for one text: (masked ids, labels with -100 where unmasked) for every
        window and draw, in (window, draw) order."""
        copies = []
        for window in self.windows(ids):
            for draw in range(self.draws):
                positions = self.masked_positions(window, draw)
                masked, labels = window.copy(), np.full(len(window), -100, dtype=np.int64)
                masked[positions], labels[positions] = self.mask_id, window[positions]
                copies.append((masked, labels))
        return copies

    # ----- scores -----------------------------------------------------------------------------
    def loss_scores(self, texts: Sequence[str] | None = None, *, ids: list[np.ndarray] | None = None) -> TextScores:
        """Mean MLM cross-entropy over all masked positions of all draws and windows, per text."""

        def copies(text_ids: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            for masked, labels in self.masked_copies(text_ids):
                positions = np.flatnonzero(labels != -100)
                yield masked, positions, labels[positions]

        return self._score("loss", texts, ids, copies)

    def pll_scores(self, texts: Sequence[str] | None = None, *, ids: list[np.ndarray] | None = None) -> TextScores:
        """Pseudo-log-likelihood per text: each of its first ``pll_max_tokens`` maskable tokens masked alone."""

        def copies(text_ids: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            left = self.pll_max_tokens if self.pll_max_tokens is not None else np.inf
            for window in self.windows(text_ids):
                for position in np.flatnonzero(~np.isin(window, list(self.special_ids))):
                    if left <= 0:
                        return
                    masked = window.copy()
                    masked[position] = self.mask_id
                    yield masked, np.array([position]), window[[position]]
                    left -= 1

        return self._score("pll", texts, ids, copies)

    def scores(self, texts: Sequence[str] | None = None, kind: str = "loss", *,
               ids: list[np.ndarray] | None = None) -> TextScores:
        if kind not in SCORE_KINDS:
            raise InputError(f"unknown score {kind!r}; choose one of {', '.join(SCORE_KINDS)}")
        return self.loss_scores(texts, ids=ids) if kind == "loss" else self.pll_scores(texts, ids=ids)

    def _score(self, kind: str, texts, ids, copies) -> TextScores:
        if ids is None:
            if texts is None:
                raise InputError("give texts (or their token ids)")
            ids = self.tokenize(texts)
        sums = np.zeros(len(ids), dtype=np.float64)
        counts = np.zeros(len(ids), dtype=np.int64)
        pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

        def flush() -> None:
            nll = self._negative_log_likelihoods([p[1] for p in pending], [p[2] for p in pending],
                                                 [p[3] for p in pending])
            for (owner, *_), values in zip(pending, nll):
                sums[owner] += float(values.sum())
                counts[owner] += len(values)
            pending.clear()

        from ..progress import Progress

        with Progress(len(ids), f"membership {kind} scores", "texts") as progress:
            for index, text_ids in enumerate(ids):
                for masked, positions, labels in copies(text_ids):
                    if len(positions):
                        pending.append((index, masked, positions, labels))
                if len(pending) >= _COPIES_PER_RUN:
                    flush()
                progress.advance()
            if pending:
                flush()
        empty = np.flatnonzero(counts == 0)
        if len(empty):
            raise InputError(f"text {int(empty[0])} has no token that can be masked (only special tokens)")
        return TextScores(kind, sums, counts)

    @torch.inference_mode()
    def _negative_log_likelihoods(self, sequences: list[np.ndarray], positions: list[np.ndarray],
                                  labels: list[np.ndarray]) -> list[np.ndarray]:
        """-log p(label) at the given positions of each (masked) sequence; the vocabulary projection runs
        only at those positions."""
        out: list[np.ndarray] = [np.empty(0)] * len(sequences)
        types = None  # one segment: the type ids are all 0
        with torch.autocast("cpu", enabled=False):
            for indices, hidden, batch in self.engine.run([s.tolist() for s in sequences], types):
                starts = batch.cu_seqlens[:-1].numpy()
                rows = np.concatenate([starts[j] + positions[i] for j, i in enumerate(indices)])
                targets = torch.from_numpy(np.concatenate([labels[i] for i in indices]))
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16):
                    logits = self.model.mlm_head(hidden[torch.from_numpy(rows)])
                log_probs = logits.float().log_softmax(dim=-1)
                nll = -log_probs.gather(1, targets[:, None]).squeeze(1).double().numpy()
                offset = 0
                for i in indices:
                    out[i] = nll[offset:offset + len(positions[i])]
                    offset += len(positions[i])
        return out


# ---------------------------------------------------------------------------------------------
# Target (+ reference) scores and the membership report
# ---------------------------------------------------------------------------------------------
@dataclass
class MembershipScores:
    """Per-text scores, LOWER = more likely a member: the target's, the reference's, and
    calibrated = target - reference (None without a reference)."""

    kind: str
    target: np.ndarray
    reference: np.ndarray | None
    calibrated: np.ndarray | None
    token_counts: np.ndarray

    @property
    def best(self) -> np.ndarray:
        """The calibrated score when there is a reference, else the target's."""
        return self.calibrated if self.calibrated is not None else self.target


@dataclass
class MembershipReport(Report):
    """AUC and TPR at 1% FPR of the target's score and, with a reference, of the calibrated score.

    Scores are mean negative log-likelihoods per token (lower = more likely a member); AUC and TPR are
    computed on their negation, members being the positives. AUC 0.5 = no membership signal."""

    score: str  # "loss" or "pll"
    target_model: str
    reference_model: str | None
    settings: dict[str, object]
    members: int
    non_members: int
    auc: float
    tpr_at_1pct_fpr: float
    calibrated_auc: float | None
    calibrated_tpr_at_1pct_fpr: float | None
    mean_scores: dict[str, dict[str, float]]  # {"target"|"reference"|"calibrated": {"members", "non_members"}}
    member_scores: dict[str, list[float]] = field(repr=False)
    non_member_scores: dict[str, list[float]] = field(repr=False)
    seconds: float = 0.0

    def rows(self) -> list[tuple[str, float, float, float, float]]:
        names = {"target": "target score", "reference": "reference score (alone)",
                 "calibrated": "calibrated (target - reference)"}
        out = []
        for key, name in names.items():
            if key not in self.member_scores:
                continue
            members, non_members = self.member_scores[key], self.non_member_scores[key]
            out.append((name, _auc(members, non_members), _tpr(members, non_members),
                        self.mean_scores[key]["members"], self.mean_scores[key]["non_members"]))
        return out

    def markdown(self) -> str:
        reference = self.reference_model or "none"
        lines = [f"# Membership inference ({self.score} score)", "",
                 f"Target: `{self.target_model}`; reference: `{reference}`; {self.members} members vs "
                 f"{self.non_members} non-members; settings: "
                 + ", ".join(f"{k} {v}" for k, v in self.settings.items()) + ".", "",
                 "Scores are mean negative log-likelihoods per token (lower = more likely a member); AUC 0.5 = "
                 "no signal.", "",
                 markdown_table(["score", "AUC", "TPR @ 1% FPR", "mean (members)", "mean (non-members)"],
                                self.rows())]
        if self.calibrated_auc is not None:
            better = "better than" if self.calibrated_auc > self.auc else "not better than"
            lines += ["", f"The reference-calibrated score is {better} the target's score alone "
                          f"(AUC {self.calibrated_auc:.4f} vs {self.auc:.4f})."]
        return "\n".join(lines) + "\n"

    def figures(self, out_dir: Path) -> list[Path]:
        return [self.plot_roc(out_dir / "membership_roc.png"), self.plot_histograms(out_dir / "membership_scores.png")]

    def plot_roc(self, path: Path) -> Path:
        figure, axes = new_figure(10.0, 4.2)
        figure.clf()
        linear, logarithmic = figure.subplots(1, 2)
        floor = 0.5 / max(min(self.members, self.non_members), 1)  # rates of 0 drawn half a text below the smallest
        for key, colour in (("target", "tab:blue"), ("calibrated", "tab:orange")):
            if key not in self.member_scores:
                continue
            fpr, tpr = roc_curve(-np.asarray(self.member_scores[key]), -np.asarray(self.non_member_scores[key]))
            label = f"{key} (AUC {_auc(self.member_scores[key], self.non_member_scores[key]):.3f})"
            linear.plot(fpr, tpr, color=colour, label=label)
            logarithmic.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), color=colour, label=label)
        for axis, scale in ((linear, "linear"), (logarithmic, "log")):
            axis.plot([floor, 1], [floor, 1], color="grey", linestyle=":", label="chance")
            axis.set_xscale(scale)
            axis.set_yscale(scale)
            axis.set_xlabel("false-positive rate (non-members flagged)")
            axis.set_ylabel("true-positive rate (members flagged)")
            axis.legend(loc="lower right", fontsize=8)
        linear.set_title(f"ROC, {self.score} score")
        logarithmic.set_title("ROC, log-log (the low-FPR region)")
        return save_figure(figure, path)

    def plot_histograms(self, path: Path) -> Path:
        keys = [k for k in ("target", "calibrated") if k in self.member_scores]
        figure, axes = new_figure(5.0 * len(keys), 3.8)
        figure.clf()
        panels = figure.subplots(1, len(keys), squeeze=False)[0]
        for axis, key in zip(panels, keys):
            members, non_members = np.asarray(self.member_scores[key]), np.asarray(self.non_member_scores[key])
            values = np.concatenate([members, non_members])
            low, high = np.percentile(values, [0.5, 99.5])
            bins = np.linspace(low, high if high > low else low + 1.0, 40)
            axis.hist(np.clip(non_members, low, high), bins=bins, alpha=0.6, label="non-members", color="tab:grey")
            axis.hist(np.clip(members, low, high), bins=bins, alpha=0.6, label="members", color="tab:red")
            axis.set_xlabel(f"{key} score (nats/token; lower = member)")
            axis.set_ylabel("texts")
            axis.legend(fontsize=8)
        return save_figure(figure, path)


def _auc(members: Sequence[float], non_members: Sequence[float]) -> float:
    return roc_auc(-np.asarray(members), -np.asarray(non_members))


def _tpr(members: Sequence[float], non_members: Sequence[float]) -> float:
    return tpr_at_fpr(-np.asarray(members), -np.asarray(non_members), REPORT_FPR)


class MembershipInference:
    """Scores texts against a target MLM and, optionally, a reference MLM of the same tokenizer.

    >>> attack = MembershipInference.from_pretrained("runs/target/final", reference="runs/base/final")
    >>> report = attack.evaluate(members, non_members, kind="loss")
    >>> report.write("membership-report")
    """

    def __init__(self, target: MLMScorer, reference: MLMScorer | None = None, *, target_name: str = "target",
                 reference_name: str | None = None) -> None:
        if reference is not None:
            if reference.settings != target.settings:
                raise InputError(f"the reference scorer's settings {reference.settings} differ from the target's "
                                 f"{target.settings}; both must mask the same positions")
            if reference.tokenizer.backend.get_vocab() != target.tokenizer.backend.get_vocab():
                raise InputError("the reference model's tokenizer differs from the target's; a calibrated score "
                                 "compares the two on the same tokens, so use a reference with the same vocabulary")
        self.target = target
        self.reference = reference
        self.target_name = target_name
        self.reference_name = (reference_name or "reference") if reference is not None else None

    @classmethod
    def from_pretrained(cls, target: str | Path, reference: str | Path | None = None,
                        **options) -> "MembershipInference":
        """``options``: MLMScorer's (dtype, max_length, mask_rate, draws, seed, max_windows, pll_max_tokens)."""
        target_scorer = MLMScorer.from_pretrained(target, **options)
        reference_scorer = MLMScorer.from_pretrained(reference, **options) if reference is not None else None
        return cls(target_scorer, reference_scorer, target_name=str(target),
                   reference_name=None if reference is None else str(reference))

    def score(self, texts: Sequence[str], kind: str = "loss") -> MembershipScores:
        """Per-text target, reference and calibrated scores (lower = more likely a member)."""
        if kind not in SCORE_KINDS:
            raise InputError(f"unknown score {kind!r}; choose one of {', '.join(SCORE_KINDS)}")
        ids = self.target.tokenize(texts)
        target = self.target.scores(kind=kind, ids=ids)
        if self.reference is None:
            return MembershipScores(kind, target.values, None, None, target.token_counts)
        reference = self.reference.scores(kind=kind, ids=ids)
        return MembershipScores(kind, target.values, reference.values, target.values - reference.values,
                                target.token_counts)

    def evaluate(self, members: Sequence[str], non_members: Sequence[str], kind: str = "loss") -> MembershipReport:
        """AUC and TPR at 1% FPR of members (positives) against non-members."""
        for name, texts in (("members", members), ("non-members", non_members)):
            if isinstance(texts, str) or len(texts) == 0:
                raise InputError(f"{name} must be a non-empty list of texts")
        started = time.perf_counter()
        member_scores, non_member_scores = self.score(members, kind), self.score(non_members, kind)
        by_key_members = {"target": member_scores.target.tolist()}
        by_key_non_members = {"target": non_member_scores.target.tolist()}
        if self.reference is not None:
            for key in ("reference", "calibrated"):
                by_key_members[key] = getattr(member_scores, key).tolist()
                by_key_non_members[key] = getattr(non_member_scores, key).tolist()
        means = {key: {"members": float(np.mean(by_key_members[key])),
                       "non_members": float(np.mean(by_key_non_members[key]))} for key in by_key_members}
        calibrated = self.reference is not None
        settings = {**self.target.settings, "dtype": "bf16" if self.target.dtype == torch.bfloat16 else "fp32"}
        if kind == "loss":
            settings.pop("pll_max_tokens")
        else:
            for key in ("mask_rate", "draws"):
                settings.pop(key)
        return MembershipReport(
            score=kind, target_model=self.target_name, reference_model=self.reference_name, settings=settings,
            members=len(members), non_members=len(non_members),
            auc=_auc(by_key_members["target"], by_key_non_members["target"]),
            tpr_at_1pct_fpr=_tpr(by_key_members["target"], by_key_non_members["target"]),
            calibrated_auc=_auc(by_key_members["calibrated"], by_key_non_members["calibrated"]) if calibrated else None,
            calibrated_tpr_at_1pct_fpr=(_tpr(by_key_members["calibrated"], by_key_non_members["calibrated"])
                                        if calibrated else None),
            mean_scores=means, member_scores=by_key_members, non_member_scores=by_key_non_members,
            seconds=time.perf_counter() - started)


__all__ = ["MLMScorer", "MembershipInference", "MembershipReport", "MembershipScores", "TextScores", "read_texts",
           "roc_curve", "SCORE_KINDS"]
