from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from encoderkit import ConfigError, Embedder, Tokenizer, load_config, load_model
from encoderkit.cli import cli, main
from encoderkit.jobs import DEMO_SENTENCES, run_demo

from helpers import tiny_bert_dir


def test_models_table_shows_computed_sizes(capsys) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "bert-base" in out and "109.5M" in out and "66.4M" in out and "11.7M" in out


def test_models_recommend(capsys) -> None:
    assert main(["models", "--recommend", "--task", "ner", "--constraint", "memory"]) == 0
    out = capsys.readouterr().out
    assert "albert-base" in out and "why:" in out


def test_info_default_model(capsys) -> None:
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["family"] == "bert" and facts["layers"] == 6 and facts["hidden_size"] == 384
    assert facts["parameters"] == 22_713_216  # BertModel of all-MiniLM-L6-v2, pooler included
    assert facts["pooling"] == "mean" and facts["normalize"] is True and facts["tokenizer"] == "wordpiece"


def test_embed_writes_rows_in_input_order(tmp_path: Path, minilm_dir: Path) -> None:
    model = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    lines = ["the first line", "", "a much longer third line with many more words in it", "   ", "last"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    assert main(["embed", str(tmp_path / "in.txt"), "--out", str(out), "--model", str(model)]) == 0
    vectors = np.load(out)
    assert vectors.dtype == np.float32 and vectors.shape == (5, 32)
    expected = Embedder.from_pretrained(model).encode(lines)
    assert np.abs(vectors - expected).max() < 1e-6
    assert (tmp_path / "vectors.ids.txt").read_text().splitlines() == ["0", "1", "2", "3", "4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "tiny", "vectors.ids.txt", "vectors.npy"]


def test_embed_default_model_matches_python_api(tmp_path: Path) -> None:
    lines = DEMO_SENTENCES[:4]
    (tmp_path / "in.txt").write_text("\n".join(lines), encoding="utf-8")
    assert main(["embed", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.npy")]) == 0
    assert np.abs(np.load(tmp_path / "o.npy") - Embedder.from_pretrained().encode(lines)).max() < 1e-6


def test_train_tokenizer_command(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"sentence number {i} about encoders and tokenizers" for i in range(300)))
    assert main(["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"), "--kind", "bpe",
                 "--vocab-size", "300", "--min-frequency", "1"]) == 0
    assert "bpe tokenizer" in capsys.readouterr().out
    tokenizer = Tokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer.kind == "bpe" and tokenizer.vocab_size <= 300
    assert tokenizer.decode(tokenizer.encode("sentence about encoders").input_ids) == "sentence about encoders"


def test_train_tokenizer_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["train-tokenizer", str(tmp_path / "none.txt"), "--out", str(tmp_path / "tok")]) == 2
    assert "training file not found" in capsys.readouterr().err


def test_demo_finds_the_paraphrase_of_each_sentence() -> None:
    lines: list[str] = []
    result = run_demo(None, echo=lines.append)
    # The demo sentences come in paraphrase pairs (0,1), (2,3), ...: each one's neighbour is its partner.
    assert result["neighbours"] == [i ^ 1 for i in range(len(DEMO_SENTENCES))]
    assert any("nearest neighbours" in line for line in lines)


def test_embed_index_search_end_to_end(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(DEMO_SENTENCES) + "\n", encoding="utf-8")
    assert main(["embed", str(corpus), "--out", str(tmp_path / "docs.npy")]) == 0
    assert main(["index", str(tmp_path / "docs.npy"), "--out", str(tmp_path / "idx"), "--texts", str(corpus)]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), "feline resting near the glass", "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["rank"] for h in hits] == [1, 2]
    assert {h["text"] for h in hits} == {DEMO_SENTENCES[4], DEMO_SENTENCES[5]}  # the two cat sentences
    assert hits[0]["score"] >= hits[1]["score"]


def test_search_reranks_the_index_candidates(tmp_path: Path, minilm_dir: Path, capsys) -> None:
    """search --rerank: the index's top candidates, reordered by the cross-encoder exactly as its own rank() does."""
    from encoderkit.tasks.rerank import Reranker
    from helpers import tiny_bert_dir

    reranker = tiny_bert_dir(tmp_path / "reranker", minilm_dir, task="sequence-classification",
                             id2label={0: "LABEL_0"})
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(DEMO_SENTENCES) + "\n", encoding="utf-8")
    assert main(["embed", str(corpus), "--out", str(tmp_path / "docs.npy")]) == 0
    assert main(["index", str(tmp_path / "docs.npy"), "--out", str(tmp_path / "idx"), "--texts", str(corpus)]) == 0
    query = "feline resting near the glass"
    capsys.readouterr()
    assert main(["search", str(tmp_path / "idx"), query, "-k", "4", "--json"]) == 0
    retrieved = json.loads(capsys.readouterr().out)
    assert main(["search", str(tmp_path / "idx"), query, "-k", "2", "--candidates", "4", "--rerank", str(reranker),
                 "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    want = Reranker.from_pretrained(reranker).rank(query, [h["text"] for h in retrieved], top_k=2)
    assert [h["text"] for h in hits] == [retrieved[w["index"]]["text"] for w in want]
    assert [h["score"] for h in hits] == pytest.approx([w["score"] for w in want], abs=1e-6)
    assert {h["retrieval_score"] for h in hits} <= {h["score"] for h in retrieved}
    assert main(["search", str(tmp_path / "idx"), query, "-k", "5", "--candidates", "3", "--rerank",
                 str(reranker)]) == 2
    assert "--candidates (3) must be at least -k (5)" in capsys.readouterr().err


def test_search_missing_index(tmp_path: Path, capsys) -> None:
    assert main(["search", str(tmp_path), "query"]) == 2
    assert "not a saved index" in capsys.readouterr().err


# ----- through click's CliRunner: the group's error boundary and exit codes, as a shell sees them -----------
TINY_SHAPE = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 64}


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="encoderkit")


