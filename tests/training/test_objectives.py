"""ELECTRA replaced-token detection and DistilBERT-style distillation."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from encoderkit import ConfigError, EncoderConfig, EncoderForMaskedLM
from encoderkit.cli import main
from encoderkit.data.masking import IGNORE_INDEX, Masker, MaskingConfig
from encoderkit.training.objectives import (
    DisentangledEmbedding,
    DistillationObjective,
    ElectraObjective,
    student_from_teacher,
)

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=200, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)


def masked_batch():
    masker = Masker(MaskingConfig(rate=0.3), vocab_size=200, mask_token_id=4, special_token_ids=[0, 1, 2, 3, 4])
    generator = torch.Generator().manual_seed(0)
    examples = [{"index": i, "input_ids": torch.cat([torch.tensor([2]), torch.randint(5, 200, (n,), generator=generator),
                                                     torch.tensor([3])]).numpy()} for i, n in enumerate([20, 14, 9])]
    return masker.collate(examples)


def test_electra_objective_replaces_masked_tokens_and_shares_embeddings(tmp_path) -> None:
    torch.manual_seed(0)
    objective = ElectraObjective(EncoderConfig(model_type="electra", embedding_size=16, **SMALL))
    generator, discriminator = objective.generator, objective.discriminator
    assert generator.config.hidden_size == 8 and generator.config.embedding_dim == 16
    assert generator.encoder.embeddings.word.weight is discriminator.encoder.embeddings.word.weight
    batch = masked_batch()
    seen = {}
    original_forward = discriminator.forward

    def spy(input_ids, attention_mask=None, token_type_ids=None, labels=None, **kw):
        seen.update(input_ids=input_ids, labels=labels)
        return original_forward(input_ids, attention_mask, token_type_ids, labels=labels, **kw)

    discriminator.forward = spy
    out = objective(**batch)
    selected = batch["labels"] != IGNORE_INDEX
    originals = torch.where(selected, batch["labels"], batch["input_ids"])
    assert torch.equal(seen["input_ids"][~selected], batch["input_ids"][~selected])  # only masked slots change
    assert torch.equal(seen["labels"], (seen["input_ids"] != originals).long())
    assert out.loss.item() == pytest.approx(out.parts["mlm"] + 50 * out.parts["rtd"], rel=1e-5)
    out.loss.backward()
    assert generator.encoder.layers[0].ffn_in.weight.grad is not None
    # Both halves are transformers-format: the discriminator and the generator load back and agree.
    objective.save_pretrained(tmp_path)
    with torch.no_grad():
        hf_disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path).eval()
        hf_gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "generator").eval()
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        discriminator.forward = original_forward
        discriminator.eval(), generator.eval()
        real = batch["attention_mask"].bool()
        assert (hf_disc(**inputs).logits - discriminator(**inputs).logits)[real].abs().max() <= 1e-5
        assert (hf_gen(**inputs).logits - generator(**inputs).logits)[real].abs().max() <= 1e-5


def test_student_takes_every_other_teacher_layer() -> None:
    teacher = EncoderForMaskedLM(EncoderConfig(**SMALL))
    student = student_from_teacher(teacher)
    assert student.config.num_hidden_layers == 2
    for new, old in ((0, 0), (1, 2)):
        assert torch.equal(student.encoder.layers[new].ffn_in.weight, teacher.encoder.layers[old].ffn_in.weight)
    assert torch.equal(student.encoder.embeddings.word.weight, teacher.encoder.embeddings.word.weight)
    assert torch.equal(student.mlm_head.transform.weight, teacher.mlm_head.transform.weight)


def test_distillation_loss_by_hand() -> None:
    torch.manual_seed(0)
    teacher = EncoderForMaskedLM(EncoderConfig(**SMALL)).eval()
    objective = DistillationObjective(teacher, temperature=2.0, alpha_kl=5.0, alpha_mlm=2.0, alpha_cos=1.0).eval()
    batch = masked_batch()
    out = objective(**batch)
    with torch.no_grad():
        t = teacher(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
        s = objective.student(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
    selected, real = batch["labels"] != IGNORE_INDEX, batch["attention_mask"].bool()
    p_t = F.softmax(t.logits[selected] / 2, -1)
    log_p_s = F.log_softmax(s.logits[selected] / 2, -1)
    kl = (p_t * (p_t.log() - log_p_s)).sum(-1).mean() * 4
    mlm = F.cross_entropy(s.logits[selected], batch["labels"][selected])
    cosine = 1 - F.cosine_similarity(s.last_hidden_state[real], t.last_hidden_state[real], dim=-1).mean()
    assert out.loss.item() == pytest.approx((5 * kl + 2 * mlm + cosine).item(), rel=1e-5)
    same = DistillationObjective(teacher, student_from_teacher(teacher, every=1)).eval()
    parts = same(**batch).parts
    assert parts["kl"] == pytest.approx(0.0, abs=1e-5) and parts["cosine"] == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "corpus.txt"
    path.write_text("\n\n".join(f"document {d} is about encoders and masked words.\nsecond line {d}."
                                for d in range(120)) + "\n")
    return path


def test_pretrain_electra_and_distill_commands(tmp_path, corpus, capsys) -> None:
    config = json.dumps({"model_type": "electra", "embedding_size": 16,
                         **{k: v for k, v in SMALL.items() if k != "vocab_size"}})
    common = ["--corpus", str(corpus), "--steps", "3", "--batch-size", "4", "--max-length", "32", "--save-every", "0",
              "--eval-every", "0"]
    assert main(["pretrain", *common, "--objective", "electra", "--config", config, "--out", str(tmp_path / "e")]) == 0
    transformers.ElectraForPreTraining.from_pretrained(tmp_path / "e" / "final")
    transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "e" / "final" / "generator")
    teacher_config = json.dumps({"model_type": "bert", **{k: v for k, v in SMALL.items() if k != "vocab_size"}})
    assert main(["pretrain", *common, "--config", teacher_config, "--out", str(tmp_path / "t")]) == 0
    assert main(["pretrain", *common, "--objective", "distill", "--teacher", str(tmp_path / "t" / "final"),
                 "--out", str(tmp_path / "s")]) == 0
    student = transformers.BertForMaskedLM.from_pretrained(tmp_path / "s" / "final")
    assert student.config.num_hidden_layers == 2
    assert main(["pretrain", *common, "--objective", "distill", "--out", str(tmp_path / "x")]) == 2
    assert "needs --teacher" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["modernbert"])
def test_electra_refuses_families_it_cannot_describe(family: str, tmp_path, corpus, capsys) -> None:
    config = EncoderConfig(model_type=family, **SMALL)  # a model_type, all else BERT's: only the family matters
    with pytest.raises(ConfigError, match=f"{family} was pre-trained with MLM alone"):
        ElectraObjective(config)
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path), "--steps", "1", "--objective",
                 "electra", "--config", json.dumps({"model_type": family, **{k: v for k, v in SMALL.items()
                                                                                 if k != "vocab_size"}})]) == 2
    assert "use --objective mlm" in capsys.readouterr().err


def test_student_of_a_modernbert_teacher_keeps_its_attention_pattern() -> None:
    layers = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    teacher = EncoderForMaskedLM(EncoderConfig(model_type="modernbert", **SMALL, layer_types=layers, local_attention=8,
                                               global_rope_theta=160_000.0, local_rope_theta=10_000.0))
    student = student_from_teacher(teacher)
    assert student.config.layer_types == ["full_attention", "sliding_attention"]
    assert torch.equal(student.encoder.layers[1].ffn_in.weight, teacher.encoder.layers[2].ffn_in.weight)


DEBERTA_V3 = dict(model_type="deberta-v2", relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"],
                  share_att_key=True, norm_rel_ebd="layer_norm", absolute_positions=False, type_vocab_size=0)


def test_deberta_v3_rtd_shares_embeddings_with_a_stop_gradient(tmp_path) -> None:
    """Gradient-disentangled embedding sharing: the discriminator reads E_G + E_delta; E_G's gradient is the
    generator's MLM gradient alone, E_delta's comes from replaced-token detection alone."""
    torch.manual_seed(0)
    config = EncoderConfig(**DEBERTA_V3, **SMALL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    objective = ElectraObjective(config)
    generator, discriminator = objective.generator, objective.discriminator
    assert generator.config.num_hidden_layers == 2 and generator.config.hidden_size == 32  # half depth, same width
    table = discriminator.encoder.embeddings.word
    assert isinstance(table, DisentangledEmbedding) and not table.delta.any()
    with torch.no_grad():
        table.delta.normal_(std=0.02)
    source = generator.encoder.embeddings.word.weight
    assert torch.equal(table.weight, source + table.delta)
    batch = masked_batch()
    out = objective(**batch)
    out.loss.backward()
    full_grad, delta_grad = source.grad.clone(), table.delta.grad.clone()
    assert delta_grad.abs().sum() > 0
    objective.zero_grad()
    generator(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], sparse=True).loss.backward()
    assert torch.allclose(full_grad, source.grad, atol=1e-7)  # nothing of the RTD loss reached E_G
    # Saved: a discriminator whose tables are E_G + E_delta, loading in transformers; resumed: the same deltas.
    objective.save_pretrained(tmp_path)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    reference = transformers.DebertaV2Model.from_pretrained(tmp_path).eval()
    discriminator.eval()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = discriminator.encoder(**inputs).last_hidden_state
        assert (reference(**inputs).last_hidden_state - want)[real].abs().max() <= 1e-5
    again = ElectraObjective(config)
    again.load_checkpoint(tmp_path)
    assert torch.equal(again.discriminator.encoder.embeddings.word.delta, table.delta)
    assert torch.equal(again.generator.encoder.embeddings.word.weight, source)


@pytest.mark.data
@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_deberta_v3_rtd_run_lowers_the_discriminator_loss(tmp_path) -> None:
    """`encoderkit pretrain --objective electra` on a DeBERTa-v3 shape runs RTD with GDES on real text: the
    discriminator's loss falls, and transformers loads the discriminator and the generator."""
    from conftest import shared_file

    corpus = shared_file("data", "wikitext2_raw", "wiki.test.raw")
    config = json.dumps({**DEBERTA_V3, **{k: v for k, v in SMALL.items() if k != "vocab_size"}})
    out = tmp_path / "rtd"
    assert main(["pretrain", "--corpus", str(corpus), "--documents", "line", "--objective", "electra", "--config",
                 config, "--steps", "60", "--batch-size", "16", "--max-length", "64", "--lr", "1e-3",
                 "--save-every", "0", "--eval-every", "0", "--out", str(out)]) == 0
    rtd = [json.loads(line)["rtd"] for line in (out / "metrics.jsonl").read_text().splitlines()
           if "rtd" in json.loads(line)]
    assert len(rtd) >= 50
    first, last = sum(rtd[:10]) / 10, sum(rtd[-10:]) / 10
    assert last < 0.8 * first, (first, last)
    transformers.DebertaV2Model.from_pretrained(out / "final")
    transformers.DebertaV2ForMaskedLM.from_pretrained(out / "final" / "generator")
