"""NomicBERT, GTE, EuroBERT and jina-embeddings-v3 against transformers beyond the shared family cases
(test_families.py): every head on variants of each family's switches (rotary theta 10,000 and 160,000, GTE's
linear rope scaling and missing segments, EuroBERT's 1, 2 and 4 key/value heads for 4 query heads, its three
classifier poolings and a tied decoder), through the padded explicit path, the unpadded one and the engine, then saved and reloaded in
transformers; checkpoints that lack a tensor the family needs; configs encoderkit cannot run."""
from __future__ import annotations

import pytest
import torch

from encoderkit import load_model
from test_families import assert_parity_and_round_trip, perturbed_reference

transformers = pytest.importorskip("transformers")

VOCAB = 120
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64)


def nomic(theta: float, **switches):
    return lambda: transformers.NomicBertConfig(**SHAPE, rope_parameters={"rope_type": "default", "rope_theta": theta},
                                                **switches)


def gte(theta: float, rope: dict | None = None, **switches):
    rope = {"rope_type": "default", **(rope or {}), "rope_theta": theta}
    return lambda: transformers.GteConfig(**SHAPE, rope_parameters=rope, pad_token_id=1, **switches)


def eurobert(theta: float, kv_heads: int, **switches):
    return lambda: transformers.EuroBertConfig(
        **SHAPE, num_key_value_heads=kv_heads, rope_parameters={"rope_type": "default", "rope_theta": theta},
        pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3, **switches)


def jina(theta: float, **switches):
    return lambda: transformers.JinaEmbeddingsV3Config(
        **SHAPE, rope_parameters={"rope_type": "default", "rope_theta": theta}, **switches)


VARIANTS = {
    "nomic_bert-theta10000": nomic(10_000.0),
    "nomic_bert-theta160000-one-segment": nomic(160_000.0, type_vocab_size=1),
    "gte-theta10000-segments": gte(10_000.0, type_vocab_size=2),
    "gte-theta160000-linear2-no-segments": gte(160_000.0, {"rope_type": "linear", "factor": 2.0}, type_vocab_size=0),
    "eurobert-kv1-late": eurobert(10_000.0, 1),
    "eurobert-kv2-mean-tied": eurobert(160_000.0, 2, classifier_pooling="mean", tie_word_embeddings=True),
    "eurobert-kv4-bos": eurobert(10_000.0, 4, classifier_pooling="bos"),
    "jina_embeddings_v3-theta10000-segments": jina(10_000.0, type_vocab_size=2),
    "jina_embeddings_v3-theta160000": jina(160_000.0),
}
STEMS = {"nomic_bert": "NomicBert", "gte": "Gte", "eurobert": "EuroBert", "jina_embeddings_v3": "JinaEmbeddingsV3"}
TASKS = {"base": "Model", "masked-lm": "ForMaskedLM", "sequence-classification": "ForSequenceClassification",
         "token-classification": "ForTokenClassification", "question-answering": "ForQuestionAnswering"}
# every head on one variant of each family; the others' switches on the encoder (and EuroBERT's poolings)
ALL_HEADS = ("nomic_bert-theta10000", "gte-theta10000-segments", "eurobert-kv1-late",
             "jina_embeddings_v3-theta10000-segments")
CASES = [(variant, task) for variant in VARIANTS for task in TASKS
         if (task != "question-answering" or variant.startswith("jina"))  # the others have no QA in transformers
         and (variant in ALL_HEADS or task in ("base", "masked-lm")
              or (variant.startswith("eurobert") and task == "sequence-classification"))]
LENGTHS = [23, 17, 9, 4, 1]  # a padded batch of mixed lengths, one of a single token


def hf_class(variant: str, task: str = "base"):
    return getattr(transformers, STEMS[variant.split("-")[0]] + TASKS[task])


def reference_model(variant: str, task: str, directory):
    config = VARIANTS[variant]()
    reference = perturbed_reference(hf_class(variant, task), config, task)
    reference.save_pretrained(directory)
    return config, reference


def batch(config, lengths=LENGTHS):
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(5, VOCAB, (len(lengths), max(lengths)), generator=generator)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        types[row, length // 2:length] = 1
        ids[row, length:] = config.pad_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "type_vocab_size", 0) > 1:
        inputs["token_type_ids"] = types
    return inputs


