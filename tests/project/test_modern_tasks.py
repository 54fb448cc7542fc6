"""ModernBERT and DeBERTa-v3 through the task workflow (issue 19): `encoderkit finetune` writes a directory that
transformers loads as the matching *ForSequenceClassification / *ForTokenClassification / *ForQuestionAnswering with
encoderkit's logits, and bad checkpoints, configs and inputs of these families fail with one clear line."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import Classifier, InputError, load_model
from encoderkit.cli import main
from encoderkit.training.finetune import Recipe, finetune

from helpers import perturbed_model_dir
from test_finetune import write_conll, write_squad

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
MAX_POSITIONS = 128
FAST = dict(epochs=1, batch_size=8, learning_rate=1e-3, show_progress=False, seed=0)
POSITIVE = ["great", "wonderful", "superb", "lovely"]
NEGATIVE = ["awful", "dreadful", "boring", "terrible"]
# Lengths on both sides of ModernBERT's 8-token sliding window, so the local layers mask something.
TEXTS = ["the film was great", "dull",
         "the film was awful and the cast really really really really agreed that it was a long evening"]


def modernbert_config(**overrides):
    # The MiniLM WordPiece tokenizer: [PAD] 0, [CLS] 101, [SEP] 102.
    return transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
        global_attn_every_n_layers=2, local_attention=8, max_position_embeddings=MAX_POSITIONS, pad_token_id=0,
        bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102, **overrides)


def deberta_v3_config(**overrides):
    return transformers.DebertaV2Config(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=MAX_POSITIONS, type_vocab_size=0, relative_attention=True, pos_att_type="p2c|c2p",
        position_buckets=16, norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
        max_relative_positions=-1, pad_token_id=0, **overrides)


FAMILIES = {
    "modernbert": (modernbert_config, "ModernBert"),
    "deberta-v3": (deberta_v3_config, "DebertaV2"),
}


def pretrained_dir(directory: Path, minilm_dir: Path, family: str, suffix: str = "Model", **overrides) -> Path:
    """A random transformers model of ``family`` (the base model, or ``stem + suffix``), its weights perturbed so
    that no norm or projection is at its near-trivial initial value, saved with the MiniLM tokenizer files."""
    make_config, stem = FAMILIES[family]
    return perturbed_model_dir(directory, minilm_dir, getattr(transformers, stem + suffix), make_config(**overrides))


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory, minilm_dir) -> Path:
    return pretrained_dir(tmp_path_factory.mktemp("modernbert"), minilm_dir, "modernbert")


@pytest.fixture(scope="module")
def deberta(tmp_path_factory, minilm_dir) -> Path:
    return pretrained_dir(tmp_path_factory.mktemp("deberta"), minilm_dir, "deberta-v3")


def write_tsv(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = ["text\tlabel"]
    for _ in range(count):
        label = rng.choice(["pos", "neg"])
        word = rng.choice(POSITIVE if label == "pos" else NEGATIVE)
        rows.append(f"the film was {word} and the cast {' '.join(['really'] * rng.randint(0, 8))} agreed\t{label}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def hf_and_ours(out: Path, hf_class, texts, pairs=None):
    """transformers' and encoderkit's outputs on one right-padded batch, and the mask of real tokens."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    inputs = tokenizer(texts, pairs, padding=True, return_tensors="pt")
    assert not inputs["attention_mask"].all()  # the batch is padded
    reference = hf_class.from_pretrained(out, attn_implementation="eager").eval()
    if getattr(reference.config, "type_vocab_size", 0) < 2:  # one segment: a BERT tokenizer's pair types mean nothing
        inputs.pop("token_type_ids", None)
    ours = load_model(out)
    with torch.no_grad():
        return reference(**inputs), ours(**inputs), inputs["attention_mask"].bool()


# ---------------------------------------------------------------------------------------------
# Fine-tuning through the CLI: classification
# ---------------------------------------------------------------------------------------------
CLASSIFY_CASES = [("modernbert", "cls"), ("modernbert", "mean"), ("deberta-v3", None)]


