"""HF directory format <-> encoderkit models.

All naming differences between the families live in the tables below: each row maps one of our
module (or parameter) names to the family's name in transformers' state dicts. Loading is strict:
every missing, unexpected or mis-shaped tensor of the encoder is reported by name, in one error.
A task head that the checkpoint lacks is freshly initialised with a warning (that is how a
pretrained encoder becomes a classifier), and the heads of other tasks are dropped with a note.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import EncoderConfig
from ..errors import CheckpointError
from ..families import Rule

log = logging.getLogger(__name__)

JOIN = "+"  # in a rule: our tensor is the concatenation of these checkpoint tensors (see ``families.base.Rule``)


def _pattern(name: str) -> re.Pattern[str]:
    regex = re.escape(name)
    for key in ("i", "g", "j"):
        regex = regex.replace(re.escape("{" + key + "}"), f"(?P<{key}>\\d+)")
    return re.compile("^" + regex + r"(?P<suffix>(\.(weight|bias))?)$")


@dataclass
class _Mapper:
    config: EncoderConfig
    task_model: bool  # our names carry "encoder." and the HF names the family prefix
    alternative_heads: tuple[str, ...] = ()  # heads named by the family's alternative layout (DeBERTa's new MLM)

    def head_rules(self) -> dict[str, tuple[Rule, ...]]:
        family = self.config.family
        return {head: family.alternative_head_rules[head] if head in self.alternative_heads else rules
                for head, rules in family.head_rules.items()}

    def our_to_hf(self, name: str) -> str | None:
        base = name
        if self.task_model:
            if not name.startswith("encoder."):
                return self._head_to_hf(name)
            base = name[len("encoder."):]
        for ours, theirs in self.config.family.base_rules:
            match = _pattern(ours).match(base)
            if match is None:
                continue
            fields = match.groupdict()
            if "i" in fields and fields["i"] is not None:
                g, j = divmod(int(fields["i"]), self.config.inner_group_num)
                theirs = theirs.replace("{i}", fields["i"]).replace("{g}", str(g)).replace("{j}", str(j))
            prefix = f"{self.config.family.hf_prefix}." if self.task_model else ""
            return JOIN.join(prefix + part + (fields["suffix"] or "") for part in theirs.split(JOIN))
        return None

    def _head_to_hf(self, name: str) -> str | None:
        for rules in self.head_rules().values():
            for ours, theirs in rules:
                match = _pattern(ours).match(name)
                if match is not None:
                    return theirs + (match.group("suffix") or "")
        return None

    def all_head_keys(self) -> set[str]:
        """Every transformers name a head of this family may have (weight and bias), in every layout."""
        family = self.config.family
        keys = set()
        for rules in list(family.head_rules.values()) + list(family.alternative_head_rules.values()):
            for _, theirs in rules:
                keys.add(theirs)
                keys.update({theirs + ".weight", theirs + ".bias"})
        return keys


def transformers_name(config: EncoderConfig, name: str, *, task_model: bool = False) -> str | None:
    """transformers' name of one of our tensors (``layers.0.ffn_in.weight`` -> ``encoder.layer.0.intermediate.
    dense.weight`` for BERT); ``task_model``: our name carries "encoder." and theirs the family prefix."""
    return _Mapper(config, task_model).our_to_hf(name)


def _alternative_heads(config: EncoderConfig, state: dict[str, torch.Tensor] | None) -> tuple[str, ...]:
    """The heads to name by the family's alternative layout: those whose alternative names the checkpoint uses
    (when reading), or, when writing, DeBERTa's new MLM layout for a config with ``"legacy": false``."""
    alternatives = config.family.alternative_head_rules
    if state is None:
        return tuple(alternatives) if alternatives and config.legacy is False else ()
    return tuple(head for head, rules in alternatives.items() if any(theirs in state or theirs + ".weight" in state
                                                                       or theirs + ".bias" in state
                                                                       for _, theirs in rules))


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
_LEGACY_SUFFIXES = {"gamma": "weight", "beta": "bias"}  # LayerNorm parameters under TensorFlow-era names


