"""ONNX export (``encoderkit export --format onnx``): every family and head, checked with ONNX Runtime against
transformers (the independent reference) and encoderkit, on batches of other sizes and lengths than the one
traced, with padding; the default model in sentence-transformers' ONNX backend; the int8 copy; bad input."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import Embedder, EncoderConfig, InputError, Tokenizer, build_model, export_onnx, load_model
from encoderkit.cli import main
from encoderkit.export import INT8_FILE, ONNX_FILE, onnx_session, run_onnx
from encoderkit.io.st_format import write_sentence_transformer
from helpers import TOKENIZER_FILES

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'encoderkit[onnx]'")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "parity"))  # the parity tests' model configs, as they import them
from test_families import CONFIGS, TASKS, WITHOUT_QA, perturb  # noqa: E402
from test_families import build_reference as classic_reference  # noqa: E402
from test_modern_families import build_reference as modern_reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-4
# family -> a random transformers model of it with a task's head (the parity tests' configs and variants)
REFERENCES = {family: lambda task, family=family: classic_reference(family, task) for family in CONFIGS}
REFERENCES |= {family: lambda task, variant=variant: modern_reference(variant, task) for family, variant in
               (("modernbert", "modernbert-every3-window4"), ("deberta-v2", "deberta-v2-style"),
                ("deberta-v3", "deberta-v3"))}
CASES = [(family, task) for family in REFERENCES for task in TASKS
         if (family != "deberta-v3" or task in ("base", "masked-lm"))  # v3: the attention switches v2-style lacks
         and not (task == "question-answering" and family in WITHOUT_QA)]
CASES += [("bert", "pretraining"), ("albert", "pretraining"), ("electra", "replaced-token-detection")]
# transformers' names for the outputs encoderkit's graphs return
HF_NAMES = {"logits": ("logits", "prediction_logits"), "pair_logits": ("seq_relationship_logits", "sop_logits"),
            "start_logits": ("start_logits",), "end_logits": ("end_logits",),
            "last_hidden_state": ("last_hidden_state",), "pooler_output": ("pooler_output",)}


def padded_batch(config, lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    """Right-padded rows of the given real lengths, pad_token_id at padding, segment ids where the family has two."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (len(lengths), max(lengths)), generator=generator)
    mask = torch.zeros_like(ids)
    types_ = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        ids[row, length:] = config.pad_token_id
        types_[row, length // 2:length] = 1
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "type_vocab_size", 0) > 1:
        inputs["token_type_ids"] = types_
    return inputs


# The traced batch has 2 rows of at most 8 tokens (encoderkit.export.example_inputs); these have other sizes.
BATCHES = [[17, 12, 5, 1], [6], [3, 3, 3]]


def compare(name: str, want: np.ndarray, got: np.ndarray, mask: np.ndarray, label: str) -> float:
    if want.ndim >= 2 and want.shape[:2] == mask.shape:  # per token: the real tokens only
        want, got = want[mask], got[mask]
    assert want.shape == got.shape, f"{label}: {name} has shape {got.shape}, expected {want.shape}"
    diff = float(np.abs(want - got).max())
    assert diff <= TOL, f"{label}: {name} differs by {diff:.3g}"
    return diff


