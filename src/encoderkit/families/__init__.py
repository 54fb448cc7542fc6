"""The model families, one file each: config renames and defaults, which parts of the one encoder the family
uses, and its checkpoints' tensor names. Adding a family is one file here plus, at most, one new part in
``encoderkit.modeling`` (see the README's architecture section)."""
from __future__ import annotations

from . import (albert, bert, deberta, distilbert, electra, eurobert, gte, jina_embeddings_v3, modernbert, mpnet,
               nomic_bert, roberta, xlm_roberta)
from .base import BERT_DEFAULTS, COMMON_FIELDS, Family, Rule

FAMILIES: dict[str, Family] = {family.name: family for family in (
    *(module.FAMILY for module in (bert, roberta, distilbert, albert, electra, modernbert, deberta, mpnet,
                                                   nomic_bert, gte, eurobert, jina_embeddings_v3)),
    xlm_roberta.XLM_ROBERTA, xlm_roberta.CAMEMBERT)}

__all__ = ["BERT_DEFAULTS", "COMMON_FIELDS", "FAMILIES", "Family", "Rule"]
