"""A folder written whole or not at all: written into a staging folder of its own beside the target,
then renamed into place."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def staging_folder(out_dir: Path) -> Path:
    """A new, empty folder beside out_dir, made by this call (a unique name: never a folder of the
    user's, which is never removed), to write into and rename into place when complete."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))


@contextlib.contextmanager
def replaced_whole(out_dir: Path) -> Iterator[Path]:
    """A folder written whole or not at all: the caller writes into a new staging folder beside
    `out_dir` (staging_folder), which then replaces `out_dir`; on any error it is removed (this call's
    own folder only) and `out_dir` stays as it was. An OSError without a file name (a full disk) names
    `out_dir`. Where `out_dir` is a link to a folder (a checkpoint kept on another disk), the folder
    it points to is replaced, and the link stays."""
    shown, out_dir = out_dir, out_dir.resolve() if out_dir.is_symlink() else out_dir
    partial = staging_folder(out_dir)
    try:
        yield partial
    except BaseException as err:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, OSError) and not err.filename:
            raise OSError(err.errno, err.strerror or str(err), str(shown)) from err
        raise
    # Two renames, then the old copy removed: a signal between them puts the old one back, so
    # `out_dir` is the old folder or the new one, never neither.
    old = partial.with_suffix(".old") if out_dir.exists() else None
    try:
        if old is not None:
            out_dir.rename(old)
        partial.rename(out_dir)
    except BaseException:
        if old is not None and not out_dir.exists():
            old.rename(out_dir)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old)


def removed_together(paths: list[Path]) -> None:
    """Files and folders of one folder removed all or none: each is first renamed into a new folder
    beside them (a rename that fails puts back those before it), which is then removed. A link is
    removed as a link: the folder it points to, outside, is not touched."""
    if not paths:
        return
    trash = Path(tempfile.mkdtemp(prefix=".removed.", dir=paths[0].parent))
    moved: list[tuple[Path, Path]] = []
    try:
        for path in paths:
            target = trash / path.name
            path.rename(target)
            moved.append((path, target))
    except BaseException:
        for path, target in reversed(moved):
            target.rename(path)
        trash.rmdir()
        raise
    for _, target in moved:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    trash.rmdir()
