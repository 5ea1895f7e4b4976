"""A RunConfig from its sources: defaults <- a YAML file (a path or a URI) <- dotted command-line
overrides (`trainer.steps=500`). Unknown keys and wrong types raise `ConfigError` naming the full
dotted key; task names are checked against the task registry (tasks.check_task_names)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from convsts.io import storage
from convsts.io.errors import ConfigError
from convsts.io.redaction import redact
from convsts.io.storage import SAMPLE_TOKEN
from convsts.ray_jobs.config.schema import RESUME_LATEST, RunConfig
from convsts.ray_jobs.tasks import check_task_names

# Maps whose value is a whole: a layer that sets one replaces it rather than adding keys to the
# default (`trainer.task_weights={reddit: 1.0}` trains on Reddit alone).
REPLACED_MAPS = ("trainer.task_weights", "trainer.task_workers")


def merge_layer(base, layer):
    """OmegaConf.merge of one config layer onto another, with REPLACED_MAPS taken whole from the layer."""
    try:
        merged = OmegaConf.merge(base, layer)
    except TypeError:  # a list where a mapping is expected, or the reverse: OmegaConf names no key
        raise ConfigError(_container_mismatch(base, layer)) from None
    for key in REPLACED_MAPS:
        value = OmegaConf.select(layer, key, default=None)
        if value is not None:
            OmegaConf.update(merged, key, OmegaConf.to_container(value), merge=False)
    return merged


def _container_mismatch(base, layer, prefix: str = "") -> str:
    """The first key whose value in `layer` is a list where `base` has a mapping, or the reverse."""
    for key, value in layer.items_ex(resolve=False) if isinstance(layer, DictConfig) else []:
        have = base.get(key) if isinstance(base, DictConfig) else None
        path = f"{prefix}{key!s}"
        for want, got, kinds in ((DictConfig, ListConfig, "a mapping ({key: value, ...}), got a list"),
                                 (ListConfig, DictConfig, "a list ([...]), got a mapping")):  # fmt: skip
            if isinstance(have, want) and isinstance(value, got):
                return f"config key '{path}': expected {kinds}"
        if isinstance(have, DictConfig) and isinstance(value, DictConfig):
            found = _container_mismatch(have, value, f"{path}.")
            if found:
                return found
    return "config: a list where a mapping is expected, or the reverse"


def _describe(err: OmegaConfBaseException, source: str, layer: Any = None) -> str:
    key = getattr(err, "full_key", None)
    msg = str(err).splitlines()[0]
    found = _list_item_error(layer) if layer is not None else None
    if found:  # OmegaConf names only the item's own key ('lr'): name the whole path (trainer.stages[1].lr)
        key, msg = found
    where = f" in {source}" if source else ""
    return f"config key '{key}'{where}: {msg}" if key else f"config{where}: {msg}"


def _list_item_error(layer: Any) -> tuple[str, str] | None:
    """(the full key, the message) of the first item of a list of structured values (trainer.stages)
    in `layer` that does not fit its schema, or None."""
    schema = OmegaConf.structured(RunConfig)
    todo: list[tuple[str, Any]] = [("", OmegaConf.to_container(layer))]
    while todo:
        path, value = todo.pop(0)
        if isinstance(value, dict):
            todo += [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
            continue
        node = OmegaConf.select(schema, path, default=None) if isinstance(value, list) else None
        element = getattr(getattr(node, "_metadata", None), "element_type", None)
        if not (isinstance(element, type) and dataclasses.is_dataclass(element)):
            continue
        for i, item in enumerate(value):
            try:
                OmegaConf.merge(OmegaConf.structured(element), item)
            except OmegaConfBaseException as err:
                return f"{path}[{i}].{getattr(err, 'full_key', '')}", str(err).splitlines()[0]
    return None


def from_dict(values: dict[str, Any], source: str = "") -> RunConfig:
    """Build a RunConfig from a (possibly partial) nested dict, rejecting unknown keys."""
    schema = OmegaConf.structured(RunConfig)
    try:
        merged = merge_layer(schema, OmegaConf.create(values))
        return check_task_names(OmegaConf.to_object(merged)).validate()  # type: ignore[arg-type]
    except OmegaConfBaseException as err:
        raise ConfigError(_describe(err, source)) from None


OVERRIDE_ITEM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)[A-Za-z0-9_.]*=")  # a dotted KEY=VALUE on the command line


def is_override(item: str) -> bool:
    """A command-line KEY=VALUE whose KEY starts at a run config key (trainer.steps=5, seed=1), not
    a list option's own NAME=FILE (--sts sts12=FILE)."""
    found = OVERRIDE_ITEM.match(item)
    return found is not None and found.group(1) in {f.name for f in dataclasses.fields(RunConfig)}


def parse_with_overrides(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, list_options: Sequence[str] = ()
) -> argparse.Namespace:
    """parser.parse_intermixed_args, then the dotted KEY=VALUE items that a list option (nargs: --sts
    A B, --input A B) took in are moved to args.overrides, where they were meant to go."""
    args = parser.parse_intermixed_args(argv)
    for option in list_options:
        values = getattr(args, option) or []
        moved = [v for v in values if is_override(v)]
        if moved:
            setattr(args, option, [v for v in values if not is_override(v)])
            args.overrides = list(args.overrides) + moved
    return args


