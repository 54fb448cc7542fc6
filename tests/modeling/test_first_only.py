"""Training a classifier on [CLS]: the last layer computes only each sequence's first row past its attention
(``EncoderModel.forward(first_only=True)``). Without dropout its loss, logits and every gradient equal the full
forward's, for every family, padded or not; it steps aside where the batch is padded on the left, where layers'
states are asked for, and for a head that reads the token mean."""
from __future__ import annotations

import pytest
import torch

from encoderkit import EncoderConfig, build_model
from test_engine import FAMILY_CONFIGS

ZERO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
                    embedding_dropout=0.0, mlp_dropout=0.0, pooler_dropout=0.0)


def classifier(family: str, **overrides):
    torch.manual_seed(0)
    config = EncoderConfig(**{**dict(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=80, max_position_embeddings=64),
                              **FAMILY_CONFIGS[family], **ZERO_DROPOUT, **overrides}).with_labels(3)
    return build_model(config, "sequence-classification").train()


def batch(pad_left: bool = False):
    torch.manual_seed(1)
    ids = torch.randint(5, 120, (4, 11))
    mask = torch.ones(4, 11, dtype=torch.long)
    mask[1, 7:], mask[2, 3:], mask[3, 10:] = 0, 0, 0  # a third of the slots padding: the unpadded layout
    if pad_left:
        mask = mask.flip(1)
    return ids, mask, torch.tensor([0, 2, 1, 2])


def loss_and_gradients(model, ids, mask, labels, first_only: bool):
    model.zero_grad(set_to_none=True)
    calls = []
    forward = model.encoder.forward

    def spy(*args, **kwargs):
        kwargs["first_only"] = first_only
        out = forward(*args, **kwargs)
        calls.append(out.last_hidden_state.shape[1])
        return out

    model.encoder.forward = spy
    try:
        out = model(ids, mask, labels=labels)
    finally:
        del model.encoder.forward
    out.loss.backward()
    return out, calls[0], {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
@pytest.mark.parametrize("full_grid", [False, True], ids=["unpadded", "padded-grid"])
def test_first_rows_only_equal_the_full_forward(family: str, full_grid: bool, monkeypatch) -> None:
    if full_grid:  # below this share of padding the batch runs as one padded grid
        monkeypatch.setattr("encoderkit.modeling.encoder.UNPAD_MIN_PADDING", 0.9)
    model = classifier(family)
    ids, mask, labels = batch()
    full, full_width, full_grads = loss_and_gradients(model, ids, mask, labels, first_only=False)
    first, first_width, first_grads = loss_and_gradients(model, ids, mask, labels, first_only=True)
    assert (full_width, first_width) == (11, 1)  # the path under test ran
    assert torch.allclose(first.logits, full.logits, atol=1e-5, rtol=1e-5)
    assert torch.allclose(first.loss, full.loss, atol=1e-6)
    assert first_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        assert torch.allclose(first_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_training_forward_takes_it_and_other_cases_do_not(monkeypatch) -> None:
    model = classifier("bert")
    ids, mask, labels = batch()
    assert model(ids, mask, labels=labels).last_hidden_state.shape == (4, 1, 48)  # training: first rows only
    assert model.eval()(ids, mask).last_hidden_state.shape == (4, 11, 48)  # evaluation: every state, as before
    model.train()
    assert model(ids, mask, output_hidden_states=True).last_hidden_state.shape == (4, 11, 48)
    left_ids, left_mask, _ = batch(pad_left=True)
    assert model(left_ids, left_mask).last_hidden_state.shape == (4, 11, 48)  # position 0 is padding somewhere
    mean = classifier("modernbert", classifier_pooling="mean")
    assert mean(ids, mask).last_hidden_state.shape == (4, 11, 48)
