"""Request bodies, as text-embeddings-inference and OpenAI define them. Strict: a wrong type is a 422 naming the
field, never a silent coercion ("yes" is not a boolean, 5.0 is not a count). Unknown fields are ignored, as
OpenAI's clients send extras (``user``)."""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

Texts = Union[str, list[str]]
MODEL_FIELD = Field(None, description="a model name given at start-up (GET /info lists them); default: the first "
                                      "model that serves this endpoint")


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class EmbedRequest(_Request):
    inputs: Texts
    normalize: bool = True
    truncate: bool = False
    dimensions: Optional[int] = Field(None, description="keep the first N dimensions (Matryoshka), then normalize")
    prompt_name: Optional[str] = Field(None, description="a prompt the model names (config_sentence_transformers.json"
                                                         "), put before every text; default: the model's default")
    model: Optional[str] = MODEL_FIELD


class EmbedSparseRequest(_Request):
    inputs: Texts
    truncate: bool = False
    prompt_name: Optional[str] = Field(None, description="a prompt the model names, put before every text")
    model: Optional[str] = MODEL_FIELD


class EmbedAllRequest(_Request):
    inputs: Texts
    truncate: bool = False
    prompt_name: Optional[str] = Field(None, description="a prompt the model names, put before every text")
    is_query: bool = Field(False, description="multi-vector (ColBERT) models: encode the inputs as queries (query "
                                              "marker, expansion to the query length) rather than as documents")
    model: Optional[str] = MODEL_FIELD


class OpenAIEmbeddingRequest(_Request):
    input: Texts
    model: Optional[str] = MODEL_FIELD
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None


class RerankRequest(_Request):
    query: str
    texts: list[str]
    return_text: bool = False
    raw_scores: bool = Field(False, description="the logits instead of their sigmoid")
    truncate: bool = False
    model: Optional[str] = MODEL_FIELD


class PredictRequest(_Request):
    inputs: Union[str, list[str], list[list[str]]] = Field(
        description="a text, a pair [text, text], or a batch of texts and pairs [[text], [text, text], ...]")
    truncate: bool = False
    raw_scores: bool = False
    model: Optional[str] = MODEL_FIELD


class NerRequest(_Request):
    inputs: Texts
    model: Optional[str] = MODEL_FIELD


class QaRequest(_Request):
    question: str
    context: str
    model: Optional[str] = MODEL_FIELD


class FillMaskRequest(_Request):
    inputs: Texts
    top_k: int = 5
    model: Optional[str] = MODEL_FIELD


class TokenizeRequest(_Request):
    inputs: Texts
    add_special_tokens: bool = True
    model: Optional[str] = MODEL_FIELD


class SearchRequest(_Request):
    query: str
    k: int = 10
    model: Optional[str] = MODEL_FIELD
