"""/embed_sparse and /embed_all against the in-process encoders and sentence-transformers: a SPLADE SparseEncoder
(text-embeddings-inference's [[{index, value}]]), an encoder's token states, a multi-vector (ColBERT) model's token
vectors for queries and documents; bad input is a 4xx and the server goes on."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from encoderkit.server import ModelRegistry, ServerSettings, create_app  # noqa: E402
from helpers import tiny_bert_dir  # noqa: E402
from serving import client_of  # noqa: E402
from test_sparse import _perturb  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["A man is playing a guitar.", "sparse vectors expand a query", "hello",
         "Two dogs run across a snowy field while their owner throws a red ball for them."]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, minilm_dir):
    from encoderkit.embeddings.multi_vector import MultiVectorModel
    from encoderkit.embeddings.sparse import SparseModel

    root = tmp_path_factory.mktemp("retrieval-served")
    mlm = _perturb(tiny_bert_dir(root / "mlm", minilm_dir, task="masked-lm"), scale=0.1)
    SparseModel.from_pretrained(mlm, prompts={"query": "query: "}).save_pretrained(root / "splade")
    MultiVectorModel.from_pretrained(tiny_bert_dir(root / "base", minilm_dir), dimension=16).save_pretrained(
        root / "colbert")
    return {"splade": root / "splade", "colbert": root / "colbert"}


@pytest.fixture(scope="module")
def registry(dirs, minilm_dir):
    return ModelRegistry.load([(None, minilm_dir), ("splade", dirs["splade"]), ("colbert", dirs["colbert"])])


def call(registry, requests):
    async def go():
        async with client_of(create_app(registry, ServerSettings())) as client:
            return [await client.request(method, path, json=body) for method, path, body in requests]

    return asyncio.run(go())


def test_embed_sparse_equals_the_sparse_encoders(registry, dirs):
    st = pytest.importorskip("sentence_transformers")
    from encoderkit.embeddings.sparse import SparseEmbedder

    batch, single, query = call(registry, [
        ("POST", "/embed_sparse", {"inputs": TEXTS, "model": "splade"}),
        ("POST", "/embed_sparse", {"inputs": TEXTS[0], "model": "splade"}),
        ("POST", "/embed_sparse", {"inputs": TEXTS, "model": "splade", "prompt_name": "query"})])
    assert batch.status_code == single.status_code == query.status_code == 200
    ours = SparseEmbedder.from_pretrained(dirs["splade"])
    theirs = st.SparseEncoder(str(dirs["splade"]))
    for response, texts, options in ((batch, TEXTS, {}), (single, TEXTS[:1], {}),
                                     (query, TEXTS, {"prompt_name": "query"})):
        rows = response.json()
        assert len(rows) == len(texts) and all(set(item) == {"index", "value"} for row in rows for item in row)
        dense = np.zeros((len(rows), ours.dimension), dtype=np.float32)
        for r, row in enumerate(rows):
            dense[r, [item["index"] for item in row]] = [item["value"] for item in row]
        np.testing.assert_allclose(dense, ours.encode(texts, **options).to_dense(), atol=1e-6, rtol=1e-6)
        reference = theirs.encode(texts, convert_to_tensor=True, **options).to_dense().numpy()
        np.testing.assert_allclose(dense, reference, atol=1e-5, rtol=1e-5)


def test_embed_all_gives_an_encoders_token_states(registry, minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    (response,) = call(registry, [("POST", "/embed_all", {"inputs": TEXTS})])
    assert response.status_code == 200
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, output_value="token_embeddings")
    rows = response.json()
    assert [len(row) for row in rows] == [len(r) for r in reference]
    for row, expected in zip(rows, reference):
        np.testing.assert_allclose(np.array(row), expected.numpy(), atol=1e-5)


def test_embed_all_gives_a_multi_vector_models_token_vectors(registry, dirs):
    from encoderkit.embeddings.multi_vector import MultiVectorEmbedder

    documents, queries = call(registry, [
        ("POST", "/embed_all", {"inputs": TEXTS, "model": "colbert"}),
        ("POST", "/embed_all", {"inputs": TEXTS, "model": "colbert", "is_query": True})])
    assert documents.status_code == queries.status_code == 200
    embedder = MultiVectorEmbedder.from_pretrained(dirs["colbert"])
    for response, is_query in ((documents, False), (queries, True)):
        for row, expected in zip(response.json(), embedder.encode(TEXTS, is_query=is_query)):
            np.testing.assert_allclose(np.array(row, dtype=np.float32), expected, atol=1e-6)
    assert {len(row) for row in queries.json()} == {embedder.settings.query_length}  # expanded to the query length


def test_bad_retrieval_requests_are_4xx_and_the_server_goes_on(registry):
    responses = call(registry, [
        ("POST", "/embed_sparse", {"inputs": []}),
        ("POST", "/embed_sparse", {"inputs": "x", "model": "splade", "prompt_name": "nope"}),
        ("POST", "/embed_sparse", {"inputs": "x", "model": "colbert"}),
        ("POST", "/embed_all", {"inputs": "x", "is_query": True}),
        ("POST", "/embed_all", {"inputs": "word " * 600, "model": "colbert"}),
        ("POST", "/embed_sparse", {"inputs": "word " * 600, "model": "splade"}),
        ("POST", "/embed_sparse", {"inputs": [1, 2]}),
        ("POST", "/embed_sparse", {"inputs": "still serving", "model": "splade"})])
    codes = [r.status_code for r in responses]
    assert codes == [422, 422, 400, 422, 413, 413, 422, 200], [(r.status_code, r.text[:200]) for r in responses]
    assert "nope" in responses[1].json()["error"] and "query" in responses[1].json()["error"]
    assert "/embed_all" in responses[2].json()["error"]  # what the model serves instead


PASSAGES = ["Hamlet is a tragedy written by William Shakespeare.", "Bananas are rich in potassium.",
            "Shakespeare wrote plays in London.", "The violin has four strings.", "Reset your password in settings."]


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory, dirs):
    """A hybrid index of PASSAGES: SPLADE (the served "splade" model) fused with BM25, with its texts."""
    from encoderkit.data.readers import Record
    from encoderkit.retrieval import HybridIndex, load_index
    from encoderkit.retrieval.texts import build_from_texts

    root = tmp_path_factory.mktemp("hybrid")
    texts = root / "texts.txt"
    texts.write_text("".join(t + "\n" for t in PASSAGES), encoding="utf-8")
    records = [Record(f"doc{i}", t) for i, t in enumerate(PASSAGES)]
    build_from_texts("sparse", records, root / "sparse", model=dirs["splade"], info={"texts": str(texts)},
                     show_progress=False)
    build_from_texts("bm25", records, root / "bm25", info={"texts": str(texts)}, show_progress=False)
    hybrid = HybridIndex({"sparse": load_index(root / "sparse"), "bm25": load_index(root / "bm25")},
                         info={"texts": str(texts)})
    return hybrid.save(root / "hybrid")


def test_search_over_a_hybrid_index_shows_the_matched_terms(dirs, hybrid_dir):
    from encoderkit.embeddings.sparse import SparseEmbedder
    from encoderkit.retrieval import load_index, search_any

    registry = ModelRegistry.load([("splade", dirs["splade"])], index=hybrid_dir)
    query = "who wrote Hamlet"
    response, with_model = call(registry, [("POST", "/search", {"query": query, "k": 3}),
                                           ("POST", "/search", {"query": query, "model": "splade"})])
    assert response.status_code == 200 and with_model.status_code == 422
    hits = response.json()
    index = load_index(hybrid_dir)
    embedder = SparseEmbedder.from_pretrained(dirs["splade"])
    vector = embedder.encode_query([query])
    expected = search_any(index, {"sparse": vector, "bm25": [query]}, 3)
    assert [h["id"] for h in hits] == expected.ids[0] and [h["text"] for h in hits] == \
        [PASSAGES[int(i[3:])] for i in expected.ids[0]]
    np.testing.assert_allclose([h["score"] for h in hits], expected.scores[0], rtol=1e-6)
    # the terms explain the sparse part's score: their products sum to the query-document dot product
    sparse = load_index(hybrid_dir / "parts" / "sparse")
    own = set(embedder.tokenizer.encode_ids([query])[0][0])
    for hit in hits:
        row = sparse.ids.index(hit["id"])
        document = SparseEmbedder.from_pretrained(dirs["splade"]).encode_document([PASSAGES[row]])
        dot = float(vector.dot(document)[0, 0])
        if len(hit["terms"]) < 20:  # all shown
            assert sum(t["query_weight"] * t["document_weight"] for t in hit["terms"]) == pytest.approx(dot, rel=1e-5)
        tokens = embedder.tokenizer.convert_ids_to_tokens(sorted(own))
        assert all(t["expansion"] == (t["token"] not in tokens) for t in hit["terms"])
    assert any(t["expansion"] for hit in hits for t in hit["terms"])  # SPLADE expands the query
