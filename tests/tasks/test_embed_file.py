"""Embedding files: formats and ids, bounded memory, interruption and resume, awkward input."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from encoderkit import DataError, Embedder
from encoderkit.cli import main
from encoderkit.tasks.embed import embed_file

from helpers import tiny_bert_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("model") / "tiny", minilm_dir)


@pytest.fixture(scope="module")
def embedder(tiny) -> Embedder:
    return Embedder.from_pretrained(tiny)


def test_jsonl_and_csv_records_with_ids(tmp_path: Path, embedder: Embedder) -> None:
    texts = ["first text", "second, with a comma", "third \"quoted\" text"]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"doc": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    result = embed_file(jsonl, tmp_path / "a.npy", id_field="doc", embedder=embedder, show_progress=False)
    assert result.ids_path.read_text().splitlines() == ["d0", "d1", "d2"]
    expected = embedder.encode(texts)
    assert np.abs(np.load(result.path) - expected).max() < 1e-6
    csv_path = tmp_path / "in.csv"
    csv_path.write_text("id,sentence\n" + "".join(f'x{i},"{t.replace(chr(34), chr(34) * 2)}"\n'
                                                  for i, t in enumerate(texts)))
    result = embed_file(csv_path, tmp_path / "b.npy", id_field="id", embedder=embedder, show_progress=False)
    assert result.ids_path.read_text().splitlines() == ["x0", "x1", "x2"]
    assert np.abs(np.load(result.path) - expected).max() < 1e-6


def test_malformed_jsonl_names_the_line(tmp_path: Path, embedder: Embedder) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'text' must be a string"):
        embed_file(path, tmp_path / "o.npy", embedder=embedder, show_progress=False)
    path.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        embed_file(path, tmp_path / "o.npy", embedder=embedder, show_progress=False)
    assert not (tmp_path / "o.npy").exists()


class Interrupting:
    """Wraps an embedder and raises KeyboardInterrupt on the n-th call, as a user's Ctrl-C would."""

    def __init__(self, embedder: Embedder, fail_on_call: int) -> None:
        self.embedder, self.calls, self.fail_on_call = embedder, 0, fail_on_call

    def __getattr__(self, name):
        return getattr(self.embedder, name)

    def encode(self, texts, **kwargs):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt
        return self.embedder.encode(texts, **kwargs)


def test_interrupted_run_leaves_no_output_and_resumes(tmp_path: Path, embedder: Embedder) -> None:
    lines = [f"line {i} " + "word " * (i % 13) for i in range(1000)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.npy"
    with pytest.raises(KeyboardInterrupt):
        embed_file(source, out, embedder=Interrupting(embedder, 4), chunk_size=100, show_progress=False)
    assert not out.exists() and not out.with_suffix(".ids.txt").exists()
    state = json.loads((tmp_path / "out.npy.progress.json").read_text())
    assert state["done"] == 300
    resumed = Interrupting(embedder, 0)
    result = embed_file(source, out, embedder=resumed, chunk_size=100, show_progress=False)
    assert result.resumed_from == 300 and resumed.calls == 7  # only the 700 remaining rows
    full = embed_file(source, tmp_path / "full.npy", embedder=embedder, chunk_size=100, show_progress=False)
    assert np.array_equal(np.load(out), np.load(full.path))
    assert result.ids_path.read_text() == full.ids_path.read_text()
    assert not (tmp_path / "out.npy.partial").exists() and not (tmp_path / "out.npy.progress.json").exists()


def test_changed_input_is_not_resumed(tmp_path: Path, embedder: Embedder) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(f"text {i}" for i in range(300)))
    with pytest.raises(KeyboardInterrupt):
        embed_file(source, tmp_path / "o.npy", embedder=Interrupting(embedder, 2), chunk_size=100,
                   show_progress=False)
    source.write_text("\n".join(f"changed {i}" for i in range(300)))
    result = embed_file(source, tmp_path / "o.npy", embedder=embedder, chunk_size=100, show_progress=False)
    assert result.resumed_from == 0
    assert np.abs(np.load(result.path)[0] - embedder.encode("changed 0")).max() < 1e-6


