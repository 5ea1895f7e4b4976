"""pushshift dump lines -> Arrow rows: a dump read in chunks of whole lines (a byte-order mark
dropped, an oversized line skipped), each line's fields parsed by Arrow's JSON reader (line by line
where it refuses a run), with its line number and its place in the whole input (`order`)."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from convsts.datasets.reddit import json_record
from convsts.io.compression import open_lines
from convsts.io.read_ahead import read_ahead

DUMP_FIELDS = {"id": str, "parent_id": str, "link_id": str, "author": str, "body": str}
TEXT_FIELDS = [*DUMP_FIELDS, "subreddit"]  # the fields read from a line, all strings
COMMENT_COLUMNS = [*TEXT_FIELDS, "line", "order", "status"]
# A line's place in the whole input: (the rank of its file among the inputs by path) << LINE_BITS | its
# line number. The first line of a repeated comment id is the one with the smallest order.
LINE_BITS = 40
BOM = b"\xef\xbb\xbf"
NEWLINE, OPEN, CLOSE, CR = (ord(c) for c in "\n{}\r")
CHUNK_BYTES = 8 << 20  # decompressed bytes parsed at once: the reader's memory, whatever the input's size
ARROW_MIN_LINES = 2048  # a run of lines Arrow refuses is halved down to this size, then parsed line by line


def parse_comment(raw: bytes, first_line: bool = False) -> dict[str, str] | None:
    """One NDJSON line -> the fields we use, or None when the line is malformed (not UTF-8, not a
    JSON object, a required field missing or of the wrong type)."""
    obj = json_record(raw, first_line)
    if obj is None:
        return None
    for name, kind in DUMP_FIELDS.items():
        if not isinstance(obj.get(name), kind):
            return None
    sub = obj.get("subreddit")
    return {name: obj[name] for name in DUMP_FIELDS} | {"subreddit": sub if isinstance(sub, str) else ""}


def _comment_table(table):
    """Arrow's rows (TEXT_FIELDS, nulls where absent) -> the same with `status`: "malformed" for a row
    missing a required field, whose fields become ""."""
    complete = pa.array(np.ones(table.num_rows, bool))
    for name in DUMP_FIELDS:
        complete = pc.and_(complete, pc.is_valid(table[name]))
    columns = {name: pc.fill_null(table[name], "") for name in TEXT_FIELDS}
    columns |= {name: pc.if_else(complete, columns[name], "") for name in DUMP_FIELDS}
    columns["status"] = pc.if_else(complete, "", "malformed")
    return pa.table(columns)


def _arrow_comments(data: bytes, count: int):
    """`count` lines (their bytes, each ending in a newline) parsed at C speed by Arrow's JSON reader, or None
    when a line is not a JSON object, has a field of another type or is not UTF-8: the caller then
    parses those lines one by one, as parse_comment does. Arrow would take two objects on one line as
    two rows and skip a blank line: as many rows as lines means one object a line."""
    schema = pa.schema([(name, pa.string()) for name in TEXT_FIELDS])
    options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pajson.read_json(pa.py_buffer(data), parse_options=options)
        table.validate(full=True)  # the reader does not check that strings are UTF-8
    except (pa.ArrowException, UnicodeDecodeError):
        return None
    return _comment_table(table) if table.num_rows == count else None


MALFORMED_ROW = {name: "" for name in TEXT_FIELDS} | {"status": "malformed"}


def _rows_table(rows: list[dict[str, str]]):
    return pa.table({name: pa.array([r[name] for r in rows], pa.string()) for name in [*TEXT_FIELDS, "status"]})


def _line_by_line(lines: list[bytes]):
    rows = []
    for raw in lines:
        comment = parse_comment(raw)
        rows.append({**comment, "status": ""} if comment else MALFORMED_ROW)
    return _rows_table(rows)


def _parse_lines(lines: list[bytes]):
    """Well-shaped lines ({ to }) as rows, in order: Arrow's JSON reader on the run, a run it refuses (a
    malformed line inside) halved until the bad lines are parsed one by one."""
    table = _arrow_comments(b"\n".join(lines) + b"\n", len(lines)) if lines else None
    if table is not None:
        return table
    if len(lines) <= ARROW_MIN_LINES:
        return _line_by_line(lines)
    half = len(lines) // 2
    return pa.concat_tables([_parse_lines(lines[:half]), _parse_lines(lines[half:])])


# A line longer than this (its bytes before the newline) is no comment (Reddit caps a body at 10,000
# characters): it is a malformed line, unparsed, wherever it falls (parse_chunk). One that crosses
# the end of a read block is read past a piece at a time, never held whole, and shown as OVERSIZED_LINE.
MAX_LINE_BYTES = 1 << 20
OVERSIZED_LINE = b"<a line of over 1 MiB, skipped>\n"


def _line_bounds(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, well shaped) of each line of a chunk: end excludes the newline (a last line may have
    none); a well-shaped line starts with "{" and ends with "}" (before a "\\r")."""
    ends = np.flatnonzero(data == NEWLINE)  # (L,)
    if len(data) and data[-1] != NEWLINE:
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)  # (L,)
    nonempty = starts < ends
    first = np.where(nonempty, data[np.minimum(starts, len(data) - 1)], 0)
    last_at = np.maximum(ends - 1, 0)
    last_at = np.where((data[last_at] == CR) & (ends - 2 >= starts), ends - 2, last_at)
    shaped = nonempty & (first == OPEN) & (data[last_at] == CLOSE) & (ends - starts >= 2)
    return starts, ends, shaped


