"""Local copies of folders at URIs (checkpoints, pretrained weights), fetched once into the
temporary directory and keyed by each file's size and time; the least recently used are pruned."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from convsts.io.redaction import (
    redact,
)
from convsts.io.storage import copy_file, folder_stats, is_dir, join


def local_copy(folder: str, kind: str, files: Sequence[tuple[str, int, int]] | None = None) -> Path:
    """A folder at a URI on this machine: its `files` ((name, size, modification time in ns); by
    default every file directly in it) copied once into a cache folder under the temporary
    directory, keyed by the URI and each file's size and time, so that a file replaced at the same
    URI is fetched again and an unchanged one is not; past CACHE_ENTRIES copies of a kind, the least
    recently used go (prune_cache). A folder listed without files is FileNotFoundError."""

    if files is None:
        files = folder_stats(folder) if is_dir(folder) else []
        if not files:
            raise FileNotFoundError(f"{redact(folder)}: no files there")
    key = hashlib.sha1(repr((folder, list(files))).encode()).hexdigest()[:16]
    local = Path(tempfile.gettempdir()) / f"convsts-{kind}" / key
    if (local / ".complete").is_file():
        (local / ".complete").touch()  # its last use: the cache keeps the most recently used
        return local
    local.mkdir(parents=True, exist_ok=True)
    for file, _, _ in files:
        part = local / f".{file}.{os.getpid()}.part"  # a process copying the same folder never sees half a file
        copy_file(join(folder, file), part)  # ranged parts in parallel: the store's speed
        os.replace(part, local / file)
    (local / ".complete").touch()
    prune_cache(local.parent, keep=local)
    return local


CACHE_ENTRIES = 8  # copies of URI folders kept per kind (checkpoints, pretrained), the most recently used


CACHE_IN_USE_S = (
    3600  # nor is a copy used (or, unfinished, written) within this long removed: another process may read it
)


def prune_cache(root: Path, keep: Path) -> list[str]:
    """Removes the copies in one cache folder (local_copy's, per kind) beyond the CACHE_ENTRIES most
    recently used, other than `keep` and any used within CACHE_IN_USE_S seconds; an unfinished copy
    (a process stopped while copying) goes once it is that old. Returns the names removed (logged)."""

    def last_use(entry: Path) -> float:
        mark = entry / ".complete"
        try:
            return (mark if mark.is_file() else entry).stat().st_mtime
        except FileNotFoundError:  # removed by another process's pruning meanwhile
            return float("inf")

    used = {e: last_use(e) for e in root.iterdir() if e.is_dir()}  # each entry stat'ed once
    finished = sorted((e for e in used if (e / ".complete").is_file()), key=lambda e: used[e], reverse=True)
    kept = set(finished[:CACHE_ENTRIES])  # the most recently used finished copies
    old = time.time() - CACHE_IN_USE_S
    removed = [e for e, when in used.items() if e != keep and e not in kept and when < old]
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True)
    if removed:
        logging.getLogger("convsts").info(
            "%s: removed %d copies of URI folders used least recently (kept the %d most recent)",
            root,
            len(removed),
            CACHE_ENTRIES,
        )
    return [e.name for e in removed]
