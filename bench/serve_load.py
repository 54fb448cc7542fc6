"""Load and fault benchmark of `encoderkit serve` (issue 21): throughput and latency against Infinity and a plain
FastAPI + sentence-transformers server, a soak, SIGTERM under load, and clients that hang up mid-request.

Every server is a subprocess on a free loopback port, serving all-MiniLM-L6-v2 from the same directory in fp32 with
2 torch threads (``OMP_NUM_THREADS=2``):

- **encoderkit**: ``encoderkit serve default``, ``POST /embed`` with ``"truncate": true``;
- **Infinity** (``infinity-emb[server,torch,optimum]``): ``infinity_emb v2 --engine torch --device cpu``, ``POST
  /embeddings``; and **Infinity optimum**, ``--engine optimum``, its documented CPU engine (ONNX Runtime through
  optimum, on an fp32 ONNX export made once by optimum and graph-optimised by Infinity at its start); the goal is
  judged against the better of the two.
  It pins sentence-transformers < 4 and numpy < 2, so it runs from a virtual environment of its own,
  ``bench/.venv-infinity``, made here on first use: torch 2.13.0 first, then infinity-emb with the versions of
  ``bench/infinity-constraints.txt`` (which keeps torch at 2.13.0);
- **FastAPI + sentence-transformers**: ``bench/serve_baseline.py``, the server a user writes by hand.

Every server truncates to the model's 256 tokens. Traffic goes to 127.0.0.1 only, from one asyncio process that speaks
HTTP/1.1 keep-alive on raw sockets (cheap, so the client takes little of the two cores), and every loop is bounded
in requests and seconds. The requests are one fixed list, drawn once with seed 0: 1 to 8 texts each from
``../shared/bench/sentences.txt``; every round starts at its beginning.

Parts (``--parts``; parts not rerun keep their last results):

- ``load``: 1, 8 and 64 concurrent clients (each sends its next request when the last is answered). For each
  number of clients, rounds of ``--warmup`` + ``--duration`` seconds rotate over the servers, ``--repeats`` times
  (the first server of each repeat moves on by one). Throughput: texts of the requests answered inside the measured
  window, per second; latency: of the requests sent inside it. Reported: medians over the repeats.
- ``soak``: encoderkit alone, 8 clients for ``--soak-seconds``, the server's RSS (``/proc/PID/status``) sampled
  every ``--soak-sample`` seconds.
- ``sigterm``: encoderkit under 64 clients; SIGTERM after a few seconds; the clients send nothing new from then
  on. Every request sent before the signal must be answered 200, and the process must exit 0.
- ``disconnect``: encoderkit with 32 steady clients, alone and beside 8 clients that send the same kind of
  requests and hang up 0.2-0.6 s after sending (before their answer), in ABBA rounds. The steady
  clients' throughput and p99 with the hang-ups against without, and what /metrics counted (499s, queued sequences
  dropped, sequences run for clients gone).

    python bench/serve_load.py [--parts load,soak,sigterm,disconnect] [--duration 20] [--repeats 3] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import smoke_training
from common import (CACHE, RESULTS, ROOT, SHARED, SMOKE, median, provenance, require, rotated, smoke_size,
                    write_result)

THREADS = 2
# A smoke run: rounds of 0.5 + 1 s at 1 and 4 clients, one repeat, a soak of 3 s, SIGTERM after 1.5 s under 8
# clients, and Infinity only where its virtual environment is already made (a smoke run installs nothing).
CLIENTS = smoke_size((1, 8, 64), (1, 4))
IDLE_SECONDS = smoke_size(3, 1)  # how long each idle server's CPU use is watched
SIGTERM_CLIENTS, SIGTERM_AFTER = smoke_size(64, 8), smoke_size(6.0, 1.5)
PARTS = ("load", "soak", "sigterm", "disconnect")
INFINITY_VERSION = "0.0.78"
INFINITY_VENV = ROOT / "bench" / ".venv-infinity"
INFINITY_CONSTRAINTS = ROOT / "bench" / "infinity-constraints.txt"
MAX_REQUESTS_PER_ROUND = 100_000  # a bound besides the time: no round sends more
START_TIMEOUT = 300.0
SERVERS = ("encoderkit", "Infinity", "Infinity optimum", "FastAPI + sentence-transformers")
INFINITY_SERVERS = ("Infinity", "Infinity optimum")


# ---------------------------------------------------------------------------------------------------- requests

def request_list(texts: list[str], count: int = 20_000, seed: int = 0) -> list[list[str]]:
    """The fixed list of requests: 1 to 8 texts each, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, size=count)
    return [[texts[i] for i in rng.integers(0, len(texts), size=size)] for size in sizes]


@dataclass
class Flavour:
    """How one server is asked: the path, the body for a list of texts, and how many vectors an answer holds."""

    path: str
    body: Callable[[list[str]], dict[str, Any]]
    vectors: Callable[[Any], list[list[float]]]

    def encode(self, texts: list[str]) -> bytes:
        return json.dumps(self.body(texts)).encode()


FLAVOURS = {
    "encoderkit": Flavour("/embed", lambda texts: {"inputs": texts, "truncate": True}, lambda answer: answer),
    **{name: Flavour("/embeddings", lambda texts: {"input": texts, "model": "minilm"},
                     lambda answer: [row["embedding"] for row in answer["data"]]) for name in INFINITY_SERVERS},
    "FastAPI + sentence-transformers": Flavour("/embed", lambda texts: {"inputs": texts}, lambda answer: answer),
}


# ---------------------------------------------------------------------------------------------------- HTTP client