def parse_chunk(chunk: bytes) -> tuple[Any, np.ndarray]:
    """Whole lines of a dump (a file's byte-order mark already removed) -> (one row per line
    (COMMENT_COLUMNS but line and order), each row's line index in the chunk). The well-shaped lines go
    to Arrow's JSON reader in one call, as the runs of bytes between the others; the others are parsed one
    by one (they are malformed, or valid JSON with spaces around)."""
    starts, ends, shaped = _line_bounds(np.frombuffer(chunk, np.uint8))
    oversized = ends - starts > MAX_LINE_BYTES  # (L,) malformed unread, wherever the line falls
    shaped &= ~oversized
    if shaped.all():
        table = _arrow_comments(chunk if chunk.endswith(b"\n") else chunk + b"\n", len(starts))
        if table is not None:
            return table, np.arange(len(starts))
    view = memoryview(chunk)
    good_at, bad_at, long_at = np.flatnonzero(shaped), np.flatnonzero(~shaped & ~oversized), np.flatnonzero(oversized)
    runs = np.split(good_at, np.flatnonzero(np.diff(good_at) != 1) + 1) if len(good_at) else []
    good = b"\n".join(view[starts[run[0]] : ends[run[-1]]] for run in runs) + b"\n"
    good_rows = _arrow_comments(good, len(good_at)) if len(good_at) else None
    if good_rows is None:
        good_rows = _parse_lines([bytes(view[starts[i] : ends[i]]) for i in good_at.tolist()])
    bad_rows = _line_by_line([bytes(view[starts[i] : ends[i]]) for i in bad_at.tolist()])
    long_rows = _rows_table([MALFORMED_ROW] * len(long_at))
    return pa.concat_tables([good_rows, bad_rows, long_rows]), np.concatenate([good_at, bad_at, long_at])


def whole_lines(path: str, chunk_bytes: int) -> Generator[bytes, None, None]:
    """A file's bytes (decompressed), about chunk_bytes at a time, each piece ending at a line's end (the
    last may have no newline); a byte-order mark at the start removed. Read ahead in a thread: the
    decompressor and Arrow's parser release the GIL, so reading overlaps parsing."""
    with open_lines(path) as fh:
        first = True
        while block := fh.read(chunk_bytes):
            if not block.endswith(b"\n"):
                block += fh.readline(MAX_LINE_BYTES)
            if not block.endswith(b"\n") and fh.peek(1):  # its last line is longer than any comment
                block = block[: block.rfind(b"\n") + 1] + OVERSIZED_LINE
                while (rest := fh.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of that line, read and dropped a piece at a time
            if first and block.startswith(BOM):
                block = block[len(BOM) :]
            first = False
            yield block


def read_dump_chunks(path: str, rank: int = 0, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """Comments of one dump file (plain or compressed) as Arrow tables of COMMENT_COLUMNS, one per chunk of
    about `chunk_bytes` decompressed bytes cut at a line's end: each line's number and place in the input
    (`order`, with the file's `rank`); malformed lines kept with status "malformed". Within a chunk the
    malformed lines come last (rows are in no fixed order: `line` says where each was)."""
    for first, chunk in numbered(read_ahead(whole_lines(path, chunk_bytes))):
        yield numbered_table(chunk, first, rank)


def numbered(pieces: Iterable[bytes], first: int = 1) -> Iterator[tuple[int, bytes]]:
    """(the number of its first line, piece) for consecutive whole-line pieces of a file."""
    for piece in pieces:
        yield first, piece
        first += piece.count(b"\n") + (1 if piece and not piece.endswith(b"\n") else 0)


def line_pieces(data: bytes, size: int) -> Iterator[bytes]:
    """Whole-line pieces of `data` of about `size` bytes (the last may end without a newline)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start + size - 1)
        end = len(data) if end < 0 else end + 1
        yield data[start:end]
        start = end


def numbered_table(chunk: bytes, first: int, rank: int):
    """parse_chunk's rows of `chunk`, whose first line is line `first` of the input of `rank`, with
    each row's line and order (COMMENT_COLUMNS)."""
    table, at = parse_chunk(chunk)
    line = first + at.astype(np.int64)  # (rows,)
    table = table.append_column("line", pa.array(line))
    return table.append_column("order", pa.array((np.int64(rank) << LINE_BITS) + line)).select(COMMENT_COLUMNS)


def read_dump_file(path: str, chunk_bytes: int = CHUNK_BYTES, rank: int = 0) -> Iterator[pd.DataFrame]:
    """read_dump_chunks as pandas frames, their rows in line order."""
    for table in read_dump_chunks(path, rank, chunk_bytes):
        yield table.to_pandas().sort_values("line", ignore_index=True)


def source_of(order: int, paths: Sequence[str]) -> str:
    """FILE:LINE of a line's order (`paths` by rank)."""
    return f"{paths[order >> LINE_BITS]}:{order & ((1 << LINE_BITS) - 1)}"
