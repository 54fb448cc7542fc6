"""bench/finetune_small.py's ``--extend``: seeds added to a budget measured before give the summary of all the seeds
measured at once (means, paired difference and its interval, by Student's t), and an extension that cannot add to a
section is refused."""
from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bench_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small():
    return bench_module("finetune_small")


def runs_of(seeds, metrics, seconds):
    return {name: [{"seed": seed, "metric": m, "seconds": s, "train_examples": 4000}
                   for seed, m, s in zip(seeds, values, seconds[name])] for name, values in metrics.items()}


def test_extended_section_equals_all_seeds_at_once(small) -> None:
    seeds = small.SEEDS[:8]
    metrics = {"transformers": [86.0, 85.5, 86.2, 86.1, 85.9, 86.4, 85.7, 86.0],
               "encoderkit": [85.6, 85.9, 85.8, 86.3, 85.2, 86.0, 85.9, 85.5]}
    seconds = {"transformers": [120.0] * 8, "encoderkit": [40.0, 42.0, 38.0, 40.0, 40.0, 39.0, 41.0, 44.0]}
    whole = small.summarise("sst2", 4000, runs_of(seeds, metrics, seconds))
    first = small.summarise("sst2", 4000, runs_of(seeds[:5], {k: v[:5] for k, v in metrics.items()}, seconds))
    first["seeds"] = list(seeds[:5])
    merged = small.earlier_runs(first)
    later = runs_of(seeds[5:], {k: v[5:] for k, v in metrics.items()}, {k: v[5:] for k, v in seconds.items()})
    for name in merged:
        merged[name] += later[name]
    extended = small.summarise("sst2", 4000, merged)
    for a, b in zip(whole["rows"], extended["rows"]):
        assert a["metrics"] == b["metrics"] and a["mean"] == pytest.approx(b["mean"])
        assert a["seconds"] == pytest.approx(b["seconds"])  # each seed weighed once
        assert a.get("paired_difference") == b.get("paired_difference")
    differences = [a - b for a, b in zip(metrics["encoderkit"], metrics["transformers"])]
    half = 2.365 * statistics.stdev(differences) / math.sqrt(8)  # Student's t, 7 degrees of freedom
    interval = extended["rows"][1]["paired_difference"]
    assert interval["low"] == pytest.approx(statistics.fmean(differences) - half)
    assert whole["goals"] == extended["goals"]


def test_an_extension_that_cannot_add_is_refused(small) -> None:
    section = {"budget": 4000, "seeds": list(small.SEEDS[:5]),
               "rows": [{"contender": "transformers"}, {"contender": "encoderkit"}]}
    sections = {4000: section}
    small.extendable(sections, [4000], ["transformers", "encoderkit"], small.SEEDS[:15])
    # a contender the section lacks, at its own seeds or more
    small.extendable(sections, [4000], ["transformers", "encoderkit", "transformers-ek-order"], small.SEEDS[:5])
    with pytest.raises(SystemExit, match="no earlier section for 2,000 rows"):
        small.extendable(sections, [2000], ["transformers", "encoderkit"], small.SEEDS[:15])
    with pytest.raises(SystemExit, match="pass --contenders transformers,encoderkit"):
        small.extendable(sections, [4000], ["transformers", "encoderkit-torch"], small.SEEDS[:15])
    with pytest.raises(SystemExit, match="must be at least 5"):
        small.extendable(sections, [4000], ["transformers", "encoderkit", "encoderkit-torch"], small.SEEDS[:4])
    with pytest.raises(SystemExit, match="has these seeds and contenders already"):
        small.extendable(sections, [4000], ["transformers", "encoderkit"], small.SEEDS[:5])


