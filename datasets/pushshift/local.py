"""The pushshift engine in this process, without Ray: the dumps streamed and spilled to local disk in
hash partitions (a grace hash join), one partition in memory at a time; abandoned spill folders
removed."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.pushshift.steps import (
    CANDIDATE_COLUMNS,
    LOCAL_PARTITION_ROW_BYTES,
    MAX_SPLITS,
    REPLY_COLUMNS,
    cut_again,
    cut_ways,
    key_ranges,
    pairs_manifest,
    partition_pairs,
    partition_slices,
    partitioned_comments,
    repeated_lines_of,
    ruled_chunks,
    say_recut,
    without_malformed,
)
from convsts.datasets.reddit import MAX_EXAMPLES, ORDER_KEY
from convsts.datasets.shards import ShardWriter
from convsts.io import storage
from convsts.io.processes import alive
from convsts.io.redaction import redact

log = logging.getLogger("convsts")


PROGRESS_SECONDS = 30.0  # prepare_local logs how far it has read this often


class Spill:
    """Rows spilled to local disk as Arrow IPC streams, in `parts` partitions per kind:
    * "candidate": each comment as a possible parent, in the partition of a hash of its id;
    * "reply": each comment as a reply, in the partition of a hash of its parent's id (a reply to a
      submission in that of its own id); a body is kept only where its comment passed the filters;
    * "pairs-SPLIT": the pairs found, in `ranges` ranges of their ORDER_KEY (the top bits), so that
      writing the ranges one after the other, each sorted, writes in_fixed_order's order; as many as
      keep a range within a partition's row bytes (set_ranges: a dump where most comments make a
      pair holds about as many bytes of pairs as of comments)."""

    CANDIDATE, REPLY = CANDIDATE_COLUMNS, REPLY_COLUMNS

    def __init__(self, folder: Path, parts: int):
        self.folder, self.parts, self.ranges = folder, parts, parts
        self._writers: dict[tuple[str, int | str], Any] = {}

    def add_comments(self, comments) -> None:
        """A chunk of well-formed comments (COMMENT_COLUMNS, filter rules in `status`)."""
        for kind, table, part in partitioned_comments(comments, self.parts):
            self._write_parts(kind, table, part)

    def add_pairs(self, split: str, pairs) -> None:
        """Pairs of one split (WRITTEN_COLUMNS and ORDER_KEY), by ranges of their key."""
        self._write_parts(f"pairs-{split}", pairs, key_ranges(pairs, self.ranges), self.ranges)

    def set_ranges(self, part_bytes: int) -> None:
        """As many key ranges of pairs as keep each within `part_bytes`, were every comment spilled
        (its rows as a candidate and as a reply) to make a pair: at least one a partition."""
        spilled = sum(self.size(part) for part in range(self.parts))
        self.ranges = max(self.parts, cut_ways(spilled, part_bytes))

    def _write_parts(self, kind: str, table, part: np.ndarray, parts: int | None = None) -> None:
        for p, rows in partition_slices(table, part, parts or self.parts):
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
        """A partition's rows on disk (its candidate and reply files: Arrow IPC, as decompressed and parsed)."""
        files = (self.folder / f"{kind}-{part}.arrow" for kind in ("candidate", "reply"))
        return sum(f.stat().st_size for f in files if f.exists())

    def split(self, part: int | str, ways: int, seed: int) -> list[str]:
        """Partition `part`, cut into `ways` by another hash (split_key, `seed`), a batch at a time:
        the new partitions' names (`PART.0`, ...); its own files removed."""
        names = [f"{part}.{q}" for q in range(ways)]
        for kind in ("candidate", "reply"):
            path = self.folder / f"{kind}-{part}.arrow"
            if not path.exists():
                continue
            with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
                for batch in reader:
                    rows = pa.Table.from_batches([batch])
                    for q, sub in cut_again(kind, rows, ways, seed):
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

    def repeated_lines(self):
        """The orders of the lines whose comment id was on an earlier line too (an Arrow array): the
        duplicates. Memory: one partition's (id, order), and the repeated lines."""
        repeats = [pa.array([], pa.int64())]
        for part in range(self.parts):
            candidates = self.read("candidate", part)
            if candidates is not None:
                repeats.append(repeated_lines_of(candidates))
        return pa.concat_arrays(repeats)

    def write_split(self, split: str, out_dir: str | Path, rows: int, rows_per_shard: int) -> list:
        """The pairs of `split` as its shards, range after range, each range sorted by its key."""
        writer = ShardWriter(storage.join(out_dir, split), rows, rows_per_shard)
        for part in range(self.ranges):
            pairs = self.read(f"pairs-{split}", part)
            if pairs is not None:
                writer.add(pairs.sort_by([(ORDER_KEY, "ascending")]).drop_columns([ORDER_KEY]))
        return writer.close()


