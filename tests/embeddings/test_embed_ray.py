"""`encoderkit embed --engine ray`: shard planning and reading, the manifest and resumption, clear errors; on one
in-process local cluster, an interrupted job and its rerun equal the single-process embed; and, marked slow
(a local cluster per command, as a user runs it): the same with MiniLM, kill / Ctrl-C and resume."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from encoderkit import Embedder
from encoderkit.cli import main
from encoderkit.data.readers import iter_records
from encoderkit.embeddings.shard_plan import (MANIFEST, new_manifest, plan_shards, prepare_output, read_manifest,
                                          read_shard, read_shards, write_shard)
from encoderkit.errors import DataError, InputError

from conftest import shared_file
from helpers import tiny_bert_dir

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
REPO = Path(__file__).resolve().parents[2]
# One worker runs this module under pytest-xdist: its local clusters would share the machine's Ray ports otherwise.
pytestmark = pytest.mark.xdist_group("ray")


def ray_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None and importlib.util.find_spec("ray.data") is not None


needs_ray = pytest.mark.skipif(not ray_installed(), reason="ray[data] is not installed (pip install 'encoderkit[ray]')")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir) -> Path:
    return tiny_bert_dir(tmp_path_factory.mktemp("model") / "tiny", minilm_dir)


def write_jsonl(path: Path, records: list[dict], blank_every: int = 0) -> Path:
    lines = []
    for number, record in enumerate(records):
        lines.append(json.dumps(record))
        if blank_every and number % blank_every == 0:
            lines.append("   ")
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def mixed_input(root: Path) -> dict[str, list[str]]:
    """A directory of a JSONL file (BOM, blank lines), a text file and a Parquet file of three row groups;
    returns the texts of each file as an independent reader sees them."""
    root.mkdir()
    texts = {"a.jsonl": [f"json text {i}" for i in range(7)], "b.txt": [f"line {i}" for i in range(5)] + [""],
             "sub/c.parquet": [f"parquet row {i}" for i in range(10)]}
    write_jsonl(root / "a.jsonl", [{"id": f"j{i}", "text": t} for i, t in enumerate(texts["a.jsonl"])], 2)
    (root / "b.txt").write_text("\n".join(texts["b.txt"]) + "\n", encoding="utf-8")
    (root / "sub").mkdir()
    table = pa.table({"id": list(range(100, 110)), "text": texts["sub/c.parquet"]})
    pq.write_table(table, root / "sub" / "c.parquet", row_group_size=4)
    (root / "notes.md").write_text("not an input")
    return texts


def test_plan_cuts_every_file_into_shards_that_read_back_the_records(tmp_path: Path) -> None:
    texts = mixed_input(tmp_path / "in")
    plan = plan_shards(tmp_path / "in", shard_size=3)
    assert [f.name for f in plan.files] == ["a.jsonl", "b.txt", "sub/c.parquet"]  # notes.md is not an input
    assert [f.rows for f in plan.files] == [7, 6, 10] and plan.rows == 23
    assert [(s.path.rsplit("/", 1)[1], s.start, s.rows) for s in plan.shards] == [
        ("a.jsonl", 0, 3), ("a.jsonl", 3, 3), ("a.jsonl", 6, 1), ("b.txt", 0, 3), ("b.txt", 3, 3),
        ("c.parquet", 0, 3), ("c.parquet", 3, 3), ("c.parquet", 6, 3), ("c.parquet", 9, 1)]
    read = [read_shard(shard) for shard in plan.shards]
    ids = [i for shard_ids, _ in read for i in shard_ids]
    got = [t for _, shard_texts in read for t in shard_texts]
    # the independent readers: encoderkit's record reader for JSONL and text, pyarrow for Parquet
    jsonl = list(iter_records(tmp_path / "in" / "a.jsonl"))
    lines = list(iter_records(tmp_path / "in" / "b.txt"))
    assert got == [r.text for r in jsonl] + [r.text for r in lines] + texts["sub/c.parquet"]
    # ids of an id field are kept as they are; numbered records get their file's name (there are several files)
    assert ids == [r.id for r in jsonl] + [f"b.txt:{r.id}" for r in lines] + [str(i) for i in range(100, 110)]
    assert len(set(ids)) == len(ids)
    again = plan_shards(str(tmp_path / "in" / "**" / "*[lt]"), shard_size=3)  # a glob of the same files
    assert again.shards == plan.shards and again.fingerprint() == plan.fingerprint()
    single = plan_shards(tmp_path / "in" / "a.jsonl", shard_size=3, id_field="id")
    assert [i for s in single.shards for i in read_shard(s)[0]] == [f"j{i}" for i in range(7)]  # one file: bare ids


@pytest.mark.parametrize("make, args, message", [
    (lambda d: None, ["missing.jsonl"], r"input not found: .*missing.jsonl"),
    (lambda d: None, ["shards/*.jsonl"], r"no input file matches '.*shards/\*.jsonl'"),
    (lambda d: (d / "empty").mkdir(), ["empty"], r"holds no .jsonl, .parquet or .txt files"),
    (lambda d: write_jsonl(d / "x.jsonl", [{"doc": "1", "text": "a"}]), ["x.jsonl", "--id-field", "id"],
     r"x.jsonl:1: no id field 'id' among \['doc', 'text'\]; name yours with --id-field"),
    (lambda d: write_jsonl(d / "x.jsonl", [{"id": "1", "body2": "a"}]), ["x.jsonl"],
     r"x.jsonl:1: no text field text / sentence .*name yours with --text-field"),
    (lambda d: write_jsonl(d / "x.jsonl", [{"id": "1", "text": "a"}]), ["x.jsonl", "--text-field", "body"],
     r"no text field 'body' among \['id', 'text'\]"),
    (lambda d: pq.write_table(pa.table({"text": ["a"]}), d / "x.parquet"), ["x.parquet", "--id-field", "key"],
     r"x.parquet: no id column 'key' among \['text'\]"),
    (lambda d: pq.write_table(pa.table({"n": [1]}), d / "x.parquet"), ["x.parquet"], r"no text column"),
    (lambda d: (d / "x.csv").write_text("text\na\n"), ["x.csv"], r"reads JSONL, Parquet or text files.*--engine local"),
    (lambda d: (d / "x.txt").write_text("a\n"), ["x.txt", "--id-field", "id"], r"is a text file .* --id-field"),
])
def test_bad_input_is_one_clear_error_before_any_cluster(tmp_path: Path, capsys, monkeypatch, make, args,
                                                        message) -> None:
    make(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["embed", *args, "--engine", "ray", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("encoderkit: error: ") and len(err.strip().splitlines()) == 1
    import re

    assert re.search(message, err), err


def test_engine_options_are_checked(tmp_path: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}])
    assert main(["embed", str(source), "--out", str(tmp_path / "o.npy"), "--workers", "2"]) == 2
    assert "--workers is an option of --engine ray" in capsys.readouterr().err
    assert main(["embed", str(source), "--engine", "ray", "--out", str(tmp_path / "o"), "--workers", "0"],
                ) == 2
    assert "--workers must be a positive integer, found 0" in capsys.readouterr().err


def job(tmp_path: Path, tiny: Path, rows: int = 10, shard_size: int = 4, model_path: Path | None = None):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": f"text {i}"} for i in range(rows)])
    plan = plan_shards(source, shard_size=shard_size)
    from encoderkit.embeddings.distributed import model_record

    record, dimension = model_record(model_path or tiny, {"dtype": "fp32"})
    return plan, new_manifest(plan, record, dimension)


def test_resume_keeps_recorded_and_renamed_shards_and_embeds_the_rest(tmp_path: Path, tiny: Path) -> None:
    plan, manifest = job(tmp_path, tiny, rows=14, shard_size=4)  # shards of 4, 4, 4, 2 rows
    out = tmp_path / "out"
    manifest, pending = prepare_output(out, manifest, plan)
    assert [s.index for s in pending] == [0, 1, 2, 3] and read_manifest(out)["shards"] == []
    vectors = {s.index: np.random.default_rng(s.index).normal(size=(s.rows, 32)).astype(np.float32)
               for s in plan.shards}
    entry = write_shard(out, plan.shards[0], read_shard(plan.shards[0])[0], vectors[0])
    manifest["shards"].append(entry)
    (out / MANIFEST).write_text(json.dumps(manifest))
    write_shard(out, plan.shards[1], read_shard(plan.shards[1])[0], vectors[1])  # renamed, then killed: unrecorded
    (out / "shard-000002.parquet").write_bytes(b"PAR1 half a file")  # never happens (rename is atomic); refused
    (out / "shard-000003.parquet.tmp").write_bytes(b"partial")
    manifest, pending = prepare_output(out, job(tmp_path, tiny, rows=14, shard_size=4)[1], plan)
    assert [s.index for s in pending] == [2, 3]
    assert [e["index"] for e in manifest["shards"]] == [0, 1] and manifest["count"] == 8
    assert manifest["shards"][1]["ids"] == {"count": 4, "first": "r4", "last": "r7", "min": "r4", "max": "r7"}
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "shard-000000.parquet", "shard-000001.parquet"]
    table = pq.read_table(out / "shard-000001.parquet")
    assert table.schema.field("embedding").type == pa.list_(pa.float32()) and table.schema.field("id").type == pa.string()
    for index in (2, 3):
        manifest["shards"].append(write_shard(out, plan.shards[index], read_shard(plan.shards[index])[0],
                                              vectors[index]))
    manifest["complete"] = True
    (out / MANIFEST).write_text(json.dumps(manifest))
    ids, matrix = zip(*read_shards(out))
    assert [i for part in ids for i in part] == [f"r{i}" for i in range(14)]
    assert np.array_equal(np.concatenate(matrix), np.concatenate([vectors[i] for i in range(4)]))


def test_out_dir_of_another_job_or_other_files_is_refused(tmp_path: Path, tiny: Path, minilm_dir: Path) -> None:
    plan, manifest = job(tmp_path, tiny)
    out = tmp_path / "out"
    prepare_output(out, manifest, plan)
    _, other_model = job(tmp_path, tiny, model_path=minilm_dir)
    with pytest.raises(InputError, match=r"holds embeddings of another job: its model .* and its dimension differ.*"
                                         r"add --restart"):
        prepare_output(out, other_model, plan)
    (tmp_path / "sub").mkdir()
    other_plan, other_input = job(tmp_path / "sub", tiny, rows=11)
    with pytest.raises(InputError, match=r"its input files .* differ"):
        prepare_output(out, other_input, other_plan)
    _, pending = prepare_output(out, other_input, other_plan, restart=True)  # --restart: this job replaces it
    assert len(pending) == 3 and read_manifest(out)["rows"] == 11
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"is not empty \(notes.txt\) and holds no manifest.json"):
        prepare_output(stranger, manifest, plan)


def test_shard_embedder_gives_the_embedders_vectors(tmp_path: Path, tiny: Path) -> None:
    """The actor's code, called as Ray Data calls it (a numpy batch of shard descriptors), without Ray."""
    from encoderkit.embeddings.distributed import _SHARD_FIELDS, ShardEmbedder

    plan, _ = job(tmp_path, tiny, rows=10, shard_size=4)
    actor = ShardEmbedder(str(tiny), 1, {"dtype": "fp32"})
    batch = {name: np.asarray([getattr(s, name) for s in plan.shards[1:]], dtype=object) for name in _SHARD_FIELDS}
    out = actor(batch)
    assert out["shard"].tolist() == [1] * 4 + [2] * 2 and out["id"].tolist() == [f"r{i}" for i in range(4, 10)]
    expected = Embedder.from_pretrained(tiny).encode([f"text {i}" for i in range(4, 10)])
    assert out["embedding"].dtype == np.float32 and np.abs(out["embedding"] - expected).max() < 1e-6


