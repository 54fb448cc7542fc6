"""The error hierarchy. Every error encoderkit raises on purpose is an ``EncoderkitError``.

Messages say what was expected, what was found, and what to do; the CLI prints them on one line
and exits with code 2.
"""
from __future__ import annotations


class EncoderkitError(Exception):
    """Base class of all encoderkit errors."""


class ConfigError(EncoderkitError):
    """A model configuration is invalid or of an unsupported kind."""


class CheckpointError(EncoderkitError):
    """Weights are missing, corrupted, unsafe to load, or do not fit the model."""


class TokenizerError(EncoderkitError):
    """Tokenizer files are missing or invalid, or a tokenizer cannot be trained/used as asked."""


class DataError(EncoderkitError):
    """A data file is missing, unreadable or malformed."""


class InputError(EncoderkitError):
    """An argument or input value is invalid (wrong type, out of range, unknown name)."""
