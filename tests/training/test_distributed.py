"""torchrun --nproc_per_node 2 (gloo, CPU) gives the losses of one process with the same global batch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from encoderkit.cli import main

# No dropout: with it, two processes and one draw different dropout masks, by design.
CONFIG = json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "intermediate_size": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})


def losses(directory: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (directory / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


@pytest.mark.long  # make test-long (CI runs it after the default suite's ten minutes)
def test_ddp_two_processes_equal_one(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(
        f"document {d} talks about encoders, masks and tokens.\nit has a second line with more words {d * 7}."
        for d in range(300)) + "\n")
    common = ["--corpus", str(corpus), "--config", CONFIG, "--steps", "6", "--max-length", "32", "--lr", "1e-3",
              "--save-every", "3", "--eval-every", "0", "--seed", "3", "--dtype", "fp32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "encoderkit.cli", "pretrain", *common, "--batch-size", "4",
         "--out", str(tmp_path / "ddp")],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["pretrain", *common, "--batch-size", "8", "--out", str(tmp_path / "single")]) == 0
    ddp, single = losses(tmp_path / "ddp"), losses(tmp_path / "single")
    assert len(ddp) == len(single) == 6
    assert max(abs(a - b) for a, b in zip(ddp, single)) <= 1e-4, (ddp, single)
    # Rank 0 alone wrote the checkpoints.
    assert sorted(p.name for p in (tmp_path / "ddp").glob("checkpoint-*")) == ["checkpoint-0000003",
                                                                               "checkpoint-0000006"]
