"""A dataclass built from JSON with every key and value checked against its annotations, each
error one line naming the key: how a file written elsewhere (a checkpoint's config.json) is read."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any


def dataclass_from_json(
    cls: type, data: Any, key: str, required: tuple[str, ...] = (), bound: float | None = None
) -> Any:
    """`cls` built from `data` (JSON: dicts, lists, numbers, strings), nested dataclasses too: no key
    `cls` lacks, the `required` ones there, every value of its annotated type (an int not a bool, a
    finite float, a list of ints, ...) and, where `bound` is given, no number beyond it; ValueError
    naming the key (`model.dan.hidden_sizes[1]`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{key}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: not a key of {cls.__name__}")
    missing = [name for name in required if name not in data]
    if missing:
        raise ValueError(f"{key}.{missing[0]}: missing")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a nested section (model.dan)
            values[name] = dataclass_from_json(hint, value, f"{key}.{name}", bound=bound)
        else:
            _check_value(value, hint, f"{key}.{name}", bound)
            values[name] = value
    return cls(**values)


def _check_value(value: Any, hint: Any, key: str, bound: float | None) -> None:
    """`value` is of the annotated type and within `bound`; ValueError naming the key."""
    origin = typing.get_origin(hint)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        for i, item in enumerate(value):
            _check_value(item, typing.get_args(hint)[0], f"{key}[{i}]", bound)
        return
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
    if origin is dict:
        ok = isinstance(value, dict)
    elif hint in kinds:
        ok = isinstance(value, kinds[hint]) and (hint is bool or not isinstance(value, bool))
    else:
        ok = True  # Any
    if not ok:
        raise ValueError(f"{key}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if bound is not None and (not math.isfinite(value) or abs(value) > bound):
            raise ValueError(f"{key}: {value!r} is not a size a convsts model has (at most {bound})")
        if not math.isfinite(value):
            raise ValueError(f"{key}: {value!r} is not a finite number")
