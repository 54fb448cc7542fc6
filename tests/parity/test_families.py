"""Parity with transformers for the BERT-like families: every layer, every attention map, every head.

A small random model is made with transformers (its weights perturbed so that no LayerNorm or bias
is at its trivial initial value), saved, loaded into encoderkit and run on a padded batch of pairs.
Then encoderkit saves it back and transformers loads that: same outputs again.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderkit import load_model

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = 99

CONFIGS = {
    "bert": lambda: transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40, type_vocab_size=2),
    "roberta": lambda: transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    # RoBERTa's architecture under other names (their own vocabulary sizes in real checkpoints)
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    "camembert": lambda: transformers.CamembertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=29,
        max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5),
    # a relative-position bias; lengths up to 40 reach every bucket on both sides
    "mpnet": lambda: transformers.MPNetConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=42, pad_token_id=1, layer_norm_eps=1e-5, relative_attention_num_buckets=32),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=3, n_heads=4, hidden_dim=37, max_position_embeddings=40),
    "albert": lambda: transformers.AlbertConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_hidden_groups=2,
        inner_group_num=2, num_attention_heads=4, intermediate_size=37, max_position_embeddings=40),
    "electra": lambda: transformers.ElectraConfig(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=40),
    # rotary positions and gated MLPs (their variants: test_new_families.py)
    "nomic_bert": lambda: transformers.NomicBertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40),
    "gte": lambda: transformers.GteConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=1),
    "eurobert": lambda: transformers.EuroBertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=37, max_position_embeddings=40, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        mask_token_id=3),
    "jina_embeddings_v3": lambda: transformers.JinaEmbeddingsV3Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=40, type_vocab_size=2),
}
STEMS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert", "mpnet": "MPNet",
         "distilbert": "DistilBert", "albert": "Albert", "electra": "Electra", "nomic_bert": "NomicBert", "gte": "Gte",
         "eurobert": "EuroBert", "jina_embeddings_v3": "JinaEmbeddingsV3"}
WITHOUT_QA = ("nomic_bert", "gte", "eurobert")  # transformers has no *ForQuestionAnswering for these
TASKS = {
    "base": "Model",
    "masked-lm": "ForMaskedLM",
    "sequence-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
}
CASES = [(family, task) for family in CONFIGS for task in TASKS
         if not (task == "question-answering" and family in WITHOUT_QA)]
CASES += [("bert", "pretraining"), ("albert", "pretraining"), ("electra", "replaced-token-detection")]


def hf_class(family: str, task: str):
    suffix = "ForPreTraining" if task in ("pretraining", "replaced-token-detection") else TASKS[task]
    return getattr(transformers, STEMS[family] + suffix)


def make_batch(config, pad_token_id: int):
    """Two sentence pairs of different lengths, right-padded, with segment ids where the family has them."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (3, 13), generator=generator)
    lengths = [13, 9, 6]
    first_segment = [7, 4, 3]
    mask = torch.zeros(3, 13, dtype=torch.long)
    types = torch.zeros(3, 13, dtype=torch.long)
    for row, (length, first) in enumerate(zip(lengths, first_segment)):
        mask[row, :length] = 1
        types[row, first:length] = 1
        ids[row, length:] = pad_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "type_vocab_size", 0) > 1:
        inputs["token_type_ids"] = types
    return inputs


def perturb(model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)


def hf_outputs(model, inputs) -> dict[str, torch.Tensor | tuple]:
    out = model(**inputs, output_hidden_states=True, output_attentions=True)
    result = {}
    for name in ("last_hidden_state", "pooler_output", "logits", "prediction_logits", "seq_relationship_logits",
                 "sop_logits", "start_logits", "end_logits", "hidden_states", "attentions"):
        value = getattr(out, name, None)
        if value is not None:
            result[name] = value
    if "prediction_logits" in result:
        result["logits"] = result.pop("prediction_logits")
    for name in ("seq_relationship_logits", "sop_logits"):
        if name in result:
            result["pair_logits"] = result.pop(name)
    return result


def our_outputs(model, inputs, attentions: bool = True) -> dict[str, torch.Tensor | tuple]:
    """With attentions: the padded explicit path; without: the unpadded SDPA path (real tokens only)."""
    out = model(**inputs, output_hidden_states=True, output_attentions=attentions)
    result = {}
    for name in ("last_hidden_state", "pooler_output", "logits", "pair_logits", "start_logits", "end_logits",
                 "hidden_states", "attentions"):
        value = getattr(out, name, None)
        if value is not None:
            result[name] = value
    assert torch.equal(result["last_hidden_state"], result["hidden_states"][-1])
    if model.task != "base":  # transformers' task outputs carry only the hidden-state tuple
        del result["last_hidden_state"]
    return result


