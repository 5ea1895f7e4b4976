"""Local paths and filesystem URIs (s3://, gs://, file://, hdfs://) behind one small interface.

Everything that reads raw inputs, prepared shards or evaluation sets goes through pyarrow's
filesystems, so a path may be a local path or a URI. Credentials and endpoints come from the
environment as pyarrow reads them (AWS_* variables including AWS_ENDPOINT_URL, instance profiles,
GOOGLE_APPLICATION_CREDENTIALS / workload identity) or from the URI's query
(`s3://bucket/p?endpoint_override=host:port&scheme=http`); nothing is stored in configs.
Outputs of a run (checkpoints, MLflow store, evaluation folders) stay local unless noted.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob as local_glob
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from convsts.io.errors import BadInputError, ConfigError, StorageError
from convsts.io.redaction import (
    redact,
)


@contextlib.contextmanager
def path_errors(path: str | Path, error: type | None = None, what: str = ""):
    """Turns a filesystem's own error while reaching `path` (pyarrow's OSError, or its ArrowInvalid for
    a URI it cannot parse or a file it cannot decode) into one line naming the path, credentials
    redacted: a StorageError, or `error` with `what` before the detail (a file that was reached but
    is not what it claims to be). A missing file stays FileNotFoundError."""

    try:
        yield
    except FileNotFoundError as err:
        if " " in str(err).strip():  # a message of its own
            raise
        raise FileNotFoundError(f"{redact(str(path))}: no such file or folder") from err  # pyarrow's: the path alone
    except StorageError:
        raise
    except (OSError, pa.ArrowInvalid) as err:
        detail = redact(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
        raise (error or StorageError)(f"{redact(str(path))}: {what}{detail}") from err


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def is_uri(path: str | Path) -> bool:
    """True for "scheme://..." (a one-letter scheme would be a Windows drive, so two or more)."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def _split_query(uri: str) -> tuple[str, str]:
    """("scheme://path", "?k=v&...") ; a "?" not followed by k=v options is a glob character."""
    head, sep, query = uri.rpartition("?")
    if sep and "=" in query and "/" not in query:
        return head, sep + query
    return uri, ""