def read_state_dict(directory: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory: safetensors (single or sharded), or an opted-in .bin. LayerNorm
    parameters named ``gamma``/``beta`` (old BERT checkpoints; transformers 5.0-5.3 still write them so) are read as
    ``weight``/``bias``, as transformers reads them."""
    state = _read_tensors(directory, allow_pickle)
    renamed = {}
    for key, value in state.items():
        stem, _, last = key.rpartition(".")
        renamed[f"{stem}.{_LEGACY_SUFFIXES[last]}" if stem and last in _LEGACY_SUFFIXES else key] = value
    return renamed


def _read_tensors(directory: Path, allow_pickle: bool) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
        try:
            return load_file(str(path))
        except Exception as exc:  # SafetensorError, OSError, ...: the file is damaged
            raise CheckpointError(
                f"{path} is not a readable safetensors file ({exc}); it may be truncated or corrupted: "
                "re-download or re-save the checkpoint"
            ) from exc

    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    if single.is_file():
        return load_safetensors(single)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc})") from exc
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(load_safetensors(directory / shard))
        return state
    pickled = directory / "pytorch_model.bin"
    if pickled.is_file():
        if not allow_pickle:
            raise CheckpointError(
                f"{directory} has only pytorch_model.bin (a pickle, which can run code when loaded) and no "
                "model.safetensors; if you trust it, opt in with allow_pickle=True (CLI: --allow-pickle), "
                "or convert it to safetensors"
            )
        try:
            state = torch.load(pickled, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{pickled} could not be loaded with weights_only=True: {exc}") from exc
        if not isinstance(state, dict):
            raise CheckpointError(f"{pickled} does not hold a state dict (found {type(state).__name__})")
        return state
    present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    raise CheckpointError(
        f"no weights in {directory}: expected model.safetensors (or a sharded index, or pytorch_model.bin with "
        f"allow_pickle); found {present or 'nothing'}"
    )


# ---------------------------------------------------------------------------------------------
# Load / save
# ---------------------------------------------------------------------------------------------
def load_state(model: nn.Module, state: dict[str, torch.Tensor], *, source: str = "checkpoint",
               new_head_expected: bool = False) -> list[str]:
    """Copy transformers-named tensors into ``model``, strictly (see the module doc). Returns the names (the
    model's) of the head and pooler tensors the checkpoint did not have: newly initialised."""
    config: EncoderConfig = model.config  # type: ignore[assignment]
    task_model = hasattr(model, "encoder")
    prefix = config.family.hf_prefix + "."
    has_prefix = any(k.startswith(prefix) for k in state)
    mapper = _Mapper(config, task_model, _alternative_heads(config, state))
    head_keys = mapper.all_head_keys()

    # Bring the checkpoint's names into the naming of the model we load into.
    if task_model and not has_prefix:  # a bare BertModel checkpoint into a task model
        state = {(k if k in head_keys else prefix + k): v for k, v in state.items()}
    elif not task_model and has_prefix:  # a task checkpoint into the bare encoder
        state = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}

    extra_prefixes = tuple(getattr(model, "extra_prefixes", ()))
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(extra_prefixes)}
    tied = {name for name in own if name.endswith("mlm_head.decoder.weight")} if config.tie_word_embeddings else set()
    missing, mismatched, fresh, fresh_names = [], [], [], []
    consumed: set[str] = set()
    new_state: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        if name in tied:
            continue
        hf_name = mapper.our_to_hf(name)
        if hf_name is None:
            raise CheckpointError(f"internal: no transformers name for {name}")  # a gap in the tables
        is_head = not name.startswith("encoder.") and task_model
        is_pooler = ".pooler." in f".{name}"
        parts = hf_name.split(JOIN)
        absent = [part for part in parts if part not in state]
        if absent:
            (fresh if is_head or is_pooler else missing).extend(absent)
            if is_head or is_pooler:
                fresh_names.append(name)
            continue
        consumed.update(parts)
        try:
            value = state[hf_name] if len(parts) == 1 else torch.cat([state[part] for part in parts])
        except RuntimeError:  # joined tensors of different widths
            mismatched.append(" + ".join(f"{part} {tuple(state[part].shape)}" for part in parts)
                              + f" vs model {tuple(tensor.shape)}")
            continue
        if tuple(value.shape) != tuple(tensor.shape):
            mismatched.append(f"{hf_name}: checkpoint {tuple(value.shape)} vs model {tuple(tensor.shape)}")
            continue
        new_state[name] = value.to(tensor.dtype)

    dropped, unexpected = _leftovers(state, consumed, config, bool(tied), prefix, head_keys)
    problems = [f"{what} {_names(names)}" for what, names in (("missing tensors", missing), ("unexpected tensors",
                unexpected), ("tensors of the wrong shape", mismatched)) if names]
    if problems:
        raise CheckpointError(
            f"{source} does not fit the {config.model_type} model described by its config "
            f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}): "
            + "; ".join(problems) + ". Check that config.json belongs to these weights."
        )
    model.load_state_dict(new_state, strict=False)
    if config.tie_word_embeddings and hasattr(model, "mlm_head"):
        model.mlm_head.decoder.weight = model.encoder.embeddings.word.weight
    if fresh:
        log.log(logging.INFO if new_head_expected else logging.WARNING,
                "%s: newly initialised (not in the checkpoint; train before use): %s", source, _names(fresh))
    if dropped:
        log.info("%s: not used by this task and dropped: %s", source, _names(dropped))
    return fresh_names


