"""encoderkit: encoder-only transformers (BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, ALBERT, ELECTRA, MPNet, ModernBERT, DeBERTa-v2/v3,
NomicBERT, GTE, EuroBERT, jina-embeddings-v3) in plain PyTorch."""
from .modeling.models import load_model, save_model
from .config import FAMILIES, PRESETS, EncoderConfig, load_config, preset
from .errors import CheckpointError, ConfigError, DataError, EncoderkitError, InputError, TokenizerError
from .export import ExportResult, export_model, export_onnx
from .io.hub import default_model_path, resolve_model
from .modeling import (
    Encoder,
    EncoderForMaskedLM,
    EncoderForPreTraining,
    EncoderForQuestionAnswering,
    EncoderForReplacedTokenDetection,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    build_model,
)
from .tasks.classify import ClassPrediction, Classifier
from .tasks.embed import Embedder
from .tasks.ner import Entity, EntityRecognizer
from .tasks.loading import load_pipeline
from .tasks.qa import Answer, QuestionAnswerer
from .tasks.rerank import Reranker
from .training.finetune import FinetuneResult, Recipe, evaluate_model, finetune
from .tokenizer import BatchEncoding, Encoded, Tokenizer
from .tokenizer_training import train_tokenizer
from .embeddings import compressed as _compressed_index_kinds  # noqa: F401 (registers ivfpq, int8, binary)

__version__ = "0.1.0"

__all__ = [
    "Answer", "BatchEncoding", "Reranker", "CheckpointError", "ClassPrediction", "Classifier", "Entity", "EntityRecognizer",
    "FinetuneResult", "QuestionAnswerer", "Recipe", "evaluate_model", "finetune", "load_pipeline", "ConfigError", "DataError", "Embedder", "Encoded", "Encoder",
    "EncoderConfig", "EncoderForMaskedLM", "EncoderForPreTraining", "EncoderForQuestionAnswering",
    "EncoderForReplacedTokenDetection", "EncoderForSequenceClassification", "EncoderForTokenClassification",
    "EncoderkitError", "ExportResult", "FAMILIES", "InputError", "PRESETS", "Tokenizer", "TokenizerError", "build_model",
    "default_model_path", "export_model", "export_onnx", "load_config", "load_model", "preset", "resolve_model", "save_model",
    "train_tokenizer", "__version__",
]
