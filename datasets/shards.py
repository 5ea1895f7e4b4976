"""A Ray Dataset (write_shards) or rows in the driver (write_frame, write_table, ShardWriter) written as a folder of
parquet shards, each shard's manifest record computed from
the bytes as they are written: {file, rows, bytes, sha256}. Nothing is read back to list them (a
run's data digest is made of these records, and `verify_prepared` checks a shard's bytes against
its sha256 before training)."""

from __future__ import annotations

import bisect
import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from convsts.io import storage

ShardRecord = dict[str, Any]


def record(name: str, rows: int, data: memoryview | bytes) -> ShardRecord:
    """A shard's manifest record from its bytes."""
    return {"file": name, "rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def shard_name(index: int) -> str:
    """The name of the `index`-th shard of a write (names sort in the dataset's block order)."""
    return f"part-{index:06d}.parquet"


def write_shard(folder: str | Path, index: int, table) -> ShardRecord:
    """A pyarrow table as the `index`-th shard of `folder`; its record."""
    buffer = pa.BufferOutputStream()
    # Without pandas' schema metadata (Ray Data's blocks carry theirs, a frame its own): a shard's
    # bytes are its rows, whether written in the driver or by a Ray Data task.
    pq.write_table(table.replace_schema_metadata(None), buffer)
    data = memoryview(buffer.getvalue())
    name = shard_name(index)
    storage.write_bytes(storage.join(folder, name), data)
    return record(name, table.num_rows, data)


def write_frame(frame, folder: str | Path, rows_per_shard: int) -> list[ShardRecord]:
    """A pandas frame as parquet shards in `folder`, written from this process (no Ray): write_table."""
    return write_table(pa.Table.from_pandas(frame, preserve_index=False), folder, rows_per_shard)


def write_table(table, folder: str | Path, rows_per_shard: int) -> list[ShardRecord]:
    """A pyarrow table as parquet shards in `folder`, written from this process (no Ray): ShardWriter."""
    writer = ShardWriter(folder, table.num_rows, rows_per_shard)
    writer.add(table)
    return writer.close()


class ShardPlan:
    """`rows` rows of a split cut into rows // rows_per_shard shards of equal size (within a row), as
    write_shards cuts a dataset of as many equal blocks: shard i holds rows [edges[i], edges[i+1])."""

    def __init__(self, rows: int, rows_per_shard: int):
        count = max(1, rows // rows_per_shard)
        self.rows = rows
        self.edges = [rows * i // count for i in range(count + 1)]

    def size(self, index: int) -> int:
        return self.edges[index + 1] - self.edges[index]

    def overlapping(self, start: int, stop: int) -> list[int]:
        """The shards with rows among rows [start, stop)."""
        first = bisect.bisect_right(self.edges, start) - 1
        return [i for i in range(max(first, 0), len(self.edges) - 1) if self.edges[i] < stop and self.size(i)]


def write_range(
    folder: str | Path, plan: ShardPlan, start: int, table
) -> tuple[dict[int, ShardRecord], dict[int, Any]]:
    """Rows [start, start + table.num_rows) of a split, in order: the shards wholly among them
    written ({index: record}), the rows of those that cross either end returned ({index: rows}) for
    write_pieces. Both prepare engines write their shards with it: one range after another in one
    process (ShardWriter), or a task per range side by side (pushshift.prepare_distributed)."""
    stop = start + table.num_rows
    records, pieces = {}, {}
    for i in plan.overlapping(start, stop):
        lo, hi = max(plan.edges[i], start), min(plan.edges[i + 1], stop)
        rows = table.slice(lo - start, hi - lo)
        if (lo, hi) == (plan.edges[i], plan.edges[i + 1]):
            records[i] = write_shard(folder, i, rows.combine_chunks())
        else:
            pieces[i] = rows
    return records, pieces


def write_pieces(folder: str | Path, index: int, pieces: list) -> ShardRecord:
    """Shard `index` from the rows write_range left of it, in order."""
    return write_shard(folder, index, pa.concat_tables(pieces).combine_chunks())


class ShardWriter:
    """`rows` rows, handed over in order in tables of any size, as parquet shards in `folder` written from
    this process (no Ray), cut as ShardPlan cuts them (write_range). Memory: a shard. `close` returns
    their records, in name order (no rows, no shard)."""

    def __init__(self, folder: str | Path, rows: int, rows_per_shard: int):
        fs, inner = storage.resolve(folder)
        fs.create_dir(inner, recursive=True)  # there even when there are no rows
        self.folder, self.plan = folder, ShardPlan(rows, rows_per_shard)
        self._start = 0  # rows handed over so far
        self._pending: dict[int, list] = {}  # rows of shards not yet whole, by index
        self._records: dict[int, ShardRecord] = {}

    def add(self, table) -> None:
        records, pieces = write_range(self.folder, self.plan, self._start, table)
        self._start += table.num_rows
        self._records.update(records)
        for index, rows in pieces.items():
            held = self._pending.setdefault(index, [])
            held.append(rows)
            if sum(t.num_rows for t in held) == self.plan.size(index):
                self._records[index] = write_pieces(self.folder, index, self._pending.pop(index))

    def close(self) -> list[ShardRecord]:
        if self._start != self.plan.rows:
            raise RuntimeError(f"{self.folder}: {self._start} rows were handed over, not {self.plan.rows}")
        return [self._records[i] for i in sorted(self._records)]


def write_shards(ds, folder: str | Path, rows_per_shard: int) -> list[ShardRecord]:
    """`ds` as parquet shards in `folder` (local or a URI), one per write task, each of at least
    `rows_per_shard` rows but the last (Ray Data bundles blocks up to it); their records, in name
    order. With the dataset's preserve_order on, shard i holds the i-th rows."""
    fs, inner = storage.resolve(folder)
    fs.create_dir(inner, recursive=True)  # there even when `ds` has no rows
    sink = _shard_sink(str(folder), rows_per_shard)
    ds.write_datasink(sink)
    return sink.records


def _shard_sink(folder: str, rows_per_shard: int):
    """A ray.data Datasink that writes each task's blocks as one shard (made here so that importing
    this module does not import Ray)."""
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    class ShardSink(Datasink):
        def __init__(self) -> None:
            self.records: list[ShardRecord] = []

        @property
        def min_rows_per_write(self) -> int:
            return rows_per_shard

        def write(self, blocks, ctx) -> ShardRecord | None:
            tables = [BlockAccessor.for_block(b).to_arrow() for b in blocks]
            tables = [t for t in tables if t.num_rows]
            if not tables:
                return None
            return write_shard(folder, ctx.task_idx, pa.concat_tables(tables, promote_options="default"))

        def on_write_complete(self, write_result) -> None:
            self.records = sorted((r for r in write_result.write_returns if r), key=lambda r: r["file"])

    return ShardSink()
