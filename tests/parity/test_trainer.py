"""encoderkit's Trainer takes the same optimizer steps as transformers' Trainer.

Same weights, same batches, dropout off: after several steps of warm-up and linear decay, with weight decay
(none on biases and LayerNorm) and gradient clipping that bites, every parameter equals the reference's.
This is what makes the fine-tuning benchmark's "same hyperparameters" literal.
"""
from __future__ import annotations

import pytest
import torch

from encoderkit import load_model
from encoderkit.data.features import collate
from encoderkit.training import Trainer, TrainingConfig

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it

STEPS, WARMUP, BATCH = 6, 2, 8


def _features(count: int, vocab: int, pad: int) -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    features = []
    for index in range(count):
        length = 5 + index % 7
        ids = torch.randint(pad + 1, vocab, (length,), generator=generator).tolist()
        features.append({"input_ids": ids, "token_type_ids": [0] * 3 + [1] * (length - 3),
                         "labels": int(torch.randint(0, 3, (1,), generator=generator))})
    return features


@pytest.mark.parametrize("task", ["sequence-classification", "question-answering"])
def test_trainer_steps_equal_transformers_trainer(task: str, tmp_path) -> None:
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=40,
                                     num_labels=3 if task == "sequence-classification" else 2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    stem = "ForSequenceClassification" if task == "sequence-classification" else "ForQuestionAnswering"
    torch.manual_seed(0)
    reference = getattr(transformers, "Bert" + stem)(config)
    reference.save_pretrained(tmp_path / "start")
    features = _features(BATCH, config.vocab_size, config.pad_token_id)
    if task == "question-answering":  # one length for all: transformers' QA loss keeps padding among the candidates
        for index, feature in enumerate(features):
            feature["input_ids"] = feature["input_ids"][:5]
            feature["token_type_ids"] = feature["token_type_ids"][:5]
            del feature["labels"]
            feature["start_positions"], feature["end_positions"] = index % 4, index % 4 + 1

    def batches(items, epoch=0):
        return collate(items, config.pad_token_id)

    hyper = dict(learning_rate=3e-3, weight_decay=0.1, max_grad_norm=0.05, adam_eps=1e-8)
    # One batch per step holding every example: the data order cannot differ between the two.
    ours = load_model(tmp_path / "start").train()
    trainer = Trainer(ours, TrainingConfig(output_dir=str(tmp_path / "ours"), max_steps=STEPS, batch_size=BATCH,
                                           warmup_steps=WARMUP, show_progress=False, **hyper), features, batches)
    trainer.begin(resume=False)
    norms = [trainer.train_step()["grad_norm"] for _ in range(STEPS)]
    assert min(norms) > hyper["max_grad_norm"]  # clipping acted on every step

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=BATCH, max_steps=STEPS, warmup_steps=WARMUP,
        learning_rate=hyper["learning_rate"], weight_decay=hyper["weight_decay"], max_grad_norm=hyper["max_grad_norm"],
        adam_epsilon=hyper["adam_eps"], lr_scheduler_type="linear", report_to="none", save_strategy="no",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    transformers.Trainer(model=reference, args=args, train_dataset=features, data_collator=batches).train()

    ours.save_pretrained(tmp_path / "ours-final")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "ours-final" / "model.safetensors"))
    start = load_file(str(tmp_path / "start" / "model.safetensors"))
    # A span softmax over positions is blind to a shift shared by every position: the gradient of the last
    # LayerNorm's bias and of the span head's bias is zero up to rounding, which Adam scales up to a step.
    last_norm = f"bert.encoder.layer.{config.num_hidden_layers - 1}.output.LayerNorm.bias"
    invariant = {last_norm, "qa_outputs.bias"} if task == "question-answering" else set()
    moved = 0
    for name, param in reference.named_parameters():
        if name in invariant:
            continue
        assert (saved[name] - param.detach()).abs().max() <= 1e-5, name
        moved += bool((param.detach() - start[name]).abs().max() > 1e-3)
    assert moved > 20  # the steps did move the weights
