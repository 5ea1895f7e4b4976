"""What a training worker's feed reads and tokenizes, without torch, so that it can run in processes
beside the worker (trainer.feed_processes): a unit of work is one global batch's slice for one rank,
or a length-bucketing window of them, and gives the unit's batches in the order they are yielded."""

from __future__ import annotations

import collections
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from convsts.datasets.sample_order import EpochOrder, ShardSet
from convsts.datasets.text import encode_columns

Batch = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchEncoder:
    """Rows of a task -> its token-id columns (<prefix>__<field> of each text column) and its label."""

    tokenizer: Any
    columns: dict[str, str]  # text column -> prefix
    width: int
    label: str | None

    def __call__(self, rows: pa.Table) -> Batch:
        texts = {c: rows.column(c).to_numpy(zero_copy_only=False) for c in self.columns}
        out = encode_columns(self.tokenizer, texts, self.columns, self.width)
        if self.label:
            out[self.label] = rows.column(self.label).to_numpy(zero_copy_only=False)
        return out


@dataclass
class Reader:
    """One rank's reads of one task: its slice (`index`) of each global batch, read in the epoch's
    order (the last epoch's EpochOrder kept, with the block it holds) and encoded; with `bucketed`,
    each unit is a window of batches sorted by length."""

    shards: ShardSet
    encode: Callable[[pa.Table], Batch]
    seed: int
    block_rows: int
    batch_size: int
    index: int
    pad_id: int = 0
    bucketed: bool = False
    _order: EpochOrder | None = None

    def unit(self, epoch: int, starts: tuple[int, ...]) -> list[Batch]:
        """The batches of the global batches that start at `starts` of epoch `epoch`'s order."""
        if self._order is None or self._order.epoch != epoch:
            self._order = EpochOrder(self.shards, self.seed, epoch, self.block_rows)
        order = self._order
        window = [self.encode(order.rows(s + self.index * self.batch_size, self.batch_size)) for s in starts]
        return self._bucketed(window, epoch, starts[0]) if self.bucketed else window

    def read(self, epoch: int, starts: tuple[int, ...]) -> tuple[list[Batch], int]:
        """unit's batches, and the rows it read of the shards for them (0 where the block it needs is
        the one already held)."""
        before = self.shards.rows_read
        batches = self.unit(epoch, starts)
        return batches, self.shards.rows_read - before

    def _bucketed(self, window: list[Batch], epoch: int, start: int) -> list[Batch]:
        rows = {k: np.concatenate([b[k] for b in window]) for k in window[0]}  # {name: (W*B, ...)}
        # The longest text column of each row: every column's batch is cut to its own longest row, and
        # rows whose longest side is alike share a batch.
        lengths = np.stack([(v != self.pad_id).sum(1) for v in rows.values() if v.ndim == 2]).max(0)  # (W*B,)
        order = np.argsort(lengths, kind="stable")  # (W*B,) shortest first
        turns = np.random.default_rng([self.seed, epoch, start, self.index]).permutation(len(window))
        cut = [order[j * self.batch_size : (j + 1) * self.batch_size] for j in turns.tolist()]  # (B,) each
        return [{k: v[idx] for k, v in rows.items()} for idx in cut]


# A pool process's reader, set once by the pool's initializer (a process-wide value by design: each
# process of a worker's pool reads for that one stream).
_POOL_READER: list[Reader] = []


def _hold(reader: Reader) -> None:
    _POOL_READER[:] = [reader]


def _read(epoch: int, starts: tuple[int, ...]) -> Read:
    return _POOL_READER[0].read(epoch, starts)


Unit = tuple[int, tuple[int, ...]]  # (epoch, the starts of its global batches in the epoch's order)
Read = tuple[list[Batch], int]  # a unit's batches, and the rows it read of the shards (Reader.read)


def in_this_process(reader: Reader, units: Iterator[Unit]) -> Iterator[tuple[Unit, Read]]:
    """(each unit, what Reader.read gives of it), read here."""
    for unit in units:
        yield unit, reader.read(*unit)


def in_processes(reader: Reader, units: Iterator[Unit], processes: int) -> Iterator[tuple[Unit, Read]]:
    """(each unit, what Reader.read gives of it), in the units' order, read by `processes` processes (spawned: no copy
    of the worker's CUDA state or threads), up to twice as many units ahead of the consumer."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_hold, initargs=(reader,)) as pool:
        ahead: collections.deque[tuple[Unit, Future]] = collections.deque()
        try:
            for unit in units:
                ahead.append((unit, pool.submit(_read, *unit)))
                if len(ahead) >= 2 * processes:
                    done, future = ahead.popleft()
                    yield done, future.result()
            while ahead:
                done, future = ahead.popleft()
                yield done, future.result()
        finally:
            for _, future in ahead:
                future.cancel()