def resolve(path: str | Path) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI."""
    if is_uri(path):
        with path_errors(path):
            return pafs.FileSystem.from_uri(str(path))
    return pafs.LocalFileSystem(), os.path.abspath(str(path))


def path_and_filesystem(path: str | Path) -> tuple[str, pafs.FileSystem | None]:
    """(path, filesystem) for the calls that take both (ray.data read/write_parquet, pyarrow.parquet):
    URIs with a query (endpoint options) are resolved here so that those see a plain path and the
    configured filesystem; local paths go as they are (filesystem None)."""
    if is_uri(path):
        fs, inner = resolve(path)
        return inner, fs
    return str(path), None


def join(base: str | Path, *parts: str) -> str:
    """base/part/... for local paths and URIs (a URI's query stays at the end)."""
    if not is_uri(base):
        return str(Path(base, *parts))
    head, query = _split_query(str(base))
    return "/".join([head.rstrip("/"), *[p.strip("/") for p in parts]]) + query


def add_suffix(path: str | Path, suffix: str) -> str:
    """path + suffix on the last component (before a URI's query)."""
    if not is_uri(path):
        return str(path) + suffix
    head, query = _split_query(str(path))
    return head + suffix + query


def sibling(path: str | Path, other: str) -> str:
    """The file named `other` in the folder of `path` (a URI's query stays at the end)."""
    if not is_uri(path):
        return str(Path(path).with_name(other))
    head, query = _split_query(str(path))
    return head.rsplit("/", 1)[0] + "/" + other + query


def folder_name(path: str | Path) -> str:
    """The name of the folder that holds `path` (without a URI's query)."""
    text = _split_query(str(path))[0] if is_uri(path) else str(path)
    return name(text.rstrip("/").rsplit("/", 1)[0]) if "/" in text.rstrip("/") else ""


def parent_names(path: str | Path) -> list[str]:
    """The names of the folders above `path`, nearest first (without a URI's query or scheme):
    "s3://b/sts12/data/test.parquet?region=x" -> ["data", "sts12", "b"]."""
    text = _split_query(str(path))[0] if is_uri(path) else str(path)
    if is_uri(text):
        text = text.split("://", 1)[1]
    return [part for part in reversed(text.rstrip("/").split("/")[:-1]) if part]


def name(path: str | Path) -> str:
    """The last path component (without a URI's query)."""
    text = _split_query(str(path))[0] if is_uri(path) else str(path)
    return text.rstrip("/").rsplit("/", 1)[-1]


def entry_info(path: str | Path) -> pafs.FileInfo:
    """What the store says of `path` (its type, size, time); an unreachable store is one line."""
    fs, inner = resolve(path)
    with path_errors(path):
        return fs.get_file_info(inner)


def is_dir(path: str | Path) -> bool:
    if not is_uri(path):
        return Path(path).is_dir()
    return entry_info(path).type == pafs.FileType.Directory


def is_file(path: str | Path) -> bool:
    if not is_uri(path):
        return Path(path).is_file()
    return entry_info(path).type == pafs.FileType.File


def file_stat(path: str | Path) -> tuple[int, int] | None:
    """(size in bytes, modification time in ns) of a file, local or at a URI (one request); None
    where no file is."""
    if not is_uri(path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
    info = entry_info(path)
    return (int(info.size), int(info.mtime_ns or 0)) if info.type == pafs.FileType.File else None


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex; what `sha256sum` prints), local or at a URI, read in chunks."""
    with open_binary(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def list_files(folder: str | Path) -> list[str]:
    """Files directly in a folder (not hidden), sorted; local paths or URIs like the folder's."""
    if not is_uri(folder):
        return sorted(str(p) for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith("."))
    return [join(folder, file) for file, _, _ in folder_stats(folder)]


def folder_stats(folder: str | Path) -> list[tuple[str, int, int]]:
    """(name, size in bytes, modification time in ns) of each file directly in a folder (not
    hidden), sorted by name; at a URI from the one listing request."""
    if not is_uri(folder):
        return [(name(f), *stat) for f in list_files(folder) if (stat := file_stat(f)) is not None]
    fs, inner = resolve(folder)
    with path_errors(folder):
        infos = fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), recursive=False))
    return sorted(
        (i.base_name, int(i.size), int(i.mtime_ns or 0))
        for i in infos
        if i.type == pafs.FileType.File and not i.base_name.startswith(".")
    )


def check_bucket(uri: str | Path, key: str) -> None:
    """A bucket URI's bucket exists (one request; a local path or a store without buckets passes):
    else a ConfigError naming `key` and the bucket, credentials redacted, before any work."""
    if not is_uri(uri):
        return
    fs, inner = resolve(uri)
    if fs.type_name not in ("s3", "gcs"):
        return
    bucket = inner.split("/", 1)[0]
    with path_errors(uri):
        found = fs.get_file_info(bucket).type != pafs.FileType.NotFound
    if not found:
        raise ConfigError(
            f"{key}: the bucket {bucket!r} of {redact(str(uri))} does not exist; create it or name another"
        )


def writable(folder: str | Path) -> bool:
    """Whether this process can create a file in a local `folder`, tried with a temporary file (a
    read-only file system, an immutable folder or its permissions all refuse)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def has_entries(folder: str | Path) -> bool:
    """True when the folder exists and holds anything."""
    if not is_uri(folder):
        return Path(folder).exists() and any(Path(folder).iterdir())
    fs, inner = resolve(folder)
    with path_errors(folder):
        if fs.get_file_info(inner).type != pafs.FileType.Directory:
            return False
        return bool(fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), recursive=False)))


def entry_names(folder: str | Path) -> list[str]:
    """The names of a folder's entries, files and folders (local or a URI), sorted."""
    if not is_uri(folder):
        return sorted(p.name for p in Path(folder).iterdir())
    fs, inner = resolve(folder)
    with path_errors(folder):
        return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), recursive=False)))


