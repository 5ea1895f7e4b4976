"""The run config's reference (docs/config.md), made from the config dataclasses themselves: every
key with its type, its default and the comment beside (or above) its field in the source, so the
reference cannot fall behind the code (tests/config/test_config_reference.py)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import typing
from collections.abc import Iterator
from typing import Any

from convsts.ray_jobs.config.schema import RunConfig

HEADER = """# Run config reference

Every key of the run config (`convsts train --config FILE key=value ...`; `--print-config` shows a
run's resolved values), with its type and default. Made by `python scripts/config_reference.py` from
the config dataclasses and their comments; a test fails when this page and the code differ.
"""


def field_comments(cls: type) -> dict[str, str]:
    """{field: its comment}: the comment ending the field's line, else the comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    found: dict[str, str] = {}
    body = ast.parse(source).body[0]
    for node in body.body if isinstance(body, ast.ClassDef) else []:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = comments.get(node.end_lineno or node.lineno) or comments.get(node.lineno, "")
        if not text:
            above: list[str] = []
            line = node.lineno - 1
            while line in comments and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            text = " ".join(above)
        found[node.target.id] = text
    return found


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def entries(cls: type = RunConfig, prefix: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """(dotted key, type, default, comment) of every leaf key under `cls`, in field order."""
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    default = cls()
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from entries(hint, f"{prefix}{f.name}.")  # type: ignore[arg-type]
        else:
            value = getattr(default, f.name)
            value = (
                [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
                if isinstance(value, list)
                else value
            )
            yield f"{prefix}{f.name}", _type_name(hint), value, comments.get(f.name, "")


def render() -> str:
    """docs/config.md: a table per top-level section."""
    out = [HEADER]
    section = None
    for key, kind, default, comment in entries():
        top = key.split(".")[0] if "." in key else ""
        if top != section:
            section = top
            out += [
                "",
                f"## {f'`{top}`' if top else 'Top level'}",
                "",
                "| key | type | default | what it is |",
                "|---|---|---|---|",
            ]
        shown = json.dumps(default, ensure_ascii=False).replace("|", "\\|")
        out.append(f"| `{key}` | `{kind}` | `{shown}` | {comment.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"
