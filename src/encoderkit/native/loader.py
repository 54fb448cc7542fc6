"""Building, loading and checking encoderkit's native library: one build per CPU target, remembered, and refused when
it does not match the Python beside it.

Why each part:
- **The cache key is the compiler's own target.** The library is built with ``-march=native``; what that resolves to
  (``g++ -march=native -Q --help=target``: the architecture and every instruction-set switch) goes into the file
  name, with a hash of the sources, the compiler's version and ``ENCODERKIT_NATIVE_FLAGS``. A cache shared between
  machines (a home directory on NFS, a container image) then never hands an AVX-512 build to an AVX2 CPU, which
  would die of SIGILL, a signal no fallback catches. Where the compiler cannot say (``-Q --help=target`` is GCC's),
  the library is built for this process only and not cached.
- **A failed build is remembered** beside where the library would be (``<name>.failed``, holding the compiler's
  message), so every later process falls back to the PyTorch layers at once instead of compiling again. The key
  changes with the sources, the compiler and the target, so a fix is tried again by itself; deleting the file tries
  again by hand.
- **The ABI check.** After loading, the library's interface version (``ek_abi_version``) and the sizes of the
  structs Python mirrors (``ek_struct_sizes``) must equal this module's: a library from other sources is refused
  with a reason, rather than read with the wrong layout.

``library()`` returns the loaded library or None; ``status()`` says which and why.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..precision import PAIR_SUM_WEIGHT_LEVELS

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
# The library: the encoder kernel, and kernels of the training step (dropout, the gradients' norm).
SOURCES = tuple(HERE / name for name in ("small_batch.cpp", "training.cpp"))
HEADERS = (HERE / "vector_math.h",)  # included by both; part of the build's hash
ABI_VERSION = 3  # small_batch.cpp's ek_abi_version(): raise both together when the interface changes


class Embedding(ctypes.Structure):
    """small_batch.cpp's ``Embedding``."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("ids", "positions", "types", "word", "position", "segment",
                                                     "norm_weight", "norm_bias")] + \
               [("words", ctypes.c_int64), ("places", ctypes.c_int64), ("segments", ctypes.c_int64),
                ("eps", ctypes.c_float)]


class Linear(ctypes.Structure):
    """small_batch.cpp's ``Linear``: fp32 panels, or int8 ones where ``scale`` is set."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("weight", "bias", "scale", "sums", "inverse")]


class Layer(ctypes.Structure):
    """small_batch.cpp's ``Layer``."""

    _fields_ = [(name, Linear) for name in ("qkv", "output", "ffn_in", "ffn_out")] + \
               [(name, ctypes.c_void_p) for name in ("attention_norm_weight", "attention_norm_bias", "ffn_norm_weight",
                                                     "ffn_norm_bias")]


MIRRORS = (Embedding, Linear, Layer)  # in ek_struct_sizes' order


@dataclass
class _Loaded:
    """This process's one attempt: the library, or why there is none."""

    library: ctypes.CDLL | None = None
    reason: str | None = None

    @property
    def tried(self) -> bool:
        return self.library is not None or self.reason is not None


_lock = threading.Lock()
_loaded = _Loaded()