def copy_tree(source: str | Path, target: str | Path) -> None:
    """A folder copied file by file (local paths or URIs)."""
    src, src_fs = path_and_filesystem(source)
    dst, dst_fs = path_and_filesystem(target)
    dst_fs = dst_fs or pafs.LocalFileSystem()
    with path_errors(target):
        dst_fs.create_dir(dst, recursive=True)
    with path_errors(source):
        pafs.copy_files(src, dst, source_filesystem=src_fs or pafs.LocalFileSystem(), destination_filesystem=dst_fs)


def delete_folder(folder: str | Path) -> None:
    """A folder and everything in it removed (local or at a URI)."""
    if not is_uri(folder):
        shutil.rmtree(folder)
        return
    fs, inner = resolve(folder)
    with path_errors(folder):
        fs.delete_dir(inner.rstrip("/"))


def delete_file(path: str | Path) -> None:
    """One file removed (local or at a URI); one that is not there already is fine."""
    if not is_uri(path):
        Path(path).unlink(missing_ok=True)
        return
    fs, inner = resolve(path)
    with contextlib.suppress(FileNotFoundError), path_errors(path):
        fs.delete_file(inner)


def has_wildcards(path: str) -> bool:
    """Glob characters in the path (a URI's query, after "?", does not count)."""
    text = _split_query(path)[0] if is_uri(path) else path
    return any(ch in text for ch in "*?[")


def glob(pattern: str) -> list[str]:
    """Files matching a pattern whose wildcards are in the last component (URIs), or anywhere (local)."""
    if not is_uri(pattern):
        return sorted(local_glob.glob(pattern))
    head, query = _split_query(pattern)
    folder, _, base = head.rpartition("/")
    if any(ch in folder.split("://", 1)[1] for ch in "*?["):
        raise ValueError(f"{pattern}: wildcards are supported in the last path component of a URI only")
    folder_uri = folder + query
    if not is_dir(folder_uri):
        return []
    return [f for f in list_files(folder_uri) if fnmatch.fnmatchcase(name(f), base)]


READ_PART = 8 * 1024 * 1024  # bytes per request when a file at a URI is read: a ranged GET each
READ_THREADS = 8  # ranged GETs in flight at once while a whole file is copied


class _StoreReader(io.RawIOBase):
    """A stream from a store that names the file and the byte it had reached when a read fails
    (the connection dropped, the object went away, after the store's own retries): a StorageError
    instead of the bare client error, so the command reports it in one line. Nothing is written
    from a read that failed; running the command again reads the file anew. Every read from an
    object store is a request, so reads are READ_PART long (RawIOBase's own readall asks 8 KiB a time)."""

    def __init__(self, stream, path: str | Path):
        self._stream, self._path, self._offset = stream, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with path_errors(self._path, what=f"reading stopped at byte {self._offset:,}: "):
            n = self._stream.readinto(buffer)
        self._offset += n
        return n

    def readall(self) -> bytes:
        parts = []
        while chunk := self.read(READ_PART):
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self._stream.close()
        super().close()


def open_binary(path: str | Path) -> io.BufferedReader:
    """A buffered binary reader (line iteration works) for a local file or a URI (READ_PART a request)."""
    if not is_uri(path):
        return open(path, "rb")
    fs, inner = resolve(path)
    # compression=None: the bytes as stored (callers decompress, e.g. .zst with a large window).
    with path_errors(path):
        return io.BufferedReader(_StoreReader(fs.open_input_stream(inner, compression=None), path), READ_PART)


def copy_file(path: str | Path, target: str | Path) -> int:
    """A whole file, local or at a URI, copied to the local file `target` (replaced); returns its size.
    From a store the file is read in READ_PART ranges, READ_THREADS at a time: one HEAD and about
    size / READ_PART GETs, at the store's speed (a stream read in small pieces is a request each)."""
    if not is_uri(path):
        with path_errors(path):
            shutil.copyfile(path, target)
        return os.path.getsize(target)
    fs, inner = resolve(path)
    with path_errors(path), fs.open_input_file(inner) as src:
        size = src.size()
        with write_errors(target), open(target, "wb") as out:
            out.truncate(size)
            fd = out.fileno()

            def part(offset: int) -> None:
                with path_errors(path, what=f"reading stopped at byte {offset:,}: "):
                    data = src.read_at(min(READ_PART, size - offset), offset)
                os.pwrite(fd, data, offset)

            with ThreadPoolExecutor(READ_THREADS) as pool:
                list(pool.map(part, range(0, size, READ_PART)))
    return size


