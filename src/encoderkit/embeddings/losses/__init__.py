"""Losses for training sentence embedders, one per file, each with the formula of its paper in its docstring.

Every loss but the cached one takes embeddings (``SentenceModel`` outputs), not a model:

- ``SoftmaxLoss(dimension, num_labels)(u, v, labels)``: NLI-style classification over (u, v, |u - v|);
- ``CosineSimilarityLoss()(u, v, scores)``: MSE between cos(u, v) and a score in [0, 1];
- ``CoSENTLoss(scale=20)(u, v, scores)``: ranking of the pairs' cosines by their scores;
- ``TripletLoss(distance, margin)(anchors, positives, negatives)``;
- ``MultipleNegativesRankingLoss(scale=20, symmetric=False)(anchors, positives, *negatives, duplicates=None)``;
- ``CachedMultipleNegativesRankingLoss(model, mini_batch_size=32)(anchor_batch, positive_batch, ...)``: GradCache;
- ``MatryoshkaLoss(loss, dims, weights=None)``: any of the above (but softmax) on nested prefixes;
- ``MaxSimMultipleNegativesRankingLoss(scale=1)(anchors, positives, *negatives, duplicates=None)``: multi-vector
  (ColBERT) embeddings, each a ``MultiVectorModel`` output (vectors, mask), ranked by MaxSim;
- ``SpladeLoss(query_regularizer_weight, document_regularizer_weight)(queries, positives, *negatives)``: SPLADE's
  dot-product MNRL plus FLOPS regularisation, on ``SparseModel`` outputs.
"""
from .cached_mnrl import CachedMultipleNegativesRankingLoss
from .cosent import CoSENTLoss
from .cosine import CosineSimilarityLoss
from .matryoshka import MatryoshkaLoss
from .maxsim import MaxSimMultipleNegativesRankingLoss
from .mnrl import MultipleNegativesRankingLoss, false_negative_masks, text_ids
from .softmax import SoftmaxLoss
from .splade import SpladeLoss, flops
from .triplet import TripletLoss

__all__ = ["CachedMultipleNegativesRankingLoss", "CoSENTLoss", "CosineSimilarityLoss", "MatryoshkaLoss",
           "MaxSimMultipleNegativesRankingLoss", "MultipleNegativesRankingLoss", "SoftmaxLoss", "SpladeLoss",
           "TripletLoss", "false_negative_masks", "flops", "text_ids"]
