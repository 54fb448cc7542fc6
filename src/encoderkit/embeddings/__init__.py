"""Training sentence embedders: ``SentenceModel`` (encoder + pooling + optional normalisation) and its losses."""
from .losses import (
    CachedMultipleNegativesRankingLoss,
    CoSENTLoss,
    CosineSimilarityLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
    SoftmaxLoss,
    TripletLoss,
    false_negative_masks,
    text_ids,
)
from .sentence_model import SentenceModel, batch_features, slice_features

__all__ = ["CachedMultipleNegativesRankingLoss", "CoSENTLoss", "CosineSimilarityLoss", "MatryoshkaLoss",
           "MultipleNegativesRankingLoss", "SentenceModel", "SoftmaxLoss", "TripletLoss", "batch_features",
           "false_negative_masks", "slice_features", "text_ids"]
