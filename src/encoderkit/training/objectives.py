"""Pre-training objectives that need more than one network: ELECTRA and DistilBERT distillation.

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
    """ELECTRA's recipe: a generator a quarter of the discriminator's width, sharing its embeddings."""
    hidden = max(discriminator.head_dim, discriminator.hidden_size // 4)
    heads = max(1, hidden // discriminator.head_dim)
    return dataclasses.replace(discriminator, hidden_size=hidden, num_attention_heads=heads,
                               intermediate_size=4 * hidden, embedding_size=discriminator.embedding_dim,
                               extra=dict(discriminator.extra))


# Families whose blocks an ELECTRA config cannot describe (pre-norm, rotary or disentangled attention).
NO_REPLACED_TOKEN_DETECTION = ("modernbert", "deberta-v2")


class ElectraObjective(nn.Module):
    """Generator (small MLM) + discriminator (replaced-token detection), loss = MLM + weight * RTD.

    The generator's predictions at the masked positions are sampled to replace those tokens; the
    discriminator learns, at every real token, whether it was replaced. The two share their token,
    position and segment embeddings.
    """

    task = "replaced-token-detection"

    def __init__(self, discriminator_config: EncoderConfig, generator_config: EncoderConfig | None = None,
                 rtd_weight: float = 50.0) -> None:
        super().__init__()
        for config in (discriminator_config, generator_config):
            if config is not None and config.model_type in NO_REPLACED_TOKEN_DETECTION:
                raise ConfigError(
                    "replaced-token detection is ELECTRA's objective and encoderkit runs it on BERT-style blocks "
                    f"only; {config.model_type} has no ELECTRA form (DeBERTa-v3's ELECTRA-style pre-training is not "
                    "supported yet): use --objective mlm")
        if discriminator_config.model_type != "electra":
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
        own.word, own.position, own.token_type = shared.word, shared.position, shared.token_type
        if self.generator.config.tie_word_embeddings:
            self.generator.mlm_head.decoder.weight = shared.word.weight

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
        """The discriminator (an ElectraForPreTraining directory) with the generator in ``generator/``."""
        self.discriminator.save_pretrained(directory, tokenizer=tokenizer)
        self.generator.save_pretrained(Path(directory) / "generator", tokenizer=tokenizer)
        return Path(directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        from ..checkpoints import load_weights

        load_weights(self.discriminator, directory)
        load_weights(self.generator, Path(directory) / "generator")
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
        from ..checkpoints import load_weights

        load_weights(self.student, directory)