def test_shards_are_collected_in_any_order_and_actor_errors_come_back_as_encoderkit_errors(tmp_path: Path,
                                                                                           tiny: Path) -> None:
    from encoderkit.embeddings.distributed import _SHARD_FIELDS, ShardEmbedder, collect_shards

    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": f"text {i}"} for i in range(7)])
    with open(source, "a") as handle:
        handle.write('{"id": "r7", "body": "no text field"}\n')
    plan = plan_shards(source, shard_size=3)  # shards of rows 0-2, 3-5, 6-7: the last one is bad
    actor = ShardEmbedder(str(tiny), 1, {"dtype": "fp32"})

    def batch(shards):
        return actor({name: np.asarray([getattr(s, name) for s in shards], dtype=object) for name in _SHARD_FIELDS})

    second, first = batch([plan.shards[1]]), batch([plan.shards[0]])
    split = [{key: value[:2] for key, value in first.items()}, {key: value[2:] for key, value in first.items()}]
    done = collect_shards([second, *split], plan.shards[:2])  # shard 0 arrives in two pieces, after shard 1
    assert [(shard.index, ids) for shard, ids, _ in done] == [(1, ["r3", "r4", "r5"]), (0, ["r0", "r1", "r2"])]
    bad = batch([plan.shards[2]])
    assert bad["error"].tolist() == ["DataError\t" + f"{source}:8: no text field 'text'"]
    with pytest.raises(DataError, match=r"in.jsonl:8: no text field 'text'$"):
        list(collect_shards([first, bad], plan.shards))


