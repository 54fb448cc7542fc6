"""Fill-mask on the engine: the same top-k tokens and probabilities as transformers' masked-LM model, with the
vocabulary projection run only at the mask positions."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderkit.tasks.fill_mask import FillMask
from helpers import tiny_bert_dir


def test_fill_mask_equals_transformers_and_projects_only_the_masks(tmp_path, minilm_dir, monkeypatch) -> None:
    transformers = pytest.importorskip("transformers")
    directory = tiny_bert_dir(tmp_path / "mlm", minilm_dir, task="masked-lm", initializer_range=0.3)  # peaked
    fill = FillMask.from_pretrained(directory)
    texts = ["the capital of france is [MASK] .",
             "a [MASK] day, and a much longer sentence about [MASK] things, so that the batch has padding",
             "[MASK]"]
    projected = []
    head = type(fill.model.mlm_head)
    original = head.forward
    monkeypatch.setattr(head, "forward", lambda self, hidden: projected.append(hidden.shape[0]) or original(self, hidden))
    got = fill(texts, top_k=3)
    assert sum(projected) == 4  # the four masks, not every token of the batch

    reference = transformers.AutoModelForMaskedLM.from_pretrained(directory).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        probabilities = reference(**encoded).logits.softmax(-1)
    for row, per_mask in enumerate(got):
        positions = (encoded.input_ids[row] == tokenizer.mask_token_id).nonzero().flatten().tolist()
        assert len(per_mask) == len(positions)
        for position, predictions in zip(positions, per_mask):
            top = probabilities[row, position].topk(3)
            assert [p.token_id for p in predictions] == top.indices.tolist()
            np.testing.assert_allclose([p.score for p in predictions], top.values.tolist(), atol=1e-5)
            assert predictions[0].sequence == tokenizer.decode(
                [predictions[0].token_id if i == position else t for i, t in enumerate(encoded.input_ids[row].tolist())
                 if encoded.attention_mask[row, i]], skip_special_tokens=True)