def _spill_comments(spill: Spill, paths: Sequence[str], cfg: RedditFilterConfig) -> tuple[int, int, list[int]]:
    """Every line of `paths` read, filtered and spilled: (lines read, malformed lines, the orders of
    the first MAX_EXAMPLES of those). Logs its progress every PROGRESS_SECONDS (a month's dump reads
    for minutes)."""
    ranked = sorted(paths)
    lines_read, malformed_lines, examples = 0, 0, list[int]()
    started = reported = time.monotonic()
    for number, path in enumerate(paths, start=1):
        for chunk in ruled_chunks(path, ranked.index(path), cfg):
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
            chunk, malformed, orders = without_malformed(chunk, MAX_EXAMPLES - len(examples))
            malformed_lines += malformed
            examples += orders
            spill.add_comments(chunk)
    spill.close("candidate")
    spill.close("reply")
    return lines_read, malformed_lines, examples


SPILL_PREFIX = "convsts-pushshift-"  # + the pid of the process that spills there


def remove_abandoned_spills() -> list[str]:
    """Spill folders in the temporary directory whose process is gone (killed with SIGKILL, or the
    machine went down mid-prepare) removed, and logged; another live prepare's are left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SPILL_PREFIX}*-*"):
        pid = folder.name.removeprefix(SPILL_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if removed:
        logging.getLogger("convsts").info(
            "removed %d spill folder(s) of prepares that ended: %s", len(removed), removed
        )
    return removed


def prepare_local(
    paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str, out_dir: str | Path,
    rows_per_shard: int, parts: int, part_bytes: int = LOCAL_PARTITION_ROW_BYTES,
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
        spill = Spill(Path(folder), parts)
        read = _spill_comments(spill, paths, cfg)
        spill.set_ranges(part_bytes)
        counts: list[dict] = []
        repeats = spill.repeated_lines()
        todo: list[tuple[int | str, int]] = [(part, 0) for part in range(spill.parts)]  # (partition, its cuts)
        recut = 0
        while todo:
            part, cuts = todo.pop()
            size = spill.size(part)
            if size > part_bytes and cuts < MAX_SPLITS:
                ways = cut_ways(size, part_bytes)
                todo += [(sub, cuts + 1) for sub in spill.split(part, ways, seed=cuts + 1)]
                recut += 1
                continue
            part_counts, pairs = partition_pairs(
                [spill.read("reply", part)],
                functools.partial(spill.read_all, "candidate", part),
                repeats,
                test_share,
                salt,
            )
            spill.drop("candidate", part)
            spill.drop("reply", part)
            counts.append(part_counts)
            for split, table in pairs.items():
                spill.add_pairs(split, table)
        say_recut(recut, part_bytes)
        spill.close("pairs-train")
        spill.close("pairs-test")
        manifest = pairs_manifest([read], counts, sorted(paths))
        shards = {
            split: spill.write_split(split, out_dir, manifest[f"{split}_pairs"], rows_per_shard)
            for split in ("train", "test")
        }
    return {"shards": shards, **manifest}
