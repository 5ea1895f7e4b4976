"""pushshift comment dumps -> annotated Reddit pairs, in columns.

A dump is NDJSON, one comment a line (plain or compressed, see compression.py). Each line is read as
one row: its fields, its line number and its place in the whole input (`order`: the rank of its file
among the inputs by path << LINE_BITS | its line). Then every line ends in one manifest bucket:

  malformed -> a filter rule (RULES, on the raw body and the author) -> duplicate_id (a comment id
  seen on an earlier line: only the first is used) -> unpaired (the parent is a submission, is not
  in the input, or was filtered) -> a pair (parent body, body), its split a hash of `link_id`.

Two engines run those steps on the same columns:
  * `prepare_local`, in this process: the dumps streamed in chunks of decompressed bytes, parsed by
    Arrow's JSON reader, the filters vectorized; comments are spilled to local disk in hash partitions
    (a comment by its id as a parent, by its parent's id as a reply), so that the duplicate ids and the
    parent join need one partition in memory at a time, not the input (a grace hash join);
  * `prepare_distributed`, as Ray tasks across a cluster: the same steps on the same columns, a read
    task per dump streaming its partitions into Ray's object store (which spills to disk past its
    memory), then a task per partition for the repeated ids and one for the parent join.
Both give the same counts and the same pairs (tests/data/test_prepare.py compares their shards byte for byte).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.reddit import (
    DUPLICATE,
    MAX_EXAMPLES,
    ORDER_KEY,
    RULES,
    WRITTEN_COLUMNS,
    json_record,
    keyed_table,
    manifest_counts,
    split_of,
)
from convsts.datasets.shards import ShardPlan, ShardWriter, write_pieces, write_range
from convsts.io import storage
from convsts.io.compression import decompressed_prefix, open_lines
from convsts.io.redaction import redact

DUMP_FIELDS = {"id": str, "parent_id": str, "link_id": str, "author": str, "body": str}
TEXT_FIELDS = [*DUMP_FIELDS, "subreddit"]  # the fields read from a line, all strings
COMMENT_COLUMNS = [*TEXT_FIELDS, "line", "order", "status"]
# A line's place in the whole input: (the rank of its file among the inputs by path) << LINE_BITS | its
# line number. The first line of a repeated comment id is the one with the smallest order.
LINE_BITS = 40
BOM = b"\xef\xbb\xbf"
NEWLINE, OPEN, CLOSE, CR = (ord(c) for c in "\n{}\r")
CHUNK_BYTES = 8 << 20  # decompressed bytes parsed at once: the reader's memory, whatever the input's size
PARTITION_INPUT_BYTES = 64 << 20  # input bytes (as stored) per spill partition of prepare_local, at first
# A partition's rows (Arrow bytes, as decompressed and parsed) joined at once, at most: one larger is
# cut again by another hash before its join, however well its input compressed (split_key).
PARTITION_ROW_BYTES = 128 << 20
MAX_SPLITS = 3  # cuts of a partition at most: one whose rows share a few keys cannot shrink
KEY_BATCH_ROWS = 100_000  # pairs keyed at once (through pandas) in the pairs step
ARROW_MIN_LINES = 2048  # a run of lines Arrow refuses is halved down to this size, then parsed line by line
PARENT = "t1_"  # a parent_id that names a comment (t3_ names a submission)
# A reply's bucket when it makes no pair although it passed the filters (the manifest's unpaired_by_reason).
SUBMISSION, MISSING, FILTERED = "unpaired_parent_is_submission", "unpaired_parent_missing", "unpaired_parent_filtered"
PROGRESS_SECONDS = 30.0  # prepare_local logs how far it has read this often
log = logging.getLogger("convsts")


# ---------------------------------------------------------------------------------------------
# Reading: lines -> rows


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


def _whole_lines(path: str, chunk_bytes: int) -> Generator[bytes, None, None]:
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


def _read_ahead(items: Generator[Any, None, None]) -> Iterator[Any]:
    """`items` produced in a thread, one item ahead of the consumer; its error raised here."""
    done = object()
    ahead: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                ahead.put(item)
            ahead.put(done)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            ahead.put(err)
        finally:
            items.close()  # closes the file it reads

    thread = threading.Thread(target=produce, daemon=True, name="convsts-read-ahead")
    thread.start()
    try:
        while (item := ahead.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def read_dump_chunks(path: str, rank: int = 0, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """Comments of one dump file (plain or compressed) as Arrow tables of COMMENT_COLUMNS, one per chunk of
    about `chunk_bytes` decompressed bytes cut at a line's end: each line's number and place in the input
    (`order`, with the file's `rank`); malformed lines kept with status "malformed". Within a chunk the
    malformed lines come last (rows are in no fixed order: `line` says where each was)."""
    for first, chunk in _numbered(_read_ahead(_whole_lines(path, chunk_bytes))):
        yield numbered_table(chunk, first, rank)


def _numbered(pieces: Iterable[bytes], first: int = 1) -> Iterator[tuple[int, bytes]]:
    """(the number of its first line, piece) for consecutive whole-line pieces of a file."""
    for piece in pieces:
        yield first, piece
        first += piece.count(b"\n") + (1 if piece and not piece.endswith(b"\n") else 0)


def _line_pieces(data: bytes, size: int) -> Iterator[bytes]:
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


# ---------------------------------------------------------------------------------------------
# The filters, vectorized

ASCII_SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what str.strip() removes from an ASCII string


def _ascii_alpha_counts(strings) -> np.ndarray:
    """How many bytes of each string (an Arrow string array) are ASCII letters."""
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset : strings.offset + len(strings) + 1]
    values = strings.buffers()[2]
    if values is None or offsets[-1] == offsets[0]:
        return np.zeros(len(strings), np.int64)
    data = np.frombuffer(values, np.uint8)[offsets[0] : offsets[-1]]  # (bytes,)
    letters = ((data | 0x20) - ord("a")) < 26  # (bytes,) A-Z and a-z: lower-cased, then a range
    starts = np.minimum(offsets[:-1] - offsets[0], len(data) - 1)
    counts = np.add.reduceat(letters.view(np.uint8), starts, dtype=np.int32)
    return np.where(offsets[1:] > offsets[:-1], counts, 0)  # reduceat gives an empty string the next byte


def rule_status(body, author, cfg: RedditFilterConfig) -> np.ndarray:
    """failing_rule of each (body, author) pair (Arrow string arrays without nulls), in columns: the
    same answer, string for string. ASCII texts are decided in columns; a non-ASCII body (its letter
    share and its stripped form) or author goes through the same Python string methods failing_rule uses."""
    banned = pa.array(list(cfg.banned_bodies), pa.string())
    deleted = pc.is_in(pc.ascii_trim(body, characters=ASCII_SPACE), value_set=banned).to_numpy(zero_copy_only=False)
    length = pc.utf8_length(body).to_numpy(zero_copy_only=False)
    alpha = _ascii_alpha_counts(body)
    wide = np.flatnonzero(~pc.string_is_ascii(body).to_numpy(zero_copy_only=False))
    texts = body.take(pa.array(wide)).to_pylist()
    deleted[wide] = [t.strip() in cfg.banned_bodies for t in texts]
    alpha[wide] = [sum(map(str.isalpha, t)) for t in texts]
    bot = np.zeros(len(body), bool)
    if cfg.author_substring:
        needle = cfg.author_substring.lower()
        ascii_author = pc.string_is_ascii(author).to_numpy(zero_copy_only=False)
        bot = pc.match_substring(pc.ascii_lower(author), needle).to_numpy(zero_copy_only=False) & ascii_author
        others = np.flatnonzero(~ascii_author)
        bot[others] = [bool(a) and needle in a.lower() for a in author.take(pa.array(others)).to_pylist()]
    prefix = np.zeros(len(body), bool)
    for start in cfg.banned_prefixes:
        prefix |= pc.starts_with(body, start).to_numpy(zero_copy_only=False)
    low = (length == 0) | (alpha / np.maximum(length, 1) <= cfg.min_alpha_share)
    return np.select([deleted, bot, prefix, length >= cfg.max_chars, low], list(RULES), "")


def with_rules(table, cfg: RedditFilterConfig):
    """A chunk of comments with each well-formed line's filter rule in `status`."""
    status = table["status"].to_numpy(zero_copy_only=False).astype(object)
    ok = pa.array(np.flatnonzero(status == ""))
    if len(ok):
        body, author = (table[name].combine_chunks() for name in ("body", "author"))
        if len(ok) < len(table):
            body, author = body.take(ok), author.take(ok)
        status[ok.to_numpy()] = rule_status(body, author, cfg)
    return table.set_column(table.schema.get_field_index("status"), "status", pa.array(status, pa.string()))


def _source(order: int, paths: Sequence[str]) -> str:
    """FILE:LINE of a line's order (`paths` by rank)."""
    return f"{paths[order >> LINE_BITS]}:{order & ((1 << LINE_BITS) - 1)}"


# ---------------------------------------------------------------------------------------------
# In this process: spill partitions on local disk, one in memory at a time


class _Spill:
    """Rows spilled to local disk as Arrow IPC streams, in `parts` partitions per kind:
    * "node": each comment as a possible parent, in the partition of a hash of its id;
    * "edge": each comment as a reply, in the partition of a hash of its parent's id (a reply to a
      submission in that of its own id); a body is kept only where its comment passed the filters;
    * "pairs-SPLIT": the pairs found, in ranges of their ORDER_KEY (the top bits), so that writing the
      ranges one after the other, each sorted, writes in_fixed_order's order."""

    NODE = ("id", "order", "status", "body")
    EDGE = ("parent_key", "order", "status", "body", "link_id", "subreddit")

    def __init__(self, folder: Path, parts: int):
        self.folder, self.parts = folder, parts
        self._writers: dict[tuple[str, int | str], Any] = {}

    def add_comments(self, comments) -> None:
        """A chunk of well-formed comments (COMMENT_COLUMNS, filter rules in `status`)."""
        for kind, table, part in partitioned_comments(comments, self.parts):
            self._write_parts(kind, table, part)

    def add_pairs(self, split: str, pairs) -> None:
        """Pairs of one split (WRITTEN_COLUMNS and ORDER_KEY), by ranges of their key."""
        self._write_parts(f"pairs-{split}", pairs, key_ranges(pairs, self.parts))

    def _write_parts(self, kind: str, table, part: np.ndarray) -> None:
        for p, rows in partition_slices(table, part, self.parts):
            self._write(kind, rows, p)

    def _write(self, kind: str, rows, part: int | str) -> None:
        if (kind, part) not in self._writers:
            self._writers[kind, part] = pa.ipc.new_stream(str(self.folder / f"{kind}-{part}.arrow"), rows.schema)
        self._writers[kind, part].write_table(rows)

    def close_part(self, kind: str, part: int | str) -> None:
        if (kind, part) in self._writers:
            self._writers.pop((kind, part)).close()

    def close(self, kind: str) -> None:
        """The end of `kind`'s rows: its partitions can be read."""
        for key in [key for key in self._writers if key[0] == kind]:
            self._writers.pop(key).close()

    def size(self, part: int | str) -> int:
        """A partition's rows on disk (its node and edge files: Arrow IPC, as decompressed and parsed)."""
        files = (self.folder / f"{kind}-{part}.arrow" for kind in ("node", "edge"))
        return sum(f.stat().st_size for f in files if f.exists())

    def split(self, part: int | str, ways: int, seed: int) -> list[str]:
        """Partition `part`, cut into `ways` by another hash (split_key, `seed`), a batch at a time:
        the new partitions' names (`PART.0`, ...); its own files removed."""
        names = [f"{part}.{q}" for q in range(ways)]
        for kind in ("node", "edge"):
            path = self.folder / f"{kind}-{part}.arrow"
            if not path.exists():
                continue
            with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
                for batch in reader:
                    rows = pa.Table.from_batches([batch])
                    for q, sub in partition_slices(rows, _hashed(split_key(kind, rows), ways, seed), ways):
                        self._write(kind, sub, names[q])
            for name in names:
                self.close_part(kind, name)
            path.unlink()
        return names

    def read(self, kind: str, part: int | str):
        """One partition's rows (memory-mapped), or None when it has none."""
        path = self.folder / f"{kind}-{part}.arrow"
        return pa.ipc.open_stream(pa.memory_map(str(path))).read_all() if path.exists() else None

    def read_all(self, kind: str, part: int | str) -> list:
        """One partition's rows as a list of tables (as read tasks hand theirs over)."""
        return [self.read(kind, part)]

    def drop(self, kind: str, part: int | str) -> None:
        """One partition of `kind` read for the last time: its file removed (the spill's disk peak)."""
        (self.folder / f"{kind}-{part}.arrow").unlink(missing_ok=True)

    def later_lines(self):
        """The orders of the lines whose comment id was on an earlier line too (an Arrow array): the
        duplicates. Memory: one partition's (id, order), and the repeated lines."""
        later = [pa.array([], pa.int64())]
        for part in range(self.parts):
            nodes = self.read("node", part)
            if nodes is not None:
                later.append(later_lines_of(nodes))
        return pa.concat_arrays(later)

    def write_split(self, split: str, out_dir: str | Path, rows: int, rows_per_shard: int) -> list:
        """The pairs of `split` as its shards, range after range, each range sorted by its key."""
        writer = ShardWriter(storage.join(out_dir, split), rows, rows_per_shard)
        for part in range(self.parts):
            pairs = self.read(f"pairs-{split}", part)
            if pairs is not None:
                writer.add(pairs.sort_by([(ORDER_KEY, "ascending")]).drop_columns([ORDER_KEY]))
        return writer.close()


def _statuses(joined):
    """Each reply's bucket after the parent join (own status first, then its parent's), "" for a pair."""
    parent_status = joined["parent_status"]
    pair_or_filtered = pc.if_else(pc.equal(parent_status, ""), "", FILTERED)
    with_parent = pc.if_else(pc.is_null(parent_status), MISSING, pair_or_filtered)
    parent = pc.if_else(pc.is_null(joined["parent_key"]), SUBMISSION, with_parent)
    return pc.if_else(pc.equal(joined["status"], ""), parent, joined["status"])


# ---------------------------------------------------------------------------------------------
# The steps on columns, shared by both engines


def partitioned_comments(comments, parts: int) -> list[tuple[str, Any, np.ndarray]]:
    """A chunk of well-formed comments (COMMENT_COLUMNS, filter rules in `status`) as [(kind, rows,
    each row's partition)]: "node", each comment as a possible parent by a hash of its id; "edge",
    each as a reply by a hash of its parent's id (a reply to a submission by its own id); a body is
    kept only where its comment passed the filters."""
    body = pc.if_else(pc.equal(comments["status"], ""), comments["body"], None)
    is_comment = pc.starts_with(comments["parent_id"], PARENT)
    parent_key = pc.if_else(is_comment, pc.utf8_slice_codeunits(comments["parent_id"], len(PARENT)), None)
    columns = {"id": comments["id"], "parent_key": parent_key, "body": body}
    columns |= {name: comments[name] for name in ("order", "status", "link_id", "subreddit")}
    node = pa.table({name: columns[name] for name in _Spill.NODE})
    edge = pa.table({name: columns[name] for name in _Spill.EDGE})
    return [
        ("node", node, _hashed(comments["id"], parts)),
        ("edge", edge, _hashed(pc.coalesce(parent_key, comments["id"]), parts)),
    ]


def _hashed(keys, parts: int, seed: int = 0) -> np.ndarray:
    if parts == 1:
        return np.zeros(len(keys), np.int64)

    return (pl.Series(keys).hash(seed=seed).to_numpy() % parts).astype(np.int64)


def _say_recut(count: int, part_bytes: int) -> None:
    if count:
        log.info("reddit: %d partition(s) held over %g MiB of rows and were cut again", count, part_bytes / 2**20)


def split_key(kind: str, rows):
    """What a partition's rows are cut again by (with another hash): a node by its id, an edge by its
    parent's id, so that each reply stays with its parent; a reply to a submission, which has no
    parent to join, by its line."""
    if kind == "node":
        return rows["id"]
    return pc.coalesce(rows["parent_key"], pc.cast(rows["order"], pa.string()))


def key_ranges(pairs, parts: int) -> np.ndarray:
    """Each pair's range of ORDER_KEY among `parts` (monotone in the key: the ranges written one after
    the other, each sorted, are in_fixed_order's order)."""
    keys = pairs[ORDER_KEY].to_numpy()
    return np.minimum((keys / 2.0**64 * parts).astype(np.int64), parts - 1)


def partition_slices(table, part: np.ndarray, parts: int) -> Iterator[tuple[int, Any]]:
    """(partition, its rows) for each partition that has rows, rows in their order."""
    if parts > 1:
        ranked = np.argsort(part, kind="stable")
        part, table = part[ranked], table.take(pa.array(ranked))
    edges = np.searchsorted(part, np.arange(parts + 1))
    for p in np.flatnonzero(edges[1:] > edges[:-1]).tolist():
        yield p, table.slice(edges[p], edges[p + 1] - edges[p])


def later_lines_of(nodes):
    """The orders of one node partition's lines whose comment id was on an earlier line too."""
    nodes = nodes.select(["id", "order"])
    firsts = nodes.group_by("id").aggregate([("order", "min"), ("order", "count")])
    firsts = firsts.filter(pc.greater(firsts["order_count"], 1))
    if not firsts.num_rows:
        return nodes["order"].slice(0, 0).combine_chunks()
    repeated = nodes.join(firsts, "id", join_type="inner")
    return repeated.filter(pc.not_equal(repeated["order"], repeated["order_min"]))["order"].combine_chunks()


def parents_of(nodes, later):
    """A node partition's comments that can be a parent (not a later line of a repeated id)."""
    parents = nodes.filter(pc.invert(pc.is_in(nodes["order"], later)))
    return pa.table({"parent_key": parents["id"], "parent_status": parents["status"], "context": parents["body"]})


def joined_pairs(edges, parents, later, test_share: float, salt: str):
    """A partition's replies joined to their parents: ({(status, split): lines}, {split: pairs as
    WRITTEN_COLUMNS and ORDER_KEY})."""
    status = pc.if_else(pc.is_in(edges["order"], later), DUPLICATE, edges["status"])
    joined = edges.set_column(edges.schema.get_field_index("status"), "status", status)
    joined = joined.join(parents, "parent_key", join_type="left outer")
    statuses = _statuses(joined)
    counts = {
        (str(row["values"]), ""): int(row["counts"])
        for row in pc.value_counts(statuses).to_pylist()
        if row["values"] != ""
    }
    kept = joined.filter(pc.equal(statuses, "")).select(["context", "body", "link_id", "subreddit"])
    links = pc.unique(kept["link_id"])
    test = pa.array([split_of(link, test_share, salt) == "test" for link in links.to_pylist()], pa.bool_())
    is_test = pc.take(test, pc.index_in(kept["link_id"], value_set=links)).to_numpy(zero_copy_only=False)
    kept = kept.rename_columns(WRITTEN_COLUMNS)
    pieces: dict[str, list] = {"train": [], "test": []}
    # Keyed a batch at a time: the key is pandas' hash of each row, and a frame of Python strings
    # costs several times its Arrow bytes.
    for start in range(0, max(kept.num_rows, 1), KEY_BATCH_ROWS):
        frame, test = kept.slice(start, KEY_BATCH_ROWS).to_pandas(), is_test[start : start + KEY_BATCH_ROWS]
        pieces["train"].append(keyed_table(frame.loc[~test]))
        pieces["test"].append(keyed_table(frame.loc[test]))
    pairs = {split: pa.concat_tables(tables, promote_options="default") for split, tables in pieces.items()}
    counts |= {("", split): table.num_rows for split, table in pairs.items()}
    return counts, pairs


NO_PARENTS = pa.table({name: pa.array([], pa.string()) for name in ("parent_key", "parent_status", "context")})


def partition_pairs(edges: list, nodes: Callable[[], list], later, test_share: float, salt: str):
    """The pairs step of both engines: one partition's replies (its edge tables, None for none)
    joined to its possible parents (its node tables, fetched only where there are replies; a
    partition where no comment hashed has none: every reply's parent is missing): ({(status,
    split): lines}, {split: pairs as WRITTEN_COLUMNS and ORDER_KEY}); ({}, {}) without replies."""
    kept = [e for e in edges if e is not None]
    if not kept:
        return {}, {}
    found = [n for n in nodes() if n is not None]
    parents = parents_of(pa.concat_tables(found), later) if found else NO_PARENTS
    return joined_pairs(pa.concat_tables(kept), parents, later, test_share, salt)


def pairs_manifest(reads: Iterable[tuple], part_counts: Iterable[dict], ranked: Sequence[str]) -> dict[str, Any]:
    """The count merge of both engines: the manifest's counts from each read's (lines read,
    malformed lines, the orders of its first malformed lines, ...) in the inputs' order and each
    partition's {(status, split): lines}."""
    counts: dict[tuple[str, str], int] = {}
    lines_read, examples = 0, list[str]()
    for read_lines, malformed_lines, orders, *_ in reads:
        lines_read += read_lines
        counts[("malformed", "")] = counts.get(("malformed", ""), 0) + malformed_lines
        examples += [_source(int(o), ranked) for o in orders][: MAX_EXAMPLES - len(examples)]
    for part in part_counts:
        for key, n in part.items():
            counts[key] = counts.get(key, 0) + n
    return manifest_counts([(s, split, n) for (s, split), n in counts.items()], lines_read, examples)


def spill_partitions(stored: int, per: int = PARTITION_INPUT_BYTES) -> int:
    """How many partitions inputs of `stored` bytes (as stored) are cut into: one per `per` bytes
    (prepare_local's spill: PARTITION_INPUT_BYTES)."""
    return max(1, -(-stored // per))


def _without_malformed(chunk, room: int) -> tuple[Any, int, list[int]]:
    """(the chunk's well-formed lines, how many were malformed, the orders of the first `room` of
    those): the manifest's malformed count and examples."""
    malformed = pc.equal(chunk["status"], "malformed").to_numpy(zero_copy_only=False)
    if not malformed.any():
        return chunk, 0, []
    orders = np.sort(chunk["order"].to_numpy()[malformed])[:room].tolist()
    return chunk.filter(~malformed), int(malformed.sum()), orders


def _ruled_chunks(path: str, rank: int, cfg: RedditFilterConfig) -> Generator[Any, None, None]:
    """read_dump_chunks with each well-formed line's filter rule in `status` (with_rules)."""
    for chunk in read_dump_chunks(path, rank):
        yield with_rules(chunk, cfg)


def _spill_comments(spill: _Spill, paths: Sequence[str], cfg: RedditFilterConfig) -> tuple[int, int, list[int]]:
    """Every line of `paths` read, filtered and spilled: (lines read, malformed lines, the orders of
    the first MAX_EXAMPLES of those). Logs its progress every PROGRESS_SECONDS (a month's dump reads
    for minutes)."""
    ranked = sorted(paths)
    lines_read, malformed_lines, examples = 0, 0, list[int]()
    started = reported = time.monotonic()
    for number, path in enumerate(paths, start=1):
        for chunk in _ruled_chunks(path, ranked.index(path), cfg):
            lines_read += chunk.num_rows
            if time.monotonic() - reported >= PROGRESS_SECONDS:
                reported = time.monotonic()
                rate = lines_read / (reported - started)
                log.info(
                    "reddit: %d lines read (file %d of %d, %s), %.0f lines/s",
                    lines_read,
                    number,
                    len(paths),
                    redact(path),
                    rate,
                )
            chunk, malformed, orders = _without_malformed(chunk, MAX_EXAMPLES - len(examples))
            malformed_lines += malformed
            examples += orders
            spill.add_comments(chunk)
    spill.close("node")
    spill.close("edge")
    return lines_read, malformed_lines, examples


SPILL_PREFIX = "convsts-pushshift-"  # + the pid of the process that spills there


def remove_abandoned_spills() -> list[str]:
    """Spill folders in the temporary directory whose process is gone (killed with SIGKILL, or the
    machine went down mid-prepare) removed, and logged; another live prepare's are left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = folder.name.removeprefix(SPILL_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if removed:
        logging.getLogger("convsts").info(
            "removed %d spill folder(s) of prepares that ended: %s", len(removed), removed
        )
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def prepare_local(
    paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str, out_dir: str | Path,
    rows_per_shard: int, parts: int, part_bytes: int = PARTITION_ROW_BYTES,
) -> dict[str, Any]:  # fmt: skip
    """Comment dumps -> out_dir's train/test shards, in this process, without Ray: the manifest's counts and
    each split's shard records, as write_pairs gives them. The dumps are streamed (CHUNK_BYTES at a time) and
    spilled to a temporary folder on local disk (TMPDIR) in `parts` partitions (spill_partitions of the
    inputs' size as stored); a partition whose rows came to more than `part_bytes` (a dump that
    compresses well) is cut again before its join: memory holds a chunk or `part_bytes` of rows,
    not the input, whatever its compression ratio."""
    remove_abandoned_spills()
    with (
        tempfile.TemporaryDirectory(prefix=f"{SPILL_PREFIX}{os.getpid()}-") as folder,
        storage.write_errors(f"{folder} (the spill folder, in TMPDIR)"),  # a full disk names it
    ):
        spill = _Spill(Path(folder), parts)
        read = _spill_comments(spill, paths, cfg)
        counts: list[dict] = []
        later = spill.later_lines()
        todo: list[tuple[int | str, int]] = [(part, 0) for part in range(spill.parts)]  # (partition, its cuts)
        recut = 0
        while todo:
            part, cuts = todo.pop()
            size = spill.size(part)
            if size > part_bytes and cuts < MAX_SPLITS:
                ways = -(-size // part_bytes)
                todo += [(sub, cuts + 1) for sub in spill.split(part, ways, seed=cuts + 1)]
                recut += 1
                continue
            part_counts, pairs = partition_pairs(
                [spill.read("edge", part)], functools.partial(spill.read_all, "node", part), later, test_share, salt
            )
            spill.drop("node", part)
            spill.drop("edge", part)
            counts.append(part_counts)
            for split, table in pairs.items():
                spill.add_pairs(split, table)
        _say_recut(recut, part_bytes)
        spill.close("pairs-train")
        spill.close("pairs-test")
        manifest = pairs_manifest([read], counts, sorted(paths))
        shards = {
            split: spill.write_split(split, out_dir, manifest[f"{split}_pairs"], rows_per_shard)
            for split in ("train", "test")
        }
    return {"shards": shards, **manifest}


# ---------------------------------------------------------------------------------------------
# On a Ray cluster: the engine's steps as Ray tasks, its partitions in Ray's object store

# A read task hands its rows to the object store, by partition, every this many bytes: with 3 kinds
# of table per partition, objects of FLUSH_BYTES / (3 x partitions) each (a restore from Ray's spill
# costs per object, so fewer, larger ones).
FLUSH_BYTES = 256 << 20
PIECE_BYTES = 64 << 20  # decompressed bytes of a dump per task, where whole dumps would leave CPUs idle
# A task reading a dump whole keeps about this many cores busy (its decompression thread beside
# Arrow's parser threads): dumps are cut into pieces only where the CPUs outnumber that.
WHOLE_READ_CPUS = 2
TASK_PARTITION_BYTES = 256 << 20  # input bytes (as stored) per partition of the distributed path, at first
TASK_PARTITION_ROW_BYTES = 128 << 20  # a pairs task's rows at most: a partition over it is cut again


KINDS = ("key", "node", "edge")  # what a read task hands over per partition: ids, possible parents, replies


def _read_partitioned(
    path: str, rank: int, cfg: RedditFilterConfig, parts: int, flush_bytes: int, threads: int = 1
) -> Iterator[Any]:
    """A Ray streaming-generator task: one dump read, filtered and cut into `parts` hash partitions
    (partitioned_comments), handed over as _partitioned hands them. Memory: `flush_bytes` and a chunk.
    `threads`: Arrow's parser threads while it runs (Ray sizes a worker's pool by its task's CPU,
    one; a dump read whole where CPUs would be idle parses on more, as the engine does)."""
    before = pa.cpu_count()
    pa.set_cpu_count(threads)
    try:
        yield from _partitioned(_ruled_chunks(path, rank, cfg), parts, flush_bytes)
    finally:
        pa.set_cpu_count(before)


def _cut_dump(path: str, piece_bytes: int) -> Iterator[tuple[int, bytes] | None]:
    """A Ray streaming-generator task: one dump's decompressed bytes in whole-line pieces of about
    `piece_bytes`, each with the number of its first line, for _read_piece tasks to parse side by side
    (a compressed stream cannot be split, but decompressing is a small part of the work); then None,
    the end (a read that fails ends the stream with its error instead)."""
    yield from _numbered(_read_ahead(_whole_lines(path, piece_bytes)))
    yield None


def _read_piece(piece: tuple[int, bytes], rank: int, cfg: RedditFilterConfig, parts: int) -> list[Any]:
    """A Ray task: one piece of a dump (_cut_dump) read as _read_partitioned reads a dump, its rows
    handed over at once: 3 x `parts` tables, then its counts."""
    first, data = piece
    chunks = (
        with_rules(numbered_table(chunk, line, rank), cfg)
        for line, chunk in _numbered(_line_pieces(data, CHUNK_BYTES), first)
    )
    return list(_partitioned(chunks, parts, flush_bytes=sys.maxsize))


def _partitioned(chunks: Iterable[Any], parts: int, flush_bytes: int) -> Iterator[Any]:
    """Ruled chunks of one input (_ruled_chunks) cut into `parts` hash partitions
    (partitioned_comments): every `flush_bytes` of rows and at the end (at least once), 3 x `parts`
    tables in a fixed order (KINDS, each partition 0..parts-1; None for one without rows): "key", the
    node rows' (id, order) alone, for the repeated ids; "node"; "edge". Then the counts: (lines read,
    malformed lines, the first MAX_EXAMPLES of them, the largest table's bytes, each partition's
    node and edge bytes)."""
    held: dict[tuple[str, int], list] = {}
    size, largest, lines_read, malformed_lines, examples, flushed = 0, 0, 0, 0, list[int](), False
    part_bytes = [0] * parts
    for chunk in chunks:
        lines_read += chunk.num_rows
        chunk, malformed, orders = _without_malformed(chunk, MAX_EXAMPLES - len(examples))
        malformed_lines, examples = malformed_lines + malformed, examples + orders
        for kind, table, part in partitioned_comments(chunk, parts):
            for p, rows in partition_slices(table, part, parts):
                held.setdefault((kind, p), []).append(rows)
                if kind == "node":
                    held.setdefault(("key", p), []).append(rows.select(["id", "order"]))
                size += rows.nbytes
                part_bytes[p] += rows.nbytes
        if size >= flush_bytes:
            largest = max(largest, max(sum(t.nbytes for t in tables) for tables in held.values()))
            yield from _flush(held, parts)
            held, size, flushed = {}, 0, True
    if held or not flushed:
        largest = max([largest, *(sum(t.nbytes for t in tables) for tables in held.values())])
        yield from _flush(held, parts)
    yield lines_read, malformed_lines, examples, largest, part_bytes


def _flush(held: dict[tuple[str, int], list], parts: int) -> Iterator[Any]:
    """3 x `parts` tables, KINDS in order, each partition 0..parts-1 (None for one with no rows),
    each one chunk: Ray serializes a table buffer by buffer, so the slices of every chunk read since
    the last hand-over would cost several times the copy that joins them."""
    for kind in KINDS:
        for p in range(parts):
            yield pa.concat_tables(held[kind, p]).combine_chunks() if (kind, p) in held else None


def _read_tasks(
    paths: Sequence[str], cfg: RedditFilterConfig, parts: int, flush_bytes: int, piece_bytes: int, cpus: int
) -> Iterator[list]:
    """Each read task's refs, the inputs in order and a dump's pieces in line order: its tables (3 x
    `parts` per hand-over, KINDS in order), then its counts. A read task per dump; where the
    cluster's `cpus` outnumber WHOLE_READ_CPUS a dump (whole dumps would leave CPUs idle), each dump
    is cut into pieces of `piece_bytes` (_cut_dump, a task that decompresses and holds a tenth of a
    CPU) parsed by a task each, at most 2 x `cpus` pieces at a time. Not on fewer CPUs: the pieces
    pass through the object store once more, which costs more than they gain there."""
    import ray

    ranked = sorted(paths)
    if len(paths) * WHOLE_READ_CPUS >= cpus:
        threads = min(WHOLE_READ_CPUS, max(1, cpus // max(len(paths), 1)))  # the CPUs the reads leave idle
        read = ray.remote(num_returns="streaming")(_read_partitioned)
        streams = [read.remote(path, ranked.index(path), cfg, parts, flush_bytes, threads) for path in paths]
        for stream in streams:
            yield list(stream)  # a streaming generator's refs
        return
    # Ray's private option (the stubs do not list it): the cutter waits while `cpus` pieces are not taken.
    backpressure: dict[str, Any] = {"_generator_backpressure_num_objects": cpus}
    cut = ray.remote(num_returns="streaming", num_cpus=0.1, **backpressure)(_cut_dump)
    parse = ray.remote(num_returns=len(KINDS) * parts + 1)(_read_piece)
    cutters = [cut.remote(path, piece_bytes) for path in paths]
    running: list = []
    pieces = 0
    for path, cutter in zip(paths, cutters):
        held: Any = None  # a piece is handed to a task once the next item comes: the last is the end or an error
        for item in cutter:  # type: ignore[attr-defined]  # a streaming generator's refs (the stubs: one ref)
            if held is not None:
                if len(running) >= 2 * cpus:
                    running = ray.wait(running, num_returns=1)[1]
                refs: list = parse.remote(held, ranked.index(path), cfg, parts)  # type: ignore[assignment]  # num_returns > 1: a list
                running.append(refs[-1])
                pieces += 1
                yield refs
            held = item
        ray.get(held)  # the end mark, or the read's error raised here, before a task is given it
    log.info("reddit: %d file(s) on %d CPUs, read in %d pieces", len(paths), cpus, pieces)


def _split_task(kind: str, ways: int, rows) -> list[Any]:
    """A Ray task: one table a read task handed over, cut into `ways` by another hash (split_key)."""
    if rows is None:
        return [None] * ways
    subs = dict(partition_slices(rows, _hashed(split_key(kind, rows), ways, seed=1), ways))
    return [subs.get(q) for q in range(ways)]


def _within_budget(handed: dict[str, list[list]], sizes: list[int], part_bytes: int) -> list[tuple[list, list]]:
    """Each partition's (node refs, edge refs) for a pairs task; a partition whose rows came to more
    than `part_bytes` (a dump that compresses well) cut into as many by another hash (split tasks,
    a table each), each part joined by a task of its own."""
    import ray

    out, recut = [], 0
    for p, size in enumerate(sizes):
        if size <= part_bytes:
            out.append((handed["node"][p], handed["edge"][p]))
            continue
        ways, recut = -(-size // part_bytes), recut + 1
        split = ray.remote(num_returns=ways)(_split_task)
        # num_returns > 1: each call's refs are a list (the stubs: one ref)
        cut: dict[str, list[Any]] = {
            kind: [split.remote(kind, ways, ref) for ref in handed[kind][p]] for kind in ("node", "edge")
        }
        out += [([refs[q] for refs in cut["node"]], [refs[q] for refs in cut["edge"]]) for q in range(ways)]
    _say_recut(recut, part_bytes)
    return out


def _later_task(*keys):
    """One partition's (id, order) rows, from every read task: (the orders of its later lines of a
    repeated id, its comments)."""
    kept = [k for k in keys if k is not None]
    if not kept:
        return pa.array([], pa.int64()), 0
    table = pa.concat_tables(kept)
    return later_lines_of(table), table.num_rows


SPLITS = ("train", "test")


def _pairs_task(test_share: float, salt: str, ranges: int, later, nodes: list, *edges) -> list[Any]:
    """One partition's replies joined to its possible parents: [its counts, its pairs' rows in each
    key range ({split: [rows of range 0..ranges-1]}), then the train pairs by key range
    0..ranges-1, then the test pairs by range (None where a range has none)]. `nodes`: the
    partition's node tables (refs inside a list: fetched here, after the edges)."""
    import ray

    counts, pairs = partition_pairs(list(edges), lambda: ray.get(nodes), later, test_share, salt)
    sizes: dict[str, list[int]] = {}
    tables: list[Any] = []
    for split in SPLITS:
        by_range = dict(partition_slices(pairs[split], key_ranges(pairs[split], ranges), ranges)) if pairs else {}
        sizes[split] = [by_range[r].num_rows if r in by_range else 0 for r in range(ranges)]
        tables += [by_range.get(r) for r in range(ranges)]
    return [counts, sizes, *tables]