def read_bytes(path: str | Path) -> bytes:
    """A whole file's bytes, local or at a URI (READ_PART a request)."""
    with open_binary(path) as fh:
        return fh.read()


def open_text(path: str | Path, encoding: str = "utf-8") -> io.TextIOWrapper:
    if not is_uri(path):
        return open(path, encoding=encoding)
    return io.TextIOWrapper(open_binary(path), encoding=encoding)


@contextlib.contextmanager
def write_errors(path: str | Path):
    """Names `path` in an OSError raised inside that names no file: a write() or close() that fails
    on a full disk (ENOSPC) or quota says only "No space left on device"."""
    try:
        yield
    except OSError as err:
        if err.filename or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror or str(err), redact(str(path))) from err


def write_bytes(path: str | Path, data: bytes | memoryview) -> None:
    """A file written whole or not at all: a local file is written beside its name and renamed into
    place; an object store's upload completes or leaves nothing. A failed write names `path`."""
    if not is_uri(path):
        partial = Path(path).with_name(Path(path).name + ".partial")
        try:
            with write_errors(path):
                partial.write_bytes(data)
        except BaseException:
            partial.unlink(missing_ok=True)  # this call's own file: nothing half-written is left
            raise
        partial.replace(path)
        return
    fs, inner = resolve(path)
    with path_errors(path), write_errors(path), fs.open_output_stream(inner, compression=None) as out:
        out.write(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def json_text(value) -> str:
    """`value` as indented JSON that every JSON reader takes: a NaN or infinite float (a metric that
    could not be computed) is null, not the bare NaN Python's json writes."""

    def finite(item):
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, dict):
            return {k: finite(v) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item

    return json.dumps(finite(value), indent=2, allow_nan=False)


def write_results(path: str | Path, results) -> None:
    """A results.json: json_text, credentials redacted, written whole."""
    write_text(path, redact(json_text(results)))


def read_text(path: str | Path) -> str:
    """A whole UTF-8 text file (a byte-order mark is dropped); bytes that are not UTF-8 raise
    BadInputError naming the file and line."""
    return decode_text(read_bytes(path), path)


def decode_text(data: bytes, path: str | Path) -> str:
    """The bytes of `path` as UTF-8 text (a byte-order mark is dropped), or BadInputError naming the line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BadInputError(
            f"{path}:{line}: not UTF-8 text (byte {err.start}: {err.reason}); convert the file to UTF-8"
        ) from None


SAMPLE_TOKEN = "{sample}"


def sample_dir() -> Path:
    """The embedded data sample shipped with the package."""
    return (Path(__file__).resolve().parent.parent / "datasets" / "sample").resolve()


def resolve_path(value: str) -> str:
    """Expand the "{sample}" token; other paths are returned as given (local or s3://, gs://)."""
    if SAMPLE_TOKEN in value:
        return value.replace(SAMPLE_TOKEN, str(sample_dir()))
    return value


def expand_inputs(inputs) -> list[str]:
    """Files, folders (their files) and globs, local or URIs (s3://, gs://, ...) -> a sorted list of
    files, each once: a file that two inputs name (listed twice, a folder and a glob over it, a link
    to it) is read once, and logged. Missing inputs raise."""
    files: dict[str, str] = {}  # what a file is (a local file's real path) -> how the inputs named it first
    for item in inputs:
        item = resolve_path(item)
        if is_dir(item):
            found = list_files(item)
        elif is_file(item):  # before globbing: a file named "RC_[1].zst" is that file
            found = [item]
        elif has_wildcards(item):
            found = glob(item)
        else:
            raise FileNotFoundError(f"input not found: {redact(item)}")
        if not found:
            raise FileNotFoundError(f"no input files in {redact(item)}")
        for file in found:
            key = file if is_uri(file) else os.path.realpath(file)
            if key in files:
                logging.getLogger("convsts").warning(
                    "%s: named more than once by the inputs; read once", redact(files[key])
                )
                continue
            files[key] = file
    return sorted(files.values())
