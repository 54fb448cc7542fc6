"""SPLADE: ``SparseEmbedder`` and ``SparseModel`` against sentence-transformers' ``SparseEncoder`` (its directory
format both ways, its encode, its top-k pruning), and ``SpladeLoss`` against sentence-transformers' SpladeLoss on
one batch (loss and gradients). To 1e-5, absolute and relative: sum pooling adds up a text's length of weights."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from encoderkit.embeddings.sparse import SparseEmbedder, SparseModel
from encoderkit.embeddings.sparse_vectors import SparseVectors
from encoderkit.errors import InputError
from helpers import tiny_bert_dir

st = pytest.importorskip("sentence_transformers")
from sentence_transformers import SparseEncoder  # noqa: E402

TEXTS = ["The cat sat on the mat.", "Sparse retrieval expands queries with related terms",
         "a", "Weights of 30,522 vocabulary terms, most of them zero, " * 6]


def _perturb(directory, seed=1, scale=0.3):
    """Move every weight away from its initial value (so that the MLM logits are far from zero and every
    vocabulary term can be active), keeping the checkpoint's layout."""
    from safetensors.torch import load_file, save_file

    state = load_file(directory / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    save_file({k: v + scale * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
               for k, v in state.items()}, directory / "model.safetensors")
    return directory


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, minilm_dir):
    return _perturb(tiny_bert_dir(tmp_path_factory.mktemp("splade") / "mlm", minilm_dir, task="masked-lm"))


@pytest.fixture(scope="module")
def trainable_dir(tmp_path_factory, minilm_dir):
    """Weights moved less far, as a model in training has them: gradients summed over a batch's tokens then stay
    of the magnitude where fp32 holds 1e-5."""
    return _perturb(tiny_bert_dir(tmp_path_factory.mktemp("splade") / "mlm", minilm_dir, task="masked-lm"), scale=0.05)