def test_awkward_lines_are_embedded_in_place(tmp_path: Path, tiny: Path, caplog) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"normal\n\n   \t\nbad \xff\xfe bytes\n" + b"x " * 50_000 + b"\nlast\n")
    out = tmp_path / "o.npy"
    assert main(["embed", str(source), "--out", str(out), "--model", str(tiny)]) == 0
    assert "not UTF-8" in caplog.text and "truncated" in caplog.text
    vectors = np.load(out)
    assert vectors.shape == (6, 32) and np.isfinite(vectors).all()


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak RSS from /proc (Linux)")
@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_200k_lines_in_bounded_memory_with_progress(tmp_path: Path, tiny: Path) -> None:
    source = tmp_path / "big.txt"
    with open(source, "w") as handle:
        for i in range(200_000):
            handle.write(f"record {i} of a large file, with some words to tokenize\n")
    out = tmp_path / "big.npy"
    script = textwrap.dedent(f"""
        import sys
        from encoderkit.cli import main
        code = main(["embed", {str(source)!r}, "--out", {str(out)!r}, "--model", {str(tiny)!r},
                     "--chunk-size", "20000"])
        with open("/proc/self/status") as status:
            print("maxrss_kib", next(line.split()[1] for line in status if line.startswith("VmHWM:")),
                  file=sys.stderr)
        sys.exit(code)
    """)
    # This process's own high-water mark (VmHWM), not getrusage's ru_maxrss: the kernel carries the parent's
    # high-water mark into a child's ru_maxrss across fork and exec, so it would measure pytest's memory.
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rss_kib = int(done.stderr.split("maxrss_kib")[1].split()[0])
    assert rss_kib < 2 * 1024 * 1024, f"resident memory peaked at {rss_kib / 1024:.0f} MiB"
    assert "embedding: 200,000 texts" in done.stderr  # the progress summary (bar on a terminal)
    assert np.load(out, mmap_mode="r").shape == (200_000, 32)


def _interrupted_run(source: Path, out: Path, embedder: Embedder) -> None:
    with pytest.raises(KeyboardInterrupt):
        embed_file(source, out, embedder=Interrupting(embedder, 2), chunk_size=100, show_progress=False)
    assert json.loads((out.parent / (out.name + ".progress.json")).read_text())["done"] == 100


def _perturbed(tiny: Path) -> Embedder:
    import torch

    changed = Embedder.from_pretrained(tiny)
    with torch.no_grad():
        changed.model.layers[0].ffn_out.bias.add_(1e-3)  # one small change anywhere in the weights
    return changed


CHANGED_SETTINGS = {  # setting -> the embedder of a resumed run that differs from the first in that alone
    "weights": _perturbed,
    "dtype": lambda tiny: Embedder.from_pretrained(tiny, dtype="int8"),
    "pooling": lambda tiny: Embedder.from_pretrained(tiny, pooling="cls"),
    "normalize": lambda tiny: Embedder.from_pretrained(tiny, normalize=True),
    "max_length": lambda tiny: Embedder.from_pretrained(tiny, max_length=16),
    "long_text": lambda tiny: Embedder.from_pretrained(tiny, long_text="window"),
    "truncate_dim": lambda tiny: Embedder.from_pretrained(tiny, truncate_dim=16),
    "prompt": lambda tiny: Embedder.from_pretrained(tiny, prompt="query: "),
}


@pytest.mark.parametrize("setting", sorted(CHANGED_SETTINGS))
def test_resume_with_a_changed_setting_is_refused(tmp_path: Path, tiny: Path, embedder: Embedder,
                                                  setting: str) -> None:
    """Rows of two kinds of vectors must never share one output: a resume whose vectors would differ is refused,
    naming the setting, and the partial run stays resumable with its own settings."""
    from encoderkit import InputError

    source = tmp_path / "in.txt"
    source.write_text("\n".join(f"text number {i} " + "word " * (i % 40) for i in range(300)))
    out = tmp_path / "o.npy"
    _interrupted_run(source, out, embedder)
    with pytest.raises(InputError, match=rf"other settings \({setting} |; {setting} ") as error:
        embed_file(source, out, embedder=CHANGED_SETTINGS[setting](tiny), chunk_size=100, show_progress=False)
    assert "--restart" in str(error.value)
    assert not out.exists() and (tmp_path / "o.npy.partial").exists()
    result = embed_file(source, out, embedder=embedder, chunk_size=100, show_progress=False)
    assert result.resumed_from == 100
    assert np.abs(np.load(out) - embedder.encode(source.read_text().split("\n"))).max() < 1e-6


def test_cli_resume_with_other_settings_is_one_line_and_restart_starts_over(tmp_path: Path, tiny: Path,
                                                                           embedder: Embedder, capsys) -> None:
    source = tmp_path / "in.txt"
    source.write_text("\n".join(f"text {i}" for i in range(300)))
    out = tmp_path / "o.npy"
    _interrupted_run(source, out, embedder)
    assert main(["embed", str(source), "--out", str(out), "--model", str(tiny), "--chunk-size", "100",
                 "--prompt", "passage: "]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("encoderkit:")]
    assert len(lines) == 1 and "prompt None -> 'passage: '" in lines[0], lines
    assert main(["embed", str(source), "--out", str(out), "--model", str(tiny), "--chunk-size", "100",
                 "--prompt", "passage: ", "--restart"]) == 0
    prompted = Embedder.from_pretrained(tiny, prompt="passage: ")
    assert np.abs(np.load(out) - prompted.encode([f"text {i}" for i in range(300)])).max() < 1e-6


def test_prompt_equals_sentence_transformers(tiny: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    texts = ["how do I reset a password?", "the cat sat on the mat", "ok"]
    theirs = st.SentenceTransformer(str(tiny), device="cpu").encode(texts, prompt="query: ")
    ours = Embedder.from_pretrained(tiny, prompt="query: ").encode(texts)
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.abs(ours - Embedder.from_pretrained(tiny).encode(texts)).max() > 1e-3  # the prompt did something
