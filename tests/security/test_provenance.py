"""Model provenance: manifests (tampering, renames), safetensors header validation against the safetensors
library's own verdict, pickle opcode scans (malicious pickles are built, never loaded), config vs weights,
the verdict, and the `scan provenance` command."""
from __future__ import annotations

import builtins
import hashlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from encoderkit import InputError, load_model
from encoderkit.cli import cli, main
from encoderkit.security.provenance import (
    MANIFEST_NAME,
    ModelProvenanceChecker,
    check_provenance,
    create_manifest,
    validate_safetensors,
    verify_manifest,
)
from encoderkit.security.pickles import scan_pickle_bytes

from helpers import tiny_bert_dir

# A protocol-0 pickle written opcode by opcode: GLOBAL os.system, MARK, a string, TUPLE, REDUCE, STOP.
# Unpickling it would run `echo pwned`; the scanner only reads the opcodes.
OS_SYSTEM_PICKLE = b"cos\nsystem\n(S'echo pwned'\ntR."


class _RunsCommand:
    """Pickling this writes a REDUCE of os.system: what a malicious checkpoint does."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


class _Evaluates:
    def __reduce__(self):
        return (builtins.eval, ("1 + 1",))


class _Spawns:
    def __reduce__(self):
        return (subprocess.check_output, (["true"],))


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory, minilm_dir) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny"), minilm_dir, task="sequence-classification")


@pytest.fixture()
def tiny(tmp_path, tiny_source) -> Path:
    """A fresh, writable copy of a tiny BERT classifier per test."""
    return Path(shutil.copytree(tiny_source, tmp_path / "model"))


def header_of(path: Path) -> tuple[int, dict]:
    """The safetensors header, read with struct + json (independently of the code under test)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return length, json.loads(raw[8:8 + length])


def rewrite_header(path: Path, header: dict, data: bytes) -> None:
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def severities(report, check: str) -> list[str]:
    return [f.severity for f in report.findings if f.check == check]


# ---------------------------------------------------------------------------------------------
# Manifest: create and verify
# ---------------------------------------------------------------------------------------------
def test_clean_model_verifies_as_trusted_and_manifest_hashes_every_file(tiny) -> None:
    manifest = create_manifest(tiny)
    entries = {e["path"]: e for e in json.loads(manifest.read_text())["files"]}
    on_disk = sorted(p.name for p in tiny.iterdir() if p.name != MANIFEST_NAME)
    assert sorted(entries) == on_disk and "model.safetensors" in entries and "vocab.txt" in entries
    for name, entry in entries.items():
        content = (tiny / name).read_bytes()
        assert entry["size"] == len(content) and entry["sha256"] == hashlib.sha256(content).hexdigest()
    _, header = header_of(tiny / "model.safetensors")
    assert set(entries["model.safetensors"]["tensors"]) == (set(header) - {"__metadata__"}) | {"__header__"}

    report = check_provenance(tiny)  # finds the directory's own manifest
    assert report.verdict == "trusted" and report.reasons == []
    assert report.manifest_diff is not None and report.manifest_diff.clean
    assert all(row["ok"] for row in report.config_checks) and len(report.config_checks) >= 8


def test_tampered_tensor_is_named(tiny) -> None:
    create_manifest(tiny)
    path = tiny / "model.safetensors"
    length, header = header_of(path)
    target = "bert.encoder.layer.1.attention.self.value.weight"
    begin = 8 + length + header[target]["data_offsets"][0]
    data = bytearray(path.read_bytes())
    data[begin + 40: begin + 44] = struct.pack("<f", 7.0)  # one weight changed, file size and header unchanged
    path.write_bytes(bytes(data))
    assert load_file(str(path))[target].flatten()[10].item() == 7.0  # still a valid safetensors file
    assert validate_safetensors(path) == []

    report = check_provenance(tiny)
    assert report.verdict == "unsafe"
    [change] = report.manifest_diff.modified
    assert change["path"] == "model.safetensors" and change["tensors"]["changed"] == [target]
    [reason] = report.reasons
    assert reason.startswith("model.safetensors:") and target in reason and "content differs" in reason


