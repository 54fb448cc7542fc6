"""Optional extras: which command needs which installable extra, checked before anything is loaded.

A command that needs an extra (``pip install 'encoderkit[serve]'``) must say so at once, in one line, rather than
load a model for a minute and then fail on an import deep inside a server or a worker. ``require`` looks the
modules up without importing them (``importlib.util.find_spec``), so the check costs nothing where they are
installed.
"""
from __future__ import annotations

import importlib.util

from .errors import InputError

# extra -> (what it is for, the top-level modules it installs)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "serve": ("the HTTP server (FastAPI on uvicorn)", ("fastapi", "uvicorn")),
    "onnx": ("the ONNX writer and ONNX Runtime", ("onnx", "onnxruntime")),
    "ray": ("Ray Data's actor pools", ("ray",)),
    "ann": ("the FAISS indexes and Parquet shards", ("faiss", "pyarrow")),
    "bm25": ("the BM25 index (bm25s)", ("bm25s",)),
}


class MissingExtraError(InputError):
    """A command needs an optional extra that is not installed."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be found (none: the extra is installed)."""
    _, modules = EXTRAS[extra]
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-removed installation
            found = False
        if not found:
            missing.append(module)
    return missing


def require(extra: str, command: str) -> None:
    """Raises one clear ``MissingExtraError`` when ``command`` cannot run because ``extra`` is not installed."""
    missing = missing_modules(extra)
    if missing:
        purpose, _ = EXTRAS[extra]
        raise MissingExtraError(f"{command} needs the '{extra}' extra ({purpose}), which is not installed "
                                f"(missing: {', '.join(missing)}): pip install 'encoderkit[{extra}]'")


__all__ = ["EXTRAS", "MissingExtraError", "missing_modules", "require"]


def faiss_module():
    """FAISS, imported where an index needs it; an InputError saying how to install it where it is missing."""
    try:
        import faiss
    except ImportError as exc:
        raise InputError("approximate and multi-vector indexes need FAISS: pip install 'encoderkit[ann]' (faiss-cpu), "
                         "or use an exact index") from exc
    return faiss