def _write_range_task(folder: str, plan: ShardPlan, start: int, *tables) -> tuple[dict, dict]:
    """A Ray task: one key range of a split, from every partition's pairs task, sorted by its key and
    written as the shards wholly within it (write_range): (their records, the rows of the shards
    that cross its ends)."""
    table = pa.concat_tables([t for t in tables if t is not None])
    return write_range(folder, plan, start, table.sort_by([(ORDER_KEY, "ascending")]).drop_columns([ORDER_KEY]))


def _write_pieces_task(folder: str, index: int, *pieces: dict) -> dict:
    """A Ray task: shard `index` from the rows its key ranges' write tasks left of it, in order."""
    return write_pieces(folder, index, [p[index] for p in pieces if index in p])


def _write_split(
    joined: list, range_rows: list[dict], split: str, rows: int, out_dir: str | Path, rows_per_shard: int
) -> list:
    """One split's shards written by tasks side by side, as ShardWriter writes them in one process:
    a task per key range (its offset from the ranges' sizes), a task per shard that crosses a
    range's end; the driver gathers the records alone."""
    import ray
    import ray.util.scheduling_strategies

    folder = storage.join(out_dir, split)
    fs, inner = storage.resolve(folder)
    fs.create_dir(inner, recursive=True)  # there even when there are no rows
    plan, index = ShardPlan(rows, rows_per_shard), SPLITS.index(split)
    ranges = len(range_rows[0][split]) if range_rows else 0  # `range_rows`: each join's rows by key range
    sizes = [sum(s[split][r] for s in range_rows) for r in range(ranges)]
    if sum(sizes) != rows:
        raise RuntimeError(f"{folder}: the key ranges hold {sum(sizes)} rows, not {rows}")
    # A local folder is the command's machine's: the tasks write it there (on that node's CPUs); a
    # bucket takes them from every node.
    here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), False)
    place: Any = "DEFAULT" if storage.is_uri(folder) else here  # the stubs list no node affinity
    write = ray.remote(num_returns=2, scheduling_strategy=place)(_write_range_task)
    starts = [sum(sizes[:r]) for r in range(ranges)]
    written = {
        r: write.remote(folder, plan, starts[r], *[j[2 + index * ranges + r] for j in joined])
        for r in range(ranges)
        if sizes[r]
    }
    records: dict[int, dict] = {}
    for recs in ray.get([refs[0] for refs in written.values()]):
        records.update(recs)
    join = ray.remote(scheduling_strategy=place)(_write_pieces_task)
    crossing = [i for i in range(len(plan.edges) - 1) if plan.size(i) and i not in records]
    joins = {
        i: join.remote(
            folder,
            i,
            *[refs[1] for r, refs in written.items() if i in plan.overlapping(starts[r], starts[r] + sizes[r])],
        )
        for i in crossing
    }
    records.update(zip(joins, ray.get(list(joins.values()))))
    return [records[i] for i in sorted(records)]