class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1 on raw asyncio streams: a POST, its status and body."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, path: str, body: bytes) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        await self.writer.drain()

    async def answer(self) -> tuple[int, bytes]:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append(await self.reader.readexactly(size + 2))
                if size == 0:
                    break
            body = b"".join(part[:-2] for part in parts)
        else:
            body = await self.reader.read()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        await self.send(path, body)
        return await self.answer()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    def abort(self) -> None:
        """Hang up at once (a reset, as a client that is killed or times out)."""
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None


async def get(port: int, path: str, timeout: float = 10) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


# ---------------------------------------------------------------------------------------------------- servers

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
           "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return env


class Server:
    """A server subprocess on a free loopback port, up once ``GET /health`` answers 200; its output goes to a log."""

    def __init__(self, name: str, command: list[str], log: Path, cwd: Path = ROOT) -> None:
        self.name = name
        self.port = free_port()
        self.command = [part.replace("{port}", str(self.port)) for part in command]
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("w")
        started = time.perf_counter()
        self.process = subprocess.Popen(self.command, env=server_environment(), stdout=self.log,
                                        stderr=subprocess.STDOUT, cwd=cwd)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.process.returncode} while starting: "
                                   f"{self.tail()}")
            try:
                if asyncio.run(get(self.port, "/health", 2))[0] == 200:
                    break
            except (OSError, asyncio.TimeoutError, IndexError, ValueError):
                pass
            if time.perf_counter() - started > START_TIMEOUT:
                self.stop()
                raise RuntimeError(f"{name} did not answer /health within {START_TIMEOUT:.0f} s: {self.tail()}")
            time.sleep(0.5)
        self.start_seconds = time.perf_counter() - started

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tail(self, characters: int = 3000) -> str:
        if not self.log.closed:  # stop() closes it
            self.log.flush()
        return self.log_path.read_text(errors="replace")[-characters:]

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self.log.close()


def model_dir() -> Path:
    from encoderkit import default_model_path

    return Path(default_model_path())


