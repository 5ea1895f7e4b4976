"""The error types of convsts' data layer: bad input (named by file, row or key) and unreachable storage."""

from __future__ import annotations


class BadInputError(ValueError):
    """An input that cannot be read as what it claims to be (a truncated dump, a half-written
    prepared folder); the message names the file."""


class StorageError(OSError):
    """A filesystem or object store that could not be reached, or that refused a request (no such
    bucket, access denied, a network error); the message names the path, credentials redacted."""
