"""Shared fixtures: the default model, the shared data directory (skipped with a reason when absent)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# The tests live in folders that mirror src/encoderkit (tests/README.md) and import each other by module name, as
# pytest imports them (``from test_engine import FAMILY_CONFIGS``): every folder of tests is on sys.path, whichever
# tests run, so a test module's name must be unique across the folders.
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


def shared_file(*parts: str) -> Path:
    """A file under ../shared; the calling test is skipped, with the reason, when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/data and ../shared/bench exist in CI)")
    return path


def bench_module(name: str):
    """bench/<name>.py as a module, ``bench_<name>``, executed anew: bench/ is not a package on the tests' path, and
    its scripts import each other by plain name, so bench/ is on sys.path while it loads."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(bench))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(bench))
    return module


def pytest_configure(config) -> None:
    """Under pytest-xdist (``make test`` runs two workers), each worker computes on one torch thread: two workers of
    two threads on a 2-CPU machine would spin-wait against each other at every op. Tests that need more threads set
    them themselves; the processes tests start keep torch's default. No test reaches the Hugging Face hub: a hub id
    resolves from a cache the test lays out on disk (HF_HUB_OFFLINE=1; tests of the download path fake it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of many tiny batches: on a 2-core machine, threads that spin-wait on tiny
    matrices slow every process down. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from encoderkit import default_model_path

    try:
        return default_model_path()
    except Exception as exc:  # pragma: no cover - the Makefile installs it
        pytest.skip(f"default model not installed: {exc}")


@pytest.fixture(scope="session")
def bench_sentences() -> list[str]:
    path = shared_file("bench", "sentences.txt")
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def tiny_classifier_dir(tmp_path_factory, minilm_dir) -> Path:
    """A 2-layer, hidden-32 random BERT sequence classifier with the MiniLM tokenizer (see helpers.tiny_bert_dir)."""
    from helpers import tiny_bert_dir

    return tiny_bert_dir(tmp_path_factory.mktemp("tiny-classifier"), minilm_dir, task="sequence-classification")
