"""Embedding losses: each equals its formula on hand-computed examples, and sentence-transformers' loss (the
oracle) on the same model and batch, loss and gradients, to 1e-5. Cached MNRL's gradients equal MNRL's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from encoderkit import InputError
from encoderkit.io.checkpoints import transformers_name
from encoderkit.embeddings import (
    CachedMultipleNegativesRankingLoss,
    CoSENTLoss,
    CosineSimilarityLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
    SentenceModel,
    SoftmaxLoss,
    TripletLoss,
    slice_features,
    text_ids,
)

pytestmark = pytest.mark.usefixtures("one_thread")

ANCHORS = ["how do I reset my password", "the printer is out of toner", "book a meeting room",
           "my laptop will not boot", "where is the cafeteria", "request a new badge"]
POSITIVES = ["password reset steps", "replace the toner cartridge", "room booking calendar",
             "laptop boot failure help", "cafeteria on the ground floor", "badge request form"]
NEGATIVES = ["printer driver download", "password policy", "parking rules", "monitor flickers",
             "holiday calendar", "visitor wifi"]
SCORES = [0.9, 0.1, 0.55, 0.3, 0.75, 0.3]  # one tie (0.3) on purpose
LABELS = [0, 2, 1, 0, 1, 2]


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# The models: a tiny random BERT (and all-MiniLM-L6-v2) as encoderkit SentenceModel and SentenceTransformer
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def st():
    """sentence-transformers' SentenceTransformer and its losses module (the oracle)."""
    from types import SimpleNamespace

    model = pytest.importorskip("sentence_transformers")
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    return SimpleNamespace(SentenceTransformer=model.SentenceTransformer, losses=losses)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir, st):
    from helpers import tiny_bert_dir

    directory = tiny_bert_dir(tmp_path_factory.mktemp("tiny-embedder"), minilm_dir)
    return SentenceModel.from_pretrained(directory).eval(), st.SentenceTransformer(str(directory), device="cpu").eval()


@pytest.fixture(scope="module")
def minilm(minilm_dir, st):
    theirs = st.SentenceTransformer(str(minilm_dir), device="cpu").eval()
    return SentenceModel.from_pretrained(minilm_dir).eval(), theirs


def run_both(models, columns, our_loss, their_loss, their_labels=None, **targets):
    """The same batch through both models and both losses, each back-propagated: (our loss, their loss,
    our gradients and their parameters, both by transformers name)."""
    ours, theirs = models
    ours.zero_grad()
    theirs.zero_grad()
    preprocess = getattr(theirs, "preprocess", None) or theirs.tokenize  # tokenize: before version 6
    features = [preprocess(column) for column in columns]
    batches = [ours.tokenize(column) for column in columns]
    for feature, batch in zip(features, batches):
        assert torch.equal(feature["input_ids"], batch.input_ids)
    their_value = their_loss(features, their_labels)
    their_value.backward()
    our_value = our_loss(*[ours.embed(b) for b in batches], **targets)
    our_value.backward()
    return our_value, their_value, grads(ours), dict(theirs[0].auto_model.named_parameters())


def grads(model: SentenceModel) -> dict[str, torch.Tensor]:
    config = model.encoder.config
    return {transformers_name(config, name): p.grad.clone() for name, p in model.encoder.named_parameters()
            if p.grad is not None}


def assert_same(our_value, their_value, our_grads, their_params) -> None:
    assert abs(our_value.item() - their_value.item()) < 1e-5, (our_value.item(), their_value.item())
    assert len(our_grads) > 10
    for name, grad in our_grads.items():
        assert (grad - their_params[name].grad).abs().max() < 1e-5, name


def test_sentence_model_reads_the_directory_and_equals_sentence_transformers(minilm) -> None:
    ours, theirs = minilm
    assert (ours.pooling, ours.normalize, ours.max_length, ours.dimension) == ("mean", True, 256, 384)
    with torch.no_grad():
        mine = ours.embed(ours.tokenize(ANCHORS[:3]))
    want = theirs.encode(ANCHORS[:3], convert_to_tensor=True)
    assert (mine - want).abs().max() < 1e-5
    with pytest.raises(InputError, match="unknown pooling"):
        SentenceModel(ours.encoder, pooling="median")