def test_renamed_missing_and_added_files(tiny) -> None:
    create_manifest(tiny)
    (tiny / "vocab.txt").rename(tiny / "vocabulary.txt")
    (tiny / "special_tokens_map.json").unlink()
    (tiny / "notes.txt").write_text("hello")
    diff = verify_manifest(tiny, tiny / MANIFEST_NAME)
    assert diff.renamed == [{"from": "vocab.txt", "to": "vocabulary.txt"}]
    assert diff.missing == ["special_tokens_map.json"] and diff.added == ["notes.txt"] and diff.modified == []

    report = check_provenance(tiny)
    assert report.verdict == "suspicious"
    assert any("vocabulary.txt: renamed from vocab.txt" in reason for reason in report.reasons)
    assert any(r.startswith("special_tokens_map.json:") and "missing" in r for r in report.reasons)
    assert any(r.startswith("notes.txt:") and "added" in r for r in report.reasons)


def test_manifest_elsewhere_and_bad_manifests(tiny, tmp_path) -> None:
    outside = tmp_path / "elsewhere" / "m.json"
    report = ModelProvenanceChecker(tiny).check(outside, write_manifest=True)
    assert outside.is_file() and not (tiny / MANIFEST_NAME).exists() and report.manifest_written
    assert check_provenance(tiny, outside).verdict == "trusted"
    with pytest.raises(InputError, match="manifest not found"):
        check_provenance(tiny, tmp_path / "absent.json")
    (tmp_path / "not.json").write_text("{ nope")
    with pytest.raises(Exception, match="not valid JSON"):
        check_provenance(tiny, tmp_path / "not.json")
    (tmp_path / "escape.json").write_text(json.dumps(
        {"format": "encoderkit-manifest", "files": [{"path": "../x", "size": 1, "sha256": "0"}]}))
    with pytest.raises(Exception, match="leaves the model directory"):
        check_provenance(tiny, tmp_path / "escape.json")
    with pytest.raises(InputError, match="not found"):
        check_provenance(tmp_path / "no-such-model")


# ---------------------------------------------------------------------------------------------
# safetensors headers: every corruption the safetensors library refuses, we name
# ---------------------------------------------------------------------------------------------
def _corruptions(raw: bytes, length: int, header: dict) -> dict[str, tuple[bytes | None, dict | None, str]]:
    first = next(k for k in header if k != "__metadata__")
    second = [k for k in header if k != "__metadata__"][1]
    shape_wrong = dict(header, **{first: dict(header[first], shape=[header[first]["shape"][0] + 1,
                                                                     *header[first]["shape"][1:]])})
    dtype_wrong = dict(header, **{first: dict(header[first], dtype="F99")})
    begin, end = header[second]["data_offsets"]
    overlap = dict(header, **{second: dict(header[second], data_offsets=[begin - 4, end - 4])})
    return {
        "header length": (struct.pack("<Q", len(raw)) + raw[8:], None, "header length"),
        "json": (raw[:8] + b"{\"a\": [" + raw[15:], None, "does not parse as JSON"),
        "shape vs bytes": (None, shape_wrong, "needs"),
        "dtype": (None, dtype_wrong, "unknown dtype 'F99'"),
        "overlap": (None, overlap, "overlaps"),
        "trailing garbage": (raw + b"\x00" * 16, None, "16 trailing bytes"),
        "truncated": (raw[:-100], None, "ends past the data"),
    }


