"""The sentence-transformers directory format, read and written.

A sentence-transformers model is an HF model directory (config.json, model.safetensors and the tokenizer
files at the top level) with these files beside it:

    modules.json                       the pipeline: Transformer (path ""), Pooling, Normalize (if normalising)
    sentence_bert_config.json          {"max_seq_length": N, "do_lower_case": false}
    1_Pooling/config.json              the dimension and one pooling mode
    2_Normalize/                       empty: the module has no settings
    config_sentence_transformers.json  versions, prompts and the similarity function

The writer uses the key names of sentence-transformers 2 to 5 (``word_embedding_dimension``, one
``pooling_mode_*`` flag per mode, ``sentence_transformers.models.*`` module types): every version loads
them, version 6 included (it converts them without a warning), while version 6's own keys
(``embedding_dimension``, ``pooling_mode: "mean_sqrt_len_tokens"``) fail to load in earlier versions.
The reader takes both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError, InputError
from ..modeling.packing import POOLING

# encoderkit's pooling name -> (sentence-transformers 2-5 flag, sentence-transformers 6 ``pooling_mode``).
# In sentence-transformers' order: the order a version-5 config lists its flags in.
_ST_POOLING = {
    "cls": ("pooling_mode_cls_token", "cls"),
    "mean": ("pooling_mode_mean_tokens", "mean"),
    "max": ("pooling_mode_max_tokens", "max"),
    "mean_sqrt_len": ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
    "weightedmean": ("pooling_mode_weightedmean_tokens", "weightedmean"),
}
_UNSUPPORTED_FLAGS = {"pooling_mode_lasttoken": "lasttoken"}  # a decoder's pooling; written as false
POOLING_MODES = POOLING  # the modes encoderkit pools by (modeling.packing); each has its sentence-transformers flag
assert set(_ST_POOLING) == set(POOLING_MODES)

POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
MODULE_TYPE = "sentence_transformers.models.{}"
CONFIG_FILE = "config_sentence_transformers.json"  # versions, prompts, the similarity function


@dataclass(frozen=True)
class SentenceTransformerInfo:
    """What a sentence-transformers directory says about turning token states into one vector."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    dimension: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)  # config_sentence_transformers.json: name -> prefix
    default_prompt_name: str | None = None  # the prompt every text gets unless told otherwise


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


def _write_json(path: Path, value: Any, **options: Any) -> None:
    path.write_text(json.dumps(value, indent=2, **options) + "\n", encoding="utf-8")


def read_sentence_transformer(root: Path) -> tuple[Path, SentenceTransformerInfo]:
    """The directory holding the transformer's weights, and the pooling that follows it, from modules.json."""
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list):
        raise ConfigError(f"{root / 'modules.json'} must be a list of modules")
    weights_dir = root
    pooling, normalize, dimension = "cls", False, None
    max_seq_length = None
    for module in modules:
        kind = str(module.get("type", ""))
        module_dir = root / module.get("path", "")
        if kind.endswith(".Transformer"):
            weights_dir = module_dir
            bert_config = module_dir / "sentence_bert_config.json"
            if not bert_config.is_file():
                bert_config = root / "sentence_bert_config.json"
            if bert_config.is_file():
                max_seq_length = _read_json(bert_config).get("max_seq_length")
        elif kind.endswith(".Pooling"):
            pooling_config = _read_json(module_dir / "config.json")
            pooling = pooling_mode(pooling_config)
            dimension = pooling_config.get("word_embedding_dimension", pooling_config.get("embedding_dimension"))
        elif kind.endswith(".Normalize"):
            normalize = True
    prompts, default_prompt_name = read_prompts(root)
    return weights_dir, SentenceTransformerInfo(pooling, normalize, max_seq_length, dimension, prompts,
                                                default_prompt_name)


def read_prompts(root: Path) -> tuple[dict[str, str], str | None]:
    """``prompts`` and ``default_prompt_name`` of a directory's config_sentence_transformers.json (none: {}, None);
    a default that names no prompt, or prompts that are not strings, are a ConfigError."""
    path = root / CONFIG_FILE
    if not path.is_file():
        return {}, None
    config = _read_json(path)
    prompts = config.get("prompts") or {}
    default = config.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError(f"{path}: prompts must map names to strings, found {prompts!r}")
    if default is not None and default not in prompts:
        raise ConfigError(f"{path}: default_prompt_name {default!r} is not among its prompts "
                          f"({', '.join(prompts) or 'none'})")
    return dict(prompts), default


