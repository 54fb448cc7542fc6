"""encoderkit's model code: one encoder with switches for the BERT family, and task heads."""
from .encoder import EncoderLayer, EncoderModel, EncoderOutput
from .models import (
    TASK_MODELS,
    Encoder,
    EncoderForMaskedLM,
    EncoderForPreTraining,
    EncoderForQuestionAnswering,
    EncoderForReplacedTokenDetection,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    TaskOutput,
    build_model,
)

__all__ = [
    "TASK_MODELS", "Encoder", "EncoderForMaskedLM", "EncoderForPreTraining", "EncoderForQuestionAnswering",
    "EncoderForReplacedTokenDetection", "EncoderForSequenceClassification", "EncoderForTokenClassification",
    "EncoderLayer", "EncoderModel", "EncoderOutput", "TaskOutput", "build_model",
]