@pytest.mark.parametrize("pooling,activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_sparse_embedder_equals_sentence_transformers(tmp_path, mlm_dir, pooling, activation):
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    theirs = SparseEncoder(modules=[MLMTransformer(str(mlm_dir)), SpladePooling(pooling, activation)])
    theirs.save(str(tmp_path / "st"))
    ours = SparseEmbedder.from_pretrained(tmp_path / "st")
    assert (ours.pooling, ours.activation) == (pooling, activation)
    expected = theirs.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    got = ours.encode(TEXTS)
    assert isinstance(got, SparseVectors) and len(got) == len(TEXTS) and got.dimension == expected.shape[1]
    # Both sides are fp32, so both are judged against the same model in float64. Summed over a text's tokens, the
    # perturbed head's weights reach about 100, where fp32's own rounding is about 1e-5: ours may be off the truth
    # by a few times what the fp32 reference is, and no more (a wrong term or token would be off by far more).
    truth = SparseEncoder(modules=[MLMTransformer(str(mlm_dir)), SpladePooling(pooling, activation)]).to(
        torch.float64).encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    reference_error = float(np.abs(expected - truth).max())
    np.testing.assert_allclose(got.to_dense(), truth, atol=max(1e-5, 4 * reference_error), rtol=1e-5)
    assert (got.to_dense() != 0).sum() == (expected != 0).sum()  # the same terms active, none lost to rounding
    top = theirs.encode(TEXTS, max_active_dims=7, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(ours.encode(TEXTS, max_active_dims=7).to_dense(), top, atol=1e-5, rtol=1e-5)
    assert np.diff(ours.encode(TEXTS, max_active_dims=7).indptr).max() == 7


def test_encoderkit_writes_what_sentence_transformers_reads(tmp_path, mlm_dir):
    model = SparseModel.from_pretrained(mlm_dir, pooling="sum", max_length=40, prompts={"query": "query: "})
    model.save_pretrained(tmp_path / "ours")
    theirs = SparseEncoder(str(tmp_path / "ours"))
    assert json.loads((tmp_path / "ours" / "config_sentence_transformers.json").read_text())["similarity_fn_name"] \
        == "dot" and theirs.max_seq_length == 40
    ours = SparseEmbedder.from_pretrained(tmp_path / "ours")
    expected = theirs.encode(TEXTS, prompt_name="query", convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(ours.encode(TEXTS, prompt_name="query").to_dense(), expected, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ours.encode_query(TEXTS).to_dense(), expected, atol=1e-5, rtol=1e-5)


def test_the_trainable_model_pools_as_the_embedder(mlm_dir):
    model = SparseModel.from_pretrained(mlm_dir).eval()
    batch = model.tokenize(TEXTS)
    with torch.no_grad():
        dense = model(**batch.model_inputs()).numpy()
    np.testing.assert_allclose(SparseEmbedder.from_pretrained(mlm_dir).encode(TEXTS).to_dense(), dense,
                               atol=1e-5, rtol=1e-5)


def test_a_base_checkpoint_has_no_mlm_head_to_expand_with(tmp_path, minilm_dir):
    with pytest.raises(InputError, match="no trained masked-lm head.*encoderkit pretrain"):
        SparseEmbedder.from_pretrained(minilm_dir)


def test_sparse_vectors_dot_and_terms(mlm_dir):
    ours = SparseEmbedder.from_pretrained(mlm_dir)
    vectors = ours.encode(TEXTS[:2])
    dense = vectors.to_dense().astype(np.float64)
    np.testing.assert_allclose(vectors.dot(vectors), dense @ dense.T, rtol=1e-9)
    terms = vectors.terms(0, ours.vocabulary, top=3)
    columns, weights = vectors.row(0)
    heaviest = columns[np.argsort(-weights)[:3]]
    assert [t for t, _ in terms] == ours.tokenizer.convert_ids_to_tokens(heaviest.tolist())


@pytest.mark.parametrize("chunk_entries", [1 << 22, 37, 1])
def test_sparse_dot_equals_the_dense_product(chunk_entries):
    """Rows of 0 to 80 terms over BERT's 30,522, some sharing many terms: the product by terms, in chunks of any
    size (one pair, 37, all at once), equals the float64 product of the dense rows."""
    rng = np.random.default_rng(5)

    def vectors(count: int) -> SparseVectors:
        rows = []
        for r in range(count):
            pool = 200 if r % 3 else 30522  # a third of the rows drawn from all terms, the others from 200
            ids = rng.choice(pool, size=int(rng.integers(0, 80)), replace=False)
            rows.append((ids, rng.random(len(ids)).astype(np.float32) + 0.05))
        return SparseVectors.from_rows(rows, 30522)

    queries, documents = vectors(23), vectors(150)
    expected = queries.to_dense().astype(np.float64) @ documents.to_dense().astype(np.float64).T
    np.testing.assert_allclose(queries.dot(documents, chunk_entries=chunk_entries), expected, rtol=1e-12, atol=0)
    empty = SparseVectors.from_rows([(np.zeros(0), np.zeros(0))] * 2, 30522)
    assert (empty.dot(documents) == 0).all() and empty.dot(documents).shape == (2, 150)
    assert (queries.dot(empty) == 0).all() and queries.dot(empty).shape == (23, 2)



def test_picked_rows_equal_the_dense_rows_picked():
    """Rows picked by an int, a slice (steps, negative ends) or a list (repeats, negative ids, empty rows) equal
    numpy's indexing of the dense rows; a row outside the vectors raises IndexError."""
    rng = np.random.default_rng(9)
    rows = [(ids, rng.random(len(ids)).astype(np.float32) + 0.1)
            for ids in (rng.choice(40, size=int(rng.integers(0, 6)), replace=False) for _ in range(12))]
    vectors = SparseVectors.from_rows(rows, 40)
    dense = vectors.to_dense()
    for pick in (3, -1, slice(None), slice(2, 9, 3), slice(None, None, -2), slice(5, 5), [7, 0, 7, -12],
                 np.array([11, 2]), []):
        picked = vectors[pick]
        want = dense[[pick]] if np.isscalar(pick) else dense[pick]
        np.testing.assert_array_equal(picked.to_dense(), want.reshape(-1, 40), err_msg=str(pick))
        assert picked.indptr[-1] == picked.nnz and (picked.values != 0).all()
    for outside in (12, -13, [0, 12]):
        with pytest.raises(IndexError):
            vectors[outside]


def test_calibration_starts_the_vectors_at_the_asked_active_terms(mlm_dir):
    """``calibrate_active_terms`` against transformers' BertForMaskedLM: the shift is the midpoint between the
    (k x texts)-th and the next largest of the texts' per-term maximum logits (found here by sorting them), the
    bias moves by exactly that, and the texts' sparse vectors then hold k non-zero terms each on average."""
    from transformers import BertForMaskedLM

    from encoderkit.embeddings.sparse import calibrate_active_terms

    texts, wanted = TEXTS + DOCUMENTS, 40
    reference = BertForMaskedLM.from_pretrained(str(mlm_dir)).eval()
    model = SparseModel.from_pretrained(mlm_dir)
    maxima = []
    for text in texts:  # one text at a time: no padding to leave out
        batch = model.tokenize([text])
        with torch.no_grad():
            maxima.append(reference(**batch.model_inputs()).logits[0].amax(dim=0).numpy())
    values = np.sort(np.concatenate(maxima))[::-1]
    k = wanted * len(texts)
    assert (values > 0).sum() > k  # the perturbed head starts denser than asked
    before = model.mlm.mlm_head.decoder.bias.detach().clone()
    done = calibrate_active_terms(model, texts, wanted, batch_size=3)  # batches with padding
    assert done["shift"] == pytest.approx((values[k - 1] + values[k]) / 2, abs=1e-5)
    assert done["active_before"] == pytest.approx((values > 0).sum() / len(texts))
    torch.testing.assert_close(model.mlm.mlm_head.decoder.bias, before - done["shift"], rtol=0, atol=1e-6)
    model.eval()
    with torch.no_grad():
        vectors = model(**model.tokenize(texts).model_inputs())
    assert float((vectors > 0).sum()) / len(texts) == done["active_after"] == wanted
    assert model.mlm.mlm_head.decoder.bias.requires_grad  # still trainable


@pytest.mark.parametrize("terms", [0, 30522])
def test_calibration_refuses_a_count_outside_the_vocabulary(mlm_dir, terms):
    from encoderkit.embeddings.sparse import calibrate_active_terms

    with pytest.raises(InputError, match="between 1 and the vocabulary size - 1"):
        calibrate_active_terms(SparseModel.from_pretrained(mlm_dir), TEXTS, terms)


QUERIES = ["what do cats sit on", "how does sparse retrieval expand a query", "weights of terms"]
DOCUMENTS = ["The cat sat on the mat.", "Expansion adds related vocabulary terms to the query.",
             "Most of the 30,522 weights are zero."]
NEGATIVES = ["Dogs bark at night.", "Dense vectors have 384 dimensions.", "the"]


@pytest.mark.parametrize("pooling,negatives", [("sum", False), ("sum", True), ("max", True)])
def test_splade_loss_equals_sentence_transformers(trainable_dir, pooling, negatives):
    """Loss terms and gradients, to 1e-5 relative to their magnitude: an untrained MLM head's logits are large, so
    the loss is in the hundreds and the tied embeddings' gradients reach thousands (sums over every token and term),
    where fp32 holds about 1e-6 of the value."""
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss
    from sentence_transformers.sparse_encoder.losses import SpladeLoss as TheirSpladeLoss
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    from encoderkit.embeddings.losses import SpladeLoss

    columns = [QUERIES, DOCUMENTS] + ([NEGATIVES] if negatives else [])
    theirs = SparseEncoder(modules=[MLMTransformer(str(trainable_dir)), SpladePooling(pooling)])
    their_loss = TheirSpladeLoss(theirs, SparseMultipleNegativesRankingLoss(theirs), document_regularizer_weight=3e-2,
                                 query_regularizer_weight=5e-2)
    parts = their_loss([theirs.tokenize(texts) for texts in columns], None)
    sum(parts.values()).backward()
    ours = SparseModel.from_pretrained(trainable_dir, pooling=pooling)
    our_parts = SpladeLoss(5e-2, 3e-2).parts(*(ours(**ours.tokenize(texts).model_inputs()) for texts in columns))
    sum(our_parts.values()).backward()
    for mine, name in (("ranking", "base_loss"), ("query_flops", "query_regularizer_loss"),
                       ("document_flops", "document_regularizer_loss")):
        assert abs(our_parts[mine].item() - parts[name].item()) <= 1e-5 * max(1.0, abs(parts[name].item())), mine
    their_bert = theirs[0].auto_model.bert
    for our_param, their_param in (
            (ours.mlm.encoder.embeddings.word.weight, their_bert.embeddings.word_embeddings.weight),
            (ours.mlm.encoder.layers[0].attention.query.weight,
             their_bert.encoder.layer[0].attention.self.query.weight),
            (ours.mlm.mlm_head.transform.weight, theirs[0].auto_model.cls.predictions.transform.dense.weight)):
        torch.testing.assert_close(our_param.grad, their_param.grad, rtol=1e-5,
                                   atol=1e-5 * float(their_param.grad.abs().max()))


def test_flops_is_the_squared_mean_activation_per_term():
    from encoderkit.embeddings.losses import flops

    vectors = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert flops(vectors).item() == pytest.approx(2.0 ** 2 + 0 + 1.0 ** 2)
    assert flops(vectors, threshold=1).item() == pytest.approx(0.5 ** 2 + 1.0 ** 2)  # row 2 has 1 term: dropped


def test_train_embedder_kind_sparse_lowers_the_splade_loss(tmp_path, trainable_dir):
    """A few SPLADE steps through the command: the loss of the whole training set falls, the result is a
    SparseEncoder directory that sentence-transformers encodes as encoderkit does, with the trained prompts."""
    from encoderkit.cli.app import main
    from encoderkit.embeddings.losses import SpladeLoss

    pairs = list(zip(QUERIES, DOCUMENTS)) + [("which animal barks", NEGATIVES[0]),
                                             ("how many dimensions has a dense vector", NEGATIVES[1])]
    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{q}\t{d}\n" for q, d in pairs), encoding="utf-8")

    def loss_of(directory):
        model = SparseModel.from_pretrained(directory).eval()
        with torch.no_grad():
            return float(SpladeLoss(5e-3, 3e-3)(*(model(**model.tokenize([p[c] for p in pairs]).model_inputs())
                                                    for c in (0, 1))))

    out = tmp_path / "out"
    code = main(["train-embedder", "--model", str(trainable_dir), "--kind", "sparse", "--train", str(train),
                 "--epochs", "4", "--batch-size", "5", "--lr", "1e-3", "--query-regularizer-weight", "5e-3",
                 "--document-regularizer-weight", "3e-3", "--query-prompt", "query: ", "--out", str(out)])
    assert code == 0
    assert loss_of(out / "final") < loss_of(trainable_dir)
    theirs = SparseEncoder(str(out / "final"))
    assert theirs.prompts["query"] == "query: "
    np.testing.assert_allclose(SparseEmbedder.from_pretrained(out / "final").encode_query(QUERIES).to_dense(),
                               theirs.encode_query(QUERIES, convert_to_tensor=True).to_dense().numpy(),
                               atol=1e-5, rtol=1e-5)


def test_train_embedder_starts_at_the_asked_active_terms(tmp_path, trainable_dir):
    """--start-active-terms through the command: with a learning rate too small to move anything, the saved model's
    vectors of the training documents (every one, as there are fewer than the calibration sample) average the
    asked count."""
    from encoderkit.cli.app import main

    pairs = list(zip(QUERIES, DOCUMENTS))
    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{q}\t{d}\n" for q, d in pairs), encoding="utf-8")
    code = main(["train-embedder", "--model", str(trainable_dir), "--kind", "sparse", "--train", str(train),
                 "--epochs", "1", "--batch-size", "3", "--lr", "1e-12", "--start-active-terms", "25",
                 "--out", str(tmp_path / "out")])
    assert code == 0
    vectors = SparseEmbedder.from_pretrained(tmp_path / "out" / "final").encode_document(DOCUMENTS)
    assert vectors.nnz / len(DOCUMENTS) == 25


@pytest.mark.parametrize("extra,message", [
    (["--loss", "mnrl"], "the mnrl loss does not train a sparse model"),
    (["--start-active-terms", "0"], "between 1 and the vocabulary size - 1"),
    (["--model", "DEFAULT"], "no trained masked-lm head"),
])
def test_train_embedder_sparse_bad_input_is_one_line(tmp_path, minilm_dir, trainable_dir, capsys, extra, message):
    from encoderkit.cli.app import main

    train = tmp_path / "train.tsv"
    train.write_text("anchor\tpositive\nq\tp\n", encoding="utf-8")
    model = str(minilm_dir) if "DEFAULT" in extra else str(trainable_dir)
    extra = [model if e == "DEFAULT" else e for e in extra]
    args = ["train-embedder", "--kind", "sparse", "--train", str(train), "--out", str(tmp_path / "o")]
    code = main(args + (extra if "--model" in extra else ["--model", model] + extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("encoderkit: error:") and message in err[0], err


def test_int8_sparse_vectors_stay_close_to_fp32(mlm_dir):
    """The engine's int8 path under SPLADE: the MLM head stays fp32, so the weights move only as much as the
    encoder's states do."""
    exact = SparseEmbedder.from_pretrained(mlm_dir).encode(TEXTS).to_dense()
    int8 = SparseEmbedder.from_pretrained(mlm_dir, dtype="int8").encode(TEXTS).to_dense()
    cosine = (exact * int8).sum(1) / np.linalg.norm(exact, axis=1) / np.linalg.norm(int8, axis=1)
    assert cosine.min() > 0.99, cosine


def test_start_active_terms_is_for_sparse_models_only():
    from encoderkit.training.sentence import EmbedderRecipe

    with pytest.raises(InputError, match="use it with --kind sparse"):
        EmbedderRecipe(kind="dense", start_active_terms=100)
