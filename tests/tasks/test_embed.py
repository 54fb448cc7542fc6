from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderkit import Embedder, InputError
from encoderkit.data.readers import read_lines
from encoderkit.tasks.embed import pool

ST_MODES = {"mean": "mean", "cls": "cls", "max": "max", "weightedmean": "weightedmean",
            "mean_sqrt_len": "mean_sqrt_len_tokens"}


@pytest.mark.parametrize("mode", list(ST_MODES))
def test_pooling_equals_sentence_transformers(mode: str) -> None:
    st_models = pytest.importorskip("sentence_transformers.models")
    torch.manual_seed(0)
    hidden = torch.randn(4, 9, 16)
    mask = torch.ones(4, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 2:] = 0
    hidden[mask == 0] = 100.0  # padding must not leak into any mode
    reference = st_models.Pooling(16, pooling_mode=ST_MODES[mode])
    want = reference({"token_embeddings": hidden, "attention_mask": mask})["sentence_embedding"]
    assert torch.allclose(pool(hidden, mask, mode), want, atol=1e-6)


def test_pooling_by_hand() -> None:
    hidden = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [50.0, 50.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, -1.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 2.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]
    with pytest.raises(InputError, match="unknown pooling"):
        pool(hidden, mask, "median")


def test_encode_keeps_input_order_and_normalises(minilm_dir) -> None:
    embedder = Embedder.from_pretrained(minilm_dir)
    texts = ["a short one", "a considerably longer sentence about something else entirely", "", "mid length text"]
    together = embedder.encode(texts, batch_size=2)
    one_by_one = np.stack([embedder.encode(t) for t in texts])
    assert np.abs(together - one_by_one).max() < 1e-5
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    raw = embedder.encode(texts, normalize=False, convert_to="torch")
    assert isinstance(raw, torch.Tensor) and not torch.allclose(raw.norm(dim=1), torch.ones(4))


def test_read_lines_replaces_bad_bytes(tmp_path, caplog) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes(b"\xef\xbb\xbfgood line\nbad \xff\xfe bytes\r\n\nlast")
    assert read_lines(path) == ["good line", "bad \ufffd\ufffd bytes", "", "last"]
    assert "1 line(s) held bytes that are not UTF-8" in caplog.text