def final_model_path(result: Result) -> Path:
    """The path of the `final model: PATH` line, which must be the last line of the output."""
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("final model: "), result.stdout
    return Path(last.removeprefix("final model: "))


@pytest.fixture()
def small_corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"document {d} is about encoders and masked words.\nsecond line {d}."
                                 for d in range(40)) + "\n", encoding="utf-8")
    return path


def test_config_without_model_type_names_the_accepted_forms(tmp_path: Path, small_corpus: Path) -> None:
    shape = {k: v for k, v in TINY_SHAPE.items() if k != "model_type"}
    (tmp_path / "config.json").write_text(json.dumps(shape), encoding="utf-8")
    for source in (shape, json.dumps(shape), tmp_path / "config.json", tmp_path):  # the Python API
        with pytest.raises(ConfigError, match='no "model_type".*preset name .*bert-base.*config.json.*inline JSON'):
            load_config(source)
    for config in (json.dumps(shape), tmp_path / "config.json"):  # the command line: one line, exit code 2
        result = invoke("pretrain", "--corpus", small_corpus, "--out", tmp_path / "run", "--config", config,
                        "--steps", "1")
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("encoderkit: error: "), result.stderr
        for form in ('"model_type"', "minilm-l6-h384", "bert-base", "config.json path", "model directory",
                     "inline JSON"):
            assert form in lines[0]
        assert not (tmp_path / "run" / "final").exists()
    with pytest.raises(ConfigError, match="neither a preset nor a config file; give a preset name"):
        load_config("no-such-shape")


def test_pretrain_prints_the_final_model(tmp_path: Path, small_corpus: Path) -> None:
    result = invoke("pretrain", "--corpus", small_corpus, "--out", tmp_path / "run", "--config", json.dumps(TINY_SHAPE),
                    "--steps", "2", "--batch-size", "4", "--max-length", "32", "--save-every", "0",
                    "--eval-every", "0", "--dtype", "fp32")
    path = final_model_path(result)
    assert path == tmp_path / "run" / "final" and (path / "model.safetensors").is_file()
    model = load_model(path, task="masked-lm")
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_finetune_prints_the_final_model(tmp_path: Path, minilm_dir: Path) -> None:
    tiny = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    rows = [f"{'good' if i % 2 else 'bad'} film number {i},{'pos' if i % 2 else 'neg'}" for i in range(24)]
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    result = invoke("finetune", "--task", "classify", "--train", tmp_path / "train.csv", "--model", tiny,
                    "--out", tmp_path / "clf", "--epochs", "1", "--batch-size", "8", "--max-length", "16")
    path = final_model_path(result)
    assert path == tmp_path / "clf" and (path / "model.safetensors").is_file()
    model = load_model(path)
    assert model.config.id2label == {0: "neg", 1: "pos"}
