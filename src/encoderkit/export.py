"""Exporting a model directory to other runtimes. One format so far: ONNX.

``export_onnx`` writes a copy of the model directory (config.json, tokenizer files and, for an embedder, the
sentence-transformers module files) with the graph at ``onnx/model.onnx``, where sentence-transformers'
ONNX backend (``SentenceTransformer(dir, backend="onnx")``) and Optimum's ``ORTModel*`` classes look for it,
and with ``int8=True`` a dynamically quantised copy beside it, ``onnx/model_qint8.onnx``.

The graph is the same model code as every other job, with the encoder's ``traceable`` switch on: one padded
(batch, length) grid with an additive padding mask, and sliding windows as a mask over the full grid, so that
no shape or branch depends on the input's values and the batch and sequence axes stay dynamic.

The exporter is torch's TorchScript-based one (``torch.onnx.export(..., dynamo=False)``): it records the
dynamic axes as named ``dynamic_axes`` and needs no onnxscript. The torch.export-based exporter, torch's
default since 2.9, gives the same graph numerically but exports an order of magnitude more slowly (which the
tests, exporting some 40 tiny models, would pay), and needs onnxscript.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import CheckpointError, InputError
from .io.hub import resolve_model
from .modeling.packing import pool_padded
from .progress import Progress

log = logging.getLogger(__name__)

FORMATS = ("onnx",)
ONNX_DIR = "onnx"
ONNX_FILE = "model.onnx"
INT8_FILE = "model_qint8.onnx"
OPSET = 17  # LayerNormalization is one op from 17 on; ONNX Runtime 1.14 and later run it
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data")

# What each task's graph returns, and which outputs have a value per token (batch, sequence, ...) rather than
# one per sequence (batch, ...). The base encoder's outputs are chosen in ``OnnxGraph``.
TASK_OUTPUTS = {
    "masked-lm": ("logits",),
    "pretraining": ("logits", "pair_logits"),
    "replaced-token-detection": ("logits",),
    "sequence-classification": ("logits",),
    "token-classification": ("logits",),
    "question-answering": ("start_logits", "end_logits"),
}
_PER_SEQUENCE = {"pooler_output", "sentence_embedding", "pair_logits"}
_PER_SEQUENCE_TASKS = {"sequence-classification", "multitask"}


@dataclass
class ExportResult:
    out_dir: Path
    model_path: Path  # onnx/model.onnx
    int8_path: Path | None  # onnx/model_qint8.onnx, with int8=True
    task: str
    inputs: list[str]
    outputs: list[str]
    max_difference: float  # the largest |ONNX Runtime - encoderkit| over the check batch's real tokens
    files: list[str] = field(default_factory=list)  # everything written, relative to out_dir

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": str(self.out_dir), "model": str(self.model_path),
                "int8_model": None if self.int8_path is None else str(self.int8_path), "task": self.task,
                "inputs": self.inputs, "outputs": self.outputs, "max_difference": self.max_difference}


class OnnxGraph(nn.Module):
    """What is traced: padded ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the model has
    segment embeddings) in, the task's outputs out as a tuple in ``output_names`` order. ``pooling`` (an
    embedder's): the base encoder also returns the pooled ``sentence_embedding``, L2-normalised if
    ``normalize``."""

    def __init__(self, model: nn.Module, pooling: str | None = None, normalize: bool = False) -> None:
        super().__init__()
        self.model = model
        self.task = model.task
        self.pooling, self.normalize = pooling, normalize
        self.input_names = ["input_ids", "attention_mask"]
        if self.encoder.embeddings.token_type is not None and self.encoder.config.type_vocab_size > 1:
            self.input_names.append("token_type_ids")  # one segment (RoBERTa): its embedding is a constant
        if self.task == "base":
            self.output_names = ["last_hidden_state"]
            if self.encoder.pooler is not None:
                self.output_names.append("pooler_output")
            if pooling is not None:
                self.output_names.append("sentence_embedding")
        elif self.task == "multitask":
            self.output_names = [f"logits_{name}" for name in model.head_names]
        elif self.task in TASK_OUTPUTS:
            self.output_names = list(TASK_OUTPUTS[self.task])
        else:
            raise InputError(f"cannot export a {self.task!r} model to ONNX")

    @property
    def encoder(self) -> nn.Module:
        return self.model if self.task == "base" else self.model.encoder

    def per_token(self, name: str) -> bool:
        return name not in _PER_SEQUENCE and self.task not in _PER_SEQUENCE_TASKS

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask, token_type_ids)
        if self.task == "multitask":
            return tuple(out.logits[name] for name in self.model.head_names)
        if self.task != "base":
            return tuple(getattr(out, name) for name in self.output_names)
        results = [out.last_hidden_state]
        if out.pooler_output is not None:
            results.append(out.pooler_output)
        if self.pooling is not None:
            pooled = pool_padded(out.last_hidden_state, attention_mask, self.pooling)
            results.append(torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled)
        return tuple(results)


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise InputError(f"ONNX export needs the {module} package, which is not installed: "
                         "pip install 'encoderkit[onnx]'") from exc


def check_format(format: str) -> str:
    if format not in FORMATS:
        raise InputError(f"unknown export format {format!r}; choose one of: {', '.join(FORMATS)}")
    return format


def export_model(model: str | Path | None, out_dir: str | Path, *, format: str = "onnx", **options: Any
                 ) -> ExportResult:
    """Export the model directory ``model`` (None: the default model) to ``format`` under ``out_dir``
    (see ``export_onnx`` for the options)."""
    check_format(format)
    return export_onnx(model, out_dir, **options)


def export_onnx(model: str | Path | None, out_dir: str | Path, *, int8: bool = False, overwrite: bool = False,
                task: str | None = None, opset: int = OPSET, progress: bool = True) -> ExportResult:
    """Export a model directory to ONNX, with dynamic batch and sequence axes.

    ``out_dir`` must not exist or be empty, unless ``overwrite`` (then it is replaced once the export has
    succeeded). ``task``: the head to export (default: the one config.json names). ``int8``: also write a
    dynamically quantised copy (int8 weights, per output channel). The export is checked: ONNX Runtime runs a
    batch of another size and length than the one traced, and the largest difference from encoderkit's own
    outputs is returned (``max_difference``)."""
    from .modeling.models import load_model

    for module in ("onnx", "onnxruntime"):
        _require(module)
    if opset < 17:
        raise InputError(f"opset must be 17 or later (LayerNormalization), found {opset}")
    resolved = resolve_model(model)
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir, resolved.root, overwrite)
    loaded = load_model(resolved, task=task, dtype=torch.float32)  # ONNX Runtime's CPU kernels are fp32
    info = resolved.sentence_transformer
    pooling = info.pooling if info is not None and loaded.task == "base" else None
    graph = OnnxGraph(loaded, pooling, bool(info and info.normalize)).eval()
    if loaded.task == "token-classification" and getattr(loaded, "crf", None) is not None:
        log.warning("this tagger decodes with a CRF; the ONNX graph returns the per-token scores (emissions) "
                    "before the CRF's Viterbi decoding")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"  # renamed to out_dir once complete
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with Progress(3 if int8 else 2, "export onnx", unit="steps", enabled=progress) as bar:
            files = _copy_model_files(resolved.root, resolved.weights_dir, staging)
            onnx_dir = staging / resolved.weights_dir.relative_to(resolved.root) / ONNX_DIR
            onnx_dir.mkdir(parents=True, exist_ok=True)
            _trace(graph, onnx_dir / ONNX_FILE, opset)
            bar.advance()
            difference = _check(graph, onnx_dir / ONNX_FILE)
            bar.advance()
            if int8:
                quantize_int8(onnx_dir / ONNX_FILE, onnx_dir / INT8_FILE)
                bar.advance()
        if difference > 1e-4:
            log.warning("ONNX Runtime's outputs differ from encoderkit's by up to %.3g", difference)
        relative_onnx = onnx_dir.relative_to(staging)
        written = files + [str(relative_onnx / ONNX_FILE)] + ([str(relative_onnx / INT8_FILE)] if int8 else [])
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    onnx_dir = out_dir / relative_onnx
    return ExportResult(out_dir, onnx_dir / ONNX_FILE, onnx_dir / INT8_FILE if int8 else None, loaded.task,
                        list(graph.input_names), list(graph.output_names), difference, sorted(written))


def _check_out_dir(out_dir: Path, model_root: Path, overwrite: bool) -> None:
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file; name a new or empty directory")
    target, source = out_dir.resolve(), model_root.resolve()
    if target == source or target in source.parents:
        raise InputError(f"--out {out_dir} holds the model being exported; name another directory")
    if any(out_dir.iterdir()) and not overwrite:
        raise InputError(f"--out {out_dir} exists and is not empty; name a new directory, or pass --overwrite "
                         "(overwrite=True) to replace it")


def _copy_model_files(root: Path, weights_dir: Path, destination: Path) -> list[str]:
    """The model directory without its weights: config.json, the tokenizer files, a README, and the
    sentence-transformers files (modules.json, its settings, and every module directory but the transformer's,
    copied whole: a Dense module keeps its weights)."""
    copied = []

    def copy_files(source: Path) -> None:
        target = destination / source.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(source.iterdir()):
            if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(path, target / path.name)
                copied.append(str((target / path.name).relative_to(destination)))

    copy_files(root)
    if weights_dir != root:
        copy_files(weights_dir)
    if (root / "modules.json").is_file():
        for module in json.loads((root / "modules.json").read_text(encoding="utf-8")):
            path = str(module.get("path", ""))
            source = root / path
            if path and source.is_dir() and source.resolve() != weights_dir.resolve():
                shutil.copytree(source, destination / path, dirs_exist_ok=True)
                copied.extend(str(p.relative_to(destination)) for p in (destination / path).rglob("*") if p.is_file())
    if not (destination / weights_dir.relative_to(root) / "config.json").is_file():
        raise CheckpointError(f"{weights_dir} has no config.json to copy beside the ONNX graph")
    return copied


def example_inputs(graph: OnnxGraph, batch: int, lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch of random token ids: rows of the given real lengths, padding with pad_token_id, and
    segment ids (the second half of each row in segment 1, where the model has two segments)."""
    config = graph.encoder.config
    length = max(lengths)
    generator = torch.Generator().manual_seed(seed)
    low = min(5, config.vocab_size - 1)
    ids = torch.randint(low, config.vocab_size, (batch, length), generator=generator)
    mask = torch.zeros(batch, length, dtype=torch.long)
    types = torch.zeros(batch, length, dtype=torch.long)
    for row, real in enumerate(lengths):
        mask[row, :real] = 1
        ids[row, real:] = config.pad_token_id
        if config.type_vocab_size > 1:
            types[row, real // 2:real] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in graph.input_names:
        inputs["token_type_ids"] = types
    return inputs


def _trace(graph: OnnxGraph, path: Path, opset: int) -> None:
    limit = graph.encoder.config.max_sequence_length
    example = example_inputs(graph, 2, [min(8, limit), min(5, limit)])
    axes = {name: {0: "batch", 1: "sequence"} for name in graph.input_names}
    for name in graph.output_names:
        axes[name] = {0: "batch", 1: "sequence"} if graph.per_token(name) else {0: "batch"}
    graph.encoder.traceable = True
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings on the length check; the exporter's deprecation note
            torch.onnx.export(graph, tuple(example[name] for name in graph.input_names), str(path), dynamo=False,
                              input_names=graph.input_names, output_names=graph.output_names, dynamic_axes=axes,
                              opset_version=opset, do_constant_folding=True)
    finally:
        graph.encoder.traceable = False


def onnx_session(path: str | Path) -> Any:
    """An ONNX Runtime session for an exported graph, on CPU."""
    ort = _require("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_onnx(graph: str | Path | Any, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Run an exported graph (a path, or an ``onnx_session``) with ONNX Runtime: its outputs by name. ``inputs``
    may hold more than the graph takes (``token_type_ids`` for a model without segments): what it does not take
    is left out; segment ids it takes and did not get are zeros."""
    session = onnx_session(graph) if isinstance(graph, (str, Path)) else graph
    wanted = {item.name for item in session.get_inputs()}
    feed = {name: np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, dtype=np.int64)
            for name, value in inputs.items() if name in wanted}
    if "token_type_ids" in wanted and "token_type_ids" not in feed:
        feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
    names = [item.name for item in session.get_outputs()]
    return dict(zip(names, session.run(names, feed)))


def _check(graph: OnnxGraph, path: Path) -> float:
    """The largest difference between ONNX Runtime and encoderkit (its usual, unpadded path) on a batch of
    another size and length than the traced one, over the real tokens."""
    limit = graph.encoder.config.max_sequence_length
    lengths = [min(n, limit) for n in (11, 3, 7)]
    inputs = example_inputs(graph, 3, lengths, seed=1)
    with torch.no_grad():
        expected = graph(*(inputs[name] for name in graph.input_names))
    got = run_onnx(path, inputs)
    real = inputs["attention_mask"].bool().numpy()
    worst = 0.0
    for name, want in zip(graph.output_names, expected):
        want, have = want.numpy(), got[name]
        if graph.per_token(name):
            want, have = want[real], have[real]
        worst = max(worst, float(np.abs(want - have).max()) if want.size else 0.0)
    return worst


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation with ONNX Runtime: int8 weights (one scale per output channel where the
    operator allows it), activations quantised on the fly, per batch. On all-MiniLM-L6-v2 the sentence vectors
    keep a cosine of 0.992 to fp32 on average (2,000 sentences of ../shared/bench: 1st percentile 0.981, lowest
    0.970); one scale per matrix instead of per channel dropped the average to 0.958 (the first 200)."""
    _require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    if not log.isEnabledFor(logging.DEBUG):  # its advice (pre-process the graph first) is printed on the root logger
        root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(str(source), str(target), per_channel=True, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


__all__ = ["ExportResult", "FORMATS", "INT8_FILE", "ONNX_DIR", "ONNX_FILE", "OnnxGraph", "check_format",
           "example_inputs", "export_model", "export_onnx", "onnx_session", "quantize_int8", "run_onnx"]
