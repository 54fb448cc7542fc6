"""Cross-encoder reranking: training (BCE on one logit, mined negatives), the Reranker pipeline, parity with
transformers and sentence-transformers' CrossEncoder, and the train-reranker / rerank commands."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit.cli.app import main
from encoderkit.tasks.rerank import Reranker
from encoderkit.training.reranker import read_rerank_file, train_reranker
from helpers import tiny_bert_dir

pytestmark = pytest.mark.usefixtures("one_thread")

PAIRS = [
    ("what is the capital of france", "Paris is the capital and largest city of France.", 1),
    ("what is the capital of france", "Bananas are rich in potassium.", 0),
    ("how do bees make honey", "Bees turn nectar into honey by evaporation and enzymes.", 1),
    ("how do bees make honey", "The stock market closed higher on Friday.", 0),
    ("who wrote hamlet", "Hamlet is a tragedy written by William Shakespeare.", 1),
    ("who wrote hamlet", "Mount Everest is the highest mountain on Earth.", 0),
    ("what is photosynthesis", "Plants convert light into chemical energy by photosynthesis.", 1),
    ("what is photosynthesis", "The violin has four strings.", 0),
    ("how fast is light", "Light travels at about 300,000 kilometres per second.", 0.9),
    ("how fast is light", "Cats sleep for most of the day.", 0.1),
]
QUERY = "who wrote hamlet"
CANDIDATES = ["Mount Everest is the highest mountain on Earth.", "Hamlet is a tragedy written by William Shakespeare.",
              "Bananas are rich in potassium.", "Shakespeare wrote plays in London.", "The violin has four strings."]


def write_pairs(path: Path, rows=PAIRS, header: str = "query\tpassage\tlabel") -> Path:
    path.write_text(header + "\n" + "".join(f"{q}\t{p}\t{label}\n" for q, p, label in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny"), minilm_dir)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, minilm_dir):
    """MiniLM (a random tiny encoder's [CLS] barely varies between inputs) trained a few steps on PAIRS."""
    root = tmp_path_factory.mktemp("rerank")
    data = write_pairs(root / "train.tsv")
    result = train_reranker(minilm_dir, data, root / "out", epochs=4, batch_size=5, learning_rate=2e-4, valid_file=data,
                            show_progress=False, warmup_ratio=0.0)
    return result


def bce_on(model_dir: Path) -> float:
    reranker = Reranker.from_pretrained(model_dir)
    logits = np.concatenate([reranker.scores(q, [p]) for q, p, _ in PAIRS]).astype(np.float64)
    labels = np.array([label for *_, label in PAIRS], dtype=np.float64)
    return float(torch.nn.functional.binary_cross_entropy_with_logits(torch.from_numpy(logits),
                                                                      torch.from_numpy(labels)))


def test_training_lowers_bce_and_saves_one_logit(trained, minilm_dir, tmp_path):
    out = trained.out_dir
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "LABEL_0"} and config["problem_type"] == "multi_label_classification"
    # the untrained start: the tiny encoder with a fresh one-logit head, seeded as train_reranker seeds it
    from encoderkit.modeling.models import load_model

    start = load_model(out)
    torch.manual_seed(42)
    fresh = load_model(minilm_dir, task="sequence-classification", config=start.config, new_head_expected=True)
    fresh.save_pretrained(tmp_path / "start", tokenizer=Reranker.from_pretrained(out).tokenizer)
    assert bce_on(out) < bce_on(tmp_path / "start") - 0.03


def test_loads_in_transformers_and_cross_encoder(trained):
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("sentence_transformers")
    out = str(trained.out_dir)
    reranker = Reranker.from_pretrained(out)
    ours = reranker.scores(QUERY, CANDIDATES)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        batch = tokenizer([QUERY] * len(CANDIDATES), CANDIDATES, padding=True, truncation=True, return_tensors="pt")
        theirs = model(**batch).logits[:, 0].numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-5)

    cross = st.CrossEncoder(out, device="cpu")
    predicted = cross.predict([(QUERY, c) for c in CANDIDATES])  # default activation for one label: sigmoid
    np.testing.assert_allclose(reranker.scores(QUERY, CANDIDATES, activation="sigmoid"), predicted, atol=1e-5)
    ranked = reranker.rank(QUERY, CANDIDATES, return_text=True, activation="sigmoid")
    theirs_ranked = cross.rank(QUERY, CANDIDATES, return_documents=True)
    assert [r["index"] for r in ranked] == [r["corpus_id"] for r in theirs_ranked]
    np.testing.assert_allclose([r["score"] for r in ranked], [r["score"] for r in theirs_ranked], atol=1e-5)