# ---------------------------------------------------------------------------------------------
# Softmax (SBERT, classification)
# ---------------------------------------------------------------------------------------------
def test_softmax_by_hand() -> None:
    loss = SoftmaxLoss(2, 2)
    with torch.no_grad():
        loss.classifier.weight.copy_(t([[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1]]))
        loss.classifier.bias.zero_()
    # u = (1, 2), v = (3, 0): [u; v; |u - v|] = (1, 2, 3, 0, 2, 2) -> logits (1, 4)
    value = loss(t([[1, 2]]), t([[3, 0]]), torch.tensor([0]))
    assert value.item() == pytest.approx(math.log(1 + math.exp(3)), abs=1e-6)
    with pytest.raises(InputError, match="label 2 of example 0 is outside"):
        loss(t([[1, 2]]), t([[3, 0]]), torch.tensor([2]))
    with pytest.raises(InputError, match="class indices"):
        loss(t([[1, 2]]), t([[3, 0]]), t([0.0]))


def test_softmax_equals_sentence_transformers(tiny, st) -> None:
    theirs_loss = st.losses.SoftmaxLoss(tiny[1], embedding_dimension=32, num_labels=3)
    ours_loss = SoftmaxLoss(32, 3)
    ours_loss.classifier.load_state_dict(theirs_loss.classifier.state_dict())
    labels = torch.tensor(LABELS)
    values = run_both(tiny, [ANCHORS, POSITIVES], ours_loss, theirs_loss, labels, labels=labels)
    assert_same(*values)
    assert (ours_loss.classifier.weight.grad - theirs_loss.classifier.weight.grad).abs().max() < 1e-5


# ---------------------------------------------------------------------------------------------
# Cosine-similarity regression
# ---------------------------------------------------------------------------------------------
def test_cosine_by_hand() -> None:
    value = CosineSimilarityLoss()(t([[1, 0], [1, 0]]), t([[1, 1], [-1, 0]]), t([0.5, 0.0]))
    assert value.item() == pytest.approx(((1 / math.sqrt(2) - 0.5) ** 2 + (-1 - 0) ** 2) / 2, abs=1e-6)
    with pytest.raises(InputError, match="score 1.5 of example 1 is outside \\[0, 1\\]"):
        CosineSimilarityLoss()(t([[1, 0], [1, 0]]), t([[1, 1], [-1, 0]]), t([0.5, 1.5]))
    with pytest.raises(InputError, match="expected 2 scores"):
        CosineSimilarityLoss()(t([[1, 0], [1, 0]]), t([[1, 1], [-1, 0]]), t([0.5]))


def test_cosine_equals_sentence_transformers(tiny, st) -> None:
    scores = t(SCORES)
    values = run_both(tiny, [ANCHORS, POSITIVES], CosineSimilarityLoss(), st.losses.CosineSimilarityLoss(tiny[1]),
                      scores, scores=scores)
    assert_same(*values)


# ---------------------------------------------------------------------------------------------
# CoSENT
# ---------------------------------------------------------------------------------------------
def test_cosent_by_hand() -> None:
    # cosines: A 1, B 0, C -1, D 1; scores: A 0.2, B 0.9, C 0.5, D 0.2 (a tie with A: no term)
    u = t([[1, 0], [1, 0], [1, 0], [0, 2]])
    v = t([[1, 0], [0, 1], [-1, 0], [0, 1]])
    scores = t([0.2, 0.9, 0.5, 0.2])
    # s_i > s_j: (B, A), (B, C), (B, D), (C, A), (C, D): exp(cos_j - cos_i) at scale 1
    terms = [1 - 0, -1 - 0, 1 - 0, 1 + 1, 1 + 1]
    want = math.log(1 + sum(math.exp(x) for x in terms))
    assert CoSENTLoss(scale=1.0)(u, v, scores).item() == pytest.approx(want, abs=1e-6)
    want20 = np.logaddexp.reduce([0.0] + [20.0 * x for x in terms])
    assert CoSENTLoss()(u, v, scores).item() == pytest.approx(want20, rel=1e-6)


def test_cosent_equals_sentence_transformers(tiny, st) -> None:
    scores = t(SCORES)
    values = run_both(tiny, [ANCHORS, POSITIVES], CoSENTLoss(), st.losses.CoSENTLoss(tiny[1]), scores, scores=scores)
    assert_same(*values)


