"""A folder of parquet shards read in one global order per epoch, the same for any number of readers
(MosaicML Streaming's elastic determinism): the shards in a seeded order, cut into blocks of about
`block_rows` rows (trainer.shuffle_block_rows), each block's rows in a seeded order of their own. A
reader asks for rows by their index in the epoch's order and reads only the blocks that hold them,
each read whole and kept while it is read (a resume seeks; it reads nothing it skips)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from convsts.io import storage, tables
from convsts.io.errors import BadInputError


@dataclass(frozen=True)
class Shard:
    """One parquet file of the folder: its rows, and of them the ones a run reads (a task's row
    filter: their indices; None: every row)."""

    path: str
    rows: int
    kept: np.ndarray | None = None

    @property
    def size(self) -> int:
        return self.rows if self.kept is None else len(self.kept)


# A run's row filter: the filter's columns of a shard -> a boolean mask of the rows it reads.
RowFilter = Callable[[dict[str, np.ndarray]], np.ndarray]


class ShardSet:
    """The shards of one folder in their file order (the prepared manifest's), the columns a run
    reads of them, and how many rows that is."""

    def __init__(self, shards: Sequence[Shard], columns: Sequence[str]):
        self.shards, self.columns = list(shards), list(columns)
        self.rows = sum(s.size for s in self.shards)
        self.rows_read = 0  # rows read from the shards so far (a resume's seek is checked by it)

    @classmethod
    def of_folder(
        cls,
        folder: str,
        records: Sequence[tuple[str, int]],
        columns: Sequence[str],
        keep: RowFilter | None = None,
        filter_columns: Sequence[str] = (),
    ) -> ShardSet:
        """`records`: (file name, rows) of each shard in `folder`, as its manifest lists them; with
        `keep`, each shard's `filter_columns` are read once to know which of its rows the run reads."""
        shards = []
        for name, rows in records:
            path = storage.join(folder, name)
            kept = None
            if keep is not None:
                table = tables.read_parquet_table(path, columns=list(filter_columns))
                mask = keep({c: table.column(c).to_numpy(zero_copy_only=False) for c in filter_columns})
                kept = np.flatnonzero(mask)
            shards.append(Shard(path, rows, kept))
        return cls(shards, columns)

    def read(self, index: int) -> pa.Table:
        """The run's rows of shard `index` (its kept rows, in file order), the run's columns."""
        shard = self.shards[index]
        table = tables.read_parquet_table(shard.path, columns=self.columns)
        if table.num_rows != shard.rows:
            raise BadInputError(
                f"{shard.path}: {table.num_rows} rows, but its manifest lists {shard.rows}; prepare the folder again"
            )
        self.rows_read += table.num_rows
        return table if shard.kept is None else table.take(pa.array(shard.kept))


class EpochOrder:
    """Epoch `epoch`'s order of a ShardSet's rows, from `seed`: rows(start, count) gives the rows at
    those indices of the order, reading the blocks that hold them (the last one read is kept)."""

    def __init__(self, shards: ShardSet, seed: int, epoch: int, block_rows: int):
        self.shards, self.seed, self.epoch = shards, seed, epoch
        self.units = np.random.default_rng([seed, epoch]).permutation(len(shards.shards))  # shard order
        self.blocks: list[list[int]] = []  # shard indices of each block
        self.starts: list[int] = []  # index in the epoch's order of each block's first row
        rows = 0
        for unit in self.units.tolist():
            if not self.blocks or rows - self.starts[-1] >= block_rows:
                self.blocks.append([])
                self.starts.append(rows)
            self.blocks[-1].append(unit)
            rows += shards.shards[unit].size
        self._held: tuple[int, pa.Table] | None = None

    def block(self, index: int) -> pa.Table:
        """Block `index` of the epoch: its shards' rows in the block's own seeded order (kept while it
        is the block read last)."""
        if self._held is None or self._held[0] != index:
            table = pa.concat_tables([self.shards.read(u) for u in self.blocks[index]])
            order = np.random.default_rng([self.seed, self.epoch, index]).permutation(table.num_rows)
            self._held = (index, table.take(pa.array(order)))
        return self._held[1]

    def blocks_in(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(block, first row, row after the last) of each block that holds rows [start, end) of the
        epoch's order, the rows counted within the block."""
        out = []
        index = bisect.bisect_right(self.starts, start) - 1
        while start < end:
            first = self.starts[index]
            last = self.starts[index + 1] if index + 1 < len(self.starts) else self.shards.rows
            out.append((index, start - first, min(end, last) - first))
            start, index = min(end, last), index + 1
        return out

    def rows(self, start: int, count: int) -> pa.Table:
        """Rows [start, start + count) of the epoch's order."""
        pieces = []
        while count > 0:
            index = bisect.bisect_right(self.starts, start) - 1
            block = self.block(index)
            offset = start - self.starts[index]
            n = min(count, block.num_rows - offset)
            pieces.append(block.slice(offset, n))
            start, count = start + n, count - n
        return pa.concat_tables(pieces)