def test_rank_sorts(trained):
    reranker = Reranker.from_pretrained(trained.out_dir)
    scores = reranker.scores(QUERY, CANDIDATES)
    ranked = reranker.rank(QUERY, CANDIDATES)
    assert [r["index"] for r in ranked] == list(np.argsort(-scores, kind="stable"))
    assert all(a["score"] >= b["score"] for a, b in zip(ranked, ranked[1:]))
    assert "text" not in ranked[0]
    top = reranker.rank(QUERY, CANDIDATES, top_k=2, return_text=True)
    assert len(top) == 2 and top[0]["text"] == CANDIDATES[top[0]["index"]]
    assert reranker.rank(QUERY, []) == []


def test_ties_keep_input_order(trained):
    reranker = Reranker.from_pretrained(trained.out_dir)
    ranked = reranker.rank(QUERY, ["same passage", "other", "same passage"])
    same = [r["index"] for r in ranked if r["index"] != 1]
    assert same == [0, 2]


def test_mined_negatives_are_added(tiny, minilm_dir, tmp_path):
    from encoderkit.tasks.embed import Embedder
    from encoderkit.training.reranker import add_mined_negatives

    examples = read_rerank_file(write_pairs(tmp_path / "train.tsv"))
    more = add_mined_negatives(examples, Embedder.from_pretrained(minilm_dir), 1, margin=None)
    positives = [e for e in examples if e.label >= 0.5]
    added = more[len(examples):]
    assert len(added) == len(positives) and all(e.label == 0.0 for e in added)
    for example in added:  # never one of the query's own positives
        assert example.pair not in {e.pair for e in positives if e.text == example.text}


