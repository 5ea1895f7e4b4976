"""The local feed's reader (trainer.feed=local): what a training worker reads and tokenizes itself,
without torch, so that it can run in processes beside the worker (trainer.feed_processes); a unit of
work is one global batch, of which the reader gives its rank's slice."""

from __future__ import annotations

import collections
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from convsts.datasets.sample_order import EpochOrder
from convsts.datasets.text import encode_columns
from convsts.ray_jobs.training.feed_order import FeedOrder

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
    """One rank's reads of one task (trainer.feed=local): its slice (`index`) of each global batch of
    the task's trained order (feed_order.FeedOrder), read from the epoch's order (the last epoch's
    EpochOrder kept, with the block it holds) and encoded; with bucketing, the window that holds the
    slice is read, encoded and bucketed whole (the last one kept)."""

    order: FeedOrder
    encode: Callable[[pa.Table], Batch]
    batch_size: int
    index: int
    _epoch: EpochOrder | None = None
    _window: tuple[int, int, Batch] | None = None  # (epoch, the window's first row, its bucketed rows)

    def _epoch_order(self, epoch: int) -> EpochOrder:
        if self._epoch is None or self._epoch.epoch != epoch:
            self._epoch = EpochOrder(self.order.shards, self.order.seed, epoch, self.order.block_rows)
        return self._epoch

    def _bucketed_window(self, epoch: int, first: int) -> Batch:
        if self._window is None or self._window[:2] != (epoch, first):
            count = min(self.order.window, self.order.rows - first)
            rows = self.encode(self._epoch_order(epoch).rows(first, count))
            self._window = (epoch, first, self.order.bucketed(rows, epoch, first))
        return self._window[2]

    def unit(self, epoch: int, start: int) -> Batch:
        """The rank's batch of the global batch at row `start` of epoch `epoch`'s trained order."""
        first = start + self.index * self.batch_size
        if not self.order.window:
            return self.encode(self._epoch_order(epoch).rows(first, self.batch_size))
        pieces, row, end = [], first, first + self.batch_size
        while row < end:
            window_start = row // self.order.window * self.order.window
            window = self._bucketed_window(epoch, window_start)
            stop = min(end, window_start + self.order.window)
            pieces.append({k: v[row - window_start : stop - window_start] for k, v in window.items()})
            row = stop
        return pieces[0] if len(pieces) == 1 else {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}

    def epoch_rows(self, epoch: int) -> Batch:
        """Every row of epoch `epoch`'s trained order, encoded (what a test or a benchmark checks a
        feed's batches against)."""
        if not self.order.window:
            return self.encode(self._epoch_order(epoch).rows(0, self.order.rows))
        windows = [self._bucketed_window(epoch, w) for w in range(0, self.order.rows, self.order.window)]
        return {k: np.concatenate([w[k] for w in windows]) for k in windows[0]}

    def read(self, epoch: int, start: int) -> tuple[Batch, int]:
        """unit's batch, and the rows it read of the shards for it (0 where the blocks it needs are
        the ones already held)."""
        before = self.order.shards.rows_read
        batch = self.unit(epoch, start)
        return batch, self.order.shards.rows_read - before


# A pool process's reader, set once by the pool's initializer (a process-wide value by design: each
# process of a worker's pool reads for that one stream).
_POOL_READER: list[Reader] = []


PARENT_POLL_S = 1.0  # how often a pool process checks that its worker is alive


def _hold(reader: Reader, parent: int) -> None:
    """A pool process's start: it keeps `reader`, and ends itself once its worker (`parent`) is
    gone. A worker killed with SIGKILL (a lost driver, Ray ending its job) cannot shut its pool
    down, and the pool's processes would wait on its queue for ever."""
    _POOL_READER[:] = [reader]

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="convsts-feed-parent").start()


def _read(epoch: int, start: int) -> Read:
    return _POOL_READER[0].read(epoch, start)


Unit = tuple[int, int]  # (epoch, the row of its trained order a global batch starts at)
Read = tuple[Batch, int]  # a rank's batch of a unit, and the rows it read of the shards (Reader.read)


def in_this_process(reader: Reader, units: Iterator[Unit]) -> Iterator[tuple[Unit, Read]]:
    """(each unit, what Reader.read gives of it), read here."""
    for unit in units:
        yield unit, reader.read(*unit)


def in_processes(reader: Reader, units: Iterator[Unit], processes: int) -> Iterator[tuple[Unit, Read]]:
    """(each unit, what Reader.read gives of it), in the units' order, read by `processes` processes (spawned: no copy
    of the worker's CUDA state or threads), up to twice as many units ahead of the consumer."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_hold, initargs=(reader, os.getpid())) as pool:
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