@pytest.mark.parametrize(("family", "pooling"), CLASSIFY_CASES, ids=["modernbert", "modernbert-mean", "deberta-v3"])
def test_finetune_classify_cli_loads_in_transformers(tmp_path, minilm_dir, modernbert, deberta, family,
                                                     pooling, capsys) -> None:
    if pooling == "mean":
        base = pretrained_dir(tmp_path / "base", minilm_dir, family, classifier_pooling="mean")
    else:
        base = modernbert if family == "modernbert" else deberta
    train, out = write_tsv(tmp_path / "train.tsv", 40), tmp_path / "out"
    code = main(["finetune", "--task", "classify", "--train", str(train), "--model", str(base), "--out", str(out),
                 "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--seed", "0"])
    assert code == 0, capsys.readouterr().err
    assert f"final model: {out}" in capsys.readouterr().out

    stem = FAMILIES[family][1]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == base_model_type(family)
    assert config["architectures"] == [f"{stem}ForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["encoderkit"]["task"] == "classify"
    if family == "modernbert":
        assert config["classifier_pooling"] == pooling
        assert config["layer_types"] == ["full_attention", "sliding_attention", "full_attention"]
        assert config["local_attention"] == 8
    else:
        assert config["position_buckets"] == 16 and config["share_att_key"] is True
        assert sorted(config["pos_att_type"]) == ["c2p", "p2c"] and config["position_biased_input"] is False

    hf_class = getattr(transformers, f"{stem}ForSequenceClassification")
    want, got, _ = hf_and_ours(out, hf_class, TEXTS)
    assert want.logits.shape == got.logits.shape == (len(TEXTS), 2)
    assert (want.logits - got.logits).abs().max() <= TOL
    assert (want.logits[0] - want.logits[1]).abs().max() > 1e-3  # the texts are told apart: not a constant head
    # The pipeline (packed, no padding) gives the padded batch's logits too.
    pipeline_logits = Classifier.from_pretrained(out).logits(TEXTS)
    assert np.abs(pipeline_logits - want.logits.numpy()).max() <= TOL
    # Pairs: DeBERTa-v3 and ModernBERT have no segment embeddings; the tokenizer's type ids must not matter.
    want, got, _ = hf_and_ours(out, hf_class, TEXTS, [t[::-1] for t in TEXTS])
    assert (want.logits - got.logits).abs().max() <= TOL


def base_model_type(family: str) -> str:
    return "modernbert" if family == "modernbert" else "deberta-v2"


# ---------------------------------------------------------------------------------------------
# Token classification and question answering
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["modernbert", "deberta-v3"])
def test_finetune_ner_loads_in_transformers(tmp_path, modernbert, deberta, family) -> None:
    base = modernbert if family == "modernbert" else deberta
    train = write_conll(tmp_path / "train.conll", 30)
    result = finetune("ner", train, tmp_path / "out", model=base, recipe=Recipe(**FAST))
    assert {"precision", "recall", "f1"} <= set(result.metrics)
    stem = FAMILIES[family][1]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [f"{stem}ForTokenClassification"]
    want, got, real = hf_and_ours(tmp_path / "out", getattr(transformers, f"{stem}ForTokenClassification"),
                                  ["Anna Smith visited Oslo .", "Jo Lee visited New York and then Reykjavik again ."])
    assert want.logits.shape == got.logits.shape
    assert (want.logits - got.logits)[real].abs().max() <= TOL


@pytest.mark.parametrize("family", ["modernbert", "deberta-v3"])
def test_finetune_qa_loads_in_transformers(tmp_path, modernbert, deberta, family) -> None:
    base = modernbert if family == "modernbert" else deberta
    train = write_squad(tmp_path / "train.json", 24)
    result = finetune("qa", train, tmp_path / "out", model=base,
                      recipe=Recipe(**{**FAST, "max_length": 48, "doc_stride": 16}))
    assert set(result.metrics) == {"exact_match", "f1"}
    stem = FAMILIES[family][1]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [f"{stem}ForQuestionAnswering"]
    want, got, real = hf_and_ours(tmp_path / "out", getattr(transformers, f"{stem}ForQuestionAnswering"),
                                  ["Where was it?", "Where was the meeting held last year?"],
                                  ["It was in Lima, a city in Peru.", "The meeting took place in Oslo."])
    assert (want.start_logits - got.start_logits)[real].abs().max() <= TOL
    assert (want.end_logits - got.end_logits)[real].abs().max() <= TOL


