"""`train_embedder` / `encoderkit train-embedder`: a few steps on tiny hand-written data with the default model.
CoSENT lowers the loss and writes a directory that sentence-transformers loads with equal vectors; MNRL runs end
to end through the command with Matryoshka and validation (best checkpoint, metric in metrics.jsonl); bad input
is one line and exit 2; a rerun resumes from the last checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit.embeddings import CoSENTLoss, SentenceModel

pytestmark = pytest.mark.usefixtures("one_thread")

SUBJECTS = ["a man", "a woman", "a child", "the dog", "an old cat", "the teacher", "a farmer", "the pilot"]
ACTIONS = [("is playing a guitar", "plays the guitar", "is cooking dinner"),
           ("is riding a bike", "rides a bicycle", "is reading a book"),
           ("is eating an apple", "eats some fruit", "is driving a truck"),
           ("is swimming in a lake", "swims in the water", "is painting a wall")]
QA = [("what is the capital of france", "Paris is the capital of France."),
      ("how tall is mount everest", "Mount Everest is 8,849 metres tall."),
      ("who wrote hamlet", "Hamlet was written by William Shakespeare."),
      ("what do bees make", "Bees make honey from nectar."),
      ("when did the second world war end", "The Second World War ended in 1945."),
      ("what is the chemical formula of water", "Water is H2O."),
      ("which is the largest planet", "Jupiter is the largest planet of the solar system."),
      ("how fast does light travel", "Light travels at about 300,000 km per second.")]


def sts_rows() -> list[tuple[str, str, float]]:
    """32 STS-like pairs: a paraphrase scores 4.5, the same subject doing something else 1.0."""
    rows = []
    for subject in SUBJECTS:
        for verb, paraphrase, other in ACTIONS:
            rows.append((f"{subject} {verb}.", f"{subject} {paraphrase}.", 4.5) if len(rows) % 2 == 0
                        else (f"{subject} {verb}.", f"{subject} {other}.", 1.0))
    return rows


def write_tsv(path: Path, header: str, rows) -> Path:
    path.write_text(header + "\n" + "".join("\t".join(str(x) for x in row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cli_main():
    from encoderkit.cli.app import main

    return main


def full_cosent_loss(directory: Path, rows) -> float:
    model = SentenceModel.from_pretrained(directory).eval()
    with torch.no_grad():
        u = model.embed(model.tokenize([r[0] for r in rows]))
        v = model.embed(model.tokenize([r[1] for r in rows]))
        return float(CoSENTLoss()(u, v, torch.tensor([r[2] for r in rows])))


def test_cosent_lowers_loss_and_loads_in_sentence_transformers(tmp_path: Path, minilm_dir: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from encoderkit.tasks.embed import Embedder
    from encoderkit.training.sentence import EmbedderRecipe, train_embedder

    rows = sts_rows()
    train = write_tsv(tmp_path / "sts.tsv", "sentence1\tsentence2\tscore", rows)
    result = train_embedder(minilm_dir, train, tmp_path / "out", EmbedderRecipe(
        loss="cosent", epochs=2, batch_size=8, learning_rate=5e-5, warmup_ratio=0.0, show_progress=False))
    assert result.step == 8 and result.final_dir == tmp_path / "out" / "final"
    assert full_cosent_loss(result.final_dir, rows) < full_cosent_loss(minilm_dir, rows) - 0.05
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json", "model.safetensors"):
        assert (result.final_dir / name).is_file()
    assert not (result.final_dir / "loss_head.pt").exists()
    texts = [r[0] for r in rows[:6]] + ["a short one", "a somewhat longer sentence about nothing in particular"]
    theirs = st.SentenceTransformer(str(result.final_dir), device="cpu").encode(texts, convert_to_numpy=True)
    ours = Embedder.from_pretrained(result.final_dir).encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert (tmp_path / "out" / "loss.png").is_file()


def test_mnrl_command_with_matryoshka_and_validation(tmp_path: Path, minilm_dir: Path, cli_main, capsys) -> None:
    train = write_tsv(tmp_path / "train.tsv", "anchor\tpositive", QA + [(q.upper(), p) for q, p in QA[:4]])
    valid = write_tsv(tmp_path / "valid.tsv", "anchor\tpositive", QA)
    out = tmp_path / "out"
    code = cli_main(["train-embedder", "--model", str(minilm_dir), "--train", str(train), "--loss", "mnrl",
                     "--matryoshka", "384,128,64", "--valid", str(valid), "--epochs", "1", "--batch-size", "4",
                     "--eval-every", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert f"final model: {out / 'final'}" in printed.splitlines()[-1]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    evaluated = [r for r in records if "eval_ndcg_at_10" in r]
    assert len(evaluated) >= 3 and all(0.0 <= r["eval_ndcg_at_10"] <= 1.0 for r in evaluated)
    assert (out / "best" / "modules.json").is_file() and (out / "final" / "modules.json").is_file()
    assert "best ndcg_at_10:" in printed


@pytest.mark.parametrize("content,extra,message", [
    ("query\tpassage\nq\tp\n", [], "missing column(s) anchor, positive"),
    ("", [], "is empty"),
    ("sentence1\tsentence2\tscore\na\tb\t0.5\n", ["--loss", "nope"], "unknown loss 'nope'"),
    ("anchor\tpositive\nq\tp\n", ["--matryoshka", "384,x"], "--matryoshka takes comma-separated"),
    ("sentence1\tsentence2\tscore\na\tb\t4.5\n", ["--loss", "cosine"], "outside [0, 1]"),
    ("anchor\tpositive\nq\tp\n", ["--loss", "triplet"], "needs a negative column"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, minilm_dir: Path, cli_main, capsys, content: str,
                                      extra: list[str], message: str) -> None:
    train = tmp_path / "pairs.tsv"
    train.write_text(content, encoding="utf-8")
    code = cli_main(["train-embedder", "--model", str(minilm_dir), "--train", str(train), "--out",
                     str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("encoderkit: error: ") and message in err[0]
    assert not (tmp_path / "out" / "final").exists()


def test_rerun_resumes_from_last_checkpoint(tmp_path: Path, minilm_dir: Path, cli_main, capsys) -> None:
    train = write_tsv(tmp_path / "train.tsv", "anchor\tpositive", QA)
    out = tmp_path / "out"
    command = ["train-embedder", "--model", str(minilm_dir), "--train", str(train), "--loss", "cached-mnrl",
               "--mini-batch-size", "2", "--batch-size", "4", "--out", str(out)]
    assert cli_main([*command, "--epochs", "1"]) == 0
    first = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in first] == [1, 2]
    assert (out / "checkpoint-0000002" / "trainer_state.pt").is_file()
    assert cli_main([*command, "--epochs", "2"]) == 0  # the same run, longer: continues at step 3
    records = (out / "metrics.jsonl").read_text().splitlines()
    assert records[:2] == first and [json.loads(line)["step"] for line in records] == [1, 2, 3, 4]
    assert (out / "checkpoint-0000004").is_dir()


@pytest.mark.parametrize("loss,header,rows", [
    ("softmax", "premise\thypothesis\tlabel", [(q, p, "yes" if i % 2 else "no") for i, (q, p) in enumerate(QA)]),
    ("triplet", "anchor\tpositive\tnegative", [(q, p, QA[(i + 1) % len(QA)][1]) for i, (q, p) in enumerate(QA)]),
])
def test_softmax_and_triplet_train(tmp_path: Path, minilm_dir: Path, loss: str, header: str, rows) -> None:
    from encoderkit.training.sentence import EmbedderRecipe, train_embedder

    train = write_tsv(tmp_path / "train.tsv", header, rows)
    result = train_embedder(minilm_dir, train, tmp_path / "out", EmbedderRecipe(
        loss=loss, batch_size=4, show_progress=False, valid=train if loss == "triplet" else None))
    assert result.step == 2 and (result.final_dir / "modules.json").is_file()
    assert not (result.final_dir / "loss_head.pt").exists()  # the softmax classifier is not part of the embedder
    if loss == "softmax":
        assert (tmp_path / "out" / "checkpoint-0000002" / "loss_head.pt").is_file()  # kept for resuming
    else:
        assert result.metric == "triplet_accuracy" and 0.0 <= result.best_metric <= 1.0


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path: Path, minilm_dir: Path, cli_main, capsys, caplog,
                                                     monkeypatch) -> None:
    """A run stopped by Ctrl-C after its step-2 checkpoint continues from step 2 when rerun (not from step 0), and
    ends with the same weights as a run that was never interrupted."""
    from helpers import tiny_bert_dir
    from encoderkit.tasks.embed import Embedder
    from encoderkit.training.trainer import Trainer

    tiny = tiny_bert_dir(tmp_path / "tiny", minilm_dir)
    train = write_tsv(tmp_path / "train.tsv", "anchor\tpositive", QA)

    def command(out: Path) -> list[str]:
        return ["train-embedder", "--model", str(tiny), "--train", str(train), "--batch-size", "2", "--epochs", "1",
                "--save-every", "1", "--lr", "1e-3", "--warmup-ratio", "0", "--out", str(out)]

    assert cli_main(command(tmp_path / "whole")) == 0
    step = Trainer.train_step

    def interrupted(self):
        if self.step == 2:
            raise KeyboardInterrupt
        return step(self)

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "train_step", interrupted)
        assert cli_main(command(out)) == 130
    assert "encoderkit: interrupted" in capsys.readouterr().err
    assert not (out / "final").exists() and (out / "checkpoint-0000002" / "trainer_state.pt").is_file()
    before = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [1, 2]

    caplog.clear()
    assert cli_main(command(out)) == 0
    assert f"resumed from {out / 'checkpoint-0000002'} (step 2)" in caplog.text
    records = (out / "metrics.jsonl").read_text().splitlines()
    assert records[:2] == before and [json.loads(line)["step"] for line in records] == [1, 2, 3, 4]
    texts = [q for q, _ in QA]
    np.testing.assert_allclose(Embedder.from_pretrained(out / "final").encode(texts),
                               Embedder.from_pretrained(tmp_path / "whole" / "final").encode(texts), atol=1e-6)

