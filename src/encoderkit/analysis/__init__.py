"""Inspection of what a model does: attention maps, head statistics, pronoun-antecedent heads."""
from .antecedents import (
    AntecedentHeads,
    CoreferenceExample,
    HeadScore,
    find_antecedent_heads,
    rank_antecedent_heads,
    read_coreference_examples,
    resolve_span,
)
from .attention import (
    CATEGORIES,
    AttentionAnalyzer,
    AttentionMaps,
    HeadStatistics,
    MaskComparison,
    attention_entropy,
    attention_shares,
    head_statistics,
    key_categories,
)

__all__ = [
    "CATEGORIES", "AntecedentHeads", "AttentionAnalyzer", "AttentionMaps", "CoreferenceExample", "HeadScore",
    "HeadStatistics", "MaskComparison", "attention_entropy", "attention_shares", "find_antecedent_heads",
    "head_statistics", "key_categories", "rank_antecedent_heads", "read_coreference_examples", "resolve_span",
]
