"""`encoderkit serve` as a real process on a real port: the official openai client against /v1/embeddings (with
the key from ENCODERKIT_API_KEY), a graceful stop on SIGTERM with requests in flight, and the command's
start-up errors (safetensors only unless --allow-pickle)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import encoderkit  # noqa: E402
from encoderkit.cli.app import main  # noqa: E402
from serving import metric  # noqa: E402

KEY = "test-key"
TEXTS = ["The cat sat on the mat.", "A completely different sentence about the stock market.", "hi"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`python -m encoderkit.cli serve ...` in a subprocess, on a free loopback port, up once /health answers."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        environment = {**os.environ, **(env or {})}
        source = str(Path(encoderkit.__file__).resolve().parents[1])
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [source, environment.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "encoderkit.cli", "serve", *args,
                                         "--port", str(self.port)], env=environment,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited with {self.process.returncode}: {self.process.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError("the server did not come up within 120 s")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture
def keyed_server():
    server = Server("default", env={"ENCODERKIT_API_KEY": KEY})
    yield server
    server.stop()


def test_openai_client_against_v1_embeddings(keyed_server, minilm_dir):
    openai = pytest.importorskip("openai")
    from encoderkit.tasks.embed import Embedder

    reference = Embedder.from_pretrained(minilm_dir).encode(TEXTS, normalize=True)
    client = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key=KEY, max_retries=0)
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # the client asks for base64
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0], encoding_format="float")
    short = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS, dimensions=128)
    assert default.model == "all-MiniLM-L6-v2" and [d.index for d in default.data] == [0, 1, 2]
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), reference, atol=1e-6)
    np.testing.assert_allclose(np.array(floats.data[0].embedding), reference[0], atol=1e-6)
    assert default.usage.prompt_tokens == default.usage.total_tokens > len(TEXTS) * 2
    cut = reference[:, :128] / np.linalg.norm(reference[:, :128], axis=1, keepdims=True)
    np.testing.assert_allclose(np.array([d.embedding for d in short.data]), cut, atol=1e-6)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="wrong", max_retries=0).embeddings.create(
            model="all-MiniLM-L6-v2", input="x")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200  # no key needed
    assert httpx.get(f"{keyed_server.url}/info").status_code == 401


def test_sigterm_finishes_the_requests_in_flight_and_exits_0(keyed_server):
    headers = {"Authorization": f"Bearer {KEY}"}
    long_texts = [f"{i} " + "a fairly long sentence that keeps the model busy for a while " * 20 for i in range(32)]
    results: list[httpx.Response | Exception] = []

    def send() -> None:
        try:
            results.append(httpx.post(f"{keyed_server.url}/embed", json={"inputs": long_texts, "truncate": True},
                                      headers=headers, timeout=120))
        except Exception as exc:  # reported by the asserts below
            results.append(exc)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # all four requests are in the server
        text = httpx.get(f"{keyed_server.url}/metrics", headers=headers).text
        if metric(text, "encoderkit_requests_in_flight") == 4:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the requests never reached the server")
    keyed_server.process.send_signal(signal.SIGTERM)
    code = keyed_server.process.wait(timeout=120)
    for thread in threads:
        thread.join(timeout=120)
    assert code == 0, keyed_server.process.stdout.read()
    assert len(results) == 4
    for response in results:
        assert isinstance(response, httpx.Response), response
        assert response.status_code == 200 and len(response.json()) == 32
    with pytest.raises(httpx.ConnectError):  # it stopped accepting
        httpx.get(f"{keyed_server.url}/health", timeout=2)


def test_pickled_weights_need_allow_pickle(tmp_path, minilm_dir, capsys):
    import torch

    from encoderkit.server import ModelRegistry
    from helpers import tiny_bert_dir

    model_dir = tiny_bert_dir(tmp_path / "pickled", minilm_dir)
    from safetensors.torch import load_file

    torch.save(load_file(model_dir / "model.safetensors"), model_dir / "pytorch_model.bin")
    (model_dir / "model.safetensors").unlink()
    assert main(["serve", str(model_dir), "--port", str(free_port())]) == 2
    assert "allow" in capsys.readouterr().err
    registry = ModelRegistry.load([("tiny", model_dir)], allow_pickle=True)
    assert registry.names() == ["tiny"] and registry.kinds("tiny") == {"embed", "embed_all"}


def test_start_up_errors_are_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing"), "--port", str(free_port())]) == 2
    assert "model not found" in capsys.readouterr().err
    assert main(["serve", "default", "--model", f"a={tmp_path / 'missing'}", "--port", str(free_port())]) == 2
    assert main(["serve", "default", "--max-client-batch-size", "0", "--port", str(free_port())]) == 2
    assert "max_client_batch_size" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("environment, expected", [({}, "None"), ({"MALLOC_MMAP_THRESHOLD_": "65536"},
                                                                   "MALLOC_MMAP_THRESHOLD_ is set")])
def test_steady_memory_says_when_it_cannot_apply(environment, expected):
    """In a child process: mallopt changes the allocator of the whole process it runs in."""
    code = "from encoderkit.server.run import return_large_blocks; print(return_large_blocks())"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")} | environment
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout.strip().splitlines()[-1]


def test_serve_warns_when_steady_memory_has_no_effect(monkeypatch, caplog):
    import uvicorn

    from encoderkit.server import app as app_module
    from encoderkit.server import run as run_module
    from encoderkit.server.settings import ServerSettings

    monkeypatch.setattr(run_module, "return_large_blocks", lambda: "this C library is not glibc")
    monkeypatch.setattr(app_module, "create_app", lambda registry, settings: object())
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    with caplog.at_level("WARNING", logger="encoderkit.server.run"):
        assert run_module.serve(None, ServerSettings(), steady_memory=True) == 0
    assert "--steady-memory has no effect: this C library is not glibc" in caplog.text