@needs_ray
def test_unreachable_address_fails_fast(tmp_path: Path, tiny: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "x.jsonl", [{"text": "a"}])
    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.perf_counter()
    code = main(["embed", str(source), "--engine", "ray", "--model", str(tiny), "--out", str(tmp_path / "o"),
                 "--address", f"127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot reach the Ray cluster at --address 127.0.0.1:{port}" in err and "ray start --head" in err
    assert time.perf_counter() - start < 15
    assert not (tmp_path / "o").exists()  # a job that never started leaves no output directory
    import ray

    assert not ray.is_initialized()


# ---------------------------------------------------------------------------------------------
# A local Ray cluster, started by the command itself (in a subprocess, as a user runs it)
# ---------------------------------------------------------------------------------------------
def ray_processes(ray_tmp: str) -> list[str]:
    """Processes (pid and name) started with RAY_TMPDIR=ray_tmp: the cluster's, its workers' included."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if f"RAY_TMPDIR={ray_tmp}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(f"{entry.name} {(entry / 'comm').read_text().strip()}")
        except OSError:
            continue
    return found


def run_cli(args: list[str], ray_tmp: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "RAY_TMPDIR": ray_tmp, **env}
    result = subprocess.run([sys.executable, "-m", "encoderkit.cli", *args], capture_output=True, text=True,
                            env=environment, timeout=300)
    return result


def no_ray_left(ray_tmp: str) -> list[str]:
    deadline = time.monotonic() + 5  # the command waits for its cluster; a moment for the kernel to reap
    while (left := ray_processes(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def embed_file_by_id(source: Path, out: Path, model: Path | None = None) -> dict[str, np.ndarray]:
    """The single-process engine's vectors (``encoderkit embed`` without --engine), by id."""
    from encoderkit.tasks.embed import embed_file

    local = embed_file(source, out, model=model, id_field="id", show_progress=False)
    return dict(zip(local.ids_path.read_text().splitlines(), np.load(local.path)))


def vectors_by_id(out: Path) -> dict[str, np.ndarray]:
    got: dict[str, np.ndarray] = {}
    for ids, vectors in read_shards(out):
        for record_id, vector in zip(ids, vectors):
            assert record_id not in got, f"{record_id} written twice"
            got[record_id] = vector
    return got


@needs_ray
def test_two_workers_interrupted_then_rerun_on_one_cluster_equal_the_single_process_embed(
        tmp_path: Path, tiny: Path, monkeypatch) -> None:
    """The default suite's version of the acceptance test below: one local cluster (started once, in this
    process) runs a job of 2 workers that is stopped after 2 of its 6 shards, then the rerun; every id comes out
    exactly once, with the single-process engine's vector."""
    from encoderkit.embeddings.distributed import FAIL_AFTER_ENV, embed_with_ray, ray_cluster

    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": f"text number {i} " * (1 + i % 9)}
                                                 for i in range(120)])
    out = tmp_path / "out"
    ray_tmp = tempfile.mkdtemp(prefix="ekray", dir="/tmp")  # short: Ray's socket paths live below it
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    options = dict(model=tiny, id_field="id", shard_size=20, workers=2, threads_per_worker=1, show_progress=False)
    import ray

    with ray_cluster(None, num_cpus=2):
        monkeypatch.setenv(FAIL_AFTER_ENV, "2")
        with pytest.raises(KeyboardInterrupt):
            embed_with_ray(source, out, **options)
        manifest = read_manifest(out)
        assert not manifest["complete"] and len(manifest["shards"]) == 2 and manifest["count"] == 40
        before = {e["path"]: (out / e["path"]).stat().st_mtime_ns for e in manifest["shards"]}
        monkeypatch.delenv(FAIL_AFTER_ENV)
        result = embed_with_ray(source, out, **options)
        assert ray.is_initialized()  # the job used this process's cluster and left it to its owner
    assert not ray.is_initialized() and no_ray_left(ray_tmp) == []
    assert (result.shards, result.shards_skipped, result.rows) == (6, 2, 120)
    assert {f: (out / f).stat().st_mtime_ns for f in before} == before  # finished shards were not redone
    assert read_manifest(out)["complete"]
    expected = embed_file_by_id(source, tmp_path / "local.npy", tiny)
    got = vectors_by_id(out)
    assert sorted(got) == sorted(expected)
    assert max(float(np.abs(got[i] - expected[i]).max()) for i in expected) < 1e-5


