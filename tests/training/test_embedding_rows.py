"""The Trainer's embedding gradients kept between steps and cleared row by row (training/optim.EmbeddingRows):
the same steps as torch's dense embedding gradient, a weight tied to the MLM decoder left alone, a dense use of
the weight found and handed back to torch, the modules given back after training."""
from __future__ import annotations

import torch

from encoderkit import EncoderConfig, build_model
from encoderkit.data.features import collate
from encoderkit.training import Trainer, TrainingConfig

VOCAB = 5000  # above EmbeddingRows.MIN_ROWS
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def features(count: int = 48) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(count):
        length = 4 + index % 9
        ids = torch.randint(5, 400, (length,), generator=generator).tolist()  # a few hundred of the rows
        rows.append({"input_ids": ids, "token_type_ids": [0] * length, "labels": index % 3})
    return rows


def trained(tmp_path, name: str, rows: bool, model=None, steps: int = 6):
    if model is None:
        torch.manual_seed(0)
        model = build_model(EncoderConfig(**CONFIG).with_labels(3), "sequence-classification")
    config = TrainingConfig(output_dir=str(tmp_path / name), max_steps=steps, batch_size=8, learning_rate=1e-2,
                            weight_decay=0.01, max_grad_norm=1.0, warmup_steps=1, show_progress=False, seed=0,
                            save_final=False)
    trainer = Trainer(model, config, features(), lambda items, epoch: collate(items, 0))
    if not rows:
        trainer.embedding_rows.tables.clear()
    return trainer


def test_kept_rows_take_the_steps_of_dense_gradients(tmp_path) -> None:
    ours, dense = trained(tmp_path, "rows", True), trained(tmp_path, "dense", False)
    ours.begin(resume=False), dense.begin(resume=False)
    word = ours.model.encoder.embeddings.word
    assert [table.module for table in ours.embedding_rows.tables] == [word]  # words only: positions are few
    for _ in range(6):
        a, b = ours.train_step(), dense.train_step()
        assert word.sparse and word.weight.grad is None  # zero_grad took it; attach gives it back next step
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * b["grad_norm"]
    table = ours.embedding_rows.tables[0]
    kept, looked_up = table.grad, set(torch.cat(table.touched).tolist()) - {0}  # 0: padding, no gradient
    assert set(torch.nonzero((kept != 0).any(dim=1)).flatten().tolist()) == looked_up  # the last step's rows
    ours.embedding_rows.attach()
    assert torch.count_nonzero(kept) == 0 and word.weight.grad is kept
    for (name, p), q in zip(ours.model.named_parameters(), dense.model.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name


def test_tied_decoder_weight_is_left_to_dense_gradients(tmp_path) -> None:
    model = build_model(EncoderConfig(**CONFIG), "masked-lm")
    assert model.mlm_head.decoder.weight is model.encoder.embeddings.word.weight
    trainer = trained(tmp_path, "mlm", True, model=model)
    assert trainer.embedding_rows.tables == []


class DenseUse(torch.nn.Module):
    """A classifier whose loss also reads the whole word table outside its module: a dense gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = build_model(EncoderConfig(**CONFIG).with_labels(3), "sequence-classification")
        self.encoder = self.inner.encoder

    def forward(self, **batch):
        out = self.inner(**batch)
        out.loss = out.loss + 1e-3 * self.encoder.embeddings.word.weight.square().sum()
        return out


def test_a_dense_use_of_the_weight_hands_it_back_to_torch(tmp_path) -> None:
    ours, dense = trained(tmp_path, "rows", True, model=DenseUse()), trained(tmp_path, "dense", False, model=DenseUse())
    ours.begin(resume=False), dense.begin(resume=False)
    word = ours.model.encoder.embeddings.word
    for _ in range(4):
        ours.train_step(), dense.train_step()
    assert ours.embedding_rows.tables == [] and not word.sparse  # found at the first step, released at the second
    for p, q in zip(ours.model.parameters(), dense.model.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5)


def test_training_gives_the_modules_back(tmp_path) -> None:
    trainer = trained(tmp_path, "whole", True, steps=3)
    trainer.train()
    word = trainer.model.encoder.embeddings.word
    assert not word.sparse and word.weight.grad is None
    assert not word._forward_pre_hooks and not word.weight._backward_hooks
