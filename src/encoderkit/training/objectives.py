"""Pre-training objectives that need more than one network: replaced-token detection (ELECTRA, and DeBERTa-v3
with gradient-disentangled embedding sharing) and DistilBERT distillation.

Both wrap encoderkit task models and expose what the Trainer uses: ``forward(**batch) -> .loss``,
``config``, ``save_pretrained`` and ``load_checkpoint``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..errors import ConfigError
from ..modeling.models import EncoderForMaskedLM, EncoderForReplacedTokenDetection

IGNORE_INDEX = -100


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor
    parts: dict[str, float]


def default_generator_config(discriminator: EncoderConfig) -> EncoderConfig:
    """ELECTRA's recipe: a generator a quarter of the discriminator's width, sharing its embeddings. DeBERTa-v3's:
    the discriminator's width and half its depth (He et al., 2023, section 5)."""
    if discriminator.model_type == "deberta-v2":
        return dataclasses.replace(discriminator, num_hidden_layers=max(1, discriminator.num_hidden_layers // 2),
                                   extra=dict(discriminator.extra))
    hidden = max(discriminator.head_dim, discriminator.hidden_size // 4)
    heads = max(1, hidden // discriminator.head_dim)
    return dataclasses.replace(discriminator, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=4 * hidden, embedding_size=discriminator.embedding_dim,
                               extra=dict(discriminator.extra))


# Families with no replaced-token detection form: ModernBERT was pre-trained with MLM alone.
NO_REPLACED_TOKEN_DETECTION = ("modernbert",)
GDES_DELTA = "gdes_delta.safetensors"  # the discriminator's own embedding deltas, beside its checkpoint


class DisentangledEmbedding(nn.Module):
    """DeBERTa-v3's gradient-disentangled embedding sharing (He et al., 2023, section 4): the discriminator reads
    E_D = sg(E_G) + E_delta. The generator's table E_G learns from the MLM loss only (the stop-gradient keeps
    the discriminator's pull, which the paper finds fights the generator's, out of it); the discriminator learns
    its own difference E_delta, which starts at zero."""

    def __init__(self, source: nn.Embedding) -> None:
        super().__init__()
        object.__setattr__(self, "source", source)  # the generator's module: not registered twice
        self.delta = nn.Parameter(torch.zeros_like(source.weight))
        self.padding_idx = source.padding_idx
        self.num_embeddings, self.embedding_dim = source.num_embeddings, source.embedding_dim

    @property
    def weight(self) -> torch.Tensor:
        return self.source.weight.detach() + self.delta

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)

    def merged(self) -> nn.Embedding:
        """E_G + E_delta as a plain embedding: what the discriminator is, once trained."""
        table = nn.Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx)
        with torch.no_grad():
            table.weight.copy_(self.weight)
        return table


class ElectraObjective(nn.Module):
    """Generator (small MLM) + discriminator (replaced-token detection), loss = MLM + weight * RTD.

    The generator's predictions at the masked positions are sampled to replace those tokens; the
    discriminator learns, at every real token, whether it was replaced. ELECTRA's two networks share their
    token, position and segment embeddings; DeBERTa-v3's share them through a stop-gradient plus the
    discriminator's own delta (``DisentangledEmbedding``).
    """

    task = "replaced-token-detection"

    def __init__(self, discriminator_config: EncoderConfig, generator_config: EncoderConfig | None = None,
                 rtd_weight: float = 50.0) -> None:
        super().__init__()
        for config in (discriminator_config, generator_config):
            if config is not None and config.model_type in NO_REPLACED_TOKEN_DETECTION:
                raise ConfigError(
                    f"replaced-token detection runs on ELECTRA- and DeBERTa-shaped models; {config.model_type} was "
                    "pre-trained with MLM alone: use --objective mlm")
        self.disentangled = discriminator_config.model_type == "deberta-v2"
        if discriminator_config.model_type not in ("electra", "deberta-v2"):
            discriminator_config = dataclasses.replace(discriminator_config, model_type="electra",
                                                       extra=dict(discriminator_config.extra))
        generator_config = generator_config or default_generator_config(discriminator_config)
        if generator_config.embedding_dim != discriminator_config.embedding_dim:
            raise ConfigError("the generator and discriminator share embeddings: their embedding sizes must match "
                              f"({generator_config.embedding_dim} vs {discriminator_config.embedding_dim})")
        self.config = discriminator_config
        self.discriminator = EncoderForReplacedTokenDetection(discriminator_config)
        self.generator = EncoderForMaskedLM(generator_config)
        self.rtd_weight = rtd_weight
        self.tie_embeddings()

    def tie_embeddings(self) -> None:
        shared, own = self.discriminator.encoder.embeddings, self.generator.encoder.embeddings
        if self.disentangled:  # the discriminator reads the generator's tables through DisentangledEmbedding
            for name in ("word", "position", "token_type"):
                source, current = getattr(own, name), getattr(shared, name)
                if source is not None and not isinstance(current, DisentangledEmbedding):
                    setattr(shared, name, DisentangledEmbedding(source))
            return
        own.word, own.position, own.token_type = shared.word, shared.position, shared.token_type
        if self.generator.config.tie_word_embeddings:
            self.generator.mlm_head.decoder.weight = shared.word.weight

    def _disentangled_tables(self) -> dict[str, DisentangledEmbedding]:
        embeddings = self.discriminator.encoder.embeddings
        return {name: getattr(embeddings, name) for name in ("word", "position", "token_type")
                if isinstance(getattr(embeddings, name), DisentangledEmbedding)}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **_: Any) -> ObjectiveOutput:
        generated = self.generator(input_ids, attention_mask, token_type_ids, labels=labels, sparse=True)
        selected = labels != IGNORE_INDEX
        with torch.no_grad():  # sample replacements (no gradient through the sampling, as in the paper)
            sampled = torch.multinomial(generated.logits.float().softmax(-1), 1).squeeze(-1)
        replaced = input_ids.clone()
        replaced[selected] = sampled
        original = torch.where(selected, labels, input_ids)
        is_replaced = (replaced != original).long()
        discriminated = self.discriminator(replaced, attention_mask, token_type_ids, labels=is_replaced)
        loss = generated.loss + self.rtd_weight * discriminated.loss
        return ObjectiveOutput(loss, {"mlm": float(generated.loss.detach()),
                                      "rtd": float(discriminated.loss.detach())})

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> Path:
        """The discriminator (ElectraForPreTraining; for DeBERTa-v3 a DebertaV2Model with its RTD head, its
        embeddings E_G + E_delta) with the generator in ``generator/``; DeBERTa's deltas also go to GDES_DELTA,
        so that a resumed run continues from the very same numbers."""
        from safetensors.torch import save_file

        tables = self._disentangled_tables()
        embeddings = self.discriminator.encoder.embeddings
        try:
            for name, table in tables.items():
                setattr(embeddings, name, table.merged())
            self.discriminator.save_pretrained(directory, tokenizer=tokenizer)
        finally:
            for name, table in tables.items():
                setattr(embeddings, name, table)
        if tables:
            save_file({name: table.delta.detach().contiguous() for name, table in tables.items()},
                      str(Path(directory) / GDES_DELTA))
        self.generator.save_pretrained(Path(directory) / "generator", tokenizer=tokenizer)
        return Path(directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        from safetensors.torch import load_file

        from ..modeling.models import load_weights

        tables = self._disentangled_tables()
        embeddings = self.discriminator.encoder.embeddings
        for name in tables:  # the checkpoint holds plain tables: load into plain ones, then restore the deltas
            setattr(embeddings, name, tables[name].merged())
        load_weights(self.discriminator, directory)
        load_weights(self.generator, Path(directory) / "generator")
        for name, table in tables.items():
            setattr(embeddings, name, table)
        if tables:
            path = Path(directory) / GDES_DELTA
            if not path.is_file():
                raise ConfigError(f"{directory} has no {GDES_DELTA}: it is not a DeBERTa-v3 replaced-token "
                                  "detection checkpoint of encoderkit")
            deltas = load_file(str(path))
            with torch.no_grad():
                for name, table in tables.items():
                    table.delta.copy_(deltas[name])
        self.tie_embeddings()


def student_from_teacher(teacher: EncoderForMaskedLM, every: int = 2) -> EncoderForMaskedLM:
    """DistilBERT's initialisation: the teacher with every ``every``-th layer (0, 2, 4, ...), its embeddings
    and MLM head."""
    config = teacher.config
    if config.num_groups != config.num_hidden_layers:
        raise ConfigError("distillation by layer selection needs a teacher without shared layers")
    keep = list(range(0, config.num_hidden_layers, every))
    layer_types = [config.layer_type(i) for i in keep] if config.layer_types else None  # ModernBERT's pattern
    student_config = dataclasses.replace(config, num_hidden_layers=len(keep), num_hidden_groups=None,
                                         layer_types=layer_types, extra=dict(config.extra))
    student = EncoderForMaskedLM(student_config)
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith("encoder.layers.")}
    for new_index, old_index in enumerate(keep):
        prefix = f"encoder.layers.{old_index}."
        state.update({f"encoder.layers.{new_index}." + k[len(prefix):]: v
                      for k, v in teacher.state_dict().items() if k.startswith(prefix)})
    student.load_state_dict(state)
    return student