@pytest.mark.parametrize(("variant", "task"), CASES, ids=[f"{v}-{t}" for v, t in CASES])
def test_every_head_equals_transformers_and_round_trips(variant: str, task: str, tmp_path) -> None:
    config, reference = reference_model(variant, task, tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.task == task
    assert_parity_and_round_trip(reference, ours, batch(config), tmp_path / "ours", f"{variant}/{task}")


@pytest.mark.parametrize("variant", ["nomic_bert-theta10000", "gte-theta160000-linear2-no-segments",
                                     "eurobert-kv2-mean-tied", "jina_embeddings_v3-theta10000-segments"])
def test_engine_and_int8_follow_the_padded_forward(variant: str, tmp_path) -> None:
    """The engine (packed sequences, never padded) gives transformers' states; its int8 model stays near them."""
    from encoderkit.engine import engine_for

    config, reference = reference_model(variant, "base", tmp_path)
    inputs = batch(config)
    with torch.no_grad():
        want = reference(**inputs).last_hidden_state
    lengths = inputs["attention_mask"].sum(1).tolist()
    rows = [ids[:length].tolist() for ids, length in zip(inputs["input_ids"], lengths)]
    types = None
    if "token_type_ids" in inputs:
        types = [t[:length].tolist() for t, length in zip(inputs["token_type_ids"], lengths)]
    engine = engine_for(load_model(tmp_path), "fp32")
    got = torch.zeros_like(want)
    for indices, states, packing in engine.run(rows, types):
        starts = packing.cu_seqlens.tolist()
        for k, i in enumerate(indices.tolist()):
            got[i, :len(rows[i])] = states[starts[k]:starts[k + 1]]
    real = inputs["attention_mask"].bool()
    assert (got - want)[real].abs().max() <= 1e-5
    int8 = engine_for(load_model(tmp_path), "int8").pooled(rows, types, pooling="mean")
    fp32 = engine.pooled(rows, types, pooling="mean")
    assert torch.nn.functional.cosine_similarity(int8, fp32).min() > 0.99


@pytest.mark.parametrize(("variant", "removed"), [
    ("nomic_bert-theta10000", "encoder.layers.1.mlp.fc12.weight"),  # one half of a joined matrix
    ("gte-theta10000-segments", "encoder.layer.0.attention.qkv_proj.bias"),
    ("eurobert-kv2-mean-tied", "layers.1.self_attn.k_proj.weight"),
    ("eurobert-kv1-late", "norm.weight"),
    ("jina_embeddings_v3-theta160000", "emb_ln.weight"),
])
def test_a_checkpoint_without_a_needed_tensor_is_refused(variant: str, removed: str, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from encoderkit.errors import CheckpointError

    reference_model(variant, "base", tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights[removed]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"missing tensors.*{removed.replace('.', '[.]')}"):
        load_model(tmp_path)


def test_a_joined_matrix_of_mismatched_halves_is_refused(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from encoderkit.errors import CheckpointError

    reference_model("eurobert-kv4-bos", "base", tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["layers.0.mlp.gate_proj.weight"] = weights["layers.0.mlp.gate_proj.weight"][:40]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="wrong shape.*up_proj.weight.*gate_proj.weight"):
        load_model(tmp_path)


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'yarn' is not supp"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "needs a factor"),
    ({"num_key_value_heads": 3}, "num_key_value_heads .3. must be a positive divisor"),
    ({"head_dim": 16}, "head_dim .16. differs"),
    ({"classifier_pooling": "max"}, "classifier_pooling of eurobert must be one of cls, mean, bos, late"),
])
def test_configs_encoderkit_cannot_run_are_refused(change: dict, message: str) -> None:
    from encoderkit import EncoderConfig
    from encoderkit.errors import ConfigError

    data = {**VARIANTS["eurobert-kv2-mean-tied"]().to_dict(), **change}
    with pytest.raises(ConfigError, match=message):
        EncoderConfig.from_hf_dict(data)


def test_config_json_round_trips() -> None:
    """A transformers config.json read and written back keeps every key transformers wrote (rotary parameters,
    grouped heads, the MLM decoder bias folded into mlp_bias)."""
    from encoderkit import EncoderConfig

    for variant in VARIANTS:
        theirs = VARIANTS[variant]().to_dict()
        ours = EncoderConfig.from_hf_dict(theirs).to_hf_dict()
        for key, value in theirs.items():
            if key in ("transformers_version", "dtype", "use_cache", "output_attentions", "output_hidden_states",
                       "return_dict", "architectures", "problem_type", "id2label", "label2id", "chunk_size_feed_forward",
                       "is_decoder", "add_cross_attention", "torch_dtype", "_name_or_path"):
                continue
            assert ours.get(key) == value, f"{variant}: {key} written as {ours.get(key)!r}, read {value!r}"


@pytest.mark.parametrize("variant", ["eurobert-kv1-late", "eurobert-kv2-mean-tied", "eurobert-kv4-bos"])
def test_the_packed_classifier_pools_as_transformers(variant: str, tmp_path, minilm_dir) -> None:
    """The Classifier pipeline (packed batches, no padding) reads EuroBERT's classifier_pooling as transformers
    does: the first token, the mean of the states, or ("late") the mean of every token's logits."""
    from encoderkit.tasks.classify import Classifier
    from encoderkit.tokenizer import Tokenizer

    config, reference = reference_model(variant, "sequence-classification", tmp_path / "hf")
    inputs = batch(config)
    with torch.no_grad():
        expected = reference(**inputs).logits
    rows = [ids[:int(n)].tolist() for ids, n in zip(inputs["input_ids"], inputs["attention_mask"].sum(1))]
    classifier = Classifier(load_model(tmp_path / "hf"), Tokenizer.from_pretrained(minilm_dir), show_progress=False)
    logits, _ = classifier.logits_and_features_of_tokens(rows, None)
    torch.testing.assert_close(torch.from_numpy(logits), expected, atol=1e-5, rtol=0)
