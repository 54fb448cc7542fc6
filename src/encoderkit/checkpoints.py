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

from .config import EncoderConfig
from .errors import CheckpointError, ConfigError
from .modeling.models import build_model, hf_architecture, task_from_architectures

log = logging.getLogger(__name__)

Rule = tuple[str, str]  # (our name, transformers' name); {i}: our layer index; {g}/{j}: ALBERT group/inner index

_BERT_LAYER = [
    ("layers.{i}.attention.query", "encoder.layer.{i}.attention.self.query"),
    ("layers.{i}.attention.key", "encoder.layer.{i}.attention.self.key"),
    ("layers.{i}.attention.value", "encoder.layer.{i}.attention.self.value"),
    ("layers.{i}.attention.output", "encoder.layer.{i}.attention.output.dense"),
    ("layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("layers.{i}.ffn_in", "encoder.layer.{i}.intermediate.dense"),
    ("layers.{i}.ffn_out", "encoder.layer.{i}.output.dense"),
    ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
]
_EMBEDDINGS = [
    ("embeddings.word", "embeddings.word_embeddings"),
    ("embeddings.position", "embeddings.position_embeddings"),
    ("embeddings.token_type", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
]
_ALBERT_LAYER = "encoder.albert_layer_groups.{g}.albert_layers.{j}."
_DISTIL_LAYER = "transformer.layer.{i}."

# Base-model tables: names inside BertModel / RobertaModel / ... (no task prefix).
BASE_RULES: dict[str, list[Rule]] = {
    "bert": _EMBEDDINGS + _BERT_LAYER + [("pooler.dense", "pooler.dense")],
    "roberta": _EMBEDDINGS + _BERT_LAYER + [("pooler.dense", "pooler.dense")],
    "electra": _EMBEDDINGS + [("embeddings.projection", "embeddings_project")] + _BERT_LAYER,
    "albert": _EMBEDDINGS + [
        ("embeddings.projection", "encoder.embedding_hidden_mapping_in"),
        ("layers.{i}.attention.query", _ALBERT_LAYER + "attention.query"),
        ("layers.{i}.attention.key", _ALBERT_LAYER + "attention.key"),
        ("layers.{i}.attention.value", _ALBERT_LAYER + "attention.value"),
        ("layers.{i}.attention.output", _ALBERT_LAYER + "attention.dense"),
        ("layers.{i}.attention_norm", _ALBERT_LAYER + "attention.LayerNorm"),
        ("layers.{i}.ffn_in", _ALBERT_LAYER + "ffn"),
        ("layers.{i}.ffn_out", _ALBERT_LAYER + "ffn_output"),
        ("layers.{i}.ffn_norm", _ALBERT_LAYER + "full_layer_layer_norm"),
        ("pooler.dense", "pooler"),
    ],
    "distilbert": [
        ("embeddings.word", "embeddings.word_embeddings"),
        ("embeddings.position", "embeddings.position_embeddings"),
        ("embeddings.norm", "embeddings.LayerNorm"),
        ("layers.{i}.attention.query", _DISTIL_LAYER + "attention.q_lin"),
        ("layers.{i}.attention.key", _DISTIL_LAYER + "attention.k_lin"),
        ("layers.{i}.attention.value", _DISTIL_LAYER + "attention.v_lin"),
        ("layers.{i}.attention.output", _DISTIL_LAYER + "attention.out_lin"),
        ("layers.{i}.attention_norm", _DISTIL_LAYER + "sa_layer_norm"),
        ("layers.{i}.ffn_in", _DISTIL_LAYER + "ffn.lin1"),
        ("layers.{i}.ffn_out", _DISTIL_LAYER + "ffn.lin2"),
        ("layers.{i}.ffn_norm", _DISTIL_LAYER + "output_layer_norm"),
    ],
}


def _mlm(transform: str, norm: str, decoder: str, bias: str | None = None) -> list[Rule]:
    rules = [("mlm_head.transform", transform), ("mlm_head.norm", norm)]
    if bias:  # the family keeps the output bias as its own parameter, outside the decoder
        rules.append(("mlm_head.decoder.bias", bias))
    return rules + [("mlm_head.decoder", decoder)]


# Head tables: top-level names in the task models, by head.
HEAD_RULES: dict[str, dict[str, list[Rule]]] = {
    "bert": {
        "mlm": _mlm("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                    "cls.predictions.decoder", "cls.predictions.bias"),
        "pair": [("pair_head", "cls.seq_relationship")],
        "classifier": [("classifier.out", "classifier")],
    },
    "roberta": {
        "mlm": _mlm("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
        "classifier": [("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")],
    },
    "distilbert": {
        "mlm": _mlm("vocab_transform", "vocab_layer_norm", "vocab_projector"),
        "classifier": [("classifier.dense", "pre_classifier"), ("classifier.out", "classifier")],
    },
    "albert": {
        "mlm": _mlm("predictions.dense", "predictions.LayerNorm", "predictions.decoder", "predictions.bias"),
        "pair": [("pair_head", "sop_classifier.classifier")],
        "classifier": [("classifier.out", "classifier")],
    },
    "electra": {
        "mlm": _mlm("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head"),
        "rtd": [("rtd_head.dense", "discriminator_predictions.dense"),
                ("rtd_head.prediction", "discriminator_predictions.dense_prediction")],
        "classifier": [("classifier.dense", "classifier.dense"), ("classifier.out", "classifier.out_proj")],
    },
}
for _family_rules in HEAD_RULES.values():
    _family_rules["token"] = [("token_classifier.out", "classifier")]
    _family_rules["span"] = [("span_head.out", "qa_outputs")]

# transformers' buffers and tied aliases that old or new checkpoints may carry; never an error.
_IGNORABLE = re.compile(
    r"(^|\.)embeddings\.(position_ids|token_type_ids)$|"
    r"^(cls\.predictions|lm_head|predictions)\.decoder\.bias$"
)


_TIED_DECODERS = ("predictions.decoder.weight", "lm_head.decoder.weight", "vocab_projector.weight",
                   "generator_lm_head.weight")


def _pattern(name: str) -> re.Pattern[str]:
    regex = re.escape(name)
    for key in ("i", "g", "j"):
        regex = regex.replace(re.escape("{" + key + "}"), f"(?P<{key}>\\d+)")
    return re.compile("^" + regex + r"(?P<suffix>(\.(weight|bias))?)$")


@dataclass
class _Mapper:
    config: EncoderConfig
    task_model: bool  # our names carry "encoder." and the HF names the family prefix

    def our_to_hf(self, name: str) -> str | None:
        family = self.config.model_type
        base = name
        if self.task_model:
            if not name.startswith("encoder."):
                return self._head_to_hf(name)
            base = name[len("encoder."):]
        for ours, theirs in BASE_RULES[family]:
            match = _pattern(ours).match(base)
            if match is None:
                continue
            fields = match.groupdict()
            if "i" in fields and fields["i"] is not None:
                g, j = divmod(int(fields["i"]), self.config.inner_group_num)
                theirs = theirs.replace("{i}", fields["i"]).replace("{g}", str(g)).replace("{j}", str(j))
            hf_name = theirs + (fields["suffix"] or "")
            return f"{self.config.family.hf_prefix}.{hf_name}" if self.task_model else hf_name
        return None

    def _head_to_hf(self, name: str) -> str | None:
        for rules in HEAD_RULES[self.config.model_type].values():
            for ours, theirs in rules:
                match = _pattern(ours).match(name)
                if match is not None:
                    return theirs + (match.group("suffix") or "")
        return None

    def all_head_keys(self) -> set[str]:
        """Every transformers name a head of this family may have (weight and bias)."""
        keys = set()
        for rules in HEAD_RULES[self.config.model_type].values():
            for _, theirs in rules:
                keys.add(theirs)
                keys.update({theirs + ".weight", theirs + ".bias"})
        return keys


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------
def read_state_dict(directory: Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory: safetensors (single or sharded), or an opted-in .bin."""
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
               new_head_expected: bool = False) -> None:
    """Copy transformers-named tensors into ``model``, strictly (see the module doc)."""
    config: EncoderConfig = model.config  # type: ignore[assignment]
    task_model = hasattr(model, "encoder")
    prefix = config.family.hf_prefix + "."
    has_prefix = any(k.startswith(prefix) for k in state)
    mapper = _Mapper(config, task_model)
    head_keys = mapper.all_head_keys()

    # Bring the checkpoint's names into the naming of the model we load into.
    if task_model and not has_prefix:  # a bare BertModel checkpoint into a task model
        state = {(k if k in head_keys else prefix + k): v for k, v in state.items()}
    elif not task_model and has_prefix:  # a task checkpoint into the bare encoder
        state = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}

    extra_prefixes = tuple(getattr(model, "extra_prefixes", ()))
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(extra_prefixes)}
    tied = {name for name in own if name.endswith("mlm_head.decoder.weight")} if config.tie_word_embeddings else set()
    missing, mismatched, fresh = [], [], []
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
        if hf_name not in state:
            (fresh if is_head or is_pooler else missing).append(hf_name)
            continue
        consumed.add(hf_name)
        value = state[hf_name]
        if tuple(value.shape) != tuple(tensor.shape):
            mismatched.append(f"{hf_name}: checkpoint {tuple(value.shape)} vs model {tuple(tensor.shape)}")
            continue
        new_state[name] = value.to(tensor.dtype)

    dropped, unexpected = [], []
    for key in state:
        if key in consumed or _IGNORABLE.search(key):
            continue
        if tied and key.endswith(_TIED_DECODERS):
            continue  # the decoder is tied to the word embeddings
        bare = key[len(prefix):] if key.startswith(prefix) else key
        if key in head_keys or bare.startswith("pooler"):
            dropped.append(key)
        else:
            unexpected.append(key)

    problems = []
    if missing:
        problems.append(f"missing tensors {_names(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors {_names(unexpected)}")
    if mismatched:
        problems.append(f"tensors of the wrong shape {_names(mismatched)}")
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


def _names(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{f', ... {len(items) - limit} more' if len(items) > limit else ''}]"


def load_model(
    path: str | Path | None = None,
    task: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    allow_pickle: bool = False,
    labels: list[str] | None = None,
    config: EncoderConfig | None = None,
    new_head_expected: bool = False,
) -> nn.Module:
    """Load an HF-format model directory (or a sentence-transformers one) into encoderkit's model code.

    ``task`` picks the head ("base", "masked-lm", "sequence-classification", ...); None reads it from
    config.json's ``architectures``. ``labels`` sets the label names of a new classification head.
    ``new_head_expected`` (fine-tuning): a head missing from the checkpoint is noted at INFO, not warned about.
    """
    from .hub import resolve_model

    resolved = resolve_model(path)
    if config is None:
        config = EncoderConfig.from_json_file(resolved.weights_dir / "config.json")
    if labels is not None:
        config = config.with_labels(labels)
    if task is None:
        task = task_from_architectures(config)
    model = build_model(config, task)
    state = read_state_dict(resolved.weights_dir, allow_pickle=allow_pickle)
    load_state(model, state, source=str(resolved.weights_dir), new_head_expected=new_head_expected)
    load_extra_state(model, resolved.weights_dir, new_head_expected)
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    model.source = resolved  # type: ignore[attr-defined]
    return model


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


def load_weights(model: nn.Module, directory: str | Path) -> None:
    """Load a saved directory's weights (transformers-named and extra) into an existing model."""
    directory = Path(directory)
    load_state(model, read_state_dict(directory), source=str(directory))
    load_extra_state(model, directory)


def save_model(model: nn.Module, directory: str | Path, *, tokenizer: Any = None) -> Path:
    """Write config.json + model.safetensors (transformers' names), and the tokenizer when given.

    Tensors transformers has no counterpart for (a CRF, multi-task heads) go to encoderkit_extra.safetensors.
    """
    from safetensors.torch import save_file

    from .modeling.models import HF_SUFFIX, Encoder

    config: EncoderConfig = model.config  # type: ignore[assignment]
    task = getattr(model, "task", None)
    if task is None:
        raise ConfigError(f"cannot save a {type(model).__name__}: not an encoderkit model")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # A task model that transformers sees as the bare encoder (multi-task) is saved under base-model names.
    as_base = isinstance(model, Encoder) or HF_SUFFIX[task] == "Model"
    mapper = _Mapper(config, task_model=not as_base)
    prefixes = tuple(getattr(model, "extra_prefixes", ()))
    tensors: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and name.endswith("mlm_head.decoder.weight"):
            continue  # transformers re-ties it on load
        if prefixes and name.startswith(prefixes):
            extra[name] = tensor.detach().to("cpu").contiguous()
            continue
        if as_base and not isinstance(model, Encoder):
            name = name.removeprefix("encoder.")
        hf_name = mapper.our_to_hf(name)
        if hf_name is None:
            raise CheckpointError(f"internal: no transformers name for {name}")
        tensors[hf_name] = tensor.detach().to("cpu").contiguous()
    saved = _replace(config, architectures=[hf_architecture(config, task)])
    saved.save(directory)
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