def test_cli_train_and_rerank(tiny, trained, minilm_dir, tmp_path, capsys):
    data = write_pairs(tmp_path / "train.tsv")
    out = tmp_path / "cli-out"
    code = main(["train-reranker", "--model", str(tiny), "--train", str(data), "--out", str(out), "--epochs", "1",
                 "--batch-size", "8", "--mine-negatives", "1", "--embedder", str(minilm_dir)])
    assert code == 0
    assert f"final model: {out}" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "LABEL_0"}

    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join(CANDIDATES) + "\n", encoding="utf-8")
    assert main(["rerank", str(trained.out_dir), "-q", QUERY, "--candidates", str(candidates), "-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = Reranker.from_pretrained(trained.out_dir).rank(QUERY, CANDIDATES, top_k=3, return_text=True)
    assert [line.split("\t") for line in lines] == [[str(i + 1), f"{r['score']:.4f}", r["text"]]
                                                  for i, r in enumerate(expected)]
    assert main(["rerank", str(trained.out_dir), "-q", QUERY, "--candidates", str(candidates), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["index"] for r in rows] == [r["index"] for r in
                                          Reranker.from_pretrained(trained.out_dir).rank(QUERY, CANDIDATES)]


@pytest.mark.parametrize("case", ["empty-candidates", "missing-column", "label-range", "label-text", "not-a-reranker",
                                  "embedder-alone"])
def test_cli_bad_input_exits_2(case, tiny, trained, tmp_path, capsys):
    good = write_pairs(tmp_path / "good.tsv")
    if case == "empty-candidates":
        empty = tmp_path / "empty.txt"
        empty.write_text("\n", encoding="utf-8")
        args = ["rerank", str(trained.out_dir), "-q", QUERY, "--candidates", str(empty)]
    elif case == "not-a-reranker":
        candidates = tmp_path / "c.txt"
        candidates.write_text("a\nb\n", encoding="utf-8")
        args = ["rerank", str(tiny), "-q", QUERY, "--candidates", str(candidates)]
    else:
        train = good
        if case == "missing-column":
            train = write_pairs(tmp_path / "bad.tsv", header="query\tpassage\tscore")
        elif case == "label-range":
            train = write_pairs(tmp_path / "bad.tsv", [("q", "p", 1), ("q", "r", 2)])
        elif case == "label-text":
            train = write_pairs(tmp_path / "bad.tsv", [("q", "p", "yes")])
        args = ["train-reranker", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o")]
        if case == "embedder-alone":
            args += ["--embedder", str(tiny)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("encoderkit: error: ")
    expected = {"missing-column": "missing column(s) label", "label-range": "outside [0, 1]",
                "label-text": "is not a number", "empty-candidates": "holds no texts",
                "not-a-reranker": "", "embedder-alone": "--mine-negatives"}[case]
    assert expected in err


def test_rerank_rankings_reorders_only_the_top_candidates():
    """Hand-built: the cross-encoder's logits re-order each query's first N documents; the rest keep their places."""
    from encoderkit.embeddings.evaluation import rerank_rankings, retrieval_metrics

    class Fixed:  # a reranker whose logit is a fixed number per passage
        def logits(self, queries, passages):
            return np.array([[{"a": 0.1, "b": 0.9, "c": 0.5, "d": 5.0}[p]] for p in passages], dtype=np.float32)

    corpus = {doc: doc for doc in "abcd"}
    rankings = {"q1": ["a", "b", "c", "d"], "q2": ["c", "a", "d", "b"]}
    reranked = rerank_rankings(Fixed(), {"q1": "x", "q2": "y"}, corpus, rankings, top=3)
    assert reranked == {"q1": ["b", "c", "a", "d"], "q2": ["d", "c", "a", "b"]}
    # q1's relevant "b" moves from rank 2 to 1: MRR@10 goes from 1/2 to 1.
    assert retrieval_metrics(reranked, {"q1": {"b"}})["mrr@10"] == 1.0
    assert retrieval_metrics(rankings, {"q1": {"b"}})["mrr@10"] == 0.5


def test_eval_retrieval_with_rerank_equals_scoring_by_hand(trained, tmp_path, capsys):
    """`eval-retrieval --rerank`: bi-encoder top N re-ordered by Reranker.scores, scored by retrieval_metrics."""
    from encoderkit import Embedder
    from encoderkit.embeddings.evaluation import retrieval_metrics

    queries = {f"q{i}": q for i, q in enumerate(dict.fromkeys(q for q, _, _ in PAIRS))}
    corpus = {f"d{i}": p for i, (_, p, _) in enumerate(PAIRS)}
    qrels = {qid: {f"d{i}"} for qid, q in queries.items() for i, (q2, _, label) in enumerate(PAIRS)
             if q2 == q and label >= 0.5}
    (tmp_path / "q.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in queries.items()))
    (tmp_path / "c.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in corpus.items()))
    (tmp_path / "r.tsv").write_text("".join(f"{q}\t{d}\n" for q, docs in qrels.items() for d in docs))
    assert main(["eval-retrieval", "default", "--queries", str(tmp_path / "q.tsv"), "--corpus", str(tmp_path / "c.tsv"),
                 "--qrels", str(tmp_path / "r.tsv"), "--rerank", str(trained.out_dir), "--candidates", "4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)

    embedder, reranker = Embedder.from_pretrained(None), Reranker.from_pretrained(trained.out_dir)
    ids = list(corpus)
    docs = embedder.encode([corpus[d] for d in ids], normalize=True)
    expected = {}
    for qid, text in queries.items():
        similarity = docs @ embedder.encode(text, normalize=True)
        ranking = [ids[i] for i in sorted(range(len(ids)), key=lambda i: (-similarity[i], ids[i]))]
        scores = reranker.scores(text, [corpus[d] for d in ranking[:4]])
        top = [ranking[i] for i in np.argsort(-scores, kind="stable")]
        expected[qid] = top + ranking[4:]
    for name, value in retrieval_metrics(expected, qrels).items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
