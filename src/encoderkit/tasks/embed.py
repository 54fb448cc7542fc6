"""Sentence embeddings: encoder states pooled (mean / CLS / max / ...), optionally L2-normalised, optionally truncated
to their first N dimensions (Matryoshka embeddings, as sentence-transformers' ``truncate_dim``).

``Embedder.encode`` runs the inference engine (``encoderkit.engine``): texts are tokenised once, sorted by
length, grouped under a token budget, packed without padding, and restored to input order.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import DataError, InputError
from ..io.hub import resolve_model
from ..modeling.encoder import EncoderModel
from ..engine import engine_for
from ..modeling.packing import MAX_BATCH_SIZE
from ..modeling.packing import pool_padded as pool  # noqa: F401 (encoderkit.tasks.embed.pool, the padded pooling)
from ..io.st_format import POOLING_MODES
from ..tokenizer import Tokenizer

log = logging.getLogger(__name__)

LONG_TEXT_MODES = ("truncate", "window")


def check_truncate_dim(truncate_dim: int | None, dimension: int) -> int | None:
    """``truncate_dim`` if it is a valid prefix length of ``dimension``-dim vectors (None: no truncation)."""
    if truncate_dim is None:
        return None
    if isinstance(truncate_dim, bool) or not isinstance(truncate_dim, (int, np.integer)) \
            or not 1 <= truncate_dim <= dimension:
        raise InputError(f"the truncate dimension (--truncate-dim) must be an integer from 1 to the model's "
                         f"dimension {dimension}, found {truncate_dim!r}")
    return int(truncate_dim)


class Embedder:
    """Text -> vector. ``Embedder.from_pretrained()`` uses the default model and its own pooling.

    ``dtype``: "fp32" (exact: equal to the plain path and to sentence-transformers within 1e-5),
    "bf16" (bf16 matrix products, fp32 LayerNorm/softmax/pooling), "auto" (bf16 where the CPU
    has native bf16 matrix instructions, else fp32), or "int8" (int8 linear layers, opt-in, not exact:
    ``quantization`` then holds the accuracy guard's measure, ``encoderkit.quantization``). ``long_text``: "truncate" (with a warning) or
    "window" (overlapping windows of ``max_length`` tokens, their embeddings averaged by length).
    ``truncate_dim``: keep the first N dimensions of each vector (a model trained with a Matryoshka loss
    keeps most of its quality in them); see ``encode`` for how it combines with normalisation.
    ``device``: "cpu" (the default, where the model is), "cuda" or "cuda:N"; the vectors come back on the CPU
    either way. On a GPU, "auto" means bf16 where the GPU has it (Ampere on), int8 is not offered, and batches
    hold ``precision.GPU_BUDGET_FACTOR`` times the CPU's tokens.
    """

    def __init__(self, model: EncoderModel, tokenizer: Tokenizer, *, pooling: str = "mean", normalize: bool = False,
                 max_length: int | None = None, dtype: str | torch.dtype = "fp32", token_budget: int | None = None,
                 long_text: str = "truncate", window_stride: int | None = None,
                 truncate_dim: int | None = None, device: str | torch.device | None = None,
                 prompt: str | None = None, prompt_name: str | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None) -> None:
        if pooling not in POOLING_MODES:
            raise InputError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        if long_text not in LONG_TEXT_MODES:
            raise InputError(f"long_text must be one of {LONG_TEXT_MODES}, found {long_text!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        self.max_length = min(max_length or tokenizer.model_max_length, model.config.max_sequence_length)
        if self.max_length < 3:
            raise InputError(f"max_length must leave room for text between the special tokens, found {max_length}")
        if token_budget is not None and token_budget < self.max_length:
            raise InputError(f"token_budget ({token_budget}) must be at least max_length ({self.max_length})")
        self.engine = engine_for(model, dtype, "embed", token_budget, tokenizer=tokenizer, device=device)
        self.dtype = self.engine.precision.dtype
        self.quantization = self.engine.quantization  # int8: the accuracy guard's QuantizationReport
        self.token_budget = self.engine.precision.token_budget
        self.long_text = long_text
        self.window_stride = window_stride if window_stride is not None else self.max_length // 4
        self.truncate_dim = check_truncate_dim(truncate_dim, model.config.hidden_size)
        # The model's named prompts (config_sentence_transformers.json) and the one every text gets by default.
        self.prompts = dict(prompts or {})
        self.default_prompt_name = default_prompt_name
        # Prepended to every text before tokenising, as sentence-transformers' prompt= ("query: ", ...): a prompt
        # given here, else the named one, else the model's default prompt.
        self.prompt = self.prompt_of(prompt, prompt_name) or None

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, pooling: str | None = None,
                        normalize: bool | None = None, max_length: int | None = None, allow_pickle: bool = False,
                        **options) -> "Embedder":
        """``allow_pickle``: read a pytorch_model.bin (weights only) where there is no safetensors file."""
        from ..modeling.models import load_model

        resolved = resolve_model(path)
        refuse_other_kinds(resolved.root)
        model = load_model(resolved, task="base", allow_pickle=allow_pickle)
        tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
        info = resolved.sentence_transformer
        return cls(
            model, tokenizer,
            pooling=pooling or (info.pooling if info else "mean"),
            normalize=normalize if normalize is not None else bool(info and info.normalize),
            max_length=max_length or (info.max_seq_length if info else None),
            prompts=info.prompts if info else None, default_prompt_name=info.default_prompt_name if info else None,
            **options,
        )

    def prompt_of(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """The text to prepend (``choose_prompt``)."""
        return choose_prompt(self.prompts, self.default_prompt_name, prompt, prompt_name)

    @property
    def dimension(self) -> int:
        """The length of the vectors ``encode`` returns: the truncate dimension when one is set."""
        return self.truncate_dim or self.model.config.hidden_size

    def _tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
        """Token ids per piece, type ids per piece, and the text each piece belongs to."""
        stride = self.window_stride if self.long_text == "window" else 0
        if self.long_text == "window" and not 0 <= stride < self.max_length - 2:
            raise InputError(f"window_stride must be between 0 and max_length - 3, found {stride}")
        encodings = self.tokenizer.encode_raw(texts, max_length=self.max_length, stride=stride)
        ids, types, owner = [], [], []
        truncated = 0
        for index, enc in enumerate(encodings):
            ids.append(enc.ids)
            types.append(enc.type_ids)
            owner.append(index)
            if enc.overflowing:
                if self.long_text == "window":
                    for piece in enc.overflowing:
                        ids.append(piece.ids)
                        types.append(piece.type_ids)
                        owner.append(index)
                else:
                    truncated += 1
        if truncated:
            log.warning("%d of %d texts are longer than %d tokens and were truncated "
                        "(long_text='window' embeds them whole)", truncated, len(texts), self.max_length)
        return ids, types, np.asarray(owner, dtype=np.int64)

    def encode(self, texts: Sequence[str] | str, *, batch_size: int = MAX_BATCH_SIZE, normalize: bool | None = None,
               convert_to: str = "numpy", progress: Callable[[int], None] | None = None,
               truncate_dim: int | None = None, lanes: int | None = None, prompt: str | None = None,
               prompt_name: str | None = None) -> np.ndarray | torch.Tensor:
        """Embed texts, returned in input order: float32 array (or tensor) of shape (len(texts), dimension).

        ``batch_size`` caps the sequences per batch; the token budget sets the batch in tokens.
        ``truncate_dim`` (default: the embedder's) keeps the first N dimensions, in sentence-transformers'
        order of steps so that the vectors equal ``SentenceTransformer(..., truncate_dim=N).encode``: the
        model's own normalisation (``normalize=None``: the embedder's, sentence-transformers' Normalize
        module) applies to the full vector *before* the cut, so truncated vectors are then not of unit
        length; ``normalize=True`` (sentence-transformers' ``normalize_embeddings``) also normalises after
        the cut; ``normalize=False`` normalises nowhere.
        ``lanes``: the batches run on that many threads, sharing torch's threads, rather than on this thread with
        all of them (``Engine.in_lanes``); the same vectors. torch's thread count is process-wide, so the lanes
        change it while they run: the default (None) takes two lanes only where this is the only Python thread
        (``engine.owns_process``: a script or a job, not a server or a notebook), else one; ``lanes=1`` never
        changes it. Two lanes outran one lane of two threads on 2 CPUs (bench/peers.py, BENCHMARKS.md).
        ``prompt`` / ``prompt_name``: for this call, as sentence-transformers' ``encode`` takes them (``prompt_of``);
        neither: the embedder's prompt.
        """
        single = isinstance(texts, str)
        if single:
            texts = [texts]
        if batch_size <= 0:
            raise InputError(f"batch_size must be positive, found {batch_size}")
        if convert_to not in ("numpy", "torch"):
            raise InputError(f"convert_to must be 'numpy' or 'torch', found {convert_to!r}")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"texts[{index}] must be a string, found {type(text).__name__}")
        truncate_dim = self.truncate_dim if truncate_dim is None else \
            check_truncate_dim(truncate_dim, self.model.config.hidden_size)
        if not len(texts):
            out = torch.zeros(0, self.model.config.hidden_size, dtype=torch.float32)
        else:
            chosen = self.prompt if prompt is None and prompt_name is None else self.prompt_of(prompt, prompt_name)
            ids, types, owner = self._tokenize(texts if not chosen else [chosen + t for t in texts])
            if len(ids) > len(texts):  # a text's windows are averaged, weighted by their token counts
                pieces = self.encode_tokens(ids, types, batch_size=batch_size, lanes=lanes)
                rows = torch.from_numpy(owner)
                weights = torch.tensor([len(piece) for piece in ids], dtype=torch.float32)
                totals = torch.zeros(len(texts), dtype=torch.float32).index_add_(0, rows, weights)
                out = torch.zeros(len(texts), pieces.shape[1], dtype=torch.float32)
                out = out.index_add_(0, rows, pieces * weights[:, None]) / totals[:, None]
            else:
                out = self.encode_tokens(ids, types, batch_size=batch_size, progress=progress, lanes=lanes)
            if self.normalize if normalize is None else normalize:  # the model's normalisation: the full vector
                out = unit_rows(out)
        if truncate_dim is not None and truncate_dim < out.shape[1]:
            out = out[:, :truncate_dim].clone()  # a copy: the full vectors are freed
            if normalize and len(texts):  # normalize_embeddings: unit length after the cut
                out = unit_rows(out)
        result = out[0] if single else out
        return result.numpy() if convert_to == "numpy" else result

    def encode_tokens(self, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None, *,
                      batch_size: int | None = None, progress: Callable[[int], None] | None = None,
                      lanes: int = 1) -> torch.Tensor:
        """Pooled, unnormalised vectors of sequences tokenised by the caller (one row each, in input order):
        for a caller that tokenises anyway (the server counts tokens and checks lengths before queueing)."""
        return self.engine.pooled(ids, types, pooling=self.pooling, max_batch_size=batch_size, progress=progress,
                                  lanes=lanes)


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row over its L2 norm (at least 1e-12): ``F.normalize(x, p=2, dim=1)``'s numbers, in fewer steps (a
    served text's vector is normalised after the encoder's weights have passed through the caches, where each step
    costs several times what it costs alone)."""
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min_(1e-12)


def refuse_other_kinds(root: Path) -> None:
    """An InputError where ``root`` holds a sparse (SPLADE) or multi-vector (ColBERT) model, whose texts are not one
    pooled vector: pooling its encoder's states would give vectors it was never trained to give."""
    from ..io.st_format import is_multi_vector_dir, is_sparse_encoder

    if is_sparse_encoder(root):
        raise InputError(f"{root} is a sparse (SPLADE) encoder: it gives term weights, not one dense vector; use "
                         "SparseEmbedder, `encoderkit index --kind sparse` or the server's /embed_sparse")
    if is_multi_vector_dir(root):
        raise InputError(f"{root} is a multi-vector (ColBERT) model: it gives a vector per token, not one per text; "
                         "use MultiVectorEmbedder, `encoderkit index --kind multi-vector` or the server's /embed_all")


def choose_prompt(prompts: dict[str, str], default_prompt_name: str | None, prompt: str | None,
                  prompt_name: str | None) -> str | None:
    """The text to prepend, by sentence-transformers' rule: ``prompt`` if given, else the prompt called
    ``prompt_name``, else the default prompt (None: none). Every encoder with prompts (dense, sparse) uses it."""
    if prompt is not None:
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, found {type(prompt).__name__}")
        return prompt
    if prompt_name is not None:
        return pick_prompt(prompts, prompt_name)
    return prompts.get(default_prompt_name) if default_prompt_name else None


def pick_prompt(prompts: dict[str, str], name: str) -> str:
    """The text of the prompt called ``name``; InputError listing the model's prompts where there is none."""
    if name not in prompts:
        raise InputError(f"this model defines no prompt named {name!r}; its prompts: "
                         f"{', '.join(f'{k} ({v!r})' for k, v in prompts.items()) or 'none'} "
                         "(config_sentence_transformers.json), or give the text with --prompt")
    return prompts[name]


def prompt_options(prompt: str | None, prompt_name: str | None) -> dict[str, str]:
    """The ``encode`` keywords for a prompt given as text or name, only those set: callers that take any object
    with an ``encode`` (evaluators, mining) keep working with ones that know no prompts."""
    return {key: value for key, value in (("prompt", prompt), ("prompt_name", prompt_name)) if value is not None}


def named_prompt(model: str | Path | None, name: str) -> str:
    """The text of the prompt ``model`` calls ``name`` (its config_sentence_transformers.json), for commands that
    hand the text on (files, Ray actors)."""
    from ..io.st_format import read_prompts

    return pick_prompt(read_prompts(resolve_model(model).root)[0], name)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
    return a @ b.T


# ---------------------------------------------------------------------------------------------
# Embedding a file: streamed, bounded memory, resumable, never a half-written output.
# ---------------------------------------------------------------------------------------------
@dataclass
class EmbedResult:
    path: Path
    ids_path: Path
    rows: int
    dimension: int
    resumed_from: int = 0


def _output_paths(out_path: Path) -> tuple[Path, Path, Path, Path]:
    ids_path = out_path.with_suffix(".ids.txt")
    return ids_path, out_path.with_name(out_path.name + ".partial"), \
        ids_path.with_name(ids_path.name + ".partial"), out_path.with_name(out_path.name + ".progress.json")


def embed_file(input_path: str | Path, out_path: str | Path, *, model: str | Path | None = None,
               fmt: str | None = None, text_field: str | None = None, id_field: str | None = None,
               chunk_size: int = 4096, resume: bool = True, embedder: Embedder | None = None,
               show_progress: bool = True, lanes: int | None = None, **embedder_options) -> EmbedResult:
    """Embed every record of a text/JSONL/CSV file into ``out_path`` (float32 .npy) and its ids
    (``<out>.ids.txt``), ``chunk_size`` records at a time.

    Rows go to ``<out>.partial`` (a memory-mapped .npy) and the ids to ``<out>.ids.txt.partial``;
    after every chunk ``<out>.progress.json`` records how many rows are safely written. A run that
    is interrupted continues from there (``resume=True``); only a finished run renames the partial
    files to their final names, so the output path never holds a half-written file. ``lanes``: see
    ``Embedder.encode`` (``encoderkit embed`` runs two where torch has two threads or more).
    """
    from ..data.readers import count_records, iter_records
    from ..progress import Progress

    input_path, out_path = Path(input_path), Path(out_path)
    if out_path.suffix != ".npy":
        raise InputError(f"--out must name a .npy file, found {out_path.name!r}")
    if not out_path.parent.is_dir():
        raise InputError(f"output directory does not exist: {out_path.parent}")
    if chunk_size <= 0:
        raise InputError(f"chunk_size must be positive, found {chunk_size}")
    reader_options = dict(fmt=fmt, text_field=text_field, id_field=id_field)
    total = count_records(input_path, **reader_options)
    if total == 0:
        raise DataError(f"{input_path} holds no records to embed")
    embedder = embedder or Embedder.from_pretrained(model, **embedder_options)
    ids_path, partial, ids_partial, progress_path = _output_paths(out_path)
    stat = input_path.stat()
    signature = {"input": str(input_path.resolve()), "size": stat.st_size, "mtime": stat.st_mtime_ns,
                 "rows": total, "settings": vector_settings(embedder)}

    done = 0
    if resume and progress_path.is_file() and partial.is_file() and ids_partial.is_file():
        done = _resumable_rows(json.loads(progress_path.read_text(encoding="utf-8")), signature, out_path)
    if done:
        vectors = np.lib.format.open_memmap(partial, mode="r+")
        _truncate_lines(ids_partial, done)
    else:
        vectors = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(total, embedder.dimension))
        ids_partial.write_text("", encoding="utf-8")

    records = iter_records(input_path, **reader_options)
    for _ in range(done):
        next(records)
    with Progress(total, "embedding", "texts", enabled=show_progress) as progress, \
            open(ids_partial, "a", encoding="utf-8") as ids_handle:
        progress.skip(done)
        row = done
        while row < total:
            chunk = [record for _, record in zip(range(chunk_size), records)]
            if not chunk:
                break
            vectors[row:row + len(chunk)] = embedder.encode([r.text for r in chunk], lanes=lanes)
            ids_handle.write("".join(r.id.replace("\n", " ") + "\n" for r in chunk))
            row += len(chunk)
            vectors.flush()
            ids_handle.flush()
            os.fsync(ids_handle.fileno())
            _write_atomically(progress_path, json.dumps({"signature": signature, "done": row}))
            progress.advance(len(chunk))
    del vectors
    partial.replace(out_path)
    ids_partial.replace(ids_path)
    progress_path.unlink(missing_ok=True)
    return EmbedResult(out_path, ids_path, total, embedder.dimension, resumed_from=done)


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of every tensor of ``model``'s state (names, dtypes, shapes and bytes): the identity of the weights
    that a partial run's rows were computed with, whatever directory they were loaded from."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def vector_settings(embedder: Embedder) -> dict[str, object]:
    """Everything that changes the vectors ``embedder`` writes: the weights, precision, pooling, normalisation,
    truncation (length, long-text windows, dimension) and the prompt. Rows written under other settings must not
    be mixed with new ones, so a resume compares these."""
    return {"model": str(embedder.model.config.model_type), "weights": weights_digest(embedder.model),
            "dimension": embedder.dimension, "dtype": _precision_name(embedder),
            "pooling": embedder.pooling, "normalize": bool(embedder.normalize), "max_length": embedder.max_length,
            "long_text": embedder.long_text, "window_stride": embedder.window_stride,
            "truncate_dim": embedder.truncate_dim, "prompt": getattr(embedder, "prompt", None)}


def _precision_name(embedder: Embedder) -> str:
    """fp32, bf16 or int8 (with the layers int8 keeps in fp32, which change its vectors too)."""
    precision = embedder.engine.precision
    kept = f" fp32_layers={','.join(precision.fp32_layers)}" if precision.int8 and precision.fp32_layers else ""
    return precision.name + kept


def _resumable_rows(state: dict, signature: dict, out_path: Path) -> int:
    """The rows an earlier run wrote that this run may keep: all of them where the input and the settings are the
    same; none where the input changed (the partial rows belong to another file: start over). Settings that changed
    are refused: the rows written so far would be mixed with vectors of another kind."""
    earlier = state.get("signature") or {}
    same_input = all(earlier.get(key) == signature[key] for key in ("input", "size", "mtime", "rows"))
    if not same_input or "settings" not in earlier:
        log.warning("%s: the partial run was made from another input (or by an older encoderkit); starting over",
                    out_path)
        return 0
    changed = [f"{key} {earlier['settings'].get(key)!r} -> {value!r}"
               for key, value in signature["settings"].items() if earlier["settings"].get(key) != value]
    if changed:
        raise InputError(f"{out_path} has a partial run of {int(state.get('done', 0)):,} rows made with other "
                         f"settings ({'; '.join(changed)}); resuming would mix two kinds of vectors. Rerun with the "
                         "same settings to resume, or pass --restart (resume=False) to start over")
    done = int(state["done"])
    log.warning("resuming %s: %d of %d rows were already written", out_path, done, signature["rows"])
    return done


def _truncate_lines(path: Path, keep: int) -> None:
    with open(path, "rb") as handle:
        lines = handle.readlines()[:keep]
    with open(path, "wb") as handle:
        handle.writelines(lines)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
