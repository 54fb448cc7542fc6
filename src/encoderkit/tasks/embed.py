"""Sentence embeddings: encoder states pooled (mean / CLS / max / ...) and optionally L2-normalised."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError, InputError
from ..hub import resolve_model
from ..modeling.models import Encoder
from ..tokenizer import Tokenizer

log = logging.getLogger(__name__)

POOLING_MODES = ("mean", "cls", "max", "weightedmean", "mean_sqrt_len")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce (batch, length, dim) token states to (batch, dim), ignoring padding."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    if mode == "weightedmean":  # later positions weigh more (SGPT)
        weights = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
        mask = mask * weights[None, :, None]
    if mode in ("mean", "weightedmean", "mean_sqrt_len"):
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)
    raise InputError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLING_MODES)}")


class Embedder:
    """Text -> vector. ``Embedder.from_pretrained()`` uses the default model and its own pooling."""

    def __init__(self, model: Encoder, tokenizer: Tokenizer, *, pooling: str = "mean", normalize: bool = False,
                 max_length: int | None = None) -> None:
        if pooling not in POOLING_MODES:
            raise InputError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.max_length = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, pooling: str | None = None,
                        normalize: bool | None = None, max_length: int | None = None,
                        dtype: torch.dtype | None = None) -> "Embedder":
        from ..checkpoints import load_model

        resolved = resolve_model(path)
        model = load_model(resolved.root, task="base", dtype=dtype)
        tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
        info = resolved.sentence_transformer
        return cls(
            model, tokenizer,
            pooling=pooling or (info.pooling if info else "mean"),
            normalize=normalize if normalize is not None else bool(info and info.normalize),
            max_length=max_length or (info.max_seq_length if info else None),
        )

    @property
    def dimension(self) -> int:
        return self.model.config.hidden_size

    def _batches(self, texts: Sequence[str], batch_size: int) -> Iterator[list[int]]:
        # Longest first, so similar lengths share a batch and little padding is computed.
        lengths = [-len(t) for t in texts]
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(order), batch_size):
            yield order[start:start + batch_size].tolist()

    @torch.inference_mode()
    def encode(self, texts: Sequence[str] | str, *, batch_size: int = 32, normalize: bool | None = None,
               convert_to: str = "numpy", progress: Callable[[int], None] | None = None) -> np.ndarray | torch.Tensor:
        """Embed texts, returned in input order: float32 array (or tensor) of shape (len(texts), dim)."""
        single = isinstance(texts, str)
        if single:
            texts = [texts]
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {batch_size}")
        if convert_to not in ("numpy", "torch"):
            raise InputError(f"convert_to must be 'numpy' or 'torch', found {convert_to!r}")
        normalize = self.normalize if normalize is None else normalize
        out = torch.empty(len(texts), self.dimension, dtype=torch.float32)
        for indices in self._batches(texts, batch_size):
            batch = self.tokenizer.encode_batch([texts[i] for i in indices], max_length=self.max_length)
            hidden = self.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
            vectors = pool(hidden.float(), batch.attention_mask, self.pooling)
            if normalize:
                vectors = F.normalize(vectors, p=2, dim=1)
            out[indices] = vectors
            if progress is not None:
                progress(len(indices))
        result = out[0] if single else out
        return result.numpy() if convert_to == "numpy" else result


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T




@dataclass
class EmbedResult:
    path: Path
    rows: int
    dimension: int


def read_lines(path: str | Path) -> list[str]:
    """One text per line (line breaks removed). Undecodable bytes become U+FFFD, with a warning."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        log.warning("%s: bytes that are not UTF-8 (first at byte %d) were replaced by U+FFFD", path, exc.start)
        text = raw.decode("utf-8", errors="replace")
    return text.removeprefix("\ufeff").splitlines()


def embed_file(input_path: str | Path, out_path: str | Path, *, model: str | Path | None = None,
               batch_size: int = 32, max_length: int | None = None) -> EmbedResult:
    """Embed every line of a text file and write a float32 .npy (written to a temp file, then renamed)."""
    from ..progress import Progress

    texts = read_lines(input_path)
    if not texts:
        raise DataError(f"{input_path} holds no lines to embed")
    out_path = Path(out_path)
    if out_path.suffix != ".npy":
        raise InputError(f"--out must name a .npy file, found {out_path.name!r}")
    if not out_path.parent.exists():
        raise InputError(f"output directory does not exist: {out_path.parent}")
    embedder = Embedder.from_pretrained(model, max_length=max_length)
    with Progress(len(texts), "embedding", "texts") as progress:
        vectors = embedder.encode(texts, batch_size=batch_size, progress=progress.advance)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, vectors.astype(np.float32, copy=False))
    tmp.replace(out_path)
    return EmbedResult(out_path, vectors.shape[0], vectors.shape[1])
