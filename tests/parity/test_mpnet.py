"""MPNet against transformers beyond the shared family cases (test_families.py): sequences long enough to reach
every bucket of the relative-position bias on both sides (distances past 128), tables of several sizes, the
unpadded path with several attention groups, the engine, int8, training gradients, and bad checkpoints."""
from __future__ import annotations

import pytest
import torch

from encoderkit import load_model
from test_families import TOL, assert_close, hf_outputs, our_outputs, perturb

transformers = pytest.importorskip("transformers")

LENGTHS = [160, 131, 37, 9, 1]


def reference_model(tmp_path, buckets: int, task: str = "base"):
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=48, max_position_embeddings=200, layer_norm_eps=1e-5,
                                      relative_attention_num_buckets=buckets, num_labels=3)
    cls = {"base": transformers.MPNetModel, "masked-lm": transformers.MPNetForMaskedLM,
           "sequence-classification": transformers.MPNetForSequenceClassification}[task]
    reference = cls._from_config(config, attn_implementation="eager").eval()
    perturb(reference)
    reference.save_pretrained(tmp_path / "hf")
    return config, reference


def long_batch(lengths=LENGTHS):
    generator = torch.Generator().manual_seed(3)
    longest = max(lengths)
    ids = torch.randint(5, 120, (len(lengths), longest), generator=generator)
    mask = torch.zeros(len(lengths), longest, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        ids[row, length:] = 1  # MPNet's padding id
    return {"input_ids": ids, "attention_mask": mask}


def test_the_bucket_function_is_transformers():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from encoderkit.modeling.attention import RelativePositionBias

    for length in (1, 2, 9, 17, 130, 300):
        positions = torch.arange(length)
        theirs = MPNetEncoder.relative_position_bucket(positions[None, :] - positions[:, None])
        assert torch.equal(RelativePositionBias.buckets(length, torch.device("cpu")), theirs), length


@pytest.mark.parametrize("buckets", [32, 48, 64])
@pytest.mark.parametrize("task", ["base", "masked-lm", "sequence-classification"])
def test_long_sequences_equal_transformers(tmp_path, buckets, task):
    config, reference = reference_model(tmp_path, buckets, task)
    ours = load_model(tmp_path / "hf")
    inputs = long_batch()
    with torch.no_grad():
        expected = hf_outputs(reference, inputs)
        assert_close(expected, our_outputs(ours, inputs), inputs["attention_mask"], f"{buckets} explicit")
        unpadded = our_outputs(ours, inputs, attentions=False)
    assert_close({k: v for k, v in expected.items() if k != "attentions"}, unpadded, inputs["attention_mask"],
                 f"{buckets} unpadded")


def test_engine_and_int8_follow_the_padded_forward(tmp_path):
    from encoderkit.engine import engine_for

    config, reference = reference_model(tmp_path, 32)
    ours = load_model(tmp_path / "hf")
    inputs = long_batch()
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
    rows = [ids[:length].tolist() for ids, length in zip(inputs["input_ids"], inputs["attention_mask"].sum(1))]
    engine = engine_for(load_model(tmp_path / "hf"), "fp32")
    got = torch.zeros_like(want)
    for indices, states, packing in engine.run(rows):
        starts = packing.cu_seqlens.tolist()
        for k, i in enumerate(indices.tolist()):
            got[i, :len(rows[i])] = states[starts[k]:starts[k + 1]]
    real = inputs["attention_mask"].bool()
    assert (got - want)[real].abs().max() <= TOL
    int8 = engine_for(ours, "int8").pooled(rows, pooling="mean")
    fp32 = engine.pooled(rows, pooling="mean")
    assert torch.nn.functional.cosine_similarity(int8, fp32).min() > 0.99


def test_training_gradients_equal_transformers(tmp_path):
    """One MLM loss's gradients, every parameter (the bias table's included), unpadded training path against
    transformers' padded one, dropout off."""
    config, reference = reference_model(tmp_path, 32, "masked-lm")
    ours = load_model(tmp_path / "hf").train()
    reference.train()
    for module in list(ours.modules()) + list(reference.modules()):
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    inputs = long_batch([40, 23, 9])
    labels = torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], torch.full_like(inputs["input_ids"], -100))
    reference(**inputs, labels=labels).loss.backward()
    ours(**inputs, labels=labels).loss.backward()
    theirs = {name: p.grad for name, p in reference.named_parameters()}
    assert ours.encoder.position_bias.table.weight.grad.abs().max() > 0
    diff = (ours.encoder.position_bias.table.weight.grad - theirs["mpnet.encoder.relative_attention_bias.weight"])
    assert diff.abs().max() <= 1e-5
    layer = ours.encoder.layers[1].attention.query.weight.grad
    assert (layer - theirs["mpnet.encoder.layer.1.attention.attn.q.weight"]).abs().max() <= 1e-5


def test_a_checkpoint_without_the_bias_table_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from encoderkit.errors import CheckpointError

    reference_model(tmp_path, 32)
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    del weights["encoder.relative_attention_bias.weight"]
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing tensors.*relative_attention_bias"):
        load_model(tmp_path / "hf")
