"""Trainer (exact resume, NaN guard, schedule, no decay on bias/LayerNorm), corpus packing, pre-training job."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from encoderkit import EncoderConfig, EncoderForMaskedLM, Tokenizer
from encoderkit.cli import main
from encoderkit.data.corpus import pack_sequences, sentence_pairs, tokenize_corpus
from encoderkit.data.masking import Masker, MaskingConfig
from encoderkit.tasks.fill_mask import FillMask
from encoderkit.training import Trainer, TrainingConfig, TrainingError
from encoderkit.training.optim import lr_lambda, parameter_groups

from conftest import SHARED

TINY = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    source = SHARED / "data" / "mlm_corpus" / "train.txt"
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    if source.exists():
        path.write_bytes(source.read_bytes()[:120_000])
    else:  # a generated corpus keeps these tests running without ../shared
        rng = np.random.default_rng(0)
        words = "the model reads text in both directions and learns to predict masked words".split()
        docs = ["\n".join(" ".join(rng.choice(words, 12)) for _ in range(5)) for _ in range(200)]
        path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def examples(corpus_file, tokenizer) -> list[dict]:
    corpus = tokenize_corpus(corpus_file, tokenizer)
    return pack_sequences(corpus, 32, tokenizer.token_id("cls"), tokenizer.token_id("sep"))


def make_masker(tokenizer: Tokenizer) -> Masker:
    return Masker(MaskingConfig(), vocab_size=tokenizer.vocab_size, mask_token_id=tokenizer.mask_token_id,
                  special_token_ids=[tokenizer.token_id(r) for r in ("cls", "sep", "pad", "mask", "unk")])


def test_packing_is_dense_and_lossless(corpus_file, tokenizer) -> None:
    corpus = tokenize_corpus(corpus_file, tokenizer)
    cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
    packed = pack_sequences(corpus, 64, cls_id, sep_id)
    assert all(len(e["input_ids"]) == 64 for e in packed[:-1]) and len(packed[-1]["input_ids"]) <= 64
    body = np.concatenate([e["input_ids"][1:-1] for e in packed])
    assert np.array_equal(body[body != sep_id], corpus.ids[corpus.ids != sep_id])  # every token, in order
    assert int((body == sep_id).sum()) == corpus.num_documents  # one boundary marker per document


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_sentence_pairs(corpus_file, tokenizer, objective: str) -> None:
    corpus = tokenize_corpus(corpus_file, tokenizer)
    cls_id, sep_id = tokenizer.token_id("cls"), tokenizer.token_id("sep")
    pairs = sentence_pairs(corpus, 64, cls_id, sep_id, objective=objective, seed=1)
    labels = np.array([p["pair_label"] for p in pairs])
    assert len(pairs) > 50 and 0.35 < labels.mean() < 0.65
    for pair in pairs:
        ids, types = pair["input_ids"], pair["token_type_ids"]
        assert len(ids) <= 64 and ids[0] == cls_id and ids[-1] == sep_id and (ids == sep_id).sum() >= 2
        assert len(types) == len(ids) and types[0] == 0 and types[-1] == 1
        first_sep = int(np.flatnonzero(ids == sep_id)[0])
        assert (types[:first_sep + 1] == 0).all() and (types[first_sep + 1:] == 1).all()


def run_trainer(output: Path, examples, tokenizer, *, steps: int, interrupt_at: int | None = None, **overrides):
    torch.manual_seed(0)
    model = EncoderForMaskedLM(EncoderConfig(**TINY))
    masker = make_masker(tokenizer)
    calls = {"n": 0}

    def collate(batch, epoch):
        calls["n"] += 1
        if interrupt_at is not None and calls["n"] == interrupt_at:
            raise KeyboardInterrupt
        return masker.collate(batch, epoch)

    config = TrainingConfig(output_dir=str(output), max_steps=steps, batch_size=8, grad_accumulation=2,
                            learning_rate=1e-3, save_every=3, show_progress=False, **overrides)
    return Trainer(model, config, examples, collate, forward_kwargs={"sparse": True})


def losses(output: Path) -> list[float]:
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_resume_gives_identical_losses(tmp_path, examples, tokenizer) -> None:
    steps = 10  # > one epoch of this small corpus, so the epoch change is resumed too
    run_trainer(tmp_path / "a", examples[:120], tokenizer, steps=steps).train()
    with pytest.raises(KeyboardInterrupt):  # killed in step 8: the last checkpoint is step 6
        run_trainer(tmp_path / "b", examples[:120], tokenizer, steps=steps, interrupt_at=15).train()
    assert (tmp_path / "b" / "checkpoint-0000006").is_dir()
    resumed = run_trainer(tmp_path / "b", examples[:120], tokenizer, steps=steps)
    resumed.train()
    assert resumed.history[0]["step"] == 7
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # bit for bit, every step
    assert len(losses(tmp_path / "a")) == steps
    kept = sorted(p.name for p in (tmp_path / "b").glob("checkpoint-*"))
    assert kept == ["checkpoint-0000006", "checkpoint-0000009", "checkpoint-0000010"]  # keep_last=3
    assert (tmp_path / "b" / "loss.png").stat().st_size > 1000


class NanAtStep(EncoderForMaskedLM):
    bad_call = 3

    def forward(self, *args, **kwargs):
        self.calls = getattr(self, "calls", 0) + 1
        out = super().forward(*args, **kwargs)
        if self.calls == self.bad_call:
            out.loss = out.loss * float("nan")
        return out


def test_nan_loss_stops_with_a_usable_checkpoint(tmp_path, examples, tokenizer) -> None:
    model = NanAtStep(EncoderConfig(**TINY))
    masker = make_masker(tokenizer)
    config = TrainingConfig(output_dir=str(tmp_path), max_steps=10, batch_size=4, show_progress=False)
    trainer = Trainer(model, config, examples, lambda b, e: masker.collate(b, e), forward_kwargs={"sparse": True})
    with pytest.raises(TrainingError, match="the loss became nan at step 3") as caught:
        trainer.train()
    saved = tmp_path / "checkpoint-0000002-before-nan"
    assert str(saved) in str(caught.value)
    from encoderkit import load_model

    reloaded = load_model(saved)
    assert all(torch.isfinite(p).all() for p in reloaded.parameters())


def test_no_weight_decay_on_bias_and_layernorm() -> None:
    model = EncoderForMaskedLM(EncoderConfig(**TINY))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all("norm" not in names[id(p)] and not names[id(p)].endswith("bias") for p in decay["params"])
    assert any("norm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied counted once


def test_warmup_then_decay() -> None:
    linear = lr_lambda(TrainingConfig(output_dir=".", max_steps=100, warmup_steps=10))
    assert linear(0) == 0.0 and linear(9) == pytest.approx(0.9) and linear(10) == 1.0  # BERT's and transformers'
    assert linear(55) == pytest.approx(0.5) and linear(100) == 0.0
    cosine = lr_lambda(TrainingConfig(output_dir=".", max_steps=100, warmup_steps=0, schedule="cosine"))
    assert cosine(50) == pytest.approx(0.5) and cosine(100) == pytest.approx(0.0, abs=1e-12)


def test_continued_pretraining_of_minilm_loads_in_transformers(tmp_path, corpus_file, minilm_dir, caplog) -> None:
    transformers = pytest.importorskip("transformers")
    from encoderkit.training.pretrain import pretrain

    result = pretrain(corpus_file, tmp_path / "run", config=minilm_dir, max_length=32, max_steps=3, batch_size=4,
                      save_every=0, eval_every=0, show_progress=False)
    assert result["step"] == 3
    assert "newly initialised" in caplog.text and "cls.predictions" in caplog.text  # the fresh MLM head
    final = tmp_path / "run" / "final"
    reference = transformers.BertForMaskedLM.from_pretrained(str(final)).eval()
    ours = FillMask.from_pretrained(final)
    text = "the capital of france is [MASK] ."
    batch = ours.tokenizer.encode_batch([text])
    with torch.no_grad():
        want = reference(**batch.model_inputs()).logits
        got = ours.model(**batch.model_inputs()).logits
    assert (want - got).abs().max() <= 1e-5
    pipeline = transformers.pipeline("fill-mask", model=str(final), device="cpu", top_k=5)
    expected = pipeline(text)
    predictions = ours(text, top_k=5)[0][0]
    assert [p.token_id for p in predictions] == [e["token"] for e in expected]
    assert np.allclose([p.score for p in predictions], [e["score"] for e in expected], atol=1e-5)


def test_pretraining_only_the_head_keeps_the_encoder(tmp_path, corpus_file, minilm_dir) -> None:
    """``train="head"`` on an embedder: its encoder and word embeddings come out bit for bit as they went in (read
    by transformers), the new head learns (with nothing masked, it reads each token back, SPLADE's use of it), and
    the loss of that falls."""
    transformers = pytest.importorskip("transformers")
    from encoderkit.training.pretrain import pretrain

    result = pretrain(corpus_file, tmp_path / "run", config=minilm_dir, train="head", max_length=32, max_steps=12,
                      batch_size=4, learning_rate=1e-2, warmup_ratio=0.0, save_every=0, eval_every=0,
                      masking=dict(rate=0.5, mask_fraction=0.0, random_fraction=0.0), show_progress=False)
    assert result["trained"] == "head" and result["masking"]["mask_fraction"] == 0.0
    before = transformers.BertModel.from_pretrained(str(minilm_dir)).state_dict()
    after = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "run" / "final"))
    for name, value in after.bert.state_dict().items():
        if name in before:
            assert torch.equal(value, before[name]), name
    losses = [row["loss"] for row in result["history"] if "loss" in row]
    assert len(losses) == 12 and np.mean(losses[-3:]) < 0.6 * np.mean(losses[:3])


@pytest.mark.parametrize("extra,message", [
    (["--objective", "electra"], "--train head trains the MLM head of an existing model"),
    (["--config", "minilm-l6-h384"], "--train head trains the MLM head of an existing model"),
    (["--mask-fraction", "0.9", "--random-fraction", "0.2"], "add up to at most 1"),
])
def test_pretrain_train_head_bad_input_is_one_line(tmp_path, corpus_file, minilm_dir, capsys, extra, message) -> None:
    args = ["pretrain", "--corpus", str(corpus_file), "--out", str(tmp_path), "--config", str(minilm_dir),
            "--train", "head", "--steps", "1", "--batch-size", "2", "--max-length", "32"]
    code = main(args + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_pretrain_and_fill_mask_cli(tmp_path, corpus_file, capsys) -> None:
    config = json.dumps({"model_type": "bert", **{k: v for k, v in TINY.items() if k != "vocab_size"}})
    assert main(["pretrain", "--corpus", str(corpus_file), "--out", str(tmp_path), "--config", config,
                 "--steps", "4", "--batch-size", "4", "--max-length", "32", "--save-every", "2",
                 "--eval-every", "2", "--valid", str(corpus_file)]) == 0
    out = capsys.readouterr().out
    assert "trained 4 steps" in out and "eval_accuracy" in out
    assert main(["fill-mask", str(tmp_path / "final"), "paris is the [MASK] of france.", "-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all("paris is the" in line for line in lines)
    assert main(["fill-mask", str(tmp_path / "final"), "no mask here"]) == 2


def test_fill_mask_refuses_a_model_without_mlm_head(minilm_dir) -> None:
    from encoderkit import InputError

    with pytest.raises(InputError, match="without a trained MLM head"):
        FillMask.from_pretrained(minilm_dir)


@pytest.mark.parametrize("max_norm", [0.5, 50.0])  # below and above the gradients' norm
@pytest.mark.parametrize("library", ["native", "torch"])
def test_clip_gradients_equals_torch_clip_grad_norm(max_norm, library, monkeypatch) -> None:
    from encoderkit import native
    from encoderkit.training.optim import clip_gradients

    if library == "torch":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.library() is None:
        pytest.skip(f"no native library: {native.status()}")
    generator = torch.Generator().manual_seed(0)
    sizes = (7, 30, 70_001)  # the last one cut into pieces shared by the threads
    ours = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    theirs = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(a.shape, generator=generator) / 40
        b.grad = a.grad.clone()
    unused = torch.nn.Parameter(torch.zeros(3))  # no gradient: skipped, as torch does
    exact = math.sqrt(sum(float((a.grad.double() ** 2).sum()) for a in ours))  # float64 reference
    norm = clip_gradients(iter(ours + [unused]), max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm == pytest.approx(exact, rel=1e-6) and norm == pytest.approx(float(expected), rel=1e-6)
    assert (norm > max_norm) == (max_norm == 0.5)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)


def test_clipping_inside_fused_adamw_steps_like_clipping_first() -> None:
    """With a fused AdamW the clipping coefficient goes to the optimizer's kernel (``grad_scale``) instead of a pass
    over the gradients: the parameters after the step equal those of torch's clip then step, to fp32 rounding."""
    from encoderkit.training.optim import clip_gradients, scales_in_step

    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(n, generator=generator) for n in (5, 300)]
    grads = [torch.randn(n, generator=generator) * 3 for n in (5, 300)]
    results = []
    for ours in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01, fused=True)
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            if ours:
                assert scales_in_step(optimizer)
                norm = clip_gradients(iter(params), 1.0, optimizer)
                assert norm > 1.0 and float(optimizer.grad_scale) == pytest.approx(norm + 1e-6)
                assert torch.equal(params[1].grad, grads[1])  # no pass over the gradients
                optimizer.step()
                del optimizer.grad_scale
            else:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not scales_in_step(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]))  # the foreach loop