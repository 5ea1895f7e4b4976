"""A Ray Dataset (write_shards) or rows in the driver (write_frame, write_table, ShardWriter) written as a folder of
parquet shards, each shard's manifest record computed from
the bytes as they are written: {file, rows, bytes, sha256}. Nothing is read back to list them (a
run's data digest is made of these records, and `verify_prepared` checks a shard's bytes against
its sha256 before training)."""

from __future__ import annotations

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


class ShardWriter:
    """`rows` rows, handed over in order in tables of any size, as parquet shards in `folder` written from
    this process (no Ray): cut into rows // rows_per_shard shards of equal size (within a row), as
    write_shards cuts a dataset of as many equal blocks. Memory: a shard. `close` returns their records, in
    name order (no rows, no shard)."""

    def __init__(self, folder: str | Path, rows: int, rows_per_shard: int):
        fs, inner = storage.resolve(folder)
        fs.create_dir(inner, recursive=True)  # there even when there are no rows
        count = max(1, rows // rows_per_shard)
        self.folder, self.rows = folder, rows
        self._edges = [rows * i // count for i in range(count + 1)]
        self._held: list = []  # tables not yet written, in order
        self._written = 0  # rows in shards so far
        self.records: list[ShardRecord] = []

    def add(self, table) -> None:

        self._held.append(table)
        held = sum(t.num_rows for t in self._held)
        while len(self.records) < len(self._edges) - 1:
            size = self._edges[len(self.records) + 1] - self._edges[len(self.records)]
            if held < size or size == 0:
                break
            rows = pa.concat_tables(self._held)
            self.records.append(write_shard(self.folder, len(self.records), rows.slice(0, size).combine_chunks()))
            self._held, held, self._written = [rows.slice(size)], held - size, self._written + size

    def close(self) -> list[ShardRecord]:
        held = sum(t.num_rows for t in self._held)
        if self._written + held != self.rows:
            raise RuntimeError(f"{self.folder}: {self._written + held} rows were handed over, not {self.rows}")
        return self.records


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