def _reads_as_yaml(item: str) -> bool:
    try:
        OmegaConf.from_dotlist([item])  # OmegaConf's own YAML reading (it takes `?` and `&` in a URI)
    except yaml.YAMLError:
        return False
    return True


def _closed(value: str) -> str | None:
    """`value` with the brackets and braces it opens and never closes closed, innermost first
    (`[1,3` -> `[1,3]`); None where it closes all it opens, or more."""
    unclosed: list[str] = []
    for ch in value:
        if ch in "[{":
            unclosed.append("]" if ch == "[" else "}")
        elif ch in "]}":
            if not unclosed or unclosed.pop() != ch:
                return None
    return value + "".join(reversed(unclosed)) if unclosed else None


def _check_override_yaml(item: str) -> None:
    """An override whose value YAML cannot read (braces or a colon inside a list, an unclosed
    quote, a bracket never closed) as one line naming the key and the value to write instead, not
    PyYAML's traceback."""
    key, value = item.split("=", 1)
    try:
        OmegaConf.from_dotlist([item])  # OmegaConf's own YAML reading (it takes `?` and `&` in a URI)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        inner = value.strip()
        closed = _closed(inner)
        if closed is not None and _reads_as_yaml(f"{key}={closed}"):  # quoting would make it a string
            raise ConfigError(
                f"config key {key!r}: the value {value!r} opens a bracket it never closes; did you mean "
                f"'{key}={closed}'?"
            ) from None
        items = inner[1:-1].split(",") if inner.startswith("[") and inner.endswith("]") else None
        quoted = f"[{', '.join(json.dumps(i.strip()) for i in items)}]" if items else json.dumps(inner)
        raise ConfigError(
            f"config key {key!r}: the value {value!r} is not valid YAML ({problem}); quote it: "
            f"'{key}={quoted}' (the outer single quotes for the shell)"
        ) from None


# OmegaConf refuses a YAML file of over 10,000 nodes (a long stage list: 10,050 items) with a message
# about aliases; a config file is allowed 1,000,000, and OmegaConf's own 100x alias-expansion check
# still refuses an alias bomb.
MAX_CONFIG_NODES = 1_000_000


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """defaults <- YAML file <- dotted overrides such as `trainer.steps=500`."""
    schema = OmegaConf.structured(RunConfig)
    layers = [schema]
    if path:
        path = str(path) if storage.is_uri(path) else Path(path)  # a Path would make s3://b/x s3:/b/x
        shown = redact(str(path))
        if not storage.is_file(path):
            raise ConfigError(f"config file not found: {shown}")
        try:
            text = storage.read_text(path)  # a URI's in a few large requests
            layer = OmegaConf.load(io.StringIO(text), max_yaml_expanded_nodes=MAX_CONFIG_NODES)
        except Exception as err:  # yaml errors name the line
            raise ConfigError(f"cannot parse config file {shown}: {err}") from None
        if not isinstance(layer, DictConfig):
            raise ConfigError(
                f"config file {shown}: the top level must be a mapping of keys (name:, trainer:, ...), "
                f"not a {type(layer).__name__.replace('Config', '').lower()}"
            )
        layers.append(layer)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. trainer.steps=500")
        _check_override_yaml(item)
    try:
        merged = schema
        for layer in layers[1:]:
            try:
                merged = merge_layer(merged, layer)
            except OmegaConfBaseException as err:
                raise ConfigError(_describe(err, redact(str(path)), layer)) from None
        if overrides:
            dotlist = OmegaConf.from_dotlist(list(overrides))
            try:
                merged = merge_layer(merged, dotlist)
            except OmegaConfBaseException as err:
                raise ConfigError(_describe(err, "command-line overrides", dotlist)) from None
        return absolute_paths(check_task_names(OmegaConf.to_object(merged)).validate())  # type: ignore[arg-type]
    except OmegaConfBaseException as err:
        raise ConfigError(_describe(err, str(path or ""))) from None


def _absolute(value: str) -> str:
    if not value or SAMPLE_TOKEN in value or storage.is_uri(value):
        return value
    return str(Path(value).expanduser().resolve())


def absolute_paths(cfg: RunConfig) -> RunConfig:
    """Relative local paths -> absolute, against the directory the config was loaded from (the
    command's working directory), so that Ray workers, whose working directory differs, read the
    same files. "{sample}" and URIs (s3://, gs://) are kept as they are."""
    d = cfg.data
    d.reddit_inputs = [_absolute(p) for p in d.reddit_inputs]
    d.task_inputs = {task: [_absolute(p) for p in paths] for task, paths in d.task_inputs.items()}
    for name in ("snli_train", "snli_dev", "snli_test", "stsb_dir", "cqa_test", "cqa_relevancy", "prepared_dir"):
        setattr(d, name, _absolute(getattr(d, name)))
    cfg.trainer.warm_start = _absolute(cfg.trainer.warm_start)
    if cfg.trainer.resume_from != RESUME_LATEST:
        cfg.trainer.resume_from = _absolute(cfg.trainer.resume_from)
    cfg.trainer.storage_path = _absolute(cfg.trainer.storage_path)
    return cfg
