"""Flattened configs: nested dicts as {"trainer.steps": 1000, ...}, and what differs between two."""

from __future__ import annotations

from typing import Any


def changed_values(before: dict[str, Any], after: dict[str, Any], label: str, new_keys: bool = True) -> list[str]:
    """'KEY=BEFORE (LABEL: AFTER)' for each key of two flattened configs whose values differ, sorted;
    a key that `before` does not hold counts only with `new_keys` (without: a setting added since
    `before` was recorded is not a difference)."""
    keys = before.keys() | after.keys() if new_keys else before.keys() & after.keys()
    return [f"{k}={before.get(k)!r} ({label}: {after.get(k)!r})" for k in sorted(keys) if before.get(k) != after.get(k)]


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"trainer.steps": 1000, ...} (lists rendered as strings), for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, list):
            flat[name] = repr(value)
        else:
            flat[name] = value
    return flat
