"""Embedding on a Ray cluster: ``encoderkit embed INPUT --engine ray --out DIR``.

The driver plans the input into shards (``encoderkit.embeddings.shard_plan``), then runs one Ray Data pipeline:
the descriptors of the shards still to do, mapped over a pool of actors (``ActorPoolStrategy``), each holding
one ``Embedder`` with its own torch thread count. An actor reads its shard's rows straight from the input file
and returns (shard, id, embedding) rows; the driver writes each shard once all of its rows are in, then the
manifest. So INPUT must be readable at the same path on every node of a multi-node cluster (a shared
filesystem), while --out is written by the driver alone.

Without an address the job starts a local cluster and shuts it down when it ends, however it ends; every
process that cluster started is waited for (and killed after a grace period), so none is left behind.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from .. import errors as errors_module
from ..errors import EncoderkitError, InputError
from ..modeling.packing import MAX_BATCH_SIZE
from ..security.provenance import sha256_file
from ..threads import on_compute_thread
from .shard_plan import (MANIFEST, InputShard, Plan, new_manifest, plan_shards, prepare_output, read_shard,
                         write_json_atomically, write_shard)

log = logging.getLogger(__name__)

# A test hook: raise KeyboardInterrupt (as a user's Ctrl-C) once this many shards were written in this run.
FAIL_AFTER_ENV = "ENCODERKIT_EMBED_FAIL_AFTER_SHARDS"
RAY_VERSION = "2.60.0"  # the version the `ray` extra pins
_SHARD_FIELDS = ("index", "path", "format", "start", "rows", "text_field", "id_field", "id_prefix", "offset", "line")


@dataclass
class DistributedEmbedResult:
    out_dir: Path
    rows: int
    dimension: int
    shards: int
    shards_skipped: int  # already written by an earlier, interrupted run
    seconds: float


class ShardEmbedder:
    """A Ray Data actor: one Embedder, ``threads`` torch threads; maps shard descriptors to embedded rows.

    Ray calls the constructor and the calls on threads of its own, not always the same one; the model is loaded
    and run on the process's one compute thread (``encoderkit.threads``: two threads running torch make libgomp
    stop spinning, which cost 1 worker x 2 threads a tenth of its speed). With two threads or more, the batches
    run in two lanes that share them (``Engine.in_lanes``), as ``encoderkit embed`` runs: with two torch threads,
    each of Ray's daemons that preempts one thread stalls both at the next barrier."""

    def __init__(self, model: str | None, threads: int, embedder_options: dict[str, Any],
                 batch_size: int = MAX_BATCH_SIZE) -> None:
        import torch

        from ..engine import lanes_for
        from ..tasks.embed import Embedder

        torch.set_num_threads(threads)
        self.embedder = on_compute_thread(Embedder.from_pretrained, model, **embedder_options)
        self.batch_size = batch_size
        self.lanes = lanes_for(threads)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shard_column, ids, vectors, errors = [], [], [], []
        for row in range(len(batch["index"])):
            shard = shard_from_row({name: batch[name][row] for name in _SHARD_FIELDS})
            try:
                shard_ids, texts = read_shard(shard)
                vectors.append(on_compute_thread(self.embedder.encode, texts, batch_size=self.batch_size,
                                                 lanes=self.lanes))
            except EncoderkitError as exc:
                # Returned as data, not raised: Ray passes the driver a wrapper whose cause chain is lost,
                # and the user should see this one line, not a worker's traceback.
                shard_ids, errors = [""], [f"{type(exc).__name__}\t{exc}"]
                vectors.append(np.zeros((1, self.embedder.dimension), dtype=np.float32))
            ids += shard_ids
            shard_column += [shard.index] * len(shard_ids)
            errors += [""] * (len(shard_column) - len(errors))
        return {"shard": np.asarray(shard_column, dtype=np.int64), "id": np.asarray(ids, dtype=object),
                "embedding": np.concatenate(vectors).astype(np.float32, copy=False),
                "error": np.asarray(errors, dtype=object)}


