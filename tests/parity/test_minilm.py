"""Real weights: the default model's sentence embeddings equal sentence-transformers'."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderkit import Embedder, load_model

pytestmark = pytest.mark.data


@pytest.fixture(scope="module")
def reference(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir), device="cpu")


def test_embeddings_equal_sentence_transformers(reference, bench_sentences) -> None:
    texts = bench_sentences[:500]
    expected = reference.encode(texts, batch_size=32, convert_to_numpy=True)
    embedder = Embedder.from_pretrained()  # the default model, its own pooling and normalisation
    assert (embedder.pooling, embedder.normalize, embedder.max_length) == ("mean", True, 256)
    actual = embedder.encode(texts, batch_size=32)
    assert actual.dtype == np.float32 and actual.shape == expected.shape == (500, 384)
    assert np.abs(actual - expected).max() <= 1e-5
    # Some of these texts exceed 256 tokens: truncation is part of what is compared.
    assert max(len(embedder.tokenizer.encode(t, truncation=False)) for t in texts) > 256


def test_token_states_equal_transformers(minilm_dir, bench_sentences) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModel.from_pretrained(str(minilm_dir)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    batch = tokenizer(bench_sentences[:48], padding=True, truncation=True, max_length=128, return_tensors="pt")
    ours = load_model(minilm_dir, task="base")
    with torch.no_grad():
        want = reference(**batch).last_hidden_state
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (want - got)[real].abs().max() <= 1e-5
