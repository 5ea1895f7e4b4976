"""A run's checkpoints as `Checkpoint`s: those a run folder lists newest by step, the complete ones."""

from __future__ import annotations

import logging

from convsts.io import storage
from convsts.io.redaction import redact
from convsts.models.checkpoint.checkpoint import Checkpoint
from convsts.models.checkpoint.manifest import incomplete_reason
from convsts.models.checkpoint.names import FOLDER_NAME

log = logging.getLogger("convsts")


def listed_steps(folder: str) -> list[Checkpoint]:
    """The checkpoint-<step> folders in `folder` (local or a URI: one listing), newest step first,
    complete or not; [] where the folder is not there."""
    try:
        names = storage.entry_names(folder)
    except FileNotFoundError:
        return []
    found = [
        Checkpoint(storage.join(folder, n), int(m.group(1)), folder=folder)
        for n in names
        if (m := FOLDER_NAME.fullmatch(n))
    ]
    return sorted(found, key=lambda c: c.step, reverse=True)


def complete_checkpoints(folder: str, newest_only: bool = False, below: int | None = None) -> list[Checkpoint]:
    """The complete checkpoints in `folder` (those of a step below `below`, where given), newest step
    first (`newest_only`: the first of them); each incomplete one met on the way (an upload that
    stopped midway) is left out with one line."""
    kept = []
    for candidate in listed_steps(folder):
        if below is not None and candidate.step >= below:
            continue
        reason = incomplete_reason(candidate.path)
        if reason is not None:
            log.warning("%s: skipped, not a complete checkpoint (%s)", redact(candidate.path), reason)
            continue
        kept.append(candidate)
        if newest_only:
            break
    return kept


def newest_complete(folder: str) -> Checkpoint | None:
    """The newest complete checkpoint in `folder` by step, or None."""
    kept = complete_checkpoints(folder, newest_only=True)
    return kept[0] if kept else None
