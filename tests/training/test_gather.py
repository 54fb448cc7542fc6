"""Contrastive losses gathered across processes (2 processes, gloo on CPU): the mean of the processes' losses and
the gradients DDP leaves on every process equal, to 1e-5, the loss and the gradients of one process on the
concatenated batch: MNRL with a hard-negative column, symmetric MNRL, Matryoshka MNRL, cached MNRL and CoSENT,
with texts repeated across the processes. Without gathering the loss differs. Then `train-embedder` under
torchrun with 2 processes takes the steps of one process with the doubled batch, and only rank 0 writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from encoderkit import InputError
from encoderkit.embeddings import (
    CachedMultipleNegativesRankingLoss,
    CoSENTLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
    SentenceModel,
    text_ids,
)

WORLD = 2
ANCHORS = ["how do I reset my password", "the printer is out of toner", "book a meeting room",
           "my laptop will not boot", "where is the cafeteria", "request a new badge", "book a meeting room",
           "the wifi keeps dropping"]
POSITIVES = ["password reset steps", "replace the toner cartridge", "room booking calendar",
             "laptop boot failure help", "cafeteria on the ground floor", "replace the toner cartridge",
             "meeting rooms on floor two", "restart the wifi router"]
NEGATIVES = ["printer driver download", "password policy", "parking rules", "meeting rooms on floor two",
             "holiday calendar", "visitor wifi", "badge request form", "monitor flickers"]
SCORES = [0.9, 0.1, 0.55, 0.3, 0.75, 0.3, 0.2, 1.0]
# Texts repeated across the two halves: positive 5 = positive 1 (process 0), anchor 6 = anchor 2, and negative 3
# (process 0) = positive 6 (process 1): the masks must see the whole global batch.

CASES = ("mnrl", "symmetric", "matryoshka", "cached", "cosent", "not-gathered")


def build(case: str, model: SentenceModel, gather: bool) -> tuple[torch.nn.Module, str, list[list[str]]]:
    """(loss, its train_embedder name, the text columns) of a case."""
    mnrl = MultipleNegativesRankingLoss(gather_across_processes=gather)
    three = [ANCHORS, POSITIVES, NEGATIVES]
    if case == "mnrl":
        return mnrl, "mnrl", three
    if case == "symmetric":
        return MultipleNegativesRankingLoss(symmetric=True, gather_across_processes=gather), "mnrl", three[:2]
    if case == "matryoshka":
        return MatryoshkaLoss(mnrl, [32, 16], [1.0, 0.5]), "mnrl", three
    if case == "cached":
        inner = MultipleNegativesRankingLoss(symmetric=True, gather_across_processes=gather)
        return CachedMultipleNegativesRankingLoss(model, mini_batch_size=3, loss=inner), "cached-mnrl", three
    if case == "cosent":
        return CoSENTLoss(gather_across_processes=gather), "cosent", three[:2]
    return MultipleNegativesRankingLoss(gather_across_processes=False), "mnrl", three  # not-gathered


def batch_of(model: SentenceModel, name: str, columns: list[list[str]], rows: slice) -> dict[str, torch.Tensor]:
    """The collated batch train_embedder hands the wrapper: each column's features, text ids numbered over the
    whole (global) batch, the scores."""
    batch: dict[str, torch.Tensor] = {}
    for index, texts in enumerate(columns):
        features = model.tokenize(texts[rows]).model_inputs()
        batch.update({key if index == 0 else f"{key}_{index}": value for key, value in features.items()})
    if name == "cosent":
        batch["scores"] = torch.tensor(SCORES[rows])
    else:
        batch["duplicates"] = text_ids(columns)[:, rows]
    return batch


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def worker(rank: int, directory: str, results: str) -> None:
    """One process: each case's loss on its half of the batch, back-propagated under DDP (the cached loss: the
    Trainer's own gradient averaging); rank 0 saves the mean loss and its gradients."""
    import torch.distributed as dist

    from encoderkit.training.sentence import EmbedderTraining
    from encoderkit.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{results}.rendezvous", rank=rank, world_size=WORLD)
    half = len(ANCHORS) // WORLD
    rows = slice(rank * half, (rank + 1) * half)
    out: dict[str, object] = {}
    for case in CASES:
        model = SentenceModel.from_pretrained(directory)
        loss, name, columns = build(case, model, gather=True)
        wrapper = EmbedderTraining(model, loss, name, len(columns))
        ddp = torch.nn.parallel.DistributedDataParallel(wrapper) if wrapper.ddp_compatible else wrapper
        value = ddp(**batch_of(model, name, columns, rows)).loss
        value.backward()
        if not wrapper.ddp_compatible:
            Trainer._average_gradients(SimpleNamespace(model=wrapper, world_size=WORLD))
        mean = value.detach().reshape(1).clone()
        dist.all_reduce(mean)
        out[case] = (float(mean) / WORLD, gradients(model))
    try:  # batches of two sizes: every process gets the same clear error
        MultipleNegativesRankingLoss(gather_across_processes=True)(torch.randn(3 + rank, 4), torch.randn(3 + rank, 4))
        out["uneven"] = None
    except InputError as error:
        out["uneven"] = str(error)
    errors = [None] * WORLD
    dist.all_gather_object(errors, out["uneven"])
    out["uneven"] = errors
    if rank == 0:
        torch.save(out, results)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, minilm_dir) -> Path:
    from helpers import tiny_bert_dir

    # No dropout: the processes and the one-process reference would draw other masks.
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-gather"), minilm_dir, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_gathered_losses_equal_one_process(tmp_path: Path, tiny_dir: Path) -> None:
    from encoderkit.training.sentence import EmbedderTraining

    results = tmp_path / "ranks.pt"
    torch.multiprocessing.spawn(worker, args=(str(tiny_dir), str(results)), nprocs=WORLD)
    ranks = torch.load(results, weights_only=False)
    reference: dict[str, tuple[float, dict[str, torch.Tensor]]] = {}
    for case in CASES:
        model = SentenceModel.from_pretrained(tiny_dir)
        loss, name, columns = build(case, model, gather=True)  # one process: gathering changes nothing
        value = EmbedderTraining(model, loss, name, len(columns))(**batch_of(model, name, columns, slice(None))).loss
        value.backward()
        reference[case] = float(value.detach()), gradients(model)
    for case in CASES[:-1]:
        (loss, grads), (want_loss, want_grads) = ranks[case], reference[case]
        assert abs(loss - want_loss) < 1e-5, (case, loss, want_loss)
        assert grads.keys() == want_grads.keys() and len(grads) > 30, case  # the pooler alone is frozen
        worst = max(float((grads[n] - want_grads[n]).abs().max()) for n in grads)
        assert worst < 1e-5, (case, worst)
        assert max(float(g.abs().max()) for g in grads.values()) > 0.1  # gradients of substance
    # Each process on its own half: other negatives, another loss.
    assert abs(ranks["not-gathered"][0] - reference["not-gathered"][0]) > 1e-2
    assert all(error is not None and "batches of one size; found [3, 4]" in error for error in ranks["uneven"])