def cache_dir() -> Path:
    root = os.environ.get("ENCODERKIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "encoderkit")
    return Path(root) / "native"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def extra_flags() -> list[str]:
    """``ENCODERKIT_NATIVE_FLAGS``: added compiler flags (``-mno-avx512f``: the 256-bit build on an AVX-512 CPU)."""
    return os.environ.get("ENCODERKIT_NATIVE_FLAGS", "").split()


def resolved_target(cxx: str, extra: list[str]) -> str | None:
    """What ``-march=native`` (with ``extra``) resolves to on this CPU, as the compiler says it: its ``-march=`` line
    and every enabled ``-m`` switch. None where the compiler cannot say."""
    try:
        done = subprocess.run([cxx, "-march=native", *extra, "-Q", "--help=target"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [" ".join(line.split()) for line in done.stdout.splitlines()]
    march = [line for line in lines if line.startswith("-march=")]
    if done.returncode != 0 or not march or march[0].split("=", 1)[1].strip() in ("", "native"):
        return None
    return "\n".join(sorted(line for line in lines if line.startswith("-m") and
                            (line.endswith("[enabled]") or "=" in line.split()[0])))


def build_key(cxx: str, extra: list[str]) -> str | None:
    """The build's name: sources, compiler version, resolved target and added flags; None without a target."""
    target = resolved_target(cxx, extra)
    if target is None:
        return None
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    material = source + version.encode() + target.encode() + " ".join(extra).encode()
    return hashlib.sha256(material).hexdigest()[:16]


class BuildFailed(RuntimeError):
    pass


def _compile(cxx: str, extra: list[str], target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:  # concurrent builds: the last rename wins
        built = Path(scratch) / target.name
        command = [cxx, "-O3", "-march=native", *extra, "-std=c++17", "-shared", "-fPIC", "-fopenmp",
                   *map(str, SOURCES), "-o", str(built)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as error:
            raise BuildFailed(f"{' '.join(command)} could not run: {error}") from None
        if result.returncode != 0:
            raise BuildFailed(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        os.replace(built, target)


def build(cxx: str) -> Path:
    """The library for this CPU: the cached build, else built now (and cached where the target is known). Raises
    ``BuildFailed`` for a failed build, now or remembered from an earlier process."""
    extra = extra_flags()
    key = build_key(cxx, extra)
    if key is None:  # the target is unknown: a build for this process only
        scratch = Path(tempfile.mkdtemp(prefix="encoderkit-native-"))
        target = scratch / "encoderkit.so"
        _compile(cxx, extra, target)
        return target
    target = cache_dir() / f"encoderkit-{key}.so"
    failed = target.with_suffix(".failed")
    if target.exists():
        return target
    if failed.exists():
        first = failed.read_text(encoding="utf-8", errors="replace").strip().splitlines()[:1]
        raise BuildFailed(f"an earlier build for this CPU and compiler failed ({failed}; delete it to try again): "
                          f"{first[0] if first else 'no message'}")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        _compile(cxx, extra, target)
    except BuildFailed as error:
        failed.write_text(str(error) + "\n", encoding="utf-8")
        raise
    return target


def check_abi(lib: ctypes.CDLL) -> str | None:
    """Why ``lib`` does not match this Python (its interface version or a struct's size), or None."""
    try:
        version = lib.ek_abi_version
    except AttributeError:
        return "the library has no ek_abi_version: it was built from older sources"
    version.restype = ctypes.c_int
    if version() != ABI_VERSION:
        return f"the library's interface is version {version()}, this Python's is {ABI_VERSION}"
    sizes = (ctypes.c_int64 * len(MIRRORS))()
    lib.ek_struct_sizes.argtypes = [ctypes.c_void_p]
    lib.ek_struct_sizes.restype = None
    lib.ek_struct_sizes(sizes)
    for mirror, size in zip(MIRRORS, sizes):
        if ctypes.sizeof(mirror) != size:
            return f"struct {mirror.__name__} is {size} bytes in the library and {ctypes.sizeof(mirror)} in Python"
    return None


def _declare(lib: ctypes.CDLL) -> None:
    """The argument and return types of every entry point."""
    pointer, integer, int64, uint64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
    single, uint32 = ctypes.c_float, ctypes.c_uint32
    signatures = {
        "ek_pack": ([pointer, pointer, integer, integer], None),
        "ek_pack_int8": ([pointer, pointer, pointer, integer, integer], None),
        "ek_product": ([pointer, pointer, pointer, integer, integer, integer], None),
        "ek_quantize_rows": ([pointer, integer, integer, pointer, pointer, pointer, pointer, integer], None),
        "ek_rescale_rows": ([pointer, integer, integer, pointer, pointer, pointer, pointer, integer], None),
        "ek_encode": ([pointer, pointer, integer, integer, integer, integer, integer, pointer, pointer, integer,
                       integer, single, single, pointer, integer, integer, integer], integer),
        "ek_attention": ([pointer, pointer, pointer, integer, integer, integer, single, pointer, integer, integer,
                          integer], integer),
        "ek_vector_width": ([], integer),
        "ek_int8": ([], integer),
        "ek_phases": ([pointer], integer),
        "ek_dropout": ([pointer, pointer, int64, uint64, uint32, single, integer], None),
        "ek_dropout_mask": ([pointer, int64, uint64, uint32, integer], None),
        "ek_sum_squares": ([pointer, pointer, integer, integer], ctypes.c_double),
        "ek_adamw_rows": ([pointer] * 4 + [int64, int64, pointer, pointer] + [single] * 7 + [integer], None),
        "ek_attention_probs": ([pointer, pointer, int64, int64, pointer, int64, single, uint64, uint32, single,
                                integer], None),
        "ek_attention_probs_backward": ([pointer, pointer, int64, int64, single, uint64, uint32, single, integer],
                                        None),
        "ek_add_dropout_norm": ([pointer] * 7 + [int64, int64, single, uint64, uint32, single, integer], None),
        "ek_add_dropout_norm_backward": ([pointer] * 8 + [int64, int64, uint64, uint32, single, integer], None),
    }
    for name, (arguments, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = arguments, result


def _load() -> _Loaded:
    if os.environ.get("ENCODERKIT_NATIVE", "1") == "0":
        return _Loaded(reason="turned off by ENCODERKIT_NATIVE=0")
    cxx = compiler()
    if cxx is None:
        return _Loaded(reason="no C++ compiler (g++) found; install one (apt-get install g++) for faster single texts "
                              "and training kernels")
    try:
        lib = ctypes.CDLL(str(build(cxx)))
    except (OSError, BuildFailed, subprocess.SubprocessError) as error:
        reason = f"the build failed: {error}"
        log.warning("encoderkit's native layers are off (%s); the PyTorch layers run instead", reason)
        return _Loaded(reason=reason)
    mismatch = check_abi(lib)
    if mismatch is not None:
        reason = f"the library does not match this encoderkit: {mismatch}"
        log.warning("encoderkit's native layers are off (%s); the PyTorch layers run instead", reason)
        return _Loaded(reason=reason)
    _declare(lib)
    return _Loaded(library=lib)


def library() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None where it cannot be (``status()`` says why)."""
    global _loaded
    if not _loaded.tried:
        with _lock:
            if not _loaded.tried:
                _loaded = _load()
    return _loaded.library


def status() -> str:
    """Whether the native layers are available here, and if not, why."""
    lib = library()
    if lib is None:
        return f"off: {_loaded.reason}"
    int8 = {0: "fp32 only: int8 needs AVX2 or AVX-512", 1: "int8 too, summed exactly (VNNI)",
            2: f"int8 too, pairs summed in 16 bits (weight codes within +-{PAIR_SUM_WEIGHT_LEVELS})"}[lib.ek_int8()]
    return f"available ({lib.ek_vector_width() * 32}-bit vectors, {int8})"
