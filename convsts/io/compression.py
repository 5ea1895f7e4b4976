"""Compressed inputs, read as streams and named by what they hold.

pushshift's monthly comment dumps ship as .zst (since 2017-12; the academic-torrents re-release
converted every month to it) and as .bz2 / .xz before that; MTEB's STS files are .jsonl.gz. The
readers of Reddit, SNLI and STS inputs open them with `open_lines`, which picks the decompressor
by the file's last suffix, and decides the format by `plain_name` (`test.jsonl.gz` -> `test.jsonl`).
A truncated or corrupt file raises BadInputError naming the file, instead of ending early as
the decompressors' own stream readers can.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard

from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.io.redaction import redact

ZSTD = ".zst"
STDLIB = {
    ".gz": ("gzip", lambda raw: gzip.GzipFile(fileobj=raw, mode="rb")),
    ".bz2": ("bzip2", lambda raw: bz2.BZ2File(raw, mode="rb")),
    ".xz": ("xz", lambda raw: lzma.LZMAFile(raw, mode="rb")),
}
SUFFIXES = (ZSTD, *STDLIB)  # the compressions an input may have
BUFFER = 1 << 20
ZSTD_MAX_WINDOW = 2**31  # pushshift's large dumps need a window above zstd's default limit


def compression_of(path: str | Path) -> str:
    """The compression suffix of a file's name ('.zst', '.gz', '.bz2', '.xz'), or ''."""
    name = storage.name(str(path))
    return next((s for s in SUFFIXES if name.endswith(s)), "")


def plain_name(path: str | Path) -> str:
    """A file's name without its compression suffix: what the file holds decides the format."""
    name = storage.name(str(path))
    suffix = compression_of(path)
    return name[: len(name) - len(suffix)] if suffix else name


# The first bytes of each compression's files: a file named for one but holding another is named so.
MAGIC = {ZSTD: b"\x28\xb5\x2f\xfd", ".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00"}


def _check_magic(raw: io.BufferedReader, path: str, suffix: str) -> None:
    """BadInputError naming what a compressed file holds when its first bytes are not its suffix's."""
    head = raw.peek(8)[:8]
    if not head or head.startswith(MAGIC[suffix]):
        return
    found = next((other for other, magic in MAGIC.items() if head.startswith(magic)), None)
    holds = f"{found} data; rename it to end in {found}" if found else f"no {suffix} data (first bytes {head!r})"
    raise BadInputError(f"{redact(path)}: named {suffix} but holds {holds}")


def open_lines(path: str | Path) -> io.BufferedReader:
    """A binary line reader of a local file or a URI, decompressed as a stream by its suffix (a file
    whose first bytes are another compression's is refused, naming it)."""
    path = str(path)
    suffix = compression_of(path)
    raw = storage.open_binary(path)
    if suffix:
        try:
            _check_magic(raw, path, suffix)
        except BadInputError:
            raw.close()
            raise
    if suffix == ZSTD:
        return io.BufferedReader(_ZstdLines(raw, path), buffer_size=BUFFER)
    if suffix:
        return io.BufferedReader(_StdlibLines(raw, path, *STDLIB[suffix]), buffer_size=BUFFER)
    return raw


# Decompressors that take a stream's first bytes alone and give what those hold (open_lines'
# readers raise on a stream that stops early).
PREFIX_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    ZSTD: lambda: zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj(),
    ".gz": lambda: zlib.decompressobj(wbits=31),
    ".bz2": bz2.BZ2Decompressor,
    ".xz": lzma.LZMADecompressor,
}


def decompressed_prefix(path: str | Path, stored_bytes: int) -> tuple[bytes, int]:
    """(what a file's first `stored_bytes` as stored decompress to, as far as they go; the stored
    bytes read): a sample of a file too large to read whole. Data that does not decompress gives
    b"" (the file's own read names the problem)."""
    with storage.open_binary(str(path)) as raw:
        head = raw.read(stored_bytes)
    suffix = compression_of(path)
    if not suffix:
        return head, len(head)
    try:
        return PREFIX_DECOMPRESSORS[suffix]().decompress(head), len(head)
    except (zstandard.ZstdError, zlib.error, lzma.LZMAError, OSError, EOFError):
        return b"", len(head)


def read_text(path: str | Path) -> str:
    """A whole UTF-8 text file, decompressed by its suffix (storage.read_text's checks)."""
    with open_lines(path) as fh:
        return storage.decode_text(fh.read(), path)


class _ZstdLines(io.RawIOBase):
    """A .zst stream decompressed frame by frame that refuses to end inside a frame: a truncated
    or corrupt file raises BadInputError naming the file and the compressed byte offset, instead of
    ending early as zstandard's stream reader does."""

    def __init__(self, raw, path: str):
        self._zstd = zstandard
        self._raw, self._path = raw, path
        self._new_frame()
        self._pending, self._at = b"", 0  # decompressed bytes not yet handed out start at _at
        self._offset = 0  # compressed bytes read so far
        self._done = False

    def _new_frame(self):
        self._dobj = self._zstd.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj()
        self._frame_has_input = False

    def readable(self) -> bool:
        return True

    def _fill(self) -> None:
        while self._at == len(self._pending) and not self._done:
            chunk = self._raw.read(BUFFER)
            if not chunk:
                if self._frame_has_input and not self._dobj.eof:
                    raise BadInputError(
                        f"{self._path}: truncated zstd file: the data ends inside a frame at byte "
                        f"{self._offset} (re-download or re-compress it)"
                    )
                self._done = True
                return
            self._offset += len(chunk)
            self._pending, self._at = self._decompress(chunk), 0

    def _decompress(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            self._frame_has_input = True
            try:
                out.append(self._dobj.decompress(chunk))
            except self._zstd.ZstdError as err:
                raise BadInputError(f"{self._path}: corrupt zstd data near byte {self._offset}: {err}") from None
            if not self._dobj.eof:
                break
            chunk = self._dobj.unused_data  # the next frame (dumps may hold several)
            self._new_frame()
        return b"".join(out)

    def readinto(self, buffer) -> int:
        self._fill()
        n = min(len(buffer), len(self._pending) - self._at)
        buffer[:n] = self._pending[self._at : self._at + n]  # one copy out; the rest is not moved
        self._at += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class _SourceFailed(Exception):
    """The compressed bytes could not be read (a store's error): kept apart from the decompressor's
    own errors, which are OSErrors too for gzip and bzip2."""


class _Source(io.RawIOBase):
    def __init__(self, raw):
        self._raw = raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._raw.read(len(buffer))
        except OSError as err:
            raise _SourceFailed() from err
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _StdlibLines(io.RawIOBase):
    """gzip, bzip2 or xz through Python's own modules (several concatenated streams read as one), a
    truncated file (EOFError) or corrupt data raising BadInputError naming the file."""

    def __init__(self, raw, path: str, kind: str, opener):
        self._path, self._kind = path, kind
        self._source = _Source(raw)
        self._stream = opener(self._source)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self._stream.readinto(buffer)
        except _SourceFailed as failed:
            raise (failed.__cause__ or failed) from None  # the store's own error, as for an uncompressed file
        except EOFError:
            raise BadInputError(
                f"{self._path}: truncated {self._kind} file: the data ends before its end-of-stream "
                f"marker (re-download or re-compress it)"
            ) from None
        except (OSError, zlib.error, lzma.LZMAError) as err:
            raise BadInputError(f"{self._path}: corrupt {self._kind} data: {err}") from None

    def close(self) -> None:
        self._stream.close()  # leaves a file object it was given open
        self._source.close()
        super().close()