def infinity_binary() -> Path:
    """bench/.venv-infinity's ``infinity_emb``, making the environment first where it is missing."""
    binary = INFINITY_VENV / "bin" / "infinity_emb"
    if binary.is_file():
        return binary
    pip = [str(INFINITY_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    steps = [[sys.executable, "-m", "venv", str(INFINITY_VENV)],
             pip + ["torch==2.13.0"],  # first and pinned: an unpinned torch pulls the CUDA build
             pip + ["-c", str(INFINITY_CONSTRAINTS), f"infinity-emb[server,torch,optimum]=={INFINITY_VERSION}"]]
    for step in steps:
        print("  $", " ".join(step), flush=True)
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(step)}` failed ({done.returncode}): {(done.stderr or done.stdout)[-3000:]}")
    return binary


def infinity_onnx_model(model: Path) -> Path:
    """A copy of ``model`` with ``model.onnx`` beside its files, for ``--engine optimum``: Infinity's optimum
    engine loads an ONNX file from the model's folder (the hub's all-MiniLM-L6-v2 carries them; the installed copy
    has none) and writes its optimised graph there. Exported once by optimum in Infinity's own environment, in
    fp32 (the table's precision for every server: Infinity would pick a quantised file from the hub where one is).
    Infinity 0.0.78 hands optimum 2 the file's path as it globbed it, and optimum matches it against bare file
    names: so the file lies at the top of the folder, and the server runs in that folder with ``--model-id .``.
    That engine truncates at the model's max_position_embeddings (512), not its sentence-transformers
    max_seq_length (256): a few long texts cost it more, and their vectors differ from the others'."""
    target = CACHE / "serve_load" / f"{model.name}-onnx"
    if (target / "model.onnx").is_file():
        return target
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model, target)
    export = ("import sys; from optimum.onnxruntime import ORTModelForFeatureExtraction as M; "
              "M.from_pretrained(sys.argv[1], export=True).save_pretrained(sys.argv[2])")
    done = subprocess.run([str(infinity_binary().parent / "python"), "-c", export, str(model), str(target / "onnx")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"optimum's ONNX export failed: {(done.stderr or done.stdout)[-3000:]}")
    (target / "onnx" / "model.onnx").rename(target / "model.onnx")
    shutil.rmtree(target / "onnx")
    return target


def commands(model: Path) -> dict[str, Callable[[], list[str]]]:
    return {
        "encoderkit": lambda: [sys.executable, "-m", "encoderkit.cli", "serve", "default", "--port", "{port}"],
        **{name: (lambda engine=engine: [
            str(infinity_binary()), "v2", "--model-id", "." if engine == "optimum" else str(model),
            "--served-model-name", "minilm", "--engine", engine, "--device", "cpu", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", "{port}", "--no-vector-disk-cache", "--log-level", "warning",
            # the optimum engine pools by [CLS] unless told (its "auto"); the model is mean-pooled
            *(["--pooling-method", "mean"] if engine == "optimum" else [])])
           for name, engine in (("Infinity", "torch"), ("Infinity optimum", "optimum"))},
        "FastAPI + sentence-transformers": lambda: [sys.executable, str(ROOT / "bench" / "serve_baseline.py"),
                                                    str(model), "--port", "{port}"],
    }


def start(name: str, model: Path, logs: Path, extra: tuple[str, ...] = ()) -> Server:
    # Infinity's optimum engine runs in the exported model's folder, named "." (see infinity_onnx_model)
    cwd = infinity_onnx_model(model) if name == "Infinity optimum" else ROOT
    log = logs / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".log")
    server = Server(name, commands(model)[name]() + list(extra), log, cwd)
    print(f"  {name} up on port {server.port} after {server.start_seconds:.1f} s (pid {server.pid})", flush=True)
    return server


# ---------------------------------------------------------------------------------------------------- load

@dataclass
class Round:
    """What the clients of one round saw. ``done``: (sent, answered, texts, status) per request."""

    clients: int
    window: tuple[float, float]
    done: list[tuple[float, float, int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    first_answer: Any = None

    def summary(self) -> dict[str, Any]:
        low, high = self.window
        texts = sum(n for _, answered, n, status in self.done if low <= answered <= high and status == 200)
        latencies = [answered - sent for sent, answered, _, status in self.done if low <= sent <= high]
        statuses: dict[str, int] = {}
        for *_, status in self.done:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        return {"texts_per_second": texts / (high - low),
                "p50_ms": 1000 * float(np.percentile(latencies, 50)) if latencies else float("nan"),
                "p99_ms": 1000 * float(np.percentile(latencies, 99)) if latencies else float("nan"),
                "requests": len(self.done), "measured_requests": len(latencies), "statuses": statuses,
                "errors": len(self.errors), "first_error": self.errors[0] if self.errors else None}


async def run_clients(port: int, flavour: Flavour, requests: list[list[str]], clients: int, warmup: float,
                      duration: float, stop: asyncio.Event | None = None, on_start: Callable[[], Any] | None = None
                      ) -> Round:
    """``clients`` closed-loop clients for ``warmup + duration`` seconds (or until ``stop`` is set): each sends the
    next request of the list once its last is answered; requests sent are all answered (or fail) before returning."""
    bodies: dict[int, bytes] = {}
    started = time.perf_counter()
    result = Round(clients, (started + warmup, started + warmup + duration))
    deadline = started + warmup + duration
    next_index = 0
    if on_start is not None:
        on_start()

    async def client() -> None:
        nonlocal next_index
        connection = Connection(port)
        try:
            while time.perf_counter() < deadline and not (stop and stop.is_set()) \
                    and next_index < min(len(requests), MAX_REQUESTS_PER_ROUND):
                index, next_index = next_index, next_index + 1
                texts = requests[index]
                body = bodies.get(index) or bodies.setdefault(index, flavour.encode(texts))
                sent = time.perf_counter()
                try:
                    status, answer = await connection.post(flavour.path, body)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    result.errors.append(f"{type(exc).__name__}: {exc}")
                    result.done.append((sent, time.perf_counter(), len(texts), -1))
                    connection.abort()
                    continue
                result.done.append((sent, time.perf_counter(), len(texts), status))
                if result.first_answer is None and status == 200:
                    result.first_answer = (texts, json.loads(answer))
                elif status != 200 and len(result.errors) < 20:
                    result.errors.append(f"HTTP {status}: {answer[:300]!r}")
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return result


def check_answer(name: str, result: Round) -> None:
    texts, answer = result.first_answer
    vectors = FLAVOURS[name].vectors(answer)
    if len(vectors) != len(texts) or len(vectors[0]) != 384:
        raise RuntimeError(f"{name} answered {len(vectors)} vectors of {len(vectors[0])} for {len(texts)} texts")


async def vectors_of(port: int, name: str, texts: list[str]) -> np.ndarray:
    connection = Connection(port)
    try:
        status, body = await connection.post(FLAVOURS[name].path, FLAVOURS[name].encode(texts))
    finally:
        connection.close()
    if status != 200:
        raise RuntimeError(f"{name}: HTTP {status} {body[:300]!r}")
    return np.asarray(FLAVOURS[name].vectors(json.loads(body)), dtype=np.float64)


def run_load(servers: dict[str, Server], requests: list[list[str]], clients: tuple[int, ...], repeats: int,
             warmup: float, duration: float) -> dict[str, Any]:
    names = list(servers)
    check = requests[0] + requests[1] + [max((t for r in requests[:200] for t in r), key=len)]  # one over 256 tokens
    reference = asyncio.run(vectors_of(servers["encoderkit"].port, "encoderkit", check))
    agreement = {name: float(np.abs(asyncio.run(vectors_of(server.port, name, check)) - reference).max())
                 for name, server in servers.items()}
    print(f"  max abs difference from encoderkit's vectors ({len(check)} texts): {agreement}", flush=True)
    idle = {}
    for name, server in servers.items():  # what an idle server costs the others (all stay up through the rounds)
        before = server.cpu_seconds()
        time.sleep(IDLE_SECONDS)
        idle[name] = (server.cpu_seconds() - before) / IDLE_SECONDS
    rounds: list[dict[str, Any]] = []
    for count in clients:
        for repeat in range(repeats):
            order = rotated(names, repeat)
            for name in order:
                server = servers[name]
                cpu = server.cpu_seconds()
                result = asyncio.run(run_clients(server.port, FLAVOURS[name], requests, count, warmup, duration))
                check_answer(name, result)
                row = {"server": name, "clients": count, "repeat": repeat, **result.summary(),
                       "server_cpu_seconds": server.cpu_seconds() - cpu}
                rounds.append(row)
                print(f"  {count:3d} clients, repeat {repeat}: {name:32s} {row['texts_per_second']:7.1f} texts/s  "
                      f"p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  ({row['requests']} requests, "
                      f"{row['errors']} errors)", flush=True)
    rows = []
    for name in names:
        for count in clients:
            mine = [r for r in rounds if r["server"] == name and r["clients"] == count]
            rows.append({"server": name, "clients": count,
                         **{key: median([r[key] for r in mine]) for key in ("texts_per_second", "p50_ms", "p99_ms")},
                         "requests": sum(r["requests"] for r in mine), "errors": sum(r["errors"] for r in mine)})
    return {"rows": rows, "rounds": rounds, "max_abs_diff_vs_encoderkit": agreement,
            "idle_cpu_share": idle, "start_seconds": {n: s.start_seconds for n, s in servers.items()}}


def goal(rows: list[dict[str, Any]], clients: int = 64) -> dict[str, Any] | None:
    at = {r["server"]: r for r in rows if r["clients"] == clients}
    infinity = [at[name] for name in INFINITY_SERVERS if name in at]
    if "encoderkit" not in at or not infinity:
        return None
    ours, theirs = at["encoderkit"], max(infinity, key=lambda row: row["texts_per_second"])  # Infinity at its best
    ratio = ours["texts_per_second"] / theirs["texts_per_second"]
    return {"clients": clients, "against": theirs["server"], "throughput_ratio": ratio,
            "encoderkit_p99_ms": ours["p99_ms"],
            "infinity_p99_ms": theirs["p99_ms"], "throughput_met": ratio >= 1.5,
            "p99_met": ours["p99_ms"] < theirs["p99_ms"], "met": ratio >= 1.5 and ours["p99_ms"] < theirs["p99_ms"]}


# ---------------------------------------------------------------------------------------------------- soak

def run_soak(model: Path, logs: Path, requests: list[list[str]], seconds: float, every: float,
             clients: int = 8) -> dict[str, Any]:
    # --steady-memory: the recorded soak (RSS 351 -> 869 MiB) ran with it; without it RSS climbs to a 2.0 GiB
    # plateau within two minutes (the 10:05 UTC run of 2026-11-25), and throughput is about 30% higher
    server = start("encoderkit", model, logs, ("--steady-memory",))
    samples: list[tuple[float, float]] = []
    try:
        async def go() -> Round:
            began = time.perf_counter()
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append((time.perf_counter() - began, server.rss_mib()))
                    try:
                        await asyncio.wait_for(stop.wait(), every)
                    except asyncio.TimeoutError:
                        pass

            sampler = asyncio.ensure_future(sample())
            result = await run_clients(server.port, FLAVOURS["encoderkit"], requests * 3, clients, 0.0, seconds)
            stop.set()
            await sampler
            return result

        result = asyncio.run(go())
        samples.append((samples[-1][0] + every, server.rss_mib()))
    finally:
        code = server.stop()
    rss = [m for _, m in samples]
    after_minute = [m for t, m in samples if t >= 60] or rss
    growth = rss[-1] - after_minute[0]
    # After the warm-up (the allocator and oneDNN's primitive cache fill while batches of new shapes arrive; on a
    # slow machine that takes longer), the second half of the soak shows whether memory still grows.
    half = np.array([(t, m) for t, m in samples if t >= seconds / 2]) if len(samples) > 2 else np.array(samples)
    late_slope = float(np.polyfit(half[:, 0], half[:, 1], 1)[0] * 60) if len(half) > 1 else 0.0
    late_mean = float(half[:, 1].mean())
    summary = result.summary()
    return {"seconds": seconds, "clients": clients, "sample_every_seconds": every, "samples": samples,
            "start_rss_mib": rss[0], "rss_at_60s_mib": after_minute[0], "end_rss_mib": rss[-1], "max_rss_mib": max(rss),
            "growth_after_first_minute_mib": growth, "second_half_slope_mib_per_minute": late_slope,
            "second_half_mean_mib": late_mean, "second_half_range_mib": float(half[:, 1].max() - half[:, 1].min()),
            "flat": late_slope <= 0.005 * late_mean,
            "flat_rule": "over the second half of the soak, the fitted slope of RSS is at most 0.5% of its mean a minute",
            "requests": summary["requests"], "errors": summary["errors"], "statuses": summary["statuses"],
            "texts_per_second": summary["texts_per_second"], "exit_code": code}


# ---------------------------------------------------------------------------------------------------- SIGTERM

def run_sigterm(model: Path, logs: Path, requests: list[list[str]], clients: int = 64,
                after: float = 6.0) -> dict[str, Any]:
    server = start("encoderkit", model, logs)
    flavour = FLAVOURS["encoderkit"]
    record: dict[str, Any] = {}

    async def go() -> dict[str, Any]:
        stop = asyncio.Event()
        signalled: dict[str, float] = {}
        outcomes: list[tuple[float, float, int, str]] = []  # (sent, answered, status, error)

        async def client(offset: int) -> None:
            connection = Connection(server.port)
            index = offset
            try:
                while not stop.is_set() and index < len(requests):
                    sent = time.perf_counter()
                    try:
                        status, _ = await connection.post(flavour.path, flavour.encode(requests[index]))
                        outcomes.append((sent, time.perf_counter(), status, ""))
                    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                        outcomes.append((sent, time.perf_counter(), -1, f"{type(exc).__name__}: {exc}"))
                        connection.abort()
                    index += clients
            finally:
                connection.close()

        tasks = [asyncio.ensure_future(client(i)) for i in range(clients)]
        await asyncio.sleep(after)
        stop.set()  # nothing new is sent from here on
        signalled["at"] = time.perf_counter()
        os.kill(server.pid, signal.SIGTERM)
        await asyncio.sleep(0.5)
        try:  # a new connection after the signal: the server should no longer accept
            late = await get(server.port, "/health", 2)
            record["new_connection_after_sigterm"] = f"answered {late[0]}"
        except (OSError, asyncio.TimeoutError) as exc:
            record["new_connection_after_sigterm"] = f"refused ({type(exc).__name__})"
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        at = signalled["at"]
        in_flight = [o for o in outcomes if o[0] < at < o[1]]
        return {"in_flight_at_sigterm": len(in_flight),
                "answered_200": sum(1 for o in in_flight if o[2] == 200),
                "other_status": sum(1 for o in in_flight if o[2] not in (200, -1)),
                "connection_errors": sum(1 for o in in_flight if o[2] == -1),
                "first_error": next((o[3] for o in in_flight if o[3]), None),
                "last_answer_after_sigterm_seconds": max((o[1] - at for o in in_flight), default=0.0),
                "answered_before_sigterm": sum(1 for o in outcomes if o[1] <= at), "sigterm_at": at}

    try:
        counts = asyncio.run(go())
        code = server.process.wait(timeout=120)
        exited = time.perf_counter() - counts.pop("sigterm_at")
    finally:
        if server.process.poll() is None:
            server.stop()
        server.log.close()
    counts.update(record)
    return {"clients": clients, "signal_after_seconds": after, **counts, "exit_code": code,
            "exit_after_sigterm_seconds": exited,
            "all_answered": counts["in_flight_at_sigterm"] > 0 and counts["answered_200"] == counts["in_flight_at_sigterm"],
            "passed": code == 0 and counts["in_flight_at_sigterm"] > 0
            and counts["answered_200"] == counts["in_flight_at_sigterm"]}


# ---------------------------------------------------------------------------------------------------- hang-ups

def metrics_of(port: int) -> dict[str, float]:
    from_text = asyncio.run(get(port, "/metrics"))[1].decode()
    values: dict[str, float] = {"cancelled": 0.0, "orphaned": 0.0, "status_499": 0.0, "batched_sequences": 0.0}
    for line in from_text.splitlines():
        if line.startswith("encoderkit_cancelled_items_total"):
            values["cancelled"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("encoderkit_orphaned_items_total"):
            values["orphaned"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("encoderkit_requests_total") and 'status="499"' in line:
            values["status_499"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("encoderkit_batch_size_sum"):
            values["batched_sequences"] += float(line.rsplit(" ", 1)[1])
    return values


DISCONNECT_MODES = ("alone", "hang up", "wait")


def run_disconnect(model: Path, logs: Path, requests: list[list[str]], warmup: float, duration: float,
                   repeats: int, steady: int = 32, extra: int = 8, hang_up_after: tuple[float, float] = (0.2, 0.6),
                   pause: float = 0.25) -> dict[str, Any]:
    """What a client that hangs up costs the others. Steady clients run three ways, in rounds that alternate the
    order: alone; beside ``extra`` clients that send on a fixed schedule (a request, ``hang_up_after`` seconds,
    ``pause`` seconds, the next) and hang up (a reset) before their answer; and beside the same clients on the same
    schedule that stay for their answer. Hanging up costs nothing when the steady clients do at least as well beside
    the clients that hang up as beside those that wait: the server then spends nothing on a request once its
    client has gone, beyond the batch already running. /metrics counts what was dropped from the queue
    (``encoderkit_cancelled_items_total``) and what a running batch computed for a client that had left
    (``encoderkit_orphaned_items_total``)."""
    server = start("encoderkit", model, logs)
    flavour = FLAVOURS["encoderkit"]
    rng = random.Random(0)
    their_requests = requests[len(requests) // 2:]  # not the steady clients' requests
    rounds = []

    async def waiter(connection: Connection) -> None:
        try:
            await connection.answer()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            connection.close()

    async def extra_client(stop: asyncio.Event, hang_up: bool, sent: list[int], waiting: list[asyncio.Task]) -> None:
        while not stop.is_set():
            connection = Connection(server.port)
            texts = their_requests[rng.randrange(len(their_requests))]
            try:
                await connection.send(flavour.path, flavour.encode(texts))
                sent.append(len(texts))
            except OSError:
                connection.abort()
                continue
            if not hang_up:
                waiting.append(asyncio.ensure_future(waiter(connection)))
            await asyncio.sleep(rng.uniform(*hang_up_after))
            if hang_up:
                connection.abort()
            await asyncio.sleep(pause)

    async def one_round(mode: str) -> tuple[Round, int]:
        stop = asyncio.Event()
        sent: list[int] = []
        waiting: list[asyncio.Task] = []
        tasks = [asyncio.ensure_future(extra_client(stop, mode == "hang up", sent, waiting))
                 for _ in range(0 if mode == "alone" else extra)]
        result = await run_clients(server.port, flavour, requests, steady, warmup, duration)
        stop.set()
        await asyncio.gather(*tasks)
        await asyncio.gather(*waiting)  # the waiting clients' last answers
        await asyncio.sleep(1.0)  # the hung-up requests' leftovers are dropped or run
        return result, sum(sent)

    orders = (DISCONNECT_MODES, tuple(reversed(DISCONNECT_MODES)))
    try:
        for repeat in range(repeats):
            for mode in orders[repeat % 2]:
                before = metrics_of(server.port)
                result, sent_texts = asyncio.run(one_round(mode))
                after = metrics_of(server.port)
                delta = {k: after[k] - before[k] for k in after}
                summary = result.summary()
                row = {"mode": mode, "repeat": repeat, **summary, "extra_texts_sent": sent_texts,
                       "hung_up_requests": int(delta["status_499"]), "cancelled_sequences": int(delta["cancelled"]),
                       "orphaned_sequences": int(delta["orphaned"]),
                       "batched_sequences": int(delta["batched_sequences"])}
                rounds.append(row)
                print(f"  {mode}: {row['texts_per_second']:.1f} texts/s, p99 {row['p99_ms']:.0f} ms; extra texts "
                      f"sent {sent_texts}, 499s {row['hung_up_requests']}, dropped from the queue "
                      f"{row['cancelled_sequences']}, computed for a client gone {row['orphaned_sequences']}",
                      flush=True)
    finally:
        server.stop()
    return {"steady_clients": steady, "extra_clients": extra, "hang_up_after_seconds": list(hang_up_after),
            "pause_seconds": pause, **disconnect_summary(rounds)}


def disconnect_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of the hang-up part, their medians per mode and whether hanging up cost the others anything."""
    by_mode = {mode: [r for r in rounds if r["mode"] == mode] for mode in DISCONNECT_MODES}
    throughput = {mode: median([r["texts_per_second"] for r in rows]) for mode, rows in by_mode.items()}
    p99 = {mode: median([r["p99_ms"] for r in rows]) for mode, rows in by_mode.items()}
    hung = by_mode["hang up"]
    # nothing answered beside the waiting clients (a smoke run's second of a busy machine): no ratio
    ratio = throughput["hang up"] / throughput["wait"] if throughput["wait"] else float("nan")
    return {"rounds": rounds, "throughput": throughput, "p99_ms": p99,
            "hang_up_vs_wait": ratio,
            "hung_up_texts": sum(r["extra_texts_sent"] for r in hung),
            "hung_up_requests": sum(r["hung_up_requests"] for r in hung),
            "cancelled_sequences": sum(r["cancelled_sequences"] for r in hung),
            "orphaned_sequences": sum(r["orphaned_sequences"] for r in hung),
            "costs_nothing": ratio >= 0.97, "costs_nothing_rule": "steady texts/s beside the clients that hang up "
            "at least 0.97x that beside the same clients waiting for their answers (the rounds' spread)",
            "errors": sum(r["errors"] for r in rounds)}


# ---------------------------------------------------------------------------------------------------- plots

def plot_load(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, style in zip(SERVERS, ("o-", "s--", "d-.", "^:")):
        mine = sorted((r for r in rows if r["server"] == name), key=lambda r: r["clients"])
        if not mine:
            continue
        counts = [r["clients"] for r in mine]
        left.plot(counts, [r["texts_per_second"] for r in mine], style, label=name)
        right.plot(counts, [r["p99_ms"] for r in mine], style, label=name)
    for axis, title in ((left, "throughput (texts/s)"), (right, "p99 latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted({r["clients"] for r in rows}), [str(c) for c in sorted({r["clients"] for r in rows})])
        axis.set_xlabel("concurrent clients")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    right.set_yscale("log")
    left.set_ylim(bottom=0)
    left.legend()
    figure.suptitle("all-MiniLM-L6-v2, fp32, 2 threads, 1-8 texts per request")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_soak(soak: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.6))
    times = [t / 60 for t, _ in soak["samples"]]
    axis.plot(times, [m for _, m in soak["samples"]], ".-")
    axis.set_xlabel("minutes")
    axis.set_ylabel("server RSS (MiB)")
    axis.set_ylim(0, max(m for _, m in soak["samples"]) * 1.15)
    axis.set_title(f"encoderkit serve, {soak['clients']} clients for {soak['seconds'] / 60:g} minutes")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------- report

def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (report.py imports this module for ``render``, so this module does not import report)."""
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"] + [
        "| " + " | ".join(row) + " |" for row in rows]


def _measured(part: dict[str, Any]) -> list[str]:
    """Where and when a part was measured, from its own provenance: a partial rerun keeps the other parts' own."""
    made = part.get("provenance")
    if not made:
        return []
    if "note" in made:
        return [f"_This part was {made['note']}._", ""]
    if made.get("commit"):
        code = f", commit {made['commit'][:10]}" + (" with uncommitted changes" if made.get("dirty") else "")
    elif made.get("recorded_in"):  # bench/backfill_provenance.py
        code = f", recorded in commit {made['recorded_in'][:10]}"
    else:
        code = ""
    return [f"_This part: {made['date']}, {made['cpu']}, `{made['command']}`{code}._", ""]


def render(r: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (bench/report.py calls it)."""
    lines = ["## Serving under load: encoderkit serve, Infinity, FastAPI + sentence-transformers "
             "(`bench/serve_load.py`)", ""]
    load = r.get("load")
    if load:
        lines += _measured(load)
        lines += [f"Each server is a process of its own on 127.0.0.1 serving all-MiniLM-L6-v2 "
                  f"from the same directory, fp32, {THREADS} torch threads: `encoderkit serve default` (`POST /embed`, "
                  f"truncate), Infinity {r['infinity']['version']} (`infinity_emb v2 --engine torch --device cpu`, "
                  "`POST /embeddings`; its own virtual environment; where a row says Infinity optimum, `--engine "
                  "optimum`, ONNX Runtime through optimum) and `bench/serve_baseline.py` (FastAPI with "
                  "`SentenceTransformer.encode` in a plain handler). Every server cuts texts at 256 tokens. Closed-loop "
                  "clients send 1-8 texts per request from one seeded list of `../shared/bench/sentences.txt`. For "
                  f"each number of clients the servers take turns ({load['repeats']} rounds each, the order rotated); "
                  f"a round is {load['warmup']:g} s of warm-up and {load['duration']:g} s measured. texts/s: texts "
                  "answered in the measured window; latency: of the requests sent in it; medians over the rounds.", ""]
        rows = [[row["server"], str(row["clients"]), f"{row['texts_per_second']:,.0f}", f"{row['p50_ms']:,.0f}",
                 f"{row['p99_ms']:,.0f}", f"{row['requests']:,}", str(row["errors"])] for row in load["rows"]]
        lines += _table(["server", "clients", "texts/s", "p50 ms", "p99 ms", "requests (all rounds)", "errors"], rows)
        diffs = ", ".join(f"{n} {d:.1e}" for n, d in load["max_abs_diff_vs_encoderkit"].items() if n != "encoderkit")
        idle = ", ".join(f"{n} {100 * share:.1f}%" for n, share in load["idle_cpu_share"].items())
        lines += ["", f"The vectors agree with encoderkit's (max abs difference on {load['check_texts']} texts): {diffs}. "
                      f"All stay up through the rounds; idle, they used this share of one core: {idle}."]
        g = r.get("goal")
        if g:
            lines += ["", f"At {g['clients']} clients encoderkit serves **{g['throughput_ratio']:.2f}x** "
                          f"{g.get('against', 'Infinity')}'s (the faster Infinity engine there) "
                          f"throughput with a p99 of {g['encoderkit_p99_ms']:,.0f} ms against {g['infinity_p99_ms']:,.0f} "
                          f"ms. Goal (at least 1.5x with a lower p99): **{'met' if g['met'] else 'not met'}**"
                          + ("" if g["met"] else f" (throughput {'met' if g['throughput_met'] else 'not met'}, "
                                                 f"p99 {'met' if g['p99_met'] else 'not met'})") + "."]
        lines += ["", f"![throughput and p99 against clients]({load['plot']})", ""]
    elif r.get("infinity", {}).get("error"):
        lines += [f"Infinity could not run: {r['infinity']['error']}", ""]
    soak = r.get("soak")
    if soak:
        samples, end = soak["samples"], soak["end_rss_mib"]
        settled = next(t for i, (t, _) in enumerate(samples)
                       if all(abs(m - end) <= 0.02 * end for _, m in samples[i:]))
        lines += [f"### Soak: {soak['seconds'] / 60:g} minutes at {soak['clients']} clients", "", *_measured(soak),
                  f"{soak['requests']:,} requests ({soak['texts_per_second']:,.0f} texts/s, {soak['errors']} errors). "
                  f"Server RSS sampled every {soak['sample_every_seconds']:g} s: {soak['start_rss_mib']:,.0f} MiB at the "
                  f"start (the model loaded, nothing served yet), {soak['rss_at_60s_mib']:,.0f} MiB after a minute, "
                  f"{end:,.0f} MiB at the end, at most {soak['max_rss_mib']:,.0f} MiB. From {settled:.0f} s on it "
                  f"stayed within 2% of its final value. Over the second half: mean "
                  f"{soak['second_half_mean_mib']:,.0f} MiB, range {soak['second_half_range_mib']:.0f} MiB, fitted slope "
                  f"{soak['second_half_slope_mib_per_minute']:+.2f} MiB/min. Flat ({soak['flat_rule']}): "
                  f"**{'yes' if soak['flat'] else 'no'}**.", "",
                  f"![RSS during the soak]({soak['plot']})", ""]
    term = r.get("sigterm")
    if term:
        lines += ["### SIGTERM under load", "", *_measured(term),
                  f"{term['clients']} clients, SIGTERM after {term['signal_after_seconds']:g} s; from the signal on the "
                  f"clients send nothing new. Requests in flight at the signal: {term['in_flight_at_sigterm']}; answered "
                  f"200: **{term['answered_200']}**, other statuses {term['other_status']}, connection errors "
                  f"{term['connection_errors']}; the last answered {term['last_answer_after_sigterm_seconds']:.1f} s "
                  f"after the signal. A new connection 0.5 s after the signal: {term['new_connection_after_sigterm']}. "
                  f"The process exited with **{term['exit_code']}** {term['exit_after_sigterm_seconds']:.1f} s after "
                  f"the signal. Passed: **{'yes' if term['passed'] else 'no'}**.", ""]
    drop = r.get("disconnect")
    if drop and "throughput" in drop:
        lines += ["### Clients that hang up mid-request", "", *_measured(drop),
                  f"{drop['steady_clients']} steady clients, three ways in rounds of alternating order: alone; beside "
                  f"{drop['extra_clients']} clients that send the same kind of request on a fixed schedule (send, "
                  f"{drop['hang_up_after_seconds'][0]:g}-{drop['hang_up_after_seconds'][1]:g} s, pause "
                  f"{drop['pause_seconds']:g} s, send the next) and hang up (a reset) before their answer; and beside "
                  "the same clients on the same schedule staying for their answers.", ""]
        lines += _table(["steady clients", "texts/s", "p99 ms"], [
            [mode, f"{drop['throughput'][mode]:,.0f}", f"{drop['p99_ms'][mode]:,.0f}"] for mode in DISCONNECT_MODES])
        lines += ["", f"Beside the clients that hang up, the steady clients get **{drop['hang_up_vs_wait']:.2f}x** the "
                      "throughput they get beside the same clients waiting for their answers: a client that hangs up "
                      f"costs the others {'nothing' if drop['costs_nothing'] else 'more than waiting would'} "
                      f"({drop['costs_nothing_rule']}). Of the {drop['hung_up_texts']:,} texts the hang-ups sent, "
                      f"{drop['hung_up_requests']:,} requests were unanswered when their client left (499 in /metrics); "
                      f"the server dropped {drop['cancelled_sequences']:,} of their sequences from the queue, and "
                      f"computed {drop['orphaned_sequences']:,} in batches already running when their client left "
                      "(a running batch is not interrupted). The rest had been answered before the hang-up.", ""]
    return lines