class DistillationObjective(nn.Module):
    """loss = alpha_kl * T^2 * KL(teacher || student at temperature T, masked positions)
             + alpha_mlm * MLM + alpha_cos * (1 - cosine(student, teacher last hidden states)) at real tokens."""

    task = "masked-lm"

    def __init__(self, teacher: EncoderForMaskedLM, student: EncoderForMaskedLM | None = None, *,
                 temperature: float = 2.0, alpha_kl: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0) -> None:
        super().__init__()
        self.teacher = teacher.eval()
        for param in self.teacher.parameters():
            param.requires_grad_(False)
        self.student = student or student_from_teacher(teacher)
        if self.student.config.vocab_size != teacher.config.vocab_size:
            raise ConfigError("teacher and student must share the vocabulary")
        self.config = self.student.config
        self.temperature, self.alpha_kl, self.alpha_mlm, self.alpha_cos = temperature, alpha_kl, alpha_mlm, alpha_cos

    def train(self, mode: bool = True) -> "DistillationObjective":
        super().train(mode)
        self.teacher.eval()  # the teacher never drops out
        return self

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, **_: Any) -> ObjectiveOutput:
        with torch.no_grad():
            taught = self.teacher(input_ids, attention_mask, token_type_ids, labels=labels, sparse=True)
        learned = self.student(input_ids, attention_mask, token_type_ids, labels=labels, sparse=True)
        t = self.temperature
        kl = F.kl_div(F.log_softmax(learned.logits.float() / t, -1), F.softmax(taught.logits.float() / t, -1),
                      reduction="batchmean") * t * t
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        student_states, teacher_states = learned.last_hidden_state[real], taught.last_hidden_state[real]
        cosine = 1.0 - F.cosine_similarity(student_states.float(), teacher_states.float(), dim=-1).mean()
        loss = self.alpha_kl * kl + self.alpha_mlm * learned.loss + self.alpha_cos * cosine
        return ObjectiveOutput(loss, {"kl": float(kl.detach()), "mlm": float(learned.loss.detach()),
                                      "cosine": float(cosine.detach())})

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> Path:
        return self.student.save_pretrained(directory, tokenizer=tokenizer)

    def load_checkpoint(self, directory: str | Path) -> None:
        from ..modeling.models import load_weights

        load_weights(self.student, directory)
