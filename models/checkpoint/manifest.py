"""A checkpoint's manifest (its files' sizes and sha256, written last): written, read, checked for
completeness and against the digests once per version of the files, and extended by a tuned STS
matrix."""

from __future__ import annotations

import functools
import hashlib
import json
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact
from convsts.models.checkpoint.names import EMBEDDING_FILES, MANIFEST_FILE, checkpoint_folder

if TYPE_CHECKING:
    from convsts.models.sts_transform import StsTransform


def write_manifest(path: Path, known: dict[str, dict[str, Any]] | None = None) -> None:
    """path/MANIFEST_FILE, after every other file of the checkpoint: their sizes and sha256 digests
    (`known`: entries of files copied from a checkpoint whose manifest holds them). The tuned STS
    matrices written later are added by add_to_manifest."""
    known = known or {}
    files = {
        f.name: known.get(f.name) or _manifest_entry(f)
        for f in sorted(path.iterdir())
        if f.is_file() and f.name != MANIFEST_FILE and not f.name.startswith(".")
    }
    _write_manifest_files(path, files)


def _manifest_entry(file: Path) -> dict[str, Any]:
    return {"bytes": file.stat().st_size, "sha256": storage.file_sha256(file)}


def _write_manifest_files(path: Path, files: dict[str, dict[str, Any]]) -> None:
    storage.write_text(path / MANIFEST_FILE, json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")


def listed_files(path: str | Path) -> dict[str, dict[str, Any]]:
    """The files a checkpoint's manifest lists ({name: {"bytes", "sha256"}}); BadInputError if damaged."""
    file = storage.join(path, MANIFEST_FILE)
    try:
        files = json.loads(storage.read_text(file))["files"]
        if all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str) for e in files.values()):
            return files
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    raise BadInputError(f"{file}: not a checkpoint manifest; the checkpoint is damaged")


def incomplete_reason(path: str | Path) -> str | None:
    """Why the checkpoint folder at `path` (local or a URI: one listing, one small read) is not
    complete, or None when it is. Complete: its manifest, written last, is there, and every file it
    lists is there with the size it lists. A checkpoint whose upload or copy stopped midway lacks
    one or the other, whatever order its files were written in."""
    try:
        present = {name: size for name, size, _ in storage.folder_stats(path)}
    except FileNotFoundError:
        return "no such folder"
    except NotADirectoryError:
        return "not a folder"
    if MANIFEST_FILE not in present:
        return f"no {MANIFEST_FILE} (written last, once every file of the checkpoint is in place)"
    try:
        listed = listed_files(path)
    except BadInputError:
        return f"its {MANIFEST_FILE} is damaged"
    for name, entry in sorted(listed.items()):
        if name not in present:
            return f"{name} is missing"
        if present[name] != entry["bytes"]:
            return f"{name} has {present[name]:,} bytes, its manifest {entry['bytes']:,}"
    return None


def save_sts_matrix(folder: str | Path, transform: StsTransform, name: str = "") -> Path:
    """A tuned STS matrix saved into `folder` (a checkpoint, a model folder or an evaluation's
    output); in a checkpoint or model folder it joins the manifest, so every reader verifies it."""
    path = transform.save(folder, name)
    if (Path(folder) / MANIFEST_FILE).is_file():
        add_to_manifest(folder, path)
    return path


class Hashed(NamedTuple):
    """A checkpoint or model folder that one process hashed against its manifest: its machine, its
    local folder and its files' sizes and times then. Another process on that machine, given it,
    does not hash the same files again while they keep those sizes and times (a Ray Train worker
    after its driver's checks)."""

    host: str
    folder: str
    signature: tuple[tuple[str, int, int], ...]

    def covers(self, local: Path) -> bool:
        return self.host == socket.gethostname() and self.folder == str(local) and self.signature == _signature(local)


def hashed_here(path: str | Path) -> Hashed:
    """The folder at `path` verified (verified_folder: hashed once in this process), as a Hashed to
    hand to another process on this machine."""
    local = verified_folder(path)
    return Hashed(socket.gethostname(), str(local), _signature(local))


def verified_folder(path: str | Path, hashed: Sequence[Hashed] = ()) -> Path:
    """A checkpoint or model folder on this machine (checkpoint_folder), as every reader takes it:
    refused in one line unless its manifest is there and each file it lists is there at its size
    (always) and with its sha256 (once per version of the files in a process: a folder read again
    unchanged is not hashed again; nor one that another process on this machine hashed, `hashed`,
    unchanged since). A folder without a manifest is refused: nothing tells a whole folder from one
    cut short."""
    local = checkpoint_folder(path)  # a folder at a URI is read once, into the local cache
    reason = incomplete_reason(local)
    if reason is not None:
        raise BadInputError(f"{redact(str(path))}: not a complete checkpoint or model folder ({reason})")
    if not any(h.covers(local) for h in hashed):
        _check_digests(local, path)
    return local


def add_to_manifest(folder: str | Path, file: Path) -> None:
    """`file`, just written into the verified local `folder` (a tuned STS matrix), listed in its
    manifest beside the entries it had, so every later read verifies it too."""
    _write_manifest_files(Path(folder), listed_files(folder) | {file.name: _manifest_entry(file)})


def damaged_file(path: str | Path) -> str | None:
    """The first file of a complete checkpoint or model folder (incomplete_reason None) whose sha256
    is not its manifest's (replaced or damaged after it was written), or None; hashed as
    verified_folder hashes it, so that reading the folder next hashes nothing again."""
    local = checkpoint_folder(path)
    return _first_differing(local, _signature(local))


def _signature(local: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (name, (local / name).stat().st_size, (local / name).stat().st_mtime_ns) for name in sorted(listed_files(local))
    )


def _check_digests(local: Path, shown: str | Path) -> None:
    """Refused in one line naming `shown` unless every file the manifest lists has its sha256."""
    differs = _first_differing(local, _signature(local))
    if differs is not None:
        raise BadInputError(
            f"{redact(str(shown))}: {differs} differs from its manifest's sha256 (replaced or damaged after it was "
            "written); refused"
        )


@functools.lru_cache(maxsize=64)  # per folder and version of its files (sizes and times): hashed once
def _first_differing(local: Path, signature: tuple[tuple[str, int, int], ...]) -> str | None:
    """The first listed file whose sha256 is not its manifest's, or None."""
    for name, entry in sorted(listed_files(local).items()):
        if storage.file_sha256(local / name) != entry["sha256"]:
            return name
    return None


def embeddings_digest(path: str | Path) -> str:
    """A digest of what a checkpoint's embeddings depend on (EMBEDDING_FILES: its weights and
    tokenizer), from the sha256 its manifest lists for each (verified_folder checked them): equal for
    two folders whose those files are equal, read without reading the files again."""
    listed = listed_files(verified_folder(path))
    return hashlib.sha1("".join(listed[name]["sha256"] for name in EMBEDDING_FILES).encode()).hexdigest()