def test_the_trainer_in_encoderkits_order_is_compared_with_encoderkit_seed_by_seed(small) -> None:
    seeds = small.SEEDS[:6]
    metrics = {"transformers": [86.0, 85.5, 86.2, 86.1, 85.9, 86.4],
               "encoderkit": [85.6, 85.9, 85.8, 86.3, 85.2, 86.0],
               "transformers-ek-order": [85.9, 85.4, 86.3, 86.0, 85.6, 85.8]}
    section = small.summarise("sst2", 4000, runs_of(seeds, metrics, {name: [1.0] * 6 for name in metrics}))
    differences = [a - b for a, b in zip(metrics["encoderkit"], metrics["transformers-ek-order"])]
    half = 2.571 * statistics.stdev(differences) / math.sqrt(6)  # Student's t, 5 degrees of freedom
    (comparison,) = section["comparisons"]
    assert comparison["contenders"] == ["encoderkit", "transformers-ek-order"]
    assert comparison["mean"] == pytest.approx(statistics.fmean(differences))
    assert comparison["high"] == pytest.approx(statistics.fmean(differences) + half)


@pytest.mark.bench  # make test-bench: both sides train
@pytest.mark.parametrize("task", ["sst2", "conll"])
def test_the_trainer_in_encoderkits_order_runs_on_each_task(task) -> None:
    """The variant's smoke run on each task's head (sequence and token classification name theirs differently)."""
    registry = bench_module("registry")
    lacking = registry.missing(registry.BY_NAME["finetune_small"], smoke=True)
    if lacking:
        pytest.skip(f"bench/finetune_small.py needs {'; '.join(lacking)}")
    done = subprocess.run([sys.executable, "bench/finetune_small.py", "--smoke", "--task", task, "--contenders",
                           "encoderkit-trainer-order,transformers,encoderkit,transformers-ek-order"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"{task} 64 seed 42: transformers-ek-order" in done.stdout
    assert f"{task} 64 seed 42: encoderkit-trainer-order" in done.stdout  # after the Trainer, whose order it takes
    assert done.stdout.index(f"seed 42: transformers ") < done.stdout.index("seed 42: encoderkit-trainer-order")


def test_the_noted_order_is_the_one_the_trainer_read(small, tmp_path) -> None:
    """The collator that notes the Trainer's order changes nothing the model sees, and the batches the model was
    given are the noted rows in the noted order."""
    transformers = pytest.importorskip("transformers")
    from encoderkit import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, num_labels=2)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(40)]
    encoded = tokenizer(texts)
    rows = [{"input_ids": ids, "attention_mask": mask, "labels": i % 2, "row": i}
            for i, (ids, mask) in enumerate(zip(encoded["input_ids"], encoded["attention_mask"]))]
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()),
                                    with_kwargs=True)
    collator = small.NotingCollator(transformers.DataCollatorWithPadding(tokenizer))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=1,
                                          use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
                                          remove_unused_columns=False, seed=3)
    transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator).train()
    assert sorted(collator.rows) == list(range(40)) and collator.rows != list(range(40))  # each row once, shuffled
    assert len(seen) == 5
    for batch, rows_of_batch in zip(seen, [collator.rows[i:i + 8] for i in range(0, 40, 8)]):
        for ids, row in zip(batch.tolist(), rows_of_batch):
            own = encoded["input_ids"][row]
            assert ids[:len(own)] == own and set(ids[len(own):]) <= {tokenizer.pad_token_id}


def test_an_extension_whose_trainer_scores_otherwise_is_refused(small, monkeypatch) -> None:
    """encoderkit-trainer-order added to seeds measured before reruns the Trainer for its order; a rerun that
    scores otherwise read another order, and is refused rather than used."""
    runs = {"transformers": [{"seed": 42, "metric": 85.5}]}
    monkeypatch.setattr(small, "run_one", lambda *args, **kwargs: {"metric": 85.5, "order": [1, 0]})
    assert small.repeated_trainer_run("sst2", None, None, 42, None, "cpu", runs)["order"] == [1, 0]
    monkeypatch.setattr(small, "run_one", lambda *args, **kwargs: {"metric": 85.6, "order": [1, 0]})
    with pytest.raises(SystemExit, match="scored 85.6000 again, 85.5000 before"):
        small.repeated_trainer_run("sst2", None, None, 42, None, "cpu", runs)