# ---------------------------------------------------------------------------------------------
# Triplet
# ---------------------------------------------------------------------------------------------
def test_triplet_by_hand() -> None:
    a, p, n = t([[0, 0], [0, 0]]), t([[3, 4], [6, 8]]), t([[6, 8], [3, 4]])
    # d(a, p) - d(a, n) + 5: 5 - 10 + 5 = 0 and 10 - 5 + 5 = 10
    assert TripletLoss()(a, p, n).item() == pytest.approx(5.0)
    a, p, n = t([[1, 0], [1, 0]]), t([[1, 1], [0, 1]]), t([[0, 1], [1, 1]])
    near = 1 - 1 / math.sqrt(2)  # cosine distance of (1, 0) and (1, 1)
    want = (max(near - 1 + 0.5, 0) + max(1 - near + 0.5, 0)) / 2
    assert TripletLoss("cosine", margin=0.5)(a, p, n).item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(InputError, match="unknown triplet distance"):
        TripletLoss("manhattan")


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_triplet_equals_sentence_transformers(tiny, st, distance) -> None:
    metric = getattr(st.losses.TripletDistanceMetric, distance.upper())
    margin = 5.0 if distance == "euclidean" else 0.5
    theirs = st.losses.TripletLoss(tiny[1], distance_metric=metric, triplet_margin=margin)
    values = run_both(tiny, [ANCHORS, POSITIVES, NEGATIVES], TripletLoss(distance, margin), theirs)
    assert_same(*values)
    assert TripletLoss().margin == st.losses.TripletLoss(tiny[1]).triplet_margin  # the same default


# ---------------------------------------------------------------------------------------------
# Multiple-negatives ranking
# ---------------------------------------------------------------------------------------------
def nll(row: list[float], target: int) -> float:
    return -(row[target] - math.log(sum(math.exp(x) for x in row)))


def test_mnrl_by_hand() -> None:
    r = 1 / math.sqrt(2)
    a, p = t([[1, 0], [0, 1]]), t([[1, 1], [0, 1]])
    cos = [[r, 0.0], [r, 1.0]]  # cos(a_i, p_j)
    forward = (nll(cos[0], 0) + nll(cos[1], 1)) / 2
    assert MultipleNegativesRankingLoss(scale=1.0)(a, p).item() == pytest.approx(forward, abs=1e-6)
    backward = (nll([cos[0][0], cos[1][0]], 0) + nll([cos[0][1], cos[1][1]], 1)) / 2
    symmetric = MultipleNegativesRankingLoss(scale=1.0, symmetric=True)(a, p)
    assert symmetric.item() == pytest.approx((forward + backward) / 2, abs=1e-6)
    # a hard-negative column: n_0 = (0, 1), n_1 = (1, 0); scale 20
    n = t([[0, 1], [1, 0]])
    rows = [[20 * x for x in cos[0] + [0.0, 1.0]], [20 * x for x in cos[1] + [1.0, 0.0]]]
    want = (nll(rows[0], 0) + nll(rows[1], 1)) / 2
    assert MultipleNegativesRankingLoss()(a, p, n).item() == pytest.approx(want, rel=1e-6)