@pytest.mark.parametrize(("family", "task"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_onnx_runtime_matches_transformers_and_encoderkit(family: str, task: str, tmp_path) -> None:
    config, reference = REFERENCES[family](task)
    reference.save_pretrained(tmp_path / "hf")

    result = export_onnx(tmp_path / "hf", tmp_path / "onnx", progress=False)
    assert result.task == task and result.model_path == tmp_path / "onnx" / "onnx" / ONNX_FILE
    assert (tmp_path / "onnx" / "config.json").is_file() and not (tmp_path / "onnx" / "model.safetensors").exists()
    assert result.max_difference <= TOL
    ours = load_model(tmp_path / "hf")
    session = onnx_session(result.model_path)
    for seed, lengths in enumerate(BATCHES):
        inputs = padded_batch(config, lengths, seed)
        got = run_onnx(session, inputs)
        assert sorted(got) == sorted(result.outputs)
        mask = inputs["attention_mask"].bool().numpy()
        with torch.no_grad():
            expected = reference(**inputs)
            mine = ours(**inputs)
        for name in result.outputs:
            want = next(getattr(expected, hf) for hf in HF_NAMES[name] if getattr(expected, hf, None) is not None)
            compare(name, want.numpy(), got[name], mask, f"{family}/{task} vs transformers, rows {lengths}")
            compare(name, getattr(mine, name).numpy(), got[name], mask, f"{family}/{task} vs encoderkit, rows {lengths}")


def test_multitask_heads_are_outputs(tmp_path, minilm_dir) -> None:
    """A multi-task classifier (encoderkit's own head kind): one logits output per head."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=40)
    config.extra["encoderkit"] = {"task": "multitask", "heads": {"topic": {"labels": ["a", "b", "c"]},
                                                                 "tags": {"labels": ["x", "y"], "multi_label": True}}}
    model = build_model(config, "multitask").eval()
    perturb(model)
    model.save_pretrained(tmp_path / "mt")
    result = export_onnx(tmp_path / "mt", tmp_path / "onnx", progress=False)
    assert sorted(result.outputs) == ["logits_tags", "logits_topic"]
    inputs = padded_batch(config, [13, 4, 9], 0)
    got = run_onnx(result.model_path, inputs)
    with torch.no_grad():
        expected = model(**inputs).logits
    for name in ("topic", "tags"):
        compare(name, expected[name].numpy(), got[f"logits_{name}"], inputs["attention_mask"].bool().numpy(), name)


# ---------------------------------------------------------------------------------------------
# The default model: sentence-transformers' ONNX backend, the int8 copy
# ---------------------------------------------------------------------------------------------
SENTENCES = [
    "A man is playing a guitar on the stage.",
    "ok",
    "The central bank raised interest rates by half a point, and stocks fell sharply in the afternoon.",
    "How do I reset my password if I no longer have access to the email address on my account?",
    "Tesla was raised an Orthodox Christian.",
]


@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory, minilm_dir) -> Path:
    out = tmp_path_factory.mktemp("minilm-onnx") / "export"
    assert main(["export", str(minilm_dir), "--format", "onnx", "--int8", "--out", str(out)]) == 0
    return out


def test_default_model_export_keeps_its_files_and_matches_the_embedder(minilm_onnx, minilm_dir) -> None:
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json", *TOKENIZER_FILES):
        assert (minilm_onnx / name).read_bytes() == (minilm_dir / name).read_bytes(), name
    assert not list(minilm_onnx.rglob("*.safetensors"))
    embedder = Embedder.from_pretrained(minilm_dir)
    tokenizer = Tokenizer.from_pretrained(minilm_onnx)
    for rows in (SENTENCES, SENTENCES[2:3], SENTENCES[:2] * 3):
        batch = tokenizer(rows)
        got = run_onnx(minilm_onnx / "onnx" / ONNX_FILE, {"input_ids": batch.input_ids, "attention_mask":
                                                          batch.attention_mask, "token_type_ids": batch.token_type_ids})
        np.testing.assert_allclose(got["sentence_embedding"], embedder.encode(rows), atol=TOL, rtol=0)


class _OrtFeatureExtraction:
    """A stand-in for optimum's ``ORTModelForFeatureExtraction``, which sentence-transformers' ONNX backend loads
    the graph with. optimum-onnx (0.1.0, the latest) requires transformers < 4.58 and cannot be installed beside
    transformers 5; this does what its loading and forward do for sentence-transformers: open
    ``<dir>/<subfolder>/<file_name>`` as sentence-transformers resolved it, feed the inputs the graph declares
    (zeros for token_type_ids it declares and did not get), return ``last_hidden_state``."""

    def __init__(self, path: Path, config) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.input_names = [item.name for item in self.session.get_inputs()]
        self.config = config
        self.path = path

    @classmethod
    def from_pretrained(cls, model_id, config=None, export=False, subfolder="", file_name="model.onnx", **_):
        assert not export, "sentence-transformers found no ONNX file and asked optimum to export one"
        return cls(Path(model_id) / subfolder / file_name, config)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, **_):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        (hidden,) = self.session.run(["last_hidden_state"], {k: v.numpy() for k, v in feed.items()
                                                              if k in self.input_names})
        return {"last_hidden_state": torch.from_numpy(hidden)}

    forward = __call__

    def _save_pretrained(self, directory, **_):
        raise NotImplementedError


def sentence_transformer_onnx(directory: Path, monkeypatch, **options):
    """``SentenceTransformer(directory, backend="onnx")``, with optimum's class stood in for where it is absent."""
    from sentence_transformers import SentenceTransformer

    try:
        import optimum.onnxruntime  # noqa: F401
    except ImportError:
        fake = types.ModuleType("optimum.onnxruntime")
        fake.ONNX_WEIGHTS_NAME = "model.onnx"
        fake.ORTModelForFeatureExtraction = _OrtFeatureExtraction
        fake.ORTModelForCausalLM = fake.ORTModelForMaskedLM = fake.ORTModelForSequenceClassification = object
        monkeypatch.setitem(sys.modules, "optimum", types.ModuleType("optimum"))
        monkeypatch.setitem(sys.modules, "optimum.onnxruntime", fake)
    return SentenceTransformer(str(directory), backend="onnx", device="cpu", **options)


def test_sentence_transformers_onnx_backend_loads_the_export(minilm_onnx, minilm_dir, monkeypatch) -> None:
    model = sentence_transformer_onnx(minilm_onnx, monkeypatch)
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    assert Path(model[0].model.path) == minilm_onnx / "onnx" / ONNX_FILE  # found where it was written
    want = Embedder.from_pretrained(minilm_dir).encode(SENTENCES)
    np.testing.assert_allclose(model.encode(SENTENCES, batch_size=2), want, atol=TOL, rtol=0)


def test_int8_copy_runs_and_stays_close(minilm_onnx, monkeypatch) -> None:
    """Dynamic int8 (per-channel weights): mean cosine to fp32 over 180 real help-desk requests above 0.99."""
    import encoderkit

    int8_path = minilm_onnx / "onnx" / INT8_FILE
    assert int8_path.stat().st_size < 0.4 * (minilm_onnx / "onnx" / ONNX_FILE).stat().st_size
    demo = Path(encoderkit.__file__).parent / "demo_data"
    texts = sorted({line.split("\t")[0] for name in ("helpdesk-train.tsv", "helpdesk-valid.tsv")
                    for line in (demo / name).read_text(encoding="utf-8").splitlines()[1:]})
    model = sentence_transformer_onnx(minilm_onnx, monkeypatch)
    quantized = sentence_transformer_onnx(minilm_onnx, monkeypatch, model_kwargs={"file_name": f"onnx/{INT8_FILE}"})
    assert Path(quantized[0].model.path) == int8_path
    full, small = model.encode(texts), quantized.encode(texts)
    cosine = (full * small).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(small, axis=1)
    assert cosine.mean() > 0.99 and cosine.min() > 0.97, (cosine.mean(), cosine.min())


def test_sentence_transformers_onnx_backend_modernbert_cls(tmp_path, minilm_dir, monkeypatch) -> None:
    """A ModernBERT embedder (cls pooling, no segment ids) in sentence-transformers' ONNX backend."""
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=128, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0)
    reference = transformers.ModernBertModel._from_config(config).eval()
    perturb(reference)
    reference.save_pretrained(tmp_path / "st")
    for name in TOKENIZER_FILES:
        (tmp_path / "st" / name).write_bytes((minilm_dir / name).read_bytes())
    write_sentence_transformer(tmp_path / "st", pooling="cls", normalize=True, max_seq_length=64, dimension=32)
    result = export_onnx(tmp_path / "st", tmp_path / "onnx", progress=False)
    assert result.inputs == ["input_ids", "attention_mask"]
    st_model = sentence_transformer_onnx(tmp_path / "onnx", monkeypatch)
    want = Embedder.from_pretrained(tmp_path / "st").encode(SENTENCES)
    np.testing.assert_allclose(st_model.encode(SENTENCES, batch_size=3), want, atol=TOL, rtol=0)


@pytest.mark.skipif(not any(Path(p, "optimum", "onnxruntime").is_dir() for p in sys.path),
                    reason="optimum-onnx is not installed (its latest release, 0.1.0, requires transformers < 4.58)")
def test_sentence_transformers_with_optimum(minilm_onnx, minilm_dir) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_onnx), backend="onnx", device="cpu")
    want = Embedder.from_pretrained(minilm_dir).encode(SENTENCES)
    np.testing.assert_allclose(model.encode(SENTENCES), want, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------------
# The command line and bad input
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_ner_dir(tmp_path_factory, minilm_dir) -> Path:
    from helpers import tiny_bert_dir

    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-ner"), minilm_dir, task="token-classification")


def test_cli_export_json_and_overwrite(tiny_ner_dir, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["export", str(tiny_ner_dir), "--out", str(out), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["task"] == "token-classification" and facts["outputs"] == ["logits"] and facts["int8_model"] is None
    assert main(["export", str(tiny_ner_dir), "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    (out / "stale.txt").write_text("left from before")
    assert main(["export", str(tiny_ner_dir), "--out", str(out), "--overwrite", "--task", "base"]) == 0
    assert "exported the base model" in capsys.readouterr().out
    assert not (out / "stale.txt").exists() and (out / "onnx" / ONNX_FILE).is_file()
    assert not list(tmp_path.glob(".out.partial-*"))


@pytest.mark.parametrize(("args", "message"), [
    (["--format", "tflite"], "unknown export format 'tflite'; choose one of: onnx"),
    (["--task", "no-such-head"], "unknown task 'no-such-head'"),
    (["--out-is-model"], "holds the model being exported; name another directory"),
])
def test_cli_bad_options(tiny_ner_dir, tmp_path, capsys, args, message) -> None:
    out = str(tiny_ner_dir) if args == ["--out-is-model"] else str(tmp_path / "out")
    options = [] if args == ["--out-is-model"] else args
    assert main(["export", str(tiny_ner_dir), "--out", out, "--overwrite", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("encoderkit: error:") and message in err and len(err.strip().splitlines()) == 1
    assert (tiny_ner_dir / "model.safetensors").is_file() and not (tmp_path / "out").exists()


def test_not_a_model_directory(tmp_path, capsys) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    assert main(["export", str(tmp_path / "notes"), "--out", str(tmp_path / "out")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("package", ["onnx", "onnxruntime"])
def test_missing_package_names_the_extra(tiny_ner_dir, tmp_path, monkeypatch, package) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    with pytest.raises(InputError, match=rf"needs the {package} package.*pip install 'encoderkit\[onnx\]'"):
        export_onnx(tiny_ner_dir, tmp_path / "out", progress=False)