def pooling_mode(config: dict) -> str:
    """encoderkit's name for the one pooling mode a Pooling config.json selects (any version's keys)."""
    if "pooling_mode" in config:
        chosen = config["pooling_mode"]
        chosen = [chosen] if isinstance(chosen, str) else list(chosen)
        by_st_name = {st_name: mode for mode, (_, st_name) in _ST_POOLING.items()}
        chosen = [by_st_name.get(str(mode).lower(), str(mode).lower()) for mode in chosen]
    else:
        flags = {flag: mode for mode, (flag, _) in _ST_POOLING.items()} | _UNSUPPORTED_FLAGS
        chosen = [mode for flag, mode in flags.items() if config.get(flag)]
    if len(chosen) != 1:
        raise ConfigError(f"pooling config selects {chosen or 'no mode'}; encoderkit supports exactly one mode")
    if chosen[0] not in _ST_POOLING:
        raise ConfigError(f"pooling mode {chosen[0]!r} is not supported ({', '.join(POOLING_MODES)})")
    return chosen[0]


def write_sentence_transformer(directory: str | Path, *, pooling: str, normalize: bool, max_seq_length: int,
                               dimension: int, do_lower_case: bool = False,
                               similarity_fn_name: str = "cosine", prompts: dict[str, str] | None = None,
                               default_prompt_name: str | None = None) -> Path:
    """Make an HF model directory (written by ``save_pretrained``) a sentence-transformers one.

    ``pooling`` is one of ``POOLING_MODES``; ``normalize`` adds the L2-normalisation module;
    ``max_seq_length`` is where inputs are truncated, in tokens; ``dimension`` is the hidden size.
    """
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory} has no config.json: save the model there first "
                              "(model.save_pretrained(directory, tokenizer=tokenizer)), then write the "
                              "sentence-transformers files beside it")
    if pooling not in _ST_POOLING:
        raise InputError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
    for name, value in (("max_seq_length", max_seq_length), ("dimension", dimension)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{name} must be a positive integer, found {value!r}")

    modules = [("Transformer", ""), ("Pooling", POOLING_DIR)] + ([("Normalize", NORMALIZE_DIR)] if normalize else [])
    _write_json(directory / "modules.json", [
        {"idx": index, "name": str(index), "path": path, "type": MODULE_TYPE.format(kind)}
        for index, (kind, path) in enumerate(modules)
    ])
    _write_json(directory / "sentence_bert_config.json",
                {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case})
    (directory / POOLING_DIR).mkdir(exist_ok=True)
    flags = {flag: mode == pooling for mode, (flag, _) in _ST_POOLING.items()}
    _write_json(directory / POOLING_DIR / "config.json", {
        "word_embedding_dimension": dimension, **flags, **dict.fromkeys(_UNSUPPORTED_FLAGS, False),
        "include_prompt": True,
    })
    if normalize:
        (directory / NORMALIZE_DIR).mkdir(exist_ok=True)
    _write_json(directory / CONFIG_FILE, {
        "__version__": _versions(), "default_prompt_name": default_prompt_name, "model_type": "SentenceTransformer",
        "prompts": dict(prompts or {}), "similarity_fn_name": similarity_fn_name,
    }, sort_keys=True)
    return directory


# ----- sentence-transformers' SparseEncoder (SPLADE): the MLM model at the top level, then SpladePooling
SPLADE_POOLING_DIR = "1_SpladePooling"
_SPARSE_MODULE_TYPE = "sentence_transformers.sparse_encoder.models.{}"  # the names sentence-transformers 5 writes
_SPARSE_UNSUPPORTED = ("SparseStaticEmbedding", "Router", "SparseAutoEncoder", "Asym", "Dense")


@dataclass(frozen=True)
class SparseEncoderInfo:
    """What a SparseEncoder directory says about turning MLM logits into one sparse vector."""

    pooling: str = "max"
    activation: str = "relu"
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None


def is_multi_vector_dir(root: str | Path) -> bool:
    """Whether ``root`` is a PyLate (ColBERT) directory: a projection module after the Transformer in modules.json,
    and no pooling."""
    path = Path(root) / "modules.json"
    if not path.is_file():
        return False
    try:
        kinds = [str(module.get("type", "")) for module in json.loads(path.read_text("utf-8"))]
    except (OSError, ValueError, AttributeError):
        return False
    return any(kind.endswith(".Dense") for kind in kinds) and not any(kind.endswith(".Pooling") for kind in kinds)


def is_sparse_encoder(root: Path) -> bool:
    """Whether ``root``'s modules.json describes a SparseEncoder (a SpladePooling module)."""
    path = root / "modules.json"
    if not path.is_file():
        return False
    modules = _read_json(path)
    return isinstance(modules, list) and any(str(m.get("type", "")).endswith(".SpladePooling") for m in modules)


def read_sparse_encoder(root: Path) -> SparseEncoderInfo:
    """The SPLADE settings of a SparseEncoder directory (sentence-transformers 5's or 6's files). Modules encoderkit
    does not run (inference-free query encoders, CSR autoencoders) are a ConfigError naming them."""
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list):
        raise ConfigError(f"{root / 'modules.json'} must be a list of modules")
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    unsupported = [kind for kind in kinds if kind in _SPARSE_UNSUPPORTED]
    if unsupported or "SpladePooling" not in kinds:
        raise ConfigError(f"{root}: encoderkit runs SparseEncoders of an MLM transformer and SpladePooling; this one "
                          f"has {', '.join(kinds)}")
    pooling, activation, max_seq_length = "max", "relu", None
    for module, kind in zip(modules, kinds):
        module_dir = root / module.get("path", "")
        if kind == "SpladePooling":
            config = _read_json(module_dir / "config.json") if (module_dir / "config.json").is_file() else {}
            pooling = config.get("pooling_strategy", pooling)
            activation = config.get("activation_function", activation)
        elif kind in ("MLMTransformer", "Transformer"):
            bert_config = module_dir / "sentence_bert_config.json"
            if bert_config.is_file():
                max_seq_length = _read_json(bert_config).get("max_seq_length")
    prompts, default_prompt_name = read_prompts(root)
    return SparseEncoderInfo(pooling, activation, max_seq_length, prompts, default_prompt_name)


