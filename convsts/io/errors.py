"""The error types of convsts, a leaf module every layer imports: bad input (named by file, row or
key), unreachable storage, a config that does not fit the schema, a tracking store that failed."""

from __future__ import annotations


class BadInputError(ValueError):
    """An input that cannot be read as what it claims to be (a truncated dump, a half-written
    prepared folder); the message names the file."""


class StorageError(OSError):
    """A filesystem or object store that could not be reached, or that refused a request (no such
    bucket, access denied, a network error); the message names the path, credentials redacted."""


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


class TrackingError(RuntimeError):
    """MLflow did not take what a command had finished; its results are in --out already."""