def shard_from_row(row: dict[str, Any]) -> InputShard:
    """An InputShard from a row of the descriptor dataset (numpy scalars, and None that may come back as NaN/None)."""
    def text(value: Any) -> str | None:
        return None if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)

    return InputShard(index=int(row["index"]), path=str(row["path"]), format=str(row["format"]), start=int(row["start"]),
                 rows=int(row["rows"]), text_field=text(row["text_field"]), id_field=text(row["id_field"]),
                 id_prefix=str(row["id_prefix"]), offset=int(row["offset"]), line=int(row["line"]))


def model_record(model: str | Path | None, embedder_options: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """What identifies the embeddings a model gives (its files' hash and the embedder's settings), and their
    dimension; read from the model directory without loading the weights."""
    from ..config import load_config
    from ..io.hub import resolve_model
    from ..tasks.embed import check_truncate_dim

    resolved = resolve_model(model)
    config = load_config(resolved.weights_dir / "config.json")
    truncate_dim = check_truncate_dim(embedder_options.get("truncate_dim"), config.hidden_size)
    files = {path.name: sha256_file(path) for path in sorted(resolved.weights_dir.iterdir())
             if path.is_file() and path.suffix in (".safetensors", ".bin", ".json", ".txt", ".model")}
    info = resolved.sentence_transformer
    record = {"name": str(model) if model is not None else "default", "path": str(resolved.root.resolve()),
              "model_type": config.model_type, "sha256": hashlib.sha256(json.dumps(files).encode()).hexdigest(),
              "pooling": info.pooling if info else "mean", "normalize": bool(info and info.normalize),
              **{k: embedder_options.get(k) for k in ("dtype", "max_length", "long_text", "truncate_dim", "prompt")}}
    return record, truncate_dim or config.hidden_size


def embed_with_ray(input_spec: str | Path, out_dir: str | Path, *, model: str | Path | None = None,
                   text_field: str | None = None, id_field: str | None = None, shard_size: int = 4096,
                   workers: int = 2, threads_per_worker: int = 1, address: str | None = None,
                   restart: bool = False, batch_size: int = MAX_BATCH_SIZE, show_progress: bool = True,
                   connect_timeout_s: float = 10.0, on_shard: Callable[[dict[str, Any]], None] | None = None,
                   **embedder_options: Any) -> DistributedEmbedResult:
    """Embed every record of ``input_spec`` (a JSONL/Parquet/text file, a directory, or a glob) into Parquet
    shards in ``out_dir`` on a Ray cluster: ``workers`` actors of ``threads_per_worker`` torch threads each.

    ``address``: a running cluster ("auto", "HOST:PORT" or "ray://HOST:PORT"); None starts a local one of
    ``workers * threads_per_worker`` CPUs for this job. If Ray is already initialised in this process, that
    connection is used and left open. ``shard_size``: rows per shard, the unit of work and of resumption.
    ``restart``: remove this job's earlier output instead of resuming it. ``embedder_options`` go to
    ``Embedder.from_pretrained`` in every actor (dtype, max_length, long_text, truncate_dim).
    """
    from ..progress import Progress

    start_time = time.perf_counter()
    for name, value in (("--workers", workers), ("--threads-per-worker", threads_per_worker),
                        ("--batch-size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{name} must be a positive integer, found {value!r}")
    out_dir = Path(out_dir)
    plan = plan_shards(input_spec, shard_size=shard_size, text_field=text_field, id_field=id_field)
    record, dimension = model_record(model, embedder_options)
    manifest = new_manifest(plan, record, dimension)
    _, pending = prepare_output(out_dir, manifest, plan, restart=restart, write=False)  # refusals come first
    skipped = len(plan.shards) - len(pending)
    if not pending:
        prepare_output(out_dir, manifest, plan, restart=restart)
    else:
        fail_after = int(os.environ.get(FAIL_AFTER_ENV, "0") or 0)
        _require_ray()
        with ray_cluster(address, num_cpus=workers * threads_per_worker, timeout_s=connect_timeout_s), \
                Progress(plan.rows, "embedding", "texts", enabled=show_progress) as progress:
            # written once the cluster is up: a job that never started leaves no directory behind
            manifest, pending = prepare_output(out_dir, manifest, plan, restart=restart)
            if skipped:
                log.warning("resuming %s: %d of %d shards (%d of %d rows) were already written", out_dir, skipped,
                            len(plan.shards), manifest["count"], plan.rows)
            progress.skip(manifest["count"])
            written = 0
            for shard, ids, vectors in _run_pipeline(pending, model, embedder_options, workers=workers,
                                                     threads=threads_per_worker, batch_size=batch_size):
                if vectors.shape[1] != dimension:
                    raise InputError(f"the model gave {vectors.shape[1]}-dimensional vectors, {dimension} expected")
                entry = write_shard(out_dir, shard, ids, vectors)
                manifest["shards"] = sorted(manifest["shards"] + [entry], key=lambda e: e["index"])
                manifest["count"] += shard.rows
                manifest["complete"] = len(manifest["shards"]) == len(plan.shards)
                write_json_atomically(out_dir / MANIFEST, manifest)
                progress.advance(shard.rows)
                written += 1
                if on_shard is not None:
                    on_shard(entry)
                if fail_after and written >= fail_after and not manifest["complete"]:
                    raise KeyboardInterrupt(f"{FAIL_AFTER_ENV}={fail_after}: stopped after {written} shards")
        if not manifest["complete"]:
            raise InputError(f"the Ray job ended with {len(manifest['shards'])} of {len(plan.shards)} shards written; "
                             "rerun the same command to finish it")
    return DistributedEmbedResult(out_dir, plan.rows, dimension, len(plan.shards), skipped,
                                  time.perf_counter() - start_time)


def _run_pipeline(pending: list[InputShard], model: str | Path | None, embedder_options: dict[str, Any], *, workers: int,
                  threads: int, batch_size: int) -> Iterator[tuple[InputShard, list[str], np.ndarray]]:
    """Map the pending shards over the actor pool; yield each shard once all of its rows came back."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job shows one bar of its own
    context.print_on_execution_start = False
    descriptors = [{name: getattr(shard, name) for name in _SHARD_FIELDS} for shard in pending]
    dataset = ray.data.from_items(descriptors, override_num_blocks=len(descriptors)).map_batches(
        ShardEmbedder, batch_size=1, batch_format="numpy", num_cpus=threads,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(pending))),
        fn_constructor_kwargs={"model": None if model is None else str(model), "threads": threads,
                               "embedder_options": embedder_options, "batch_size": batch_size})
    # prefetch_batches=0: with Ray's default (1) the iterator holds each output until the next one is in, so a
    # shard would reach the driver (and the disk, where a rerun finds it) a whole shard's time after it was done
    yield from collect_shards(dataset.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0),
                              pending)


def collect_shards(batches: Iterable[dict[str, np.ndarray]],
                   pending: list[InputShard]) -> Iterator[tuple[InputShard, list[str], np.ndarray]]:
    """Group the actors' output rows (in any order, a shard possibly split over batches) by shard; yield each
    shard once all of its rows are in. An error an actor returned is raised here, as the encoderkit error."""
    by_index = {shard.index: shard for shard in pending}
    parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    counts: dict[int, int] = {}
    for batch in batches:
        failed = [message for message in batch["error"] if message]
        if failed:
            name, message = failed[0].split("\t", 1)
            raise getattr(errors_module, name, EncoderkitError)(message)
        for index in np.unique(batch["shard"]):
            rows = batch["shard"] == index
            index = int(index)
            parts.setdefault(index, []).append((batch["id"][rows], np.asarray(batch["embedding"][rows])))
            counts[index] = counts.get(index, 0) + int(rows.sum())
            if counts[index] == by_index[index].rows:
                pieces = parts.pop(index)
                ids = [str(i) for piece in pieces for i in piece[0]]
                yield by_index[index], ids, np.concatenate([piece[1] for piece in pieces])


def _require_ray() -> None:
    from ..extras import require

    require("ray", f"--engine ray (Ray Data, ray[data]=={RAY_VERSION})")
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:  # ray without its data part
        raise InputError(f"--engine ray needs Ray Data: pip install 'encoderkit[ray]' (ray[data]=={RAY_VERSION}); "
                         f"{exc}") from exc


# ---------------------------------------------------------------------------------------------
# The cluster: connect to one, or start a local one that dies with the job
# ---------------------------------------------------------------------------------------------
@contextmanager
def ray_cluster(address: str | None, *, num_cpus: int, timeout_s: float = 10.0) -> Iterator[None]:
    """Ray initialised for the job: an existing connection of this process (left open), a cluster at
    ``address`` (checked reachable within ``timeout_s``, disconnected at the end), or a local cluster of
    ``num_cpus`` CPUs, shut down at the end with every process it started."""
    import ray

    if ray.is_initialized():
        _check_cpus(ray, num_cpus)
        yield
        return
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
    # Ray's C++ core logs notices at error level (e.g. that Ray Data's actors keep constructor arguments in the
    # object store); failures still reach the driver as exceptions. A user's own setting wins.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    for name in ("ray", "ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if address is not None:
        _check_reachable(address, timeout_s)
        try:
            ray.init(address=address, **quiet)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, TimeoutError ... from ray.init
            raise InputError(f"cannot connect to the Ray cluster at --address {address}: {str(exc).rstrip('.')}. "
                             "Start one with "
                             "`ray start --head` (then --address auto on that machine, or HOST:6379 elsewhere), "
                             "or drop --address to run on a local cluster") from None
        try:
            _check_cpus(ray, num_cpus)
            yield
        finally:
            ray.shutdown()
        return
    before = _descendants(os.getpid())
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **quiet)
        yield
    finally:
        started = _descendants(os.getpid()) - before  # gcs_server, raylet, their workers and helpers
        if ray.is_initialized():
            ray.shutdown()
        _reap(started)


def _check_cpus(ray: Any, num_cpus: int) -> None:
    available = ray.cluster_resources().get("CPU", 0)
    if available < num_cpus:
        raise InputError(f"the Ray cluster has {available:g} CPUs; --workers x --threads-per-worker asks for "
                         f"{num_cpus}: ask for fewer, or add nodes")


def _check_reachable(address: str, timeout_s: float) -> None:
    """Fail fast, with the reason, when nothing listens at HOST:PORT ("auto" is left to Ray to find)."""
    target = address.split("://", 1)[-1]
    if target == "auto" or ":" not in target:
        if target != "auto":
            raise InputError(f"--address must be auto, HOST:PORT or ray://HOST:PORT, found {address!r}")
        return
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        raise InputError(f"--address {address!r}: the port must be a number")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise InputError(f"cannot reach the Ray cluster at --address {address} ({reason} within {timeout_s:g} s). "
                         "Start one with `ray start --head`, check the host and port (the head's GCS port, 6379 by "
                         "default), or drop --address to run on a local cluster") from None


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _reap(pids: set[int], grace_s: float = 10.0) -> None:
    """Wait for the local cluster's processes to exit after ray.shutdown(); kill those still there after
    ``grace_s`` (workers exit a few seconds after their raylet)."""
    deadline = time.monotonic() + grace_s
    alive = set(pids)
    while alive:
        alive = {pid for pid in alive if _running(pid)}
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in alive:
        log.warning("killing Ray process %d, still running %g s after the local cluster was shut down", pid, grace_s)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait() is missing