def test_corrupt_safetensors_headers(tiny) -> None:
    path = tiny / "model.safetensors"
    raw = path.read_bytes()
    length, header = header_of(path)
    for name, (content, new_header, expected) in _corruptions(raw, length, header).items():
        if new_header is not None:
            rewrite_header(path, new_header, raw[8 + length:])
        else:
            path.write_bytes(content)
        with pytest.raises(Exception):  # the reference: the safetensors library refuses the file too
            load_file(str(path))
        problems = validate_safetensors(path)
        assert any(expected in p for p in problems), (name, problems)
        report = check_provenance(tiny)
        assert report.verdict == "unsafe", name
        assert any(f.check == "safetensors" and f.path == "model.safetensors" for f in report.findings), name
    path.write_bytes(raw)
    assert validate_safetensors(path) == []


def test_sharded_index(tmp_path) -> None:
    save_file({"a": torch.ones(2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    good = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    index.write_text(json.dumps({"weight_map": good}))
    assert not [f for f in check_provenance(tmp_path).findings if f.check == "safetensors"]
    index.write_text(json.dumps({"weight_map": {**good, "b": "model-00001-of-00002.safetensors",
                                                "c": "model-00003-of-00002.safetensors"}}))
    reasons = [f.reason for f in check_provenance(tmp_path).findings if f.check == "safetensors"]
    assert any("model-00003-of-00002.safetensors" in r and "not a file" in r for r in reasons)
    assert any("1 tensor(s) are not in the shard" in r and "e.g. b" in r for r in reasons)


def test_tiny_file_is_not_safetensors(tmp_path) -> None:
    (tmp_path / "x.safetensors").write_bytes(b"abc")
    assert "8-byte header length" in validate_safetensors(tmp_path / "x.safetensors")[0]


# ---------------------------------------------------------------------------------------------
# Pickles: opcodes only
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_pickled_code_execution_is_flagged(protocol) -> None:
    # Protocols < 3 write Python 2 names (posix/__builtin__/commands): the scan must catch both spellings.
    for payload, needle in ((_RunsCommand(), ".system"), (_Evaluates(), "builtin__.eval" if protocol < 3 else
                                                            "builtins.eval"),
                            (_Spawns(), "commands.check_output" if protocol < 3 else "subprocess.check_output")):
        data = pickle.dumps({"weights": [1.0, 2.0], "x": payload}, protocol=protocol)  # dumped, never loaded
        scan = scan_pickle_bytes(data, "evil.pkl")
        assert scan.error is None and any(name.endswith(needle) for name in scan.dangerous), (protocol, scan)


def test_hand_written_os_system_pickle(tiny) -> None:
    scan = scan_pickle_bytes(OS_SYSTEM_PICKLE, "x")
    assert scan.imports == ["os.system"] and scan.dangerous == ["os.system"]
    (tiny / "extra.pkl").write_bytes(OS_SYSTEM_PICKLE)
    # Also hidden in a torch-style zip archive under a weights name.
    with zipfile.ZipFile(tiny / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", OS_SYSTEM_PICKLE)
        archive.writestr("archive/version", "3\n")
    report = check_provenance(tiny)
    assert report.verdict == "unsafe"
    flagged = {f.path for f in report.findings if f.check == "pickle" and f.severity == "unsafe"}
    assert flagged == {"extra.pkl", "pytorch_model.bin:archive/data.pkl"}
    assert all("os.system" in r for r in report.reasons)


def test_unknown_import_is_suspicious_not_unsafe(tmp_path) -> None:
    data = pickle.dumps(__import__("fractions").Fraction(1, 3), protocol=2)
    scan = scan_pickle_bytes(data, "f.pkl")
    assert scan.disallowed == ["fractions.Fraction"] and scan.dangerous == []
    (tmp_path / "f.pkl").write_bytes(data)
    assert check_provenance(tmp_path).verdict == "suspicious"


@pytest.mark.parametrize("zip_format", [True, False])
def test_real_torch_save_state_dict_passes(tiny, zip_format) -> None:
    state = load_model(tiny).state_dict()
    state["extra.bf16"] = torch.ones(3, dtype=torch.bfloat16)
    state["extra.int"] = torch.arange(4)
    torch.save(state, tiny / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format)
    report = check_provenance(tiny)
    assert report.verdict == "trusted", report.reasons
    [scan] = report.pickle_scans
    assert scan.error is None and scan.disallowed == []
    assert "torch._utils._rebuild_tensor_v2" in scan.imports and "torch.FloatStorage" in scan.imports


def test_pickle_detected_by_content_without_suffix(tmp_path) -> None:
    (tmp_path / "weights").write_bytes(pickle.dumps(_RunsCommand(), protocol=4))
    (tmp_path / "readme").write_text("plain text")
    report = check_provenance(tmp_path)
    assert report.verdict == "unsafe" and [s.path for s in report.pickle_scans] == ["weights"]


# ---------------------------------------------------------------------------------------------
# Config vs weights
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,check", [
    ("vocab_size", 30000, "word embeddings"),
    ("intermediate_size", 128, "intermediate size"),
    ("num_hidden_layers", 3, "layers"),
    ("max_position_embeddings", 256, "position embeddings"),
    ("hidden_size", 64, "hidden size"),
])
def test_config_weights_mismatch(tiny, field, value, check) -> None:
    config = json.loads((tiny / "config.json").read_text())
    config[field] = value
    (tiny / "config.json").write_text(json.dumps(config))
    report = check_provenance(tiny)
    assert report.verdict == "suspicious"
    failing = [row for row in report.config_checks if not row["ok"]]
    assert any(row["check"].startswith(check) for row in failing), failing
    if field != "hidden_size":  # a different hidden size changes every tensor; the others change only theirs
        assert all(row["check"].startswith(check) or row["check"].startswith("other encoder") for row in failing)
    assert any(r.startswith("config.json:") and check in r for r in report.reasons)


def test_label_count_mismatch_and_broken_config(tiny) -> None:
    config = json.loads((tiny / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    (tiny / "config.json").write_text(json.dumps(config))
    report = check_provenance(tiny)
    [row] = [row for row in report.config_checks if not row["ok"]]
    assert row["check"].startswith("classifier outputs") and row["expected"] == 3 and row["found"] == 2
    (tiny / "config.json").write_text("{ broken")
    report = check_provenance(tiny)
    assert report.verdict == "suspicious" and any("config not usable" in r for r in report.reasons)


def test_default_model_is_trusted(minilm_dir, tmp_path) -> None:
    report = check_provenance(minilm_dir, tmp_path / "m.json", write_manifest=True)
    assert report.verdict == "trusted" and all(row["ok"] for row in report.config_checks)
    assert check_provenance(minilm_dir, tmp_path / "m.json").verdict == "trusted"


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def test_cli_scan_provenance(tiny, tmp_path, capsys) -> None:
    out = tmp_path / "report"
    assert main(["scan", "provenance", str(tiny), "--write-manifest", "--out", str(out)]) == 0
    assert (tiny / MANIFEST_NAME).is_file()
    assert main(["scan", "provenance", str(tiny), "--out", str(out), "--strict"]) == 0  # --strict: still accepted
    assert capsys.readouterr().out.splitlines()[-1].startswith("trusted")
    written = json.loads((out / "provenance.json").read_text())
    assert written["verdict"] == "trusted" and "Verdict: trusted" in (out / "provenance.md").read_text()

    (tiny / "evil.pkl").write_bytes(OS_SYSTEM_PICKLE)
    assert main(["scan", "provenance", str(tiny), "--out", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("unsafe") and "os.system" in lines[0] and str(out) in lines[0]
    assert json.loads((out / "provenance.json").read_text())["verdict"] == "unsafe"

    assert main(["scan", "provenance", str(tmp_path / "absent"), "--out", str(out)]) == 2
    assert "model directory not found" in capsys.readouterr().err


def test_cli_scan_provenance_exit_code_without_out(tiny, tmp_path) -> None:
    """No --out needed: the verdict and its reasons are printed, nothing else is written, and a model that is not
    trusted exits with 1, so a script checking the exit code stops at a tampered model."""
    runner = CliRunner()
    written = runner.invoke(cli, ["scan", "provenance", str(tiny), "--write-manifest"])
    assert written.exit_code == 0, written.output
    before = sorted(p.name for p in tmp_path.rglob("*"))
    untouched = runner.invoke(cli, ["scan", "provenance", str(tiny)])
    assert untouched.exit_code == 0 and untouched.stdout.strip() == "trusted", untouched.output

    weights = tiny / "model.safetensors"
    length, _ = header_of(weights)
    raw = bytearray(weights.read_bytes())
    raw[8 + length + 100] ^= 0xFF  # one byte of one tensor's data: the file still parses
    weights.write_bytes(bytes(raw))
    tampered = runner.invoke(cli, ["scan", "provenance", str(tiny)])
    assert tampered.exit_code == 1, tampered.output
    verdict, _, reason = tampered.stdout.splitlines()[0].partition(": ")
    assert verdict in ("suspicious", "unsafe") and "model.safetensors" in reason
    assert verdict == check_provenance(tiny).verdict
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no report files without --out


def _modern_family_dir(family: str, directory: Path) -> Path:
    """A small random ModernBERT or DeBERTa-v3 classifier saved by transformers."""
    transformers = pytest.importorskip("transformers")
    if family == "modernbert":
        config = transformers.ModernBertConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2, num_labels=2)
        model = transformers.ModernBertForSequenceClassification(config)
    else:
        config = transformers.DebertaV2Config(
            vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8, norm_rel_ebd="layer_norm",
            share_att_key=True, position_biased_input=False, type_vocab_size=0, num_labels=2)
        model = transformers.DebertaV2ForSequenceClassification(config)
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", ["modernbert", "deberta-v2"])
def test_modern_families_verify_and_their_config_is_checked(family: str, tmp_path) -> None:
    """The config-vs-weights checks know each family's tensors (ModernBERT: fused Wqkv, GeGLU's double-width
    input projection, no position table): a clean model is trusted; a config that lies about its shape is not."""
    directory = _modern_family_dir(family, tmp_path / family)
    report = check_provenance(directory)
    assert report.verdict == "trusted", report.reasons
    assert all(row["ok"] for row in report.config_checks) and len(report.config_checks) >= 6
    config = json.loads((directory / "config.json").read_text())
    config["intermediate_size"] = 64
    (directory / "config.json").write_text(json.dumps(config))
    report = check_provenance(directory)
    failing = {row["check"] for row in report.config_checks if not row["ok"]}
    assert report.verdict == "suspicious" and any(check.startswith("intermediate size") for check in failing)


@pytest.mark.parametrize("family", ["nomic_bert", "eurobert"])
def test_config_checks_read_tensors_stored_in_parts(family, tmp_path) -> None:
    """NomicBERT's fc11/fc12 and EuroBERT's up/gate projections are one matrix to encoderkit and two in the
    checkpoint: a real checkpoint passes, and one with a part cut short is named."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    shape = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    config = (transformers.NomicBertConfig(**shape) if family == "nomic_bert"
              else transformers.EuroBertConfig(**shape, num_key_value_heads=1, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, mask_token_id=3))
    model = (transformers.NomicBertModel if family == "nomic_bert" else transformers.EuroBertModel)(config)
    model.save_pretrained(tmp_path)
    rows = check_provenance(tmp_path).config_checks
    assert rows and all(row["ok"] for row in rows), [row for row in rows if not row["ok"]]
    state = load_file(tmp_path / "model.safetensors")
    part = next(k for k in state if k.endswith(("fc12.weight", "gate_proj.weight")))
    state[part] = state[part][:-1]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    bad = [row for row in check_provenance(tmp_path).config_checks if not row["ok"]]
    assert bad and part in str(bad)