def test_mnrl_masks_repeated_texts() -> None:
    # pairs (q1, x), (q2, y), (q3, x): x appears twice, so p_2 is no negative of a_0 nor p_0 of a_2
    a, p = t([[1, 0], [0, 1], [1, 1]]), t([[1, 0], [1, 2], [1, 0]])
    ids = text_ids([["q1", "q2", "q3"], ["x", "y", "x"]])
    assert ids.tolist() == [[0, 1, 2], [3, 4, 3]]
    cos = torch.nn.functional.normalize(a, dim=1) @ torch.nn.functional.normalize(p, dim=1).T
    c = cos.tolist()
    masked = (nll([c[0][0], c[0][1]], 0) + nll(c[1], 1) + nll([c[2][1], c[2][2]], 1)) / 3
    assert MultipleNegativesRankingLoss(scale=1.0)(a, p, duplicates=ids).item() == pytest.approx(masked, abs=1e-6)
    unmasked = (nll(c[0], 0) + nll(c[1], 1) + nll(c[2], 2)) / 3  # what sentence-transformers computes
    assert MultipleNegativesRankingLoss(scale=1.0)(a, p).item() == pytest.approx(unmasked, abs=1e-6)
    # reverse term: positive 0 ranks anchors (a_0, a_1, a_2) with a_2 masked (its positive is x too)
    backward = (nll([c[0][0], c[1][0]], 0) + nll([c[0][1], c[1][1], c[2][1]], 1) + nll([c[1][2], c[2][2]], 1)) / 3
    symmetric = MultipleNegativesRankingLoss(scale=1.0, symmetric=True)(a, p, duplicates=ids)
    assert symmetric.item() == pytest.approx((masked + backward) / 2, abs=1e-6)
    # a repeated anchor (q1 twice) makes both its positives right answers; a hard negative equal to a_0's
    # positive is no negative either
    n = t([[0, 1], [2, 0], [0, 3]])
    ids = text_ids([["q1", "q2", "q1"], ["x", "y", "z"], ["w", "z", "v"]])
    scores = (torch.nn.functional.normalize(a, dim=1)
              @ torch.nn.functional.normalize(torch.cat([p, n]), dim=1).T).tolist()
    keep = [[0, 1, 3, 5], [0, 1, 2, 3, 4, 5], [1, 2, 3, 5]]  # a_0: drop z (p_2 and n_1); a_2: drop x (p_0), z (n_1)
    want = sum(nll([scores[i][j] for j in keep[i]], keep[i].index(i)) for i in range(3)) / 3
    assert MultipleNegativesRankingLoss(scale=1.0)(a, p, n, duplicates=ids).item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(InputError, match="duplicates must be integer text ids of shape"):
        MultipleNegativesRankingLoss()(a, p, duplicates=ids)


def test_mnrl_equals_sentence_transformers(minilm, st) -> None:
    their_loss = st.losses.MultipleNegativesRankingLoss(minilm[1])
    values = run_both(minilm, [ANCHORS[:4], POSITIVES[:4], NEGATIVES[:4]], MultipleNegativesRankingLoss(), their_loss)
    assert_same(*values)


def test_symmetric_mnrl_equals_sentence_transformers(tiny, st) -> None:
    their_loss = st.losses.MultipleNegativesRankingLoss(tiny[1], directions=("query_to_doc", "doc_to_query"),
                                                        partition_mode="per_direction")
    values = run_both(tiny, [ANCHORS, POSITIVES], MultipleNegativesRankingLoss(symmetric=True), their_loss)
    assert_same(*values)


# ---------------------------------------------------------------------------------------------
# Cached MNRL (GradCache)
# ---------------------------------------------------------------------------------------------
def reference_grads(model, batches, loss, ranges=None, **options):
    """The plain loss on the whole batch, back-propagated: each column embedded in one forward, or, with
    ``ranges``, in the mini-batches (and so the random draws) of the cached loss."""
    model.zero_grad()
    if ranges is None:
        embeddings = [model.embed(b) for b in batches]
    else:
        embeddings = [torch.cat([model(**slice_features(b.model_inputs(), *r)) for r in ranges]) for b in batches]
    value = loss(*embeddings, **options)
    value.backward()
    return value, grads(model)


def cached_grads(model, batches, cached, **options):
    model.zero_grad()
    value = cached(*batches, **options)
    value.backward()
    return value, grads(model)


def assert_equal_grads(first, second) -> None:
    assert abs(first[0].item() - second[0].item()) < 1e-5
    for name, grad in first[1].items():
        assert (grad - second[1][name]).abs().max() < 1e-5, name


def test_cached_mnrl_gradients_equal_mnrl(tiny) -> None:
    model = tiny[0]
    ids = text_ids([ANCHORS, POSITIVES[:5] + POSITIVES[:1], NEGATIVES])  # a repeated positive, masked
    batches = [model.tokenize(c) for c in (ANCHORS, POSITIVES[:5] + POSITIVES[:1], NEGATIVES)]
    plain = MultipleNegativesRankingLoss(symmetric=True)
    cached = CachedMultipleNegativesRankingLoss(model, symmetric=True, mini_batch_size=4)
    assert_equal_grads(reference_grads(model, batches, plain, duplicates=ids),
                       cached_grads(model, batches, cached, duplicates=ids))


