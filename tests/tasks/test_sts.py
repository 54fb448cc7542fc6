from __future__ import annotations

import numpy as np
import pytest

from encoderkit import DataError, Embedder
from encoderkit.cli import main
from encoderkit.tasks.sts import evaluate_sts, pearson, rank, spearman

from conftest import shared_file


def test_correlations_equal_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, 300).astype(float)  # many ties
    y = x + rng.standard_normal(300)
    assert rank(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
    with pytest.raises(DataError, match="constant"):
        pearson(np.ones(5), np.arange(5))


@pytest.mark.data
@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_eval_sts_equals_sentence_transformers_evaluator(minilm_dir, capsys) -> None:
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

    path = shared_file("data", "stsb", "sts-dev.csv")
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    evaluator = EmbeddingSimilarityEvaluator([r[5] for r in rows], [r[6] for r in rows], [float(r[4]) for r in rows],
                                             name="dev")
    reference = evaluator(st.SentenceTransformer(str(minilm_dir), device="cpu"))
    assert main(["eval-sts", str(path)]) == 0
    out = capsys.readouterr().out
    printed = dict(line.split(": ") for line in out.strip().splitlines())
    assert int(printed["pairs"]) == 1500
    assert round(float(printed["spearman"]), 4) == round(reference["dev_spearman_cosine"], 4)
    assert round(float(printed["pearson"]), 4) == round(reference["dev_pearson_cosine"], 4)


@pytest.mark.data
def test_bf16_sts_within_two_tenths_of_a_point(minilm_dir) -> None:
    """bf16's quality on STS-B dev. Where the CPU has no bf16 units, torch emulates bf16 products at about a third
    of fp32's speed (this test took 59 s on an Intel Xeon without them, the suite's longest): there it runs only
    with ENCODERKIT_TEST_EMULATED_BF16=1."""
    import os

    from encoderkit.precision import cpu_has_native_bf16

    if not cpu_has_native_bf16() and not os.environ.get("ENCODERKIT_TEST_EMULATED_BF16"):
        pytest.skip("this CPU emulates bf16 (no avx512_bf16 or amx_bf16): set ENCODERKIT_TEST_EMULATED_BF16=1 to "
                    "measure bf16's STS-B quality here anyway (about a minute)")
    path = shared_file("data", "stsb", "sts-dev.csv")
    fp32 = evaluate_sts(path, Embedder.from_pretrained(minilm_dir, dtype="fp32"))
    bf16 = evaluate_sts(path, Embedder.from_pretrained(minilm_dir, dtype="bf16"))
    assert abs(fp32.spearman - bf16.spearman) * 100 <= 0.2


def test_malformed_sts_file(tmp_path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("genre\tfile\tyear\tid\tfive\ta\tb\n")
    with pytest.raises(DataError, match=r"bad.tsv:1: column 5 must be a similarity score"):
        evaluate_sts(bad, None)
    short = tmp_path / "short.tsv"
    short.write_text("a\tb\tc\n")
    with pytest.raises(DataError, match="at least 7"):
        evaluate_sts(short, None)
