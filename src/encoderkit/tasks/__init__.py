"""Inference pipelines (embed; later fill-mask, classify, ner, qa, search)."""