def assert_close(expected: dict, actual: dict, mask: torch.Tensor, label: str) -> None:
    assert set(expected) == set(actual), f"{label}: outputs differ: {sorted(expected)} vs {sorted(actual)}"
    real = mask.bool()
    for name, want in expected.items():
        got = actual[name]
        if isinstance(want, tuple):
            assert len(want) == len(got), f"{label}: {name} has {len(got)} entries, transformers {len(want)}"
            for layer, (w, g) in enumerate(zip(want, got)):
                if name == "attentions":  # (batch, heads, query, key): compare real query rows
                    w, g = w.permute(0, 2, 1, 3)[real], g.permute(0, 2, 1, 3)[real]
                else:
                    w, g = w[real], g[real]
                diff = (w - g).abs().max().item()
                assert diff <= TOL, f"{label}: {name}[{layer}] differs by {diff:.3g}"
            continue
        if want.dim() >= 2 and want.shape[:2] == mask.shape:  # per-token outputs
            want, got = want[real], got[real]
        assert want.shape == got.shape, f"{label}: {name} shape {tuple(got.shape)} vs {tuple(want.shape)}"
        diff = (want - got).abs().max().item()
        assert diff <= TOL, f"{label}: {name} differs by {diff:.3g}"


def perturbed_reference(cls, config, task: str):
    """A random transformers ``cls`` of ``config`` (three labels for a classifier), perturbed, in eval mode."""
    torch.manual_seed(0)
    if task in ("sequence-classification", "token-classification"):
        config.num_labels = 3
    reference = cls._from_config(config, attn_implementation="eager").eval()
    perturb(reference)
    return reference


def build_reference(family: str, task: str):
    """The config and a random transformers model of ``family`` with ``task``'s head, perturbed, in eval mode."""
    config = CONFIGS[family]()
    return config, perturbed_reference(hf_class(family, task), config, task)


def assert_parity_and_round_trip(reference, ours, inputs, directory, label: str) -> None:
    """encoderkit's ``ours`` gives ``reference``'s outputs on ``inputs`` through the padded explicit path (attention
    maps) and the unpadded one; saved to ``directory``, transformers' class reloads it with the same outputs."""
    mask = inputs["attention_mask"]
    with torch.no_grad():
        expected = hf_outputs(reference, inputs)
        explicit = our_outputs(ours, inputs)
        unpadded = our_outputs(ours, inputs, attentions=False)
    assert "attentions" in expected and len(expected["hidden_states"]) == reference.config.num_hidden_layers + 1
    assert_close(expected, explicit, mask, f"{label} explicit")
    assert_close({k: v for k, v in expected.items() if k != "attentions"}, unpadded, mask, f"{label} unpadded")
    ours.save_pretrained(directory)
    reloaded = type(reference).from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        again = hf_outputs(reloaded, inputs)
    assert_close(expected, again, mask, f"{label} round trip")