def losses(directory: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (directory / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_train_embedder_torchrun_two_processes_equal_one(tmp_path: Path, tiny_dir: Path) -> None:
    from encoderkit.cli.app import main

    # 20 pairs with texts repeated across the pairs; global batches of 8 (4 per process): 3 steps an epoch, the
    # last batch (4 pairs) split 2 + 2.
    pairs = [(f"question {i % 7} about {['printers', 'badges', 'rooms'][i % 3]}", f"answer {i % 9} here")
             for i in range(20)]
    train = tmp_path / "pairs.tsv"
    train.write_text("anchor\tpositive\n" + "".join(f"{a}\t{p}\n" for a, p in pairs), encoding="utf-8")
    common = ["train-embedder", "--model", str(tiny_dir), "--train", str(train), "--loss", "cached-mnrl",
              "--mini-batch-size", "3", "--epochs", "2", "--lr", "1e-3", "--warmup-ratio", "0", "--save-every", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD),
         "-m", "encoderkit.cli", *common, "--batch-size", "4", "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main([*common, "--batch-size", "8", "--out", str(tmp_path / "single")]) == 0
    ddp, single = losses(tmp_path / "ddp"), losses(tmp_path / "single")
    assert len(ddp) == len(single) == 6
    assert max(abs(a - b) for a, b in zip(ddp, single)) < 1e-5, (ddp, single)
    assert ddp[-1] < ddp[0] - 0.1  # it learns
    assert sorted(p.name for p in (tmp_path / "ddp").glob("checkpoint-*")) == ["checkpoint-0000003",
                                                                               "checkpoint-0000006"]
    assert not list((tmp_path / "ddp").glob("*.tmp"))
    trained = SentenceModel.from_pretrained(tmp_path / "ddp" / "final").eval()
    reference = SentenceModel.from_pretrained(tmp_path / "single" / "final").eval()
    with torch.no_grad():
        texts = trained.tokenize([a for a, _ in pairs[:5]])
        assert float((trained.embed(texts) - reference.embed(texts)).abs().max()) < 1e-4


def test_gathering_a_loss_without_in_batch_comparisons_is_refused(tmp_path: Path) -> None:
    from encoderkit.training.sentence import EmbedderRecipe

    with pytest.raises(InputError, match="nothing to gather across processes.*mnrl, cached-mnrl, cosent"):
        EmbedderRecipe(loss="triplet", gather_across_processes=True)