def test_cached_mnrl_replays_dropout(tiny) -> None:
    model = tiny[0].train()
    try:
        batches = [model.tokenize(c) for c in (ANCHORS, POSITIVES)]
        cached = CachedMultipleNegativesRankingLoss(model, mini_batch_size=4)
        torch.manual_seed(7)
        want = reference_grads(model, batches, MultipleNegativesRankingLoss(), ranges=[(0, 4), (4, 6)])
        torch.manual_seed(7)
        got = cached_grads(model, batches, cached)
        assert_equal_grads(want, got)
        torch.manual_seed(8)  # dropout is really on: other draws give other gradients
        other = cached_grads(model, batches, cached)
        assert max((other[1][n] - g).abs().max() for n, g in got[1].items()) > 1e-4
    finally:
        model.eval()


# ---------------------------------------------------------------------------------------------
# Matryoshka
# ---------------------------------------------------------------------------------------------
def test_matryoshka_is_the_weighted_sum_over_prefixes() -> None:
    u = t([[1, 2, 0], [0, 1, 1], [3, -1, 2]])
    v = t([[1, 1, 1], [2, 0, 1], [-1, 1, 2]])
    scores = t([0.8, 0.2, 0.5])
    inner = CoSENTLoss(scale=1.0)
    loss = MatryoshkaLoss(inner, dims=[1, 3, 2], weights=[0.25, 1.0, 0.5])
    assert loss.dims == (3, 2, 1) and loss.weights == (1.0, 0.5, 0.25)
    want = inner(u, v, scores) + 0.5 * inner(u[:, :2], v[:, :2], scores) + 0.25 * inner(u[:, :1], v[:, :1], scores)
    assert loss(u, v, scores).item() == pytest.approx(want.item(), abs=1e-6)
    # Euclidean triplet: prefixes as they are unless asked to re-normalise
    a, p, n = u, v, v.flip(0)
    triplet = TripletLoss(margin=1.0)
    plain = triplet(a, p, n) + triplet(a[:, :2], p[:, :2], n[:, :2])
    assert MatryoshkaLoss(triplet, [3, 2])(a, p, n).item() == pytest.approx(plain.item(), abs=1e-6)
    with pytest.raises(InputError, match="cannot wrap SoftmaxLoss"):
        MatryoshkaLoss(SoftmaxLoss(3, 2), [3, 2])
    with pytest.raises(InputError, match="larger than the embeddings' dimension"):
        MatryoshkaLoss(inner, [4, 2])(u, v, scores)


@pytest.mark.parametrize("kind", ["mnrl", "cosent", "triplet"])
def test_matryoshka_equals_sentence_transformers(tiny, st, kind) -> None:
    dims, reference = [32, 16, 8], tiny[1]
    columns, labels = [ANCHORS, POSITIVES], None
    if kind == "mnrl":
        ours, theirs = MultipleNegativesRankingLoss(), st.losses.MultipleNegativesRankingLoss(reference)
    elif kind == "cosent":
        ours, theirs, labels = CoSENTLoss(), st.losses.CoSENTLoss(reference), t(SCORES)
    else:  # Euclidean: sentence-transformers re-normalises every prefix, so normalize=True below
        ours, theirs = TripletLoss(margin=1.0), st.losses.TripletLoss(reference, triplet_margin=1.0)
        columns = [ANCHORS, POSITIVES, NEGATIVES]
    options = {} if labels is None else {"scores": labels}
    values = run_both(tiny, columns, MatryoshkaLoss(ours, dims, [1.0, 0.5, 0.25], normalize=True),
                      st.losses.MatryoshkaLoss(tiny[1], theirs, dims, [1.0, 0.5, 0.25]), labels, **options)
    assert_same(*values)


def test_cached_matryoshka_gradients_equal_plain(tiny) -> None:
    model = tiny[0]
    batches = [model.tokenize(c) for c in (ANCHORS, POSITIVES)]
    loss = MatryoshkaLoss(MultipleNegativesRankingLoss(), [32, 16])
    cached = CachedMultipleNegativesRankingLoss(model, mini_batch_size=3, loss=loss)
    assert_equal_grads(reference_grads(model, batches, loss), cached_grads(model, batches, cached))
    with pytest.raises(InputError, match="for the cached loss write"):
        MatryoshkaLoss(cached, [16])