SAMPLE_BYTES = 4 << 20  # stored bytes of a dump decompressed and parsed to estimate its rows
SAMPLED_FILES = 4  # the largest dumps are sampled


def row_bytes_estimate(paths: Sequence[str], cfg: RedditFilterConfig) -> int:
    """The rows (node and edge bytes, as the read tasks count them) the dumps will hold, from the
    rows of the first SAMPLE_BYTES (as stored) of the SAMPLED_FILES largest, scaled to all their
    bytes: the monthly dumps compress 8-10x, others 3x, and their comments pass the filters at
    their own rate."""
    sizes = {path: stat[0] for path in paths if (stat := storage.file_stat(path)) is not None}
    rows = read = 0
    for path in sorted(sizes, key=sizes.__getitem__, reverse=True)[:SAMPLED_FILES]:
        data, stored = decompressed_prefix(path, SAMPLE_BYTES)
        data = data[: data.rfind(b"\n") + 1]  # whole lines
        if data.startswith(BOM):
            data = data[len(BOM) :]
        if data:
            *_, counts = _partitioned([with_rules(numbered_table(data, 1, 0), cfg)], 1, sys.maxsize)
            rows, read = rows + sum(counts[4]), read + stored
    return rows * sum(sizes.values()) // read if read else 0


def cluster_partitions(stored: int, cpus: int, row_bytes: int = 0) -> int:
    """The partitions of a distributed prepare of `stored` bytes (as stored) that will hold about
    `row_bytes` of rows (row_bytes_estimate), on `cpus` CPUs: one per TASK_PARTITION_BYTES stored
    and at least one per three quarters of TASK_PARTITION_ROW_BYTES of rows (a partition cut again
    by _within_budget costs a pass of its rows through the object store), at least one per CPU."""
    by_rows = -(-row_bytes * 4 // (3 * TASK_PARTITION_ROW_BYTES))
    return max(spill_partitions(stored, TASK_PARTITION_BYTES), by_rows, cpus)


def prepare_distributed(
    paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str, out_dir: str | Path,
    rows_per_shard: int, parts: int, flush_bytes: int = FLUSH_BYTES, piece_bytes: int = PIECE_BYTES, cpus: int = 0,
    part_bytes: int = TASK_PARTITION_ROW_BYTES,
) -> dict[str, Any]:  # fmt: skip
    """prepare_local's steps as Ray tasks on the cluster this process joined: the dumps read (_read_tasks:
    their rows partitioned by hash as they stream, handed to Ray's object store, which spills to disk
    past its memory), a task per partition for the repeated ids, a task per partition for the parent
    join; then the shards written by tasks side by side, a task per key range (_write_split), as
    prepare_local writes them range after range; the driver writes only the manifest, from the
    tasks' records. The same counts, the same shards. Memory: the object store's (configured), a
    partition per task, at most `part_bytes` of its rows (_within_budget)."""
    import ray

    ranked, started = sorted(paths), time.monotonic()
    handed: dict[str, list[list]] = {kind: [[] for _ in range(parts)] for kind in KINDS}
    stats = []
    for refs in _read_tasks(paths, cfg, parts, flush_bytes, piece_bytes, cpus):
        for i, ref in enumerate(refs[:-1]):
            handed[KINDS[(i // parts) % len(KINDS)]][i % parts].append(ref)
        stats.append(refs[-1])
    read = ray.get(stats)  # a read that failed (a truncated file) raises here, before a word of what follows
    log.info("reddit: %d file(s) read and partitioned in %.1f s", len(paths), time.monotonic() - started)
    found = [ray.remote(num_returns=2)(_later_task).remote(*handed["key"][p]) for p in range(parts)]
    later = ray.put(pa.concat_arrays([pa.array([], pa.int64()), *ray.get([f[0] for f in found])]))
    log.info("reddit: repeated ids found in %.1f s", time.monotonic() - started)
    jobs = _within_budget(handed, [sum(r[4][p] for r in read) for p in range(parts)], part_bytes)
    ranges = len(jobs)  # key ranges, a write task each: as many as the joins, each about a join's rows
    pairs_task = ray.remote(num_returns=2 + 2 * ranges)(_pairs_task)
    joined = [pairs_task.remote(test_share, salt, ranges, later, nodes, *edges) for nodes, edges in jobs]

    manifest = _distributed_manifest(read, ray.get([j[0] for j in joined]), ranked)
    log.info(
        "reddit: %d lines of %d file(s) in %d partitions (the largest %d comments), joined in %.1f s",
        manifest["lines_read"],
        len(paths),
        parts,
        max(ray.get([f[1] for f in found]), default=0),
        time.monotonic() - started,
    )
    range_rows = ray.get([j[1] for j in joined])  # fetched once: small dicts
    shards = {
        split: _write_split(joined, range_rows, split, manifest[f"{split}_pairs"], out_dir, rows_per_shard)
        for split in SPLITS
    }
    log.info("reddit: shards written by tasks in %.1f s", time.monotonic() - started)
    return {"shards": shards, **manifest}


def _distributed_manifest(stats: list, part_counts: list[dict], ranked: list[str]) -> dict[str, Any]:
    """The manifest's counts from the read tasks' stats (in the inputs' order) and each partition's
    counts; logs the largest table a read task handed over."""
    largest = max((stat[3] for stat in stats), default=0)
    log.info("reddit: read tasks handed over tables of at most %.1f MiB", largest / 2**20)
    return pairs_manifest(stats, part_counts, ranked)