# ---------------------------------------------------------------------------------------------------- main

def checkpoint(folder: Path, result: dict[str, Any]) -> None:
    """The parts done so far, kept beside the logs (not a result) in case a later part fails."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "partial.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")


def kept_parts(previous: Path, parts: list[str]) -> dict[str, Any]:
    """The parts of an earlier result that this run does not rerun (the load part brings its goal and Infinity's
    record along), each with the provenance of the run that measured it, never this run's. A part of a result
    written before parts kept their own gets that result's provenance where that run measured it (its command
    names the part), else a note that it is older."""
    if not previous.is_file():
        return {}
    old = json.loads(previous.read_text(encoding="utf-8"))
    kept = {k: old[k] for k in ("load", "goal", "soak", "sigterm", "disconnect", "infinity")
            if k in old and k not in parts and not (k in ("goal", "infinity") and "load" in parts)}
    command = (old.get("provenance") or {}).get("command") or old.get("command") or ""
    words = command.split()
    measured = words[words.index("--parts") + 1].split(",") if "--parts" in words[:-1] else list(PARTS)
    for name in PARTS:
        if isinstance(kept.get(name), dict) and "provenance" not in kept[name]:
            kept[name]["provenance"] = old.get("provenance") if name in measured else {
                "note": f"measured by a run before {old.get('date', 'the last one')}, which kept no record of it"}
    return kept


def load_part(args: argparse.Namespace, model: Path, logs: Path, requests: list[list[str]],
              infinity: dict[str, Any]) -> dict[str, Any]:
    """The load part and its goal. Infinity that cannot start is recorded in ``infinity`` and left out; a smoke
    run leaves it out where its virtual environment is not made yet."""
    print(f"load: clients {args.clients}, {args.repeats} rounds each of {args.warmup:g} + {args.duration:g} s")
    servers: dict[str, Server] = {}
    try:
        for name in args.servers.split(","):
            if name in INFINITY_SERVERS and SMOKE and not (INFINITY_VENV / "bin" / "infinity_emb").is_file():
                infinity["error"] = smoke_training.skip(name, f"{INFINITY_VENV} is not made (a smoke run "
                                                        "installs nothing)")["reason"]
                continue
            try:
                servers[name] = start(name, model, logs)
            except RuntimeError as exc:
                if name not in INFINITY_SERVERS:
                    raise
                infinity["error"] = str(exc)
                print(f"  {name} could not start: {exc}", flush=True)
        load = run_load(servers, requests, tuple(args.clients), args.repeats, args.warmup, args.duration)
    finally:
        for server in servers.values():
            server.stop()
    png = (logs if args.quick else RESULTS) / "serve_load.png"  # a trial's plots stay out of the results
    plot_load(load["rows"], png)
    load.update({"repeats": args.repeats, "warmup": args.warmup, "duration": args.duration,
                 "check_texts": len(requests[0]) + len(requests[1]) + 1, "plot": f"bench/results/{png.name}",
                 "provenance": provenance()})
    reached = goal(load["rows"])
    print(f"  goal at 64 clients: {reached}", flush=True)
    return {"load": load, "goal": reached}


def soak_part(args: argparse.Namespace, model: Path, logs: Path, requests: list[list[str]]) -> dict[str, Any]:
    print(f"soak: {args.soak_seconds:g} s at 8 clients")
    soak = run_soak(model, logs, requests, args.soak_seconds, args.soak_sample)
    png = (logs if args.quick else RESULTS) / "serve_load_soak.png"
    plot_soak(soak, png)
    soak.update(plot=f"bench/results/{png.name}", provenance=provenance())
    print(f"  RSS {soak['start_rss_mib']:.0f} -> {soak['end_rss_mib']:.0f} MiB (max {soak['max_rss_mib']:.0f}); "
          f"flat: {soak['flat']}", flush=True)
    return soak


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    # A smoke run's rounds: 0.5 s of warm-up, 1 s measured, one repeat; a soak of 3 s sampled every second.
    parser.add_argument("--duration", type=float, default=smoke_size(20.0, 1.0), help="measured seconds per round")
    parser.add_argument("--warmup", type=float, default=smoke_size(3.0, 0.5),
                        help="unmeasured seconds at the start of each round")
    parser.add_argument("--repeats", type=int, default=smoke_size(3, 1))
    parser.add_argument("--soak-seconds", type=float, default=smoke_size(300.0, 3.0))
    parser.add_argument("--soak-sample", type=float, default=smoke_size(5.0, 1.0))
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--quick", action="store_true", help="a trial with tiny rounds; prints, writes nothing")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup, args.repeats, args.soak_seconds, args.soak_sample = 3.0, 1.0, 1, 20.0, 2.0
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    return args


def main() -> None:
    args = parse_args()
    parts = args.parts.split(",")
    texts = require(SHARED / "bench" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    requests = request_list(texts)
    model = model_dir()
    logs = smoke_training.cache_dir("serve_load")  # the servers' output (ignored by git)
    started = time.perf_counter()
    result: dict[str, Any] = {"threads": THREADS, "model": "all-MiniLM-L6-v2", "dtype": "fp32",
                              "infinity": {"version": INFINITY_VERSION}}
    if not args.quick:  # parts not rerun keep their last results, each with its own provenance
        result.update(kept_parts(RESULTS / "serve_load.json", parts))
    if "load" in parts:
        result.update(load_part(args, model, logs, requests, result["infinity"]))
        checkpoint(logs, result)
    if "soak" in parts:
        result["soak"] = soak_part(args, model, logs, requests)
        checkpoint(logs, result)
    if "sigterm" in parts:
        print(f"sigterm: {SIGTERM_CLIENTS} clients, SIGTERM under load")
        result["sigterm"] = {**run_sigterm(model, logs, requests, SIGTERM_CLIENTS, SIGTERM_AFTER),
                             "provenance": provenance()}
        print(f"  {json.dumps(result['sigterm'])}", flush=True)
        checkpoint(logs, result)
    if "disconnect" in parts:
        steady, extra = smoke_size(32, 4), smoke_size(8, 2)
        print(f"disconnect: {steady} steady clients alone, beside {extra} that hang up, and beside {extra} that wait")
        result["disconnect"] = {**run_disconnect(model, logs, requests, args.warmup, args.duration,
                                                 smoke_size(2, 1), steady, extra), "provenance": provenance()}
    result["wall_minutes"] = (time.perf_counter() - started) / 60
    result["command"] = " ".join(["python bench/serve_load.py", *sys.argv[1:]])
    if args.quick:
        print(json.dumps({k: v for k, v in result.items() if k != "load"}, indent=2, default=str)[:6000])
        if "load" in result:
            print(json.dumps(result["load"]["rows"], indent=2))
    else:
        write_result("serve_load", result)


if __name__ == "__main__":
    main()
