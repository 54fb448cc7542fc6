"""Opening a fine-tuned directory with the pipeline it was made for. Kept apart from ``pipeline`` (which every
task pipeline imports), since choosing one means knowing them all."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..modeling.models import load_model
from ..tokenizer import Tokenizer
from .classify import Classifier
from .ner import EntityRecognizer
from .pipeline import TaskPipeline
from .qa import QuestionAnswerer


def load_pipeline(path: str | Path, **options: Any) -> TaskPipeline:
    """The pipeline a fine-tuned directory was made for (classification, NER or QA; fill-mask for MLMs)."""
    from ..io.hub import resolve_model

    resolved = resolve_model(path)
    model = load_model(resolved)
    tokenizer = Tokenizer.from_pretrained(resolved.tokenizer_dir)
    for pipeline in (Classifier, EntityRecognizer, QuestionAnswerer):
        if model.task in pipeline.tasks:
            return pipeline(model, tokenizer, **options)
    raise InputError(f"{resolved.root} is a {model.task} model, not a fine-tuned classifier, NER tagger or QA model; "
                     "for masked-LM models use `encoderkit fill-mask`, for encoders `encoderkit embed`")
