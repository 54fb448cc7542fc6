"""Retrieval evaluation: metrics by hand, chunked exact search, sentence-transformers' evaluator, the CLI."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from encoderkit import DataError, Embedder
from encoderkit.cli import main
from encoderkit.embeddings.evaluation import (
    evaluate_retrieval,
    read_qrels,
    read_texts_tsv,
    retrieval_metrics,
    search_top_k,
    sts_spearman,
    triplet_accuracy,
)

from conftest import shared_file


def test_metrics_by_hand() -> None:
    # q1: relevant {a, c}; ranking b a d c -> relevant at ranks 2 and 4
    # q2: relevant {x}; ranking y z x -> relevant at rank 3
    rankings = {"q1": ["b", "a", "d", "c"], "q2": ["y", "z", "x"]}
    qrels = {"q1": {"a", "c"}, "q2": {"x"}}
    m = retrieval_metrics(rankings, qrels)
    assert list(m) == ["ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100"]
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    ndcg1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 / math.log2(2) + 1 / math.log2(3))
    ndcg2 = (1 / math.log2(4)) / 1.0
    assert m["ndcg@10"] == pytest.approx((ndcg1 + ndcg2) / 2)
    assert m["recall@1"] == 0.0
    assert m["recall@10"] == m["recall@100"] == 1.0
    ap1 = (1 / 2 + 2 / 4) / 2
    ap2 = 1 / 3
    assert m["map@100"] == pytest.approx((ap1 + ap2) / 2)
    # cut-offs: at k = 2 only q1's rank-2 hit counts
    m2 = retrieval_metrics(rankings, qrels, ks={"ndcg": [2], "mrr": [2], "recall": [2], "map": [2]})
    assert m2["mrr@2"] == pytest.approx(1 / 4)
    assert m2["recall@2"] == pytest.approx(1 / 4)
    assert m2["map@2"] == pytest.approx((1 / 2 / 2) / 2)
    assert m2["ndcg@2"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)) / 2)


def test_scores_ties_graded_and_unjudged_queries() -> None:
    # scores: ties are broken by ascending id, as sentence-transformers does
    scores = {"q": {"d2": 0.5, "d1": 0.5, "d3": 0.9}}
    assert retrieval_metrics(scores, {"q": {"d1"}})["mrr@10"] == pytest.approx(1 / 2)
    assert retrieval_metrics(scores, {"q": {"d2"}})["mrr@10"] == pytest.approx(1 / 3)
    # graded nDCG: gain = grade; a grade 0 is not relevant; queries without a relevant document are skipped
    graded = {"q": {"d1": 1, "d3": 0, "d2": 2}, "empty": {"d1": 0}}
    dcg = 0 / math.log2(2) + 1 / math.log2(3) + 2 / math.log2(4)
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    m = retrieval_metrics(scores, graded)
    assert m["ndcg@10"] == pytest.approx(dcg / ideal)
    assert m["recall@1"] == 0.0 and m["mrr@10"] == pytest.approx(1 / 2)
    # a judged query missing from the rankings scores 0
    assert retrieval_metrics({}, {"q": {"d1"}})["ndcg@10"] == 0.0
    with pytest.raises(DataError, match="no query has a relevant document"):
        retrieval_metrics(scores, {"q": {"d1": 0}})


def test_chunked_search_equals_brute_force_with_ties() -> None:
    rng = np.random.default_rng(0)
    corpus = rng.integers(-2, 3, size=(53, 4)).astype(np.float32)  # many exact score ties
    queries = rng.integers(-2, 3, size=(7, 4)).astype(np.float32)
    ids = [f"doc{i:03d}" for i in rng.permutation(53)]
    k = 10
    scores = queries @ corpus.T
    expected = [sorted(((ids[j], float(row[j])) for j in range(53)), key=lambda x: (-x[1], x[0]))[:k]
                for row in scores]
    for chunk in (53, 10, 7, 1):
        found = search_top_k(queries, (corpus[s:s + chunk] for s in range(0, 53, chunk)), ids, k,
                             query_chunk_size=3)
        assert found == expected, chunk


class _LookupEmbedder:
    """Texts are 'v:<x>,<y>': the vector (x, y), for exact control of the scores."""

    def encode(self, texts, batch_size=512, normalize=False):
        vectors = np.array([[float(v) for v in t[2:].split(",")] for t in texts], dtype=np.float32)
        if normalize:
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors


def test_evaluate_retrieval_chunking_and_checks() -> None:
    corpus = {f"d{i}": f"v:{math.cos(i / 10):.6f},{math.sin(i / 10):.6f}" for i in range(30)}
    queries = {"a": "v:1,0", "b": "v:0,1", "unjudged": "v:1,1"}
    qrels = {"a": {"d0", "d2"}, "b": {"d15": 1, "d29": 2}}
    whole = evaluate_retrieval(_LookupEmbedder(), queries, corpus, qrels)
    assert whole == evaluate_retrieval(_LookupEmbedder(), queries, corpus, qrels, corpus_chunk_size=4)
    assert whole["mrr@10"] == pytest.approx((1 + 1 / 2) / 2)  # a: d0 first; b: d16 (angle 1.6) before d15
    with pytest.raises(DataError, match=r"'nope' \(query 'a'\) is not in the corpus"):
        evaluate_retrieval(_LookupEmbedder(), queries, corpus, {"a": {"nope"}})
    with pytest.raises(DataError, match="'zz' is not among the queries"):
        evaluate_retrieval(_LookupEmbedder(), queries, corpus, {"zz": {"d0"}})
    with pytest.raises(DataError, match="empty text"):
        evaluate_retrieval(_LookupEmbedder(), {**queries, "c": " "}, corpus, qrels)


def test_triplet_accuracy_and_sts_spearman() -> None:
    embedder = _LookupEmbedder()
    # right, wrong, right, and a tie (cos 0 = cos 0), which does not count
    anchors, positives, negatives = ["v:1,0", "v:0,1", "v:1,1", "v:1,0"], ["v:1,0.1", "v:1,0", "v:1,0.9", "v:0,1"], \
        ["v:0,1", "v:0,1", "v:-1,0", "v:0,-1"]
    assert triplet_accuracy(embedder, anchors, positives, negatives) == pytest.approx(2 / 4)
    pairs = [("v:1,0", "v:1,0", 5.0), ("v:1,0", "v:1,1", 3.0), ("v:1,0", "v:0,1", 1.0), ("v:1,0", "v:-1,1", 0.0)]
    assert sts_spearman(embedder, pairs) == pytest.approx(1.0)


def _squad_set(articles=(1, 2), distractor_articles=(4,)):
    path = shared_file("data", "squad_v1.1", "dev-v1.1.articles-00-20.json")
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    queries, corpus, qrels = {}, {}, {}
    for a in (*articles, *distractor_articles):
        for p, paragraph in enumerate(data[a]["paragraphs"]):
            doc = f"a{a:02d}p{p:03d}"
            corpus[doc] = paragraph["context"]
            if a in articles:
                for qa in paragraph["qas"]:
                    queries[qa["id"]] = qa["question"]
                    qrels[qa["id"]] = {doc}
    return queries, corpus, qrels


@pytest.mark.data
@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_equals_sentence_transformers_evaluator(minilm_dir, tmp_path, capsys) -> None:
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    queries, corpus, qrels = _squad_set()
    evaluator = InformationRetrievalEvaluator(queries, corpus, qrels, mrr_at_k=[10], ndcg_at_k=[10],
                                              accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
                                              map_at_k=[100], show_progress_bar=False, batch_size=64)
    reference = evaluator(st.SentenceTransformer(str(minilm_dir), device="cpu"))
    name = next(iter(k for k in reference if k.endswith("_ndcg@10"))).split("_ndcg@10")[0]
    ours = evaluate_retrieval(Embedder.from_pretrained(minilm_dir), queries, corpus, qrels, batch_size=64)
    for metric, value in ours.items():
        assert value == pytest.approx(reference[f"{name}_{metric}"], abs=1e-4), metric
    assert ours["ndcg@10"] > 0.5  # a sanity bound: MiniLM finds SQuAD paragraphs well

    # the same through files and the command line
    (tmp_path / "q.tsv").write_text("id\ttext\n" + "".join(f"{k}\t{v}\n" for k, v in queries.items()))
    (tmp_path / "c.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in corpus.items()))
    (tmp_path / "r.tsv").write_text("query_id\tdoc_id\n" + "".join(f"{q}\t{d}\n" for q, ds in qrels.items()
                                                                    for d in ds))
    args = ["eval-retrieval", str(minilm_dir), "--queries", str(tmp_path / "q.tsv"), "--corpus",
            str(tmp_path / "c.tsv"), "--qrels", str(tmp_path / "r.tsv"), "--batch-size", "64"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(": ")[0] for line in lines] == ["ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100",
                                                       "map@100"]
    for line in lines:
        key, value = line.split(": ")
        assert len(value.split(".")[1]) == 4
        assert float(value) == pytest.approx(ours[key], abs=5e-5)
    assert main(args + ["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["queries"] == len(queries) and printed["corpus"] == len(corpus)
    assert printed["ndcg@10"] == pytest.approx(ours["ndcg@10"], abs=1e-9)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_readers(tmp_path) -> None:
    assert read_texts_tsv(_write(tmp_path, "c.tsv", "id\ttext\nd1\thello\tworld\n\nd2\tbye\n")) == \
        {"d1": "hello\tworld", "d2": "bye"}
    assert read_texts_tsv(_write(tmp_path, "n.tsv", "d1\thello\n")) == {"d1": "hello"}
    qrels = read_qrels(_write(tmp_path, "r.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\nq2\td1\n"))
    assert qrels == {"q1": {"d1": 2.0, "d2": 0.0}, "q2": {"d1": 1.0}}


@pytest.mark.parametrize("which, text, message", [
    ("queries", "", r"q.tsv holds no queries"),
    ("queries", "q1\n", r"q.tsv:1: expected id<TAB>text"),
    ("queries", "q1\thi\nq1\tagain\n", r"q.tsv:2: duplicate id 'q1' \(first on line 1\)"),
    ("corpus", "d1\thi\nd2\t  \n", r"c.tsv:2: empty text for id 'd2'"),
    ("qrels", "q1\td9\n", r"r.tsv:1: document id 'd9' is not in the corpus file"),
    ("qrels", "q1\td1\nq7\td1\n", r"r.tsv:2: query id 'q7' is not in the queries file"),
    ("qrels", "q1\n", r"r.tsv:1: expected query_id<TAB>doc_id"),
    ("qrels", "q1\td1\tvery\n", r"r.tsv:1: the grade must be a finite number"),
    ("qrels", "qid\tdocument\n", r"r.tsv:1: query id 'qid' is not in the queries file \(a header line"),
    ("qrels", "q1\td1\nq1\td1\n", r"r.tsv:2: duplicate pair"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, capsys, which, text, message) -> None:
    files = {"queries": "q1\twhat is it\n", "corpus": "d1\tit is this\n", "qrels": "q1\td1\n"}
    files[which] = text
    paths = {"queries": _write(tmp_path, "q.tsv", files["queries"]),
             "corpus": _write(tmp_path, "c.tsv", files["corpus"]),
             "qrels": _write(tmp_path, "r.tsv", files["qrels"])}
    code = main(["eval-retrieval", "unused-model", "--queries", paths["queries"], "--corpus", paths["corpus"],
                 "--qrels", paths["qrels"]])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("encoderkit: error: ")
    assert __import__("re").search(message, lines[0]), lines[0]


def test_cli_missing_file(tmp_path, capsys) -> None:
    code = main(["eval-retrieval", "m", "--queries", str(tmp_path / "none.tsv"), "--corpus", "x", "--qrels", "y"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "none.tsv" in err[0]
