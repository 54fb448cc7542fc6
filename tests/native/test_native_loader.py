"""The native library's build, cache and load checks (encoderkit.native.loader): no compiler, a failed build
remembered across processes, a cache key that follows the CPU target the compiler resolves, the ABI check, and the
256-bit build on an AVX-512 CPU."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from encoderkit.native import loader as native_library
from encoderkit.precision import cpu_flags


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process's first attempt again, with a cache of its own (the real one is put back afterwards)."""
    monkeypatch.setattr(native_library, "_loaded", native_library._Loaded())
    monkeypatch.setenv("ENCODERKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ENCODERKIT_NATIVE", raising=False)
    monkeypatch.delenv("ENCODERKIT_NATIVE_FLAGS", raising=False)
    return tmp_path


def wrapper(path: Path, body: str) -> str:
    """A compiler that runs ``body`` (sh) and logs each call's arguments; g++ does the rest."""
    path.write_text(f'#!/bin/sh\necho "$@" >> {path}.calls\n{body}\nexec g++ "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


needs_gcc = pytest.mark.skipif(native_library.compiler() is None or "g++" not in native_library.compiler(),
                               reason="needs g++ (its -Q --help=target names the CPU target)")


def test_no_compiler_leaves_the_pytorch_layers_with_a_reason(fresh, monkeypatch):
    monkeypatch.setattr(native_library, "compiler", lambda: None)
    assert native_library.library() is None
    assert native_library.status().startswith("off: no C++ compiler (g++) found")


@needs_gcc
def test_a_failed_build_is_remembered_and_not_retried(fresh, monkeypatch):
    cxx = wrapper(fresh / "cxx", 'case "$*" in *-shared*) echo "error: planted failure" >&2; exit 1;; esac')
    monkeypatch.setenv("CXX", cxx)
    assert native_library.library() is None
    assert "planted failure" in native_library.status()
    marks = list((fresh / "cache" / "native").glob("*.failed"))
    assert len(marks) == 1 and "planted failure" in marks[0].read_text()

    builds = lambda: sum("-shared" in line for line in Path(cxx + ".calls").read_text().splitlines())  # noqa: E731
    assert builds() == 1
    monkeypatch.setattr(native_library, "_loaded", native_library._Loaded())  # the next process
    assert native_library.library() is None
    assert builds() == 1, "the failed build was tried again"
    assert "an earlier build for this CPU and compiler failed" in native_library.status()
    assert str(marks[0]) in native_library.status()  # says which file to delete to try again


@needs_gcc
def test_the_cache_key_is_the_resolved_target(fresh):
    cxx = native_library.compiler()
    plain = native_library.build_key(cxx, [])
    assert plain is not None and plain == native_library.build_key(cxx, [])
    assert native_library.build_key(cxx, ["-mno-avx2"]) != plain  # another target, another file
    target = native_library.resolved_target(cxx, [])
    assert "-march=" in target and "-march= native" not in target


@needs_gcc
def test_without_a_resolved_target_nothing_is_cached(fresh, monkeypatch):
    cxx = wrapper(fresh / "cxx", 'case "$*" in *--help=target*) exit 1;; esac')
    assert native_library.resolved_target(cxx, []) is None and native_library.build_key(cxx, []) is None
    made = []
    monkeypatch.setattr(native_library, "_compile", lambda c, extra, target: made.append(target) or target.touch())
    path = native_library.build(cxx)
    assert made == [path] and native_library.cache_dir() not in path.parents
    assert not (fresh / "cache").exists()


def test_the_loaded_library_matches_this_python():
    lib = native_library.library()
    if lib is None:
        pytest.skip(f"no native library here: {native_library.status()}")
    assert native_library.check_abi(lib) is None


def test_a_library_of_another_interface_is_refused(monkeypatch):
    lib = native_library.library()
    if lib is None:
        pytest.skip(f"no native library here: {native_library.status()}")
    monkeypatch.setattr(native_library, "ABI_VERSION", native_library.ABI_VERSION + 1)
    assert "interface is version" in native_library.check_abi(lib)
    monkeypatch.setattr(native_library, "_loaded", native_library._Loaded())  # the next process, same cached build
    assert native_library.library() is None
    assert "does not match this encoderkit" in native_library.status()
    monkeypatch.setattr(native_library, "ABI_VERSION", native_library.ABI_VERSION - 1)
    shuffled = (native_library.Linear, native_library.Linear, native_library.Layer)  # a struct laid out otherwise
    monkeypatch.setattr(native_library, "MIRRORS", shuffled)
    assert "struct Linear is" in native_library.check_abi(lib)


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the 256-bit build of an AVX-512 CPU needs one; this CPU "
                                                          "builds 256-bit vectors by itself (test_native covers it)")
def test_the_256_bit_build_on_an_avx512_cpu(tmp_path):
    code = "from encoderkit import native; print(native.status())"
    env = {**os.environ, "ENCODERKIT_NATIVE_FLAGS": "-mno-avx512f", "ENCODERKIT_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.stdout.startswith("available (256-bit vectors"), done.stdout + done.stderr