def _leftovers(state: dict[str, torch.Tensor], consumed: set[str], config: EncoderConfig, tied: bool, prefix: str,
               head_keys: set[str]) -> tuple[list[str], list[str]]:
    """The checkpoint tensors no model tensor took: (other tasks' heads and poolers, dropped; the unexpected rest).
    Buffers and aliases the family lists as ignorable, and a decoder tied to the word embeddings, are neither."""
    dropped, unexpected = [], []
    ignorable = [re.compile(pattern) for pattern in config.family.ignorable]
    for key in state:
        if key in consumed or any(pattern.search(key) for pattern in ignorable):
            continue
        if tied and key.endswith(config.family.tied_decoders or ("\0",)):
            continue  # the decoder is tied to the word embeddings
        bare = key[len(prefix):] if key.startswith(prefix) else key
        if key in head_keys or bare.startswith("pooler"):
            dropped.append(key)
        else:
            unexpected.append(key)
    return dropped, unexpected


def _names(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{f', ... {len(items) - limit} more' if len(items) > limit else ''}]"


EXTRA_WEIGHTS = "encoderkit_extra.safetensors"


def load_extra_state(model: nn.Module, directory: Path, new_head_expected: bool = False) -> None:
    """Load the tensors transformers has no names for (``model.extra_prefixes``) from EXTRA_WEIGHTS."""
    from safetensors.torch import load_file

    prefixes = tuple(getattr(model, "extra_prefixes", ()))
    expected = {k: v for k, v in model.state_dict().items() if prefixes and k.startswith(prefixes)}
    if not expected:
        return
    path = directory / EXTRA_WEIGHTS
    if not path.is_file():
        log.log(logging.INFO if new_head_expected else logging.WARNING,
                "%s: newly initialised (no %s in the checkpoint; train before use): %s", directory,
                EXTRA_WEIGHTS, _names(sorted(expected)))
        return
    try:
        state = load_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from exc
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(v.shape)}" for k, v in expected.items()
             if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if missing or unexpected or wrong:
        raise CheckpointError(f"{path} does not fit the model: missing {_names(missing)}, unexpected "
                              f"{_names(unexpected)}, wrong shape {_names(wrong)}")
    model.load_state_dict(state, strict=False)


def write_checkpoint(model: nn.Module, directory: str | Path, *, architecture: str, as_base: bool,
                     tokenizer: Any = None) -> Path:
    """Write config.json + model.safetensors (transformers' names), and the tokenizer when given.

    ``as_base``: the tensors go under the base model's names (a bare encoder, or a task model that transformers
    sees as its encoder, such as a multi-task model). Tensors transformers has no counterpart for (a CRF,
    multi-task heads) go to encoderkit_extra.safetensors."""
    from safetensors.torch import save_file

    config: EncoderConfig = model.config  # type: ignore[assignment]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    is_task_model = hasattr(model, "encoder")
    mapper = _Mapper(config, task_model=not as_base, alternative_heads=_alternative_heads(config, None))
    prefixes = tuple(getattr(model, "extra_prefixes", ()))
    tensors: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and name.endswith("mlm_head.decoder.weight"):
            continue  # transformers re-ties it on load
        if prefixes and name.startswith(prefixes):
            extra[name] = tensor.detach().to("cpu").contiguous()
            continue
        if as_base and is_task_model:
            name = name.removeprefix("encoder.")
        hf_name = mapper.our_to_hf(name)
        if hf_name is None:
            raise CheckpointError(f"internal: no transformers name for {name}")
        parts = hf_name.split(JOIN)
        for part, piece in zip(parts, tensor.detach().to("cpu").chunk(len(parts))):
            tensors[part] = piece.contiguous()
    _replace(config, architectures=[architecture]).save(directory)
    tmp = directory / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")
    if extra:
        tmp = directory / (EXTRA_WEIGHTS + ".tmp")
        save_file(extra, str(tmp), metadata={"format": "pt", "library": "encoderkit"})
        tmp.replace(directory / EXTRA_WEIGHTS)
    else:
        (directory / EXTRA_WEIGHTS).unlink(missing_ok=True)
    if tokenizer is not None:
        tokenizer.save(directory)
    return directory


def _replace(config: EncoderConfig, **changes: Any) -> EncoderConfig:
    return dataclasses.replace(config, extra=dict(config.extra), **changes)