# ---------------------------------------------------------------------------------------------
# Bad input: one line `encoderkit: error: ...`, exit code 2
# ---------------------------------------------------------------------------------------------
def assert_one_line_error(capsys, code: int, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("encoderkit: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err
    assert "Traceback" not in err


def without_tensor(source: Path, target: Path, name: str) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    state = load_file(str(target / "model.safetensors"))
    assert name in state
    del state[name]
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def with_config(source: Path, target: Path, **changes) -> Path:
    shutil.copytree(source, target)
    config = json.loads((source / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return target


@pytest.mark.parametrize(("family", "tensor"), [("modernbert", "layers.1.attn.Wqkv.weight"),
                                                ("deberta-v3", "encoder.rel_embeddings.weight")])
def test_missing_tensor_is_one_line(tmp_path, modernbert, deberta, family, tensor, capsys) -> None:
    broken = without_tensor(modernbert if family == "modernbert" else deberta, tmp_path / "broken", tensor)
    (tmp_path / "in.txt").write_text("hello world\nsecond line\n", encoding="utf-8")
    code = main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy"), "--model", str(broken)])
    assert_one_line_error(capsys, code, "missing tensors", tensor, str(broken), base_model_type(family))
    assert not (tmp_path / "v.npy").exists()
    code = main(["classify", str(broken), "some text"])  # a base model without the tensor: the same error first
    assert_one_line_error(capsys, code, "missing tensors", tensor)


@pytest.mark.parametrize(("family", "changes", "fragments"), [
    ("modernbert", {"hidden_size": 30}, ("hidden_size (30)", "num_attention_heads (4)", "divisible")),
    ("deberta-v3", {"num_attention_heads": 5}, ("hidden_size (32)", "num_attention_heads (5)", "divisible")),
    ("modernbert", {"local_attention": 7}, ("local_attention", "7", "even")),
], ids=["modernbert-heads", "deberta-heads", "modernbert-odd-window"])
def test_inconsistent_config_is_one_line(tmp_path, modernbert, deberta, family, changes, fragments, capsys) -> None:
    broken = with_config(modernbert if family == "modernbert" else deberta, tmp_path / "broken", **changes)
    assert_one_line_error(capsys, main(["info", str(broken)]), *fragments)
    (tmp_path / "in.txt").write_text("hello world\n", encoding="utf-8")
    code = main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy"), "--model", str(broken)])
    assert_one_line_error(capsys, code, *fragments)


@pytest.mark.parametrize("family", ["modernbert", "deberta-v3"])
def test_too_long_input_raises_input_error(modernbert, deberta, family) -> None:
    model = load_model(modernbert if family == "modernbert" else deberta)
    ids = torch.full((1, MAX_POSITIONS + 1), 1000)
    with pytest.raises(InputError, match=rf"{MAX_POSITIONS + 1} tokens is longer than this "
                                         rf"{base_model_type(family)} model's limit of {MAX_POSITIONS}.*truncate"):
        model(ids)
    with pytest.raises(InputError, match="longer than"):  # padded: the padded width counts
        model(ids, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        assert model(ids[:, :MAX_POSITIONS]).last_hidden_state.shape == (1, MAX_POSITIONS, 32)


@pytest.mark.parametrize("family", ["modernbert", "deberta-v3"])
def test_cli_truncates_long_input_with_a_warning(tmp_path, modernbert, deberta, family, capsys, caplog) -> None:
    """The CLI's commands never hand the model more than its limit: `embed` truncates (even when --max-length asks
    for more) and says so on stderr; `--long-text window` reads the whole text."""
    base = modernbert if family == "modernbert" else deberta
    long_text = " ".join(["word"] * (2 * MAX_POSITIONS))
    (tmp_path / "in.txt").write_text(long_text + "\nshort\n", encoding="utf-8")
    code = main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "v.npy"), "--model", str(base),
                 "--max-length", str(4 * MAX_POSITIONS)])
    assert code == 0, capsys.readouterr().err
    assert np.load(tmp_path / "v.npy").shape == (2, 32)
    assert f"1 of 2 texts are longer than {MAX_POSITIONS} tokens and were truncated" in caplog.text
    code = main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "w.npy"), "--model", str(base),
                 "--long-text", "window"])
    assert code == 0, capsys.readouterr().err
    vectors = np.load(tmp_path / "w.npy")
    assert vectors.shape == (2, 32) and np.isfinite(vectors).all()


@pytest.mark.parametrize("family", ["modernbert", "deberta-v3"])
def test_fill_mask_too_long_is_one_line(tmp_path, minilm_dir, family, capsys) -> None:
    """fill-mask does not truncate (that could cut the mask off): a text over the model's limit is a clear error,
    also when it is over the tokenizer's 512 and its mask is at the end (it used to say "has no [MASK] token")."""
    mlm = pretrained_dir(tmp_path / "mlm", minilm_dir, family, suffix="ForMaskedLM")
    assert main(["fill-mask", str(mlm), "the film was [MASK] .", "--top-k", "2"]) == 0
    assert "the film was" in capsys.readouterr().out
    for words in (2 * MAX_POSITIONS, 600):
        code = main(["fill-mask", str(mlm), " ".join(["word"] * words) + " [MASK] ."])
        assert_one_line_error(capsys, code, f"text 0 is {words + 4} tokens long", f"at most {MAX_POSITIONS}",
                              "[MASK]")
    code = main(["fill-mask", str(mlm), "no mask here"])
    assert_one_line_error(capsys, code, "has no [MASK] token")