@needs_ray
@pytest.mark.data
@pytest.mark.slow  # two local clusters: 84 s on this 2-core machine (most of it Ray's and the actors' start-up)
def test_two_workers_equal_the_single_process_embed_after_a_crash_and_a_resume(tmp_path: Path) -> None:
    rows = shared_file("data", "ag_news", "train_subset_10k.tsv").read_text(encoding="utf-8").splitlines()[:240]
    source = write_jsonl(tmp_path / "news.jsonl", [{"id": f"n{i}", "text": row.split("\t")[0]}
                                                   for i, row in enumerate(rows)])
    out = tmp_path / "out"
    ray_tmp = tempfile.mkdtemp(prefix="ekray", dir="/tmp")  # short: Ray's socket paths live below it
    args = ["embed", str(source), "--engine", "ray", "--workers", "2", "--threads-per-worker", "1",
            "--id-field", "id", "--chunk-size", "40", "--out", str(out)]
    crashed = run_cli(args, ray_tmp, ENCODERKIT_EMBED_FAIL_AFTER_SHARDS="2")
    assert crashed.returncode == 130, crashed.stderr
    assert no_ray_left(ray_tmp) == []
    manifest = read_manifest(out)
    assert not manifest["complete"] and 2 <= len(manifest["shards"]) < 6
    before = {e["path"]: (out / e["path"]).stat().st_mtime_ns for e in manifest["shards"]}

    resumed = run_cli(args, ray_tmp)
    assert resumed.returncode == 0, resumed.stderr
    assert f"written before" in resumed.stdout and "core_worker" not in resumed.stderr
    assert no_ray_left(ray_tmp) == []
    manifest = read_manifest(out)
    assert manifest["complete"] and manifest["rows"] == 240 and len(manifest["shards"]) == 6
    assert {f: (out / f).stat().st_mtime_ns for f in before} == before  # finished shards were not redone

    expected = embed_file_by_id(source, tmp_path / "local.npy")
    got = vectors_by_id(out)
    assert sorted(got) == sorted(expected)
    assert max(float(np.abs(got[i] - expected[i]).max()) for i in expected) < 1e-5


