"""Reading and writing models: the formats and where models come from.

- ``checkpoints``: transformers' checkpoint names <-> encoderkit's, per family (both ways, so that a saved model
  loads in transformers and the reverse).
- ``hub``: a model argument (a directory, a sentence-transformers directory, a hub id in the local
  huggingface_hub cache, or None for the default model) resolved once into a ``ResolvedModel``.
- ``st_format``: sentence-transformers' directory format (modules.json, pooling, normalisation, prompts).

Nothing here computes with a model; modeling/ and the pipelines call in, never the reverse.
"""