@pytest.mark.parametrize(("family", "task"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_load_matches_transformers_and_round_trips(family: str, task: str, tmp_path) -> None:
    config, reference = build_reference(family, task)
    reference.save_pretrained(tmp_path / "hf")

    ours = load_model(tmp_path / "hf")
    assert ours.task == task  # read from config.json's architectures
    inputs = make_batch(config, config.pad_token_id)
    with torch.no_grad():
        expected = hf_outputs(reference, inputs)
        actual = our_outputs(ours, inputs)
    assert_close(expected, actual, inputs["attention_mask"], f"{family}/{task} load")
    assert len(actual["hidden_states"]) >= config.num_hidden_layers + 1
    with torch.no_grad():
        unpadded = our_outputs(ours, inputs, attentions=False)
    assert_close({k: v for k, v in expected.items() if k != "attentions"}, unpadded, inputs["attention_mask"],
                 f"{family}/{task} unpadded")

    ours.save_pretrained(tmp_path / "ours")
    reloaded = hf_class(family, task).from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    with torch.no_grad():
        again = hf_outputs(reloaded, inputs)
    assert_close(expected, again, inputs["attention_mask"], f"{family}/{task} round trip")


@pytest.mark.parametrize("family", list(CONFIGS))
def test_sdpa_path_equals_explicit_path(family: str, tmp_path) -> None:
    """Without attention probabilities encoderkit runs SDPA; it must give the same states."""
    config = CONFIGS[family]()
    reference = hf_class(family, "base")._from_config(config, attn_implementation="eager").eval()
    perturb(reference)
    reference.save_pretrained(tmp_path)
    ours = load_model(tmp_path, task="base")
    inputs = make_batch(config, config.pad_token_id)
    with torch.no_grad():
        fast = ours(**inputs).last_hidden_state
        explicit = ours(**inputs, output_attentions=True).last_hidden_state
        want = reference(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert (fast - explicit)[real].abs().max() <= TOL
    assert (fast - want)[real].abs().max() <= TOL


@pytest.mark.parametrize("group_overhead", [None, 0], ids=["one-attention-group", "a-group-per-length"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_unpadded_training_gives_the_padded_gradients(family: str, group_overhead, tmp_path, monkeypatch) -> None:
    """Training runs the dense layers on real tokens only and attention on groups of similar length (here
    one group of all three rows, or one group per row); loss and every gradient equal the padded path's."""
    from encoderkit.modeling import packing as attention_module
    from encoderkit.modeling import encoder as encoder_module

    if group_overhead is not None:
        monkeypatch.setattr(attention_module, "GROUP_OVERHEAD", group_overhead)
    expected_groups = 1 if group_overhead is None else 3
    assert len(attention_module.length_groups(np.array([13, 9, 6]))) == expected_groups

    config = CONFIGS[family]()
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    reference = hf_class(family, "sequence-classification")._from_config(config, attn_implementation="eager")
    perturb(reference)
    reference.save_pretrained(tmp_path)
    inputs = make_batch(config, config.pad_token_id)
    labels = torch.tensor([0, 1, 1])

    def loss_and_grads(unpad: bool):
        monkeypatch.setattr(encoder_module, "_worth_unpadding", lambda mask: unpad)
        model = load_model(tmp_path).train()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    padded_loss, padded = loss_and_grads(False)
    unpadded_loss, unpadded = loss_and_grads(True)
    assert (padded_loss - unpadded_loss).abs() <= TOL
    assert padded.keys() == unpadded.keys() and len(padded) > 20
    for name in padded:
        assert (padded[name] - unpadded[name]).abs().max() <= TOL, name


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
@pytest.mark.parametrize("unpad", [False, True, "grouped"], ids=["padded", "unpadded", "unpadded-by-length"])
def test_span_loss_ignores_padding(family: str, unpad: bool | str, tmp_path, monkeypatch) -> None:
    """The QA loss of a padded batch is the mean of each example's transformers loss computed alone, without
    padding, and so is every gradient: padding is no answer candidate, whichever path the encoder takes.
    (transformers' own loss on the padded batch puts probability on padding, so it differs.)"""
    from safetensors.torch import load_file

    from encoderkit.modeling import packing as attention_module
    from encoderkit.modeling import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "_worth_unpadding", lambda mask: bool(unpad))
    if unpad == "grouped":  # attention on one group per sequence length
        monkeypatch.setattr(attention_module, "GROUP_OVERHEAD", 0)
    config = CONFIGS[family]()
    for name in [n for n in config.to_dict() if "dropout" in n]:
        setattr(config, name, 0.0)
    reference = hf_class(family, "question-answering")._from_config(config, attn_implementation="eager")
    perturb(reference)
    reference.save_pretrained(tmp_path / "hf")
    inputs = make_batch(config, config.pad_token_id)
    starts, ends = torch.tensor([2, 5, 0]), torch.tensor([4, 8, 0])  # the last row answers at [CLS]

    ours = load_model(tmp_path / "hf").train()
    loss = ours(**inputs, start_positions=starts, end_positions=ends).loss
    loss.backward()
    alone = []
    for row, length in enumerate(inputs["attention_mask"].sum(1).tolist()):
        single = {key: value[row:row + 1, :length] for key, value in inputs.items()}
        alone.append(reference(**single, start_positions=starts[row:row + 1], end_positions=ends[row:row + 1]).loss)
    want = torch.stack(alone).mean()
    want.backward()
    assert (loss - want).abs() <= TOL
    with torch.no_grad():
        padded_reference = reference(**inputs, start_positions=starts, end_positions=ends).loss
    assert (padded_reference - want).abs() > 1e-3

    # Our gradients, saved in place of the weights, come out under transformers' names.
    with torch.no_grad():
        for param in ours.parameters():
            param.copy_(param.grad)
    ours.save_pretrained(tmp_path / "grads")
    saved = load_file(str(tmp_path / "grads" / "model.safetensors"))
    grads = dict(reference.named_parameters())
    assert len(grads) > 20
    for name, param in grads.items():
        assert (saved[name] - param.grad).abs().max() <= TOL, name


def test_distilbert_sinusoidal_positions(tmp_path) -> None:
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                           max_position_embeddings=40, sinusoidal_pos_embds=True)
    reference = transformers.DistilBertModel(config).eval()
    from encoderkit import EncoderConfig, build_model

    fresh = build_model(EncoderConfig.from_hf_dict(config.to_dict()), "base")
    # A new encoderkit model builds the same fixed table transformers does.
    diff = (fresh.embeddings.position.weight - reference.embeddings.position_embeddings.weight).abs().max()
    assert diff < 1e-6
    assert not fresh.embeddings.position.weight.requires_grad


def test_task_head_is_initialised_from_a_bare_encoder(tmp_path, caplog) -> None:
    """A bare BertModel checkpoint loads into a classifier: encoder weights kept, head new (with a warning)."""
    config = CONFIGS["bert"]()
    base = transformers.BertModel(config).eval()
    base.save_pretrained(tmp_path)
    classifier = load_model(tmp_path, task="sequence-classification", labels=["neg", "neu", "pos"])
    assert classifier.config.labels == ["neg", "neu", "pos"]
    assert torch.equal(classifier.encoder.layers[1].ffn_in.weight, base.encoder.layer[1].intermediate.dense.weight)
    assert "newly initialised" in caplog.text and "classifier.weight" in caplog.text
