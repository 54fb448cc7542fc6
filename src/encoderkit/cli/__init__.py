"""The `encoderkit` command. Each sub-command is a thin shell over one job of the library: one module per group
of commands, the shared options in options.py, and in app.py the group, main() and the one error boundary (app.py,
not main.py: a submodule named main would be shadowed by the function main exported here)."""
from __future__ import annotations

from .app import cli, main

__all__ = ["cli", "main"]