def write_sparse_encoder(directory: str | Path, *, pooling: str, activation: str, max_seq_length: int,
                         prompts: dict[str, str] | None = None, default_prompt_name: str | None = None) -> Path:
    """Make an HF masked-LM directory (written by ``save_pretrained``) a sentence-transformers SparseEncoder one:
    modules.json (MLMTransformer, SpladePooling), their settings, and config_sentence_transformers.json (dot
    product similarity, the SparseEncoder's)."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory} has no config.json: save the MLM model there first")
    _write_json(directory / "modules.json", [
        {"idx": index, "name": str(index), "path": path, "type": _SPARSE_MODULE_TYPE.format(kind)}
        for index, (kind, path) in enumerate((("MLMTransformer", ""), ("SpladePooling", SPLADE_POOLING_DIR)))])
    _write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    (directory / SPLADE_POOLING_DIR).mkdir(exist_ok=True)
    _write_json(directory / SPLADE_POOLING_DIR / "config.json",
                {"pooling_strategy": pooling, "activation_function": activation, "word_embedding_dimension": None})
    _write_json(directory / CONFIG_FILE, {
        "__version__": _versions(), "default_prompt_name": default_prompt_name, "model_type": "SparseEncoder",
        "prompts": dict(prompts or {}), "similarity_fn_name": "dot",
    }, sort_keys=True)
    return directory


def _versions() -> dict[str, str]:
    """The writer's versions. No "sentence_transformers" entry: it did not write the files, and a version
    there newer than the reader's own makes sentence-transformers warn."""
    versions = {}
    for key, distribution in (("encoderkit", "encoderkit"), ("pytorch", "torch")):
        try:
            versions[key] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            pass
    return versions
