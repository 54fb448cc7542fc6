"""XLM-RoBERTa (Conneau et al., 2020) and CamemBERT (Martin et al., 2020): RoBERTa's architecture under their own
model_type and class names, with their SentencePiece vocabularies (250,002 and 32,005 tokens; the tokenizer.json
carries the fairseq id offset). The checkpoints name the base model ``roberta.`` as RoBERTa's do."""
from dataclasses import replace

from .roberta import FAMILY as ROBERTA

XLM_ROBERTA = replace(ROBERTA, name="xlm-roberta", hf_class_stem="XLMRoberta",
                      defaults=dict(ROBERTA.defaults, vocab_size=250002))
CAMEMBERT = replace(ROBERTA, name="camembert", hf_class_stem="Camembert",
                    defaults=dict(ROBERTA.defaults, vocab_size=32005))
