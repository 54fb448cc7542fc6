"""The model zoo: parameter counts computed from the preset configs, and family recommendations."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import PRESETS, EncoderConfig, preset
from .errors import InputError


def count_parameters(config: EncoderConfig, task: str = "base") -> int:
    """Distinct parameters of the model a config describes, counted on the meta device (no memory used)."""
    from .modeling.models import build_model

    with torch.device("meta"):
        model = build_model(config, task)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def embedding_parameters(config: EncoderConfig) -> int:
    """Parameters of the token embedding table (vocabulary x embedding size): how DeBERTa-v3's model cards split
    their sizes ("22M backbone + 48M embedding")."""
    return config.vocab_size * config.embedding_dim


@dataclass(frozen=True)
class ZooEntry:
    name: str
    config: EncoderConfig
    parameters: int

    @property
    def embedding_parameters(self) -> int:
        return embedding_parameters(self.config)

    @property
    def backbone_parameters(self) -> int:
        return self.parameters - self.embedding_parameters


def zoo() -> list[ZooEntry]:
    return [ZooEntry(name, preset(name), count_parameters(preset(name))) for name in PRESETS]


TASKS = ("classification", "ner", "qa", "embedding", "pretraining")
CONSTRAINTS = ("latency", "memory", "quality", "budget")


@dataclass(frozen=True)
class Recommendation:
    preset: str
    reason: str


# Reasons cite the published results behind each choice.
_DISTIL = ("distilbert-base", "6 layers instead of 12: the DistilBERT paper reports 40% fewer parameters and 60% "
                              "faster inference than BERT-base while keeping 97% of its GLUE score")
_MINILM = ("minilm-l6-h384", "6 layers of hidden size 384 (~22M parameters, ~4x less compute per token than BERT-base); "
                             "the default model all-MiniLM-L6-v2 is this shape, trained for sentence embeddings")
_ALBERT = ("albert-base", "cross-layer parameter sharing and factorised embeddings give ~12M parameters for a "
                          "BERT-base-sized network (1/9 of the weights); note its compute per token is BERT-base's")
_ELECTRA_SMALL = ("electra-small", "replaced-token detection learns from every input token, not the 15% that are "
                                   "masked: the ELECTRA paper's small model, trained on one GPU in 4 days, beats GPT "
                                   "on GLUE; the cheapest family to pre-train well")
_ROBERTA_LARGE = ("roberta-large", "BERT-large's shape trained longer on more data with dynamic masking and no NSP; "
                                   "the RoBERTa paper reports it above BERT-large on GLUE, SQuAD and RACE")
_ELECTRA_LARGE = ("electra-large", "the ELECTRA paper reports it matching RoBERTa-large on GLUE with about 1/4 of the "
                                   "pre-training compute, and the best SQuAD 2.0 results of the compared models")
_DEBERTA_V3_LARGE = ("deberta-v3-large", "DeBERTa-v3 (He et al. 2023) pre-trains disentangled attention "
                                         "ELECTRA-style: the large model averages 91.4 on GLUE, 1.9 points above "
                                         "ELECTRA-large, and reaches 91.5 F1 / 89.0 EM on SQuAD 2.0 (ELECTRA-large "
                                         "90.6 / 88.0); ModernBERT-large, the next best, averages 90.4 on GLUE "
                                         "(Warner et al. 2024)")
_MODERNBERT_RETRIEVAL = ("modernbert-large", "ModernBERT (Warner et al. 2024), trained on 2 trillion tokens of text "
                                             "and code, gives the best single-vector retrievers of the encoders its "
                                             "paper compares: 44.0 nDCG@10 on BEIR for the large model (41.6 for "
                                             "modernbert-base, the cheaper choice), and it embeds up to 8,192 tokens")
_MODERNBERT_PRETRAINING = ("modernbert-large", "ModernBERT's recipe is MLM with 30% of the tokens masked (encoderkit's "
                                               "default for the family) and an 8,192-token context: the large model "
                                               "averages 90.4 on GLUE (Warner et al. 2024), above ELECTRA-large (89.5) "
                                               "and RoBERTa-large (88.9); DeBERTa-v3-large scores 91.4 but needs "
                                               "replaced-token detection, which encoderkit pre-trains for ELECTRA only")

_MPNET = ("mpnet-base", "all-mpnet-base-v2 (MPNet-base trained by sentence-transformers on 1B sentence pairs) is "
                        "sentence-transformers' best general-purpose English embedder and the default recommendation "
                        "for most English similarity tasks: `make mpnet` fetches it and encoderkit runs it as "
                        "sentence-transformers does; modernbert-large (41.6-44.0 nDCG@10 on BEIR) when you train a "
                        "retriever yourself or embed long documents")
_MULTILINGUAL_SMALL = ("multilingual-minilm-l12-h384", "paraphrase-multilingual-MiniLM-L12-v2's shape: a 12-layer "
                                                       "384-wide BERT over XLM-R's 250k SentencePiece vocabulary, "
                                                       "distilled from a multilingual teacher for 50+ languages; "
                                                       "most of its 118M parameters are the vocabulary")
_MULTILINGUAL_BASE = ("xlm-roberta-base", "XLM-RoBERTa (Conneau et al. 2020) is pre-trained on 2.5TB of CommonCrawl "
                                          "in 100 languages; multilingual-e5-base and most multilingual fine-tunes "
                                          "start from it")
_MULTILINGUAL_LARGE = ("xlm-roberta-large", "XLM-RoBERTa-large is the backbone of the strongest open multilingual "
                                            "embedders and rerankers (bge-m3, multilingual-e5-large, "
                                            "bge-reranker-v2-m3) and of cross-lingual classification (XNLI)")

_TABLE: dict[tuple[str, str], tuple[str, str]] = {}
for _task in TASKS:
    _TABLE[(_task, "latency")] = _DISTIL
    _TABLE[(_task, "memory")] = _ALBERT
    _TABLE[(_task, "quality")] = _ROBERTA_LARGE
    _TABLE[(_task, "budget")] = _ELECTRA_SMALL
_TABLE[("embedding", "latency")] = _MINILM
_TABLE[("embedding", "memory")] = _MINILM
_TABLE[("embedding", "quality")] = _MPNET
_TABLE[("classification", "quality")] = _DEBERTA_V3_LARGE
_TABLE[("qa", "quality")] = _DEBERTA_V3_LARGE
_TABLE[("pretraining", "quality")] = _MODERNBERT_PRETRAINING
_TABLE[("ner", "latency")] = _DISTIL

# Inputs longer than this need ModernBERT: every other preset was pre-trained on at most 512 tokens.
SHORT_CONTEXT = 512
LONG_CONTEXT = PRESETS["modernbert-base"]["max_position_embeddings"]  # 8,192
_LONG_REASON = ("8,192-token context: ModernBERT (Warner et al. 2024) is trained to read 8,192 tokens (rotary "
                "positions, global attention every third layer and 128-token sliding windows in the others) "
                f"and leads its paper's long-document retrieval results (MLDR); every other preset reads at most "
                f"{SHORT_CONTEXT} tokens")


def _multilingual(task: str, constraint: str, max_tokens: int | None) -> Recommendation:
    """The XLM-R family: ModernBERT and the English presets read one language well."""
    if constraint == "quality":
        name, reason = _MULTILINGUAL_LARGE
    elif task == "embedding" and constraint in ("latency", "memory"):
        name, reason = _MULTILINGUAL_SMALL
    else:
        name, reason = _MULTILINGUAL_BASE
    if max_tokens is not None and max_tokens > SHORT_CONTEXT:
        reason += (f"; it reads {SHORT_CONTEXT} tokens (ModernBERT's 8,192 are English): embed longer texts in "
                   "windows (long_text='window'), or use bge-m3, XLM-R-large with 8,192 positions")
    return Recommendation(name, reason)


def recommend(task: str, constraint: str, max_tokens: int | None = None, *,
              multilingual: bool = False) -> Recommendation:
    """A preset for ``task`` under ``constraint``; ``max_tokens``: the longest input, in tokens. Inputs longer than
    512 tokens get ModernBERT (modernbert-large under a quality constraint, else modernbert-base). ``multilingual``:
    text in several languages, which the XLM-R family reads (``_multilingual``)."""
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    if constraint not in CONSTRAINTS:
        raise InputError(f"unknown constraint {constraint!r}; choose one of: {', '.join(CONSTRAINTS)}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise InputError(f"max_tokens must be a positive number of tokens, found {max_tokens!r}")
    if multilingual:
        return _multilingual(task, constraint, max_tokens)
    if max_tokens is not None:
        if max_tokens > SHORT_CONTEXT:
            name = "modernbert-large" if constraint == "quality" else "modernbert-base"
            reason = _LONG_REASON + ("; the large model averages 90.4 on GLUE (base 88.4)" if constraint == "quality"
                                     else "; modernbert-large if quality matters more (GLUE 90.4 vs 88.4)")
            if max_tokens > LONG_CONTEXT:
                reason += f"; inputs of {max_tokens:,} tokens still need splitting into windows of at most " \
                          f"{LONG_CONTEXT:,} tokens"
            return Recommendation(name, reason)
    name, reason = _TABLE[(task, constraint)]
    return Recommendation(name, reason)
