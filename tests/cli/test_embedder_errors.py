"""Bad input to the embedding commands of issue 20 (train-embedder, train-reranker, mine-negatives, eval-retrieval,
rerank), each through the real command line: exit code 2, nothing on stdout, exactly one stderr line
`encoderkit: error: ...` naming the file and line (or the field) at fault. The cases: a missing column or a wrong
header; an empty file or an empty text; a score or label outside the loss's range; a label never seen in training;
a qrels id missing from the corpus or the queries.

Logging is set up as in a shell (the command's own handler on stderr, not pytest's capture), so a warning printed
before the error would show as a second line and fail the case."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from encoderkit.cli import cli

from helpers import tiny_bert_dir

pytestmark = pytest.mark.usefixtures("one_thread")

GOOD = {
    "pairs.tsv": "anchor\tpositive\nwhat do cats eat\tCats eat fish.\nwho wrote hamlet\tShakespeare wrote it.\n",
    "scored.tsv": "sentence1\tsentence2\tscore\na cat sleeps\ta cat naps\t0.9\na dog runs\tstocks fell\t0.1\n",
    "nli.tsv": "premise\thypothesis\tlabel\na cat sleeps\ta cat naps\tyes\na dog runs\tstocks fell\tno\n",
    "rerank.tsv": "query\tpassage\tlabel\nwho wrote hamlet\tShakespeare wrote it.\t1\nwho wrote hamlet\tCats eat.\t0\n",
    "q.tsv": "q1\twhat do cats eat\nq2\twho wrote hamlet\n",
    "c.tsv": "d1\tCats eat fish.\nd2\tShakespeare wrote it.\n",
    "r.tsv": "q1\td1\nq2\td2\n",
    "candidates.txt": "Cats eat fish.\nShakespeare wrote it.\n",
}

# (id, command and its arguments, files that replace the good ones, expected message fragment). In the arguments
# a file name stands for its path; EMBEDDER is a tiny encoder, RERANKER a tiny one-logit cross-encoder, OUT the
# output. The fragments name the file and line (file:line) or the field.
TRAIN_EMBEDDER = ["train-embedder", "--model", "EMBEDDER", "--out", "OUT", "--batch-size", "2"]
TRAIN_RERANKER = ["train-reranker", "--model", "EMBEDDER", "--out", "OUT", "--batch-size", "2"]
MINE = ["mine-negatives", "EMBEDDER", "--out", "OUT.tsv", "--train", "pairs.tsv"]
EVAL = ["eval-retrieval", "EMBEDDER", "--queries", "q.tsv", "--corpus", "c.tsv", "--qrels", "r.tsv"]
RERANK = ["rerank", "RERANKER", "-q", "who wrote hamlet", "--candidates", "candidates.txt"]

CASES = [
    # ----- train-embedder
    ("te-wrong-header", [*TRAIN_EMBEDDER, "--train", "pairs.tsv"], {"pairs.tsv": "query\tpassage\nq\tp\n"},
     "pairs.tsv:1: missing column(s) anchor, positive"),
    ("te-no-header", [*TRAIN_EMBEDDER, "--train", "pairs.tsv", "--loss", "cosent"],
     {"pairs.tsv": "a cat\ta kitten\t0.9\n"}, "pairs.tsv:1: missing column(s) sentence1, sentence2, score"),
    ("te-missing-key", [*TRAIN_EMBEDDER, "--train", "pairs.jsonl"],
     {"pairs.jsonl": '{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n'}, "pairs.jsonl:2: no 'positive' field"),
    ("te-extra-cell", [*TRAIN_EMBEDDER, "--train", "pairs.tsv"], {"pairs.tsv": "anchor\tpositive\na\tb\tc\n"},
     "pairs.tsv:2: 3 column(s), the header has 2"),
    ("te-valid-wrong-header", [*TRAIN_EMBEDDER, "--train", "pairs.tsv", "--valid", "valid.tsv"],
     {"valid.tsv": "question\tanswer\nq\ta\n"}, "valid.tsv:1: the columns question, answer match no training shape"),
    ("te-empty-file", [*TRAIN_EMBEDDER, "--train", "pairs.tsv"], {"pairs.tsv": ""}, "pairs.tsv is empty"),
    ("te-header-only", [*TRAIN_EMBEDDER, "--train", "pairs.tsv"], {"pairs.tsv": "anchor\tpositive\n"},
     "pairs.tsv holds a header but no examples"),
    ("te-blank-text", [*TRAIN_EMBEDDER, "--train", "pairs.tsv"], {"pairs.tsv": "anchor\tpositive\nq\tp\nr\t   \n"},
     "pairs.tsv:3: empty text in column 'positive'"),
    ("te-empty-negative", [*TRAIN_EMBEDDER, "--train", "pairs.tsv", "--loss", "triplet"],
     {"pairs.tsv": "anchor\tpositive\tnegative\nq\tp\t\n"}, "pairs.tsv:2: empty text in column 'negative'"),
    ("te-valid-blank-text", [*TRAIN_EMBEDDER, "--train", "pairs.tsv", "--valid", "valid.tsv"],
     {"valid.tsv": "anchor\tpositive\n \tp\n"}, "valid.tsv:2: empty text in column 'anchor'"),
    ("te-cosine-above", [*TRAIN_EMBEDDER, "--train", "scored.tsv", "--loss", "cosine"],
     {"scored.tsv": "sentence1\tsentence2\tscore\na\tb\t0.5\nc\td\t4.5\n"},
     "scored.tsv:3: score 4.5 lies outside [0, 1], the range of the cosine loss"),
    ("te-cosine-negative", [*TRAIN_EMBEDDER, "--train", "scored.tsv", "--loss", "cosine"],
     {"scored.tsv": "sentence1\tsentence2\tscore\na\tb\t-0.5\n"}, "scored.tsv:2: score -0.5 lies outside [0, 1]"),
    ("te-cosent-infinite", [*TRAIN_EMBEDDER, "--train", "scored.tsv", "--loss", "cosent"],
     {"scored.tsv": "sentence1\tsentence2\tscore\na\tb\tinf\n"}, "scored.tsv:2: score 'inf' is not finite"),
    ("te-cosent-nan", [*TRAIN_EMBEDDER, "--train", "scored.tsv", "--loss", "cosent"],
     {"scored.tsv": "sentence1\tsentence2\tscore\na\tb\t0.5\nc\td\tnan\n"}, "scored.tsv:3: score 'nan' is not finite"),
    ("te-score-text", [*TRAIN_EMBEDDER, "--train", "scored.jsonl", "--loss", "cosent"],
     {"scored.jsonl": '{"sentence1": "a", "sentence2": "b", "score": "high"}\n'},
     "scored.jsonl:1: score 'high' is not a number"),
    ("te-valid-score-infinite", [*TRAIN_EMBEDDER, "--train", "scored.tsv", "--loss", "cosine", "--valid", "v.tsv"],
     {"v.tsv": "sentence1\tsentence2\tscore\na\tb\t-inf\n"}, "v.tsv:2: score '-inf' is not finite"),
    ("te-unseen-label", [*TRAIN_EMBEDDER, "--train", "nli.tsv", "--loss", "softmax", "--valid", "v.tsv"],
     {"v.tsv": "premise\thypothesis\tlabel\np\th\tyes\np\th\tmaybe\n"},
     "v.tsv:3: label 'maybe' was never seen in training (known: no, yes)"),
    ("te-no-label", [*TRAIN_EMBEDDER, "--train", "nli.tsv", "--loss", "softmax"],
     {"nli.tsv": "premise\thypothesis\tlabel\np\th\tyes\np\th\t \n"}, "nli.tsv:3: no label"),
    ("te-one-label", [*TRAIN_EMBEDDER, "--train", "nli.tsv", "--loss", "softmax"],
     {"nli.tsv": "premise\thypothesis\tlabel\np\th\tyes\nq\ti\tyes\n"},
     "nli.tsv: the softmax loss classifies pairs into at least 2 labels, and the file has one (yes)"),
    ("te-missing-file", [*TRAIN_EMBEDDER, "--train", "none.tsv"], {}, "none.tsv does not exist"),
    # ----- train-reranker
    ("tr-wrong-header", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": "query\tpassage\tscore\nq\tp\t1\n"},
     "rerank.tsv:1: missing column(s) label"),
    ("tr-valid-wrong-header", [*TRAIN_RERANKER, "--train", "rerank.tsv", "--valid", "v.tsv"],
     {"v.tsv": "question\tpassage\tlabel\nq\tp\t1\n"}, "v.tsv:1: missing column(s) query"),
    ("tr-empty-file", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": ""}, "rerank.tsv is empty"),
    ("tr-header-only", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": "query\tpassage\tlabel\n"},
     "rerank.tsv holds a header but no examples"),
    ("tr-blank-passage", [*TRAIN_RERANKER, "--train", "rerank.tsv"],
     {"rerank.tsv": "query\tpassage\tlabel\nq\tp\t1\nq\t  \t0\n"}, "rerank.tsv:3: empty text in column 'passage'"),
    ("tr-blank-query", [*TRAIN_RERANKER, "--train", "rerank.jsonl"],
     {"rerank.jsonl": '{"query": "", "passage": "p", "label": 1}\n'}, "rerank.jsonl:1: empty text in column 'query'"),
    ("tr-label-above", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": "query\tpassage\tlabel\nq\tp\t2\n"},
     "rerank.tsv:2: label 2 lies outside [0, 1]"),
    ("tr-label-negative", [*TRAIN_RERANKER, "--train", "rerank.tsv"],
     {"rerank.tsv": "query\tpassage\tlabel\nq\tp\t1\nq\tr\t-0.1\n"}, "rerank.tsv:3: label -0.1 lies outside [0, 1]"),
    ("tr-label-nan", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": "query\tpassage\tlabel\nq\tp\tnan\n"},
     "rerank.tsv:2: label nan lies outside [0, 1]"),
    ("tr-label-text", [*TRAIN_RERANKER, "--train", "rerank.tsv"], {"rerank.tsv": "query\tpassage\tlabel\nq\tp\tyes\n"},
     "rerank.tsv:2: label 'yes' is not a number"),
    ("tr-valid-label", [*TRAIN_RERANKER, "--train", "rerank.tsv", "--valid", "v.tsv"],
     {"v.tsv": "query\tpassage\tlabel\nq\tp\t5\n"}, "v.tsv:2: label 5 lies outside [0, 1]"),
    ("tr-one-query", [*TRAIN_RERANKER, "--train", "rerank.tsv"],
     {"rerank.tsv": "query\tpassage\tlabel\nq\tp\t1\nq\tr\t0\n"},
     "rerank.tsv: too few examples to carve a validation set from (2 went to it"),
    ("tr-missing-file", [*TRAIN_RERANKER, "--train", "none.tsv"], {}, "none.tsv does not exist"),
    # ----- mine-negatives
    ("mn-wrong-header", MINE, {"pairs.tsv": "query\tpassage\nq\tp\n"},
     "pairs.tsv:1: missing column(s) anchor, positive"),
    ("mn-empty-file", MINE, {"pairs.tsv": ""}, "pairs.tsv is empty"),
    ("mn-blank-anchor", MINE, {"pairs.tsv": "anchor\tpositive\n\t p\n"}, "pairs.tsv:2: empty text in column 'anchor'"),
    ("mn-corpus-empty", [*MINE, "--corpus", "corpus.txt"], {"corpus.txt": "\n  \n"}, "corpus.txt holds no texts"),
    ("mn-corpus-no-text-column", [*MINE, "--corpus", "corpus.tsv"], {"corpus.tsv": "id\tpassage\n1\tp\n"},
     "corpus.tsv:1: no text column among ['id', 'passage']; name it text / sentence / content / body / document"),
    ("mn-corpus-no-text-field", [*MINE, "--corpus", "corpus.jsonl"], {"corpus.jsonl": '{"passage": "p"}\n'},
     "corpus.jsonl:1: no text field (text / sentence / content / body / document)"),
    # ----- eval-retrieval
    ("er-queries-one-column", EVAL, {"q.tsv": "q1 what do cats eat\n"}, "q.tsv:1: expected id<TAB>text"),
    ("er-qrels-columns", EVAL, {"r.tsv": "q1\td1\t1\textra\n"}, "r.tsv:1: expected query_id<TAB>doc_id[<TAB>grade]"),
    ("er-qrels-wrong-header", EVAL, {"r.tsv": "query\tdocument\tgrade\nq1\td1\t1\n"},
     "r.tsv:1: the grade must be a finite number, found 'grade' (a header line must name its columns"),
    ("er-queries-empty", EVAL, {"q.tsv": ""}, "q.tsv holds no queries"),
    ("er-corpus-empty", EVAL, {"c.tsv": "\n"}, "c.tsv holds no documents"),
    ("er-qrels-empty", EVAL, {"r.tsv": ""}, "r.tsv holds no qrels"),
    ("er-blank-query", EVAL, {"q.tsv": "q1\t  \nq2\twho\n"}, "q.tsv:1: empty text for id 'q1'"),
    ("er-blank-document", EVAL, {"c.tsv": "d1\tCats eat fish.\nd2\t\n"}, "c.tsv:2: empty text for id 'd2'"),
    ("er-grade-text", EVAL, {"r.tsv": "q1\td1\thigh\n"}, "r.tsv:1: the grade must be a finite number, found 'high'"),
    ("er-grade-infinite", EVAL, {"r.tsv": "q1\td1\t1\nq2\td2\tinf\n"},
     "r.tsv:2: the grade must be a finite number, found 'inf'"),
    ("er-doc-not-in-corpus", EVAL, {"r.tsv": "q1\td1\nq2\td9\n"},
     "r.tsv:2: document id 'd9' is not in the corpus file"),
    ("er-query-not-in-queries", EVAL, {"r.tsv": "q1\td1\nq7\td2\n"},
     "r.tsv:2: query id 'q7' is not in the queries file"),
    ("er-no-relevant-document", EVAL, {"r.tsv": "q1\td1\t0\nq2\td2\t-1\n"},
     "r.tsv: every grade is 0 or less, so no query has a relevant document"),
    ("er-missing-file", [*EVAL[:5], "none.tsv", *EVAL[6:]], {}, "none.tsv"),
    # ----- rerank
    ("rr-no-text-column", [*RERANK[:-1], "candidates.tsv"], {"candidates.tsv": "id\tpassage\n1\tp\n"},
     "candidates.tsv:1: no text column among ['id', 'passage']; name it text / sentence / content / body / document"),
    ("rr-empty-candidates", RERANK, {"candidates.txt": ""}, "candidates.txt holds no texts"),
    ("rr-blank-candidates", RERANK, {"candidates.txt": "  \n\n"}, "candidates.txt holds no texts"),
    ("rr-blank-query", [*RERANK[:3], "   ", *RERANK[4:]], {}, "the query is empty"),
    ("rr-missing-file", [*RERANK[:-1], "none.txt"], {}, "--candidates file"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory, minilm_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"EMBEDDER": tiny_bert_dir(root / "embedder", minilm_dir),
            "RERANKER": tiny_bert_dir(root / "reranker", minilm_dir, task="sequence-classification",
                                      id2label={0: "LABEL_0"})}


@pytest.fixture()
def shell_logging():
    """The root logger as a command run from a shell has it: no handlers until the command's own basicConfig."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers = []
    yield
    root.handlers, root.level = handlers, level


@pytest.mark.parametrize("args,files,message", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, models: dict[str, Path], shell_logging, args: list[str],
                                      files: dict[str, str], message: str) -> None:
    written = {**GOOD, **files}
    for name, text in written.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    paths = {**{name: str(tmp_path / name) for name in [*written, "none.tsv", "none.txt"]},
             **{key: str(path) for key, path in models.items()},
             "OUT": str(tmp_path / "out"), "OUT.tsv": str(tmp_path / "out.tsv")}
    result = CliRunner().invoke(cli, [paths.get(arg, arg) for arg in args], prog_name="encoderkit")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("encoderkit: error: "), result.stderr
    assert message in lines[0]
    assert "--text-field" not in lines[0]  # none of these commands has that option: no error may suggest it
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tsv").exists()
