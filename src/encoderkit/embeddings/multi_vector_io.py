"""PyLate's directory format for multi-vector (ColBERT) models, read and written, and the settings it holds: a
sentence-transformers directory with a Transformer and ``pylate.models.Dense.Dense`` projections (``1_Dense/``),
whose config_sentence_transformers.json holds the query and document lengths, markers, query expansion and
skiplist (``MultiVectorSettings``). ``encoderkit.embeddings.multi_vector`` runs the models."""
from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, InputError
from ..io.st_format import CONFIG_FILE, MODULE_TYPE

DENSE_DIR = "{}_Dense"
DENSE_TYPE = "pylate.models.Dense.Dense"
TRANSFORMER_TYPE = MODULE_TYPE.format("Transformer")
IDENTITY = "torch.nn.modules.linear.Identity"


@dataclass(frozen=True)
class MultiVectorSettings:
    """How texts become token vectors: PyLate's settings, under its names in config_sentence_transformers.json."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)
    prompts: dict[str, str] = field(default_factory=dict)  # prepended as text, as sentence-transformers does
    default_prompt_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("query_prefix", "document_prefix"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"{name} must be a string (\"\" for no marker), found {getattr(self, name)!r}")
        for name in ("query_length", "document_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 3:
                raise InputError(f"{name} must be an integer of at least 3 (room for [CLS], the marker and "
                                 f"[SEP]), found {value!r}")
        for name in ("do_query_expansion", "attend_to_expansion_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, found {getattr(self, name)!r}")
        words = self.skiplist_words
        if isinstance(words, str) or not all(isinstance(word, str) for word in words):
            raise InputError(f"skiplist_words must be a list of strings, found {words!r}")
        object.__setattr__(self, "skiplist_words", tuple(words))
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise InputError(f"default_prompt_name {self.default_prompt_name!r} names none of the prompts "
                             f"({', '.join(self.prompts) or 'none'})")

    @property
    def attends_to_expansion(self) -> bool:
        """PyLate attends to the expansion tokens only where there are some."""
        return self.do_query_expansion and self.attend_to_expansion_tokens

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: Path | str = CONFIG_FILE,
                    **overrides: Any) -> "MultiVectorSettings":
        """From a config_sentence_transformers.json (missing or null keys: PyLate's defaults), then ``overrides``
        (those not None). A value of the wrong kind in the file is a ConfigError naming it."""
        values = {key: config[key] for key in _SETTING_KEYS if config.get(key) is not None}
        if "prompts" in values and not isinstance(values["prompts"], dict):
            raise ConfigError(f"{source}: prompts must map names to strings, found {values['prompts']!r}")
        try:
            settings = cls(**values)
        except InputError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return settings.with_overrides(**overrides)

    def with_overrides(self, **overrides: Any) -> "MultiVectorSettings":
        unknown = set(overrides) - set(_SETTING_KEYS)
        if unknown:
            raise InputError(f"unknown multi-vector settings {sorted(unknown)}; known: {', '.join(_SETTING_KEYS)}")
        chosen = {key: value for key, value in overrides.items() if value is not None}
        return replace(self, **chosen) if chosen else self

    def to_config(self) -> dict[str, Any]:
        """The keys PyLate writes into config_sentence_transformers.json."""
        values = asdict(self)
        values["skiplist_words"] = list(self.skiplist_words)
        return values


_SETTING_KEYS = tuple(MultiVectorSettings.__dataclass_fields__)


# ---------------------------------------------------------------------------------------------
# PyLate's directory
# ---------------------------------------------------------------------------------------------
@dataclass
class MultiVectorDirectory:
    """What a PyLate directory holds besides the encoder: the projection's layers (weight, bias or None), in order,
    and the settings."""

    weights_dir: Path
    layers: list[tuple[torch.Tensor, torch.Tensor | None]]
    settings: MultiVectorSettings


def read_multi_vector_dir(root: str | Path, *, allow_pickle: bool = False) -> MultiVectorDirectory:
    """The projection and settings of a PyLate directory (``pylate.models.ColBERT.save``'s layout)."""
    from ..io.st_format import _read_json

    root = Path(root)
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list) or not modules:
        raise ConfigError(f"{root / 'modules.json'} must be a non-empty list of modules")
    weights_dir, layers = None, []
    for module in modules:
        kind, path = str(module.get("type", "")), root / str(module.get("path", ""))
        if kind.endswith(".Transformer") and weights_dir is None and not layers:
            weights_dir = path
        elif kind.endswith(".Dense") and weights_dir is not None:
            layers.append(_read_dense(path, allow_pickle))
        elif kind.endswith(".Normalize"):
            continue  # token vectors are normalised anyway
        else:
            raise ConfigError(f"{root / 'modules.json'}: a multi-vector model is a Transformer followed by Dense "
                              f"projections; module {kind!r} at {module.get('path')!r} is not supported")
    if weights_dir is None or not layers:
        raise ConfigError(f"{root} is not a PyLate directory: modules.json needs a Transformer followed by a Dense "
                          "projection")
    config_path = root / CONFIG_FILE
    config = _read_json(config_path) if config_path.is_file() else {}
    return MultiVectorDirectory(weights_dir, layers, MultiVectorSettings.from_config(config, config_path))


def _read_dense(directory: Path, allow_pickle: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    from ..io.st_format import _read_json

    config = _read_json(directory / "config.json")
    activation = str(config.get("activation_function", IDENTITY))
    if activation not in (IDENTITY, "torch.nn.Identity") or config.get("use_residual"):
        raise ConfigError(f"{directory / 'config.json'}: only linear projections (activation {IDENTITY}, no "
                          f"residual) are supported, found activation {activation!r}, "
                          f"use_residual={config.get('use_residual')!r}")
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(directory / "model.safetensors"))
    elif (directory / "pytorch_model.bin").is_file():
        if not allow_pickle:
            raise CheckpointError(f"{directory} holds its projection as pytorch_model.bin (a pickle); pass "
                                  "allow_pickle=True to read it (weights only), or resave it as safetensors")
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{directory} has no projection weights (model.safetensors)")
    weight, bias = state.get("linear.weight"), state.get("linear.bias")
    expected = (config.get("out_features"), config.get("in_features"))
    if weight is None or tuple(weight.shape) != expected:
        raise CheckpointError(f"{directory}: linear.weight must have shape (out_features, in_features) = {expected}, "
                              f"found {None if weight is None else tuple(weight.shape)}")
    if bool(config.get("bias", True)) != (bias is not None):
        raise CheckpointError(f"{directory}: config.json says bias={config.get('bias')!r}, but the weights "
                              f"{'hold' if bias is not None else 'lack'} linear.bias")
    return weight.float(), None if bias is None else bias.float()


def write_multi_vector_dir(directory: str | Path, projection: Sequence[nn.Linear], settings: MultiVectorSettings,
                           max_seq_length: int) -> Path:
    """PyLate's files beside an HF model directory written by ``save_pretrained``: modules.json,
    sentence_bert_config.json, one ``N_Dense/`` per projection layer and config_sentence_transformers.json."""
    from safetensors.torch import save_file

    from ..io.st_format import _versions, _write_json

    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE}]
    for index, layer in enumerate(projection, start=1):
        folder = directory / DENSE_DIR.format(index)
        folder.mkdir(parents=True, exist_ok=True)
        state = {"linear.weight": layer.weight.detach().to("cpu", torch.float32).contiguous()}
        if layer.bias is not None:
            state["linear.bias"] = layer.bias.detach().to("cpu", torch.float32).contiguous()
        save_file(state, str(folder / "model.safetensors"))
        _write_json(folder / "config.json", {"in_features": layer.in_features, "out_features": layer.out_features,
                                             "bias": layer.bias is not None, "activation_function": IDENTITY,
                                             "use_residual": False})
        modules.append({"idx": index, "name": str(index), "path": folder.name, "type": DENSE_TYPE})
    _write_json(directory / "modules.json", modules)
    _write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    _write_json(directory / CONFIG_FILE, {"__version__": _versions(), "model_type": "ColBERT",
                                          "similarity_fn_name": "MaxSim", **settings.to_config()})
    return directory