def start_cli(args: list[str], ray_tmp: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "RAY_TMPDIR": ray_tmp}
    return subprocess.Popen([sys.executable, "-m", "encoderkit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment)


def wait_for_shards(out: Path, process: subprocess.Popen, count: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if len(read_manifest(out)["shards"]) >= count:
                return
        except (TypeError, DataError):  # not written yet, or caught between its write and rename
            pass
        time.sleep(0.2)
    raise AssertionError(f"no {count} shards within {timeout_s} s: {process.poll()} {process.stderr.read()}")


@needs_ray
@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_or_interrupted_job_leaves_no_ray_process_and_resumes(tmp_path: Path, tiny: Path, how: str) -> None:
    """SIGKILL of the driver: its cluster dies with it (Ray ties gcs_server and raylet to the driver; the
    raylet's agents notice within a minute); Ctrl-C: the job shuts it down before it exits. Either way the
    rerun finishes with every id exactly once."""
    import signal

    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": f"text number {i} " * (1 + i % 7)}
                                                 for i in range(3000)])
    out = tmp_path / "out"
    ray_tmp = tempfile.mkdtemp(prefix="ekray", dir="/tmp")
    args = ["embed", str(source), "--engine", "ray", "--model", str(tiny), "--workers", "2", "--id-field", "id",
            "--chunk-size", "20", "--out", str(out)]
    process = start_cli(args, ray_tmp)
    wait_for_shards(out, process, 3)
    process.send_signal(getattr(signal, how))
    process.communicate(timeout=60)
    assert process.returncode == (-signal.SIGKILL if how == "SIGKILL" else 130)
    if how == "SIGINT":
        assert no_ray_left(ray_tmp) == []
    else:
        killed, deadline = time.monotonic(), time.monotonic() + 90
        time.sleep(5)
        print(f"5 s after the SIGKILL: {ray_processes(ray_tmp)}")
        while ray_processes(ray_tmp) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray_processes(ray_tmp) == []
        print(f"the cluster's last process exited {time.monotonic() - killed:.1f} s after the SIGKILL")
    manifest = read_manifest(out)
    assert not manifest["complete"] and len(manifest["shards"]) >= 3
    resumed = run_cli(args, ray_tmp)
    assert resumed.returncode == 0, resumed.stderr
    assert no_ray_left(ray_tmp) == []
    ids = [i for part, _ in read_shards(out) for i in part]
    assert sorted(ids) == sorted(f"r{i}" for i in range(3000)) and len(set(ids)) == 3000
