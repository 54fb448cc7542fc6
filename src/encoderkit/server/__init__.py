"""encoderkit over HTTP: ``encoderkit serve`` (``create_app`` for the app, ``ModelRegistry`` for the models).

Needs the ``serve`` extra (FastAPI and uvicorn): ``pip install 'encoderkit[serve]'``. Names are imported on
first use, so the CLI reads the settings' defaults without loading the models' code or FastAPI.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {"ModelRegistry": ".registry", "ServedModel": ".registry", "ServerSettings": ".settings",
            "create_app": ".app"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
