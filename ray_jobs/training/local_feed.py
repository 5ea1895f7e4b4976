"""The local feed (trainer.feed=local): a worker reads its own slice of each global batch of a task's
order from the shards itself (feed_reader.Reader), in a thread beside its steps or in
trainer.feed_processes processes. Every rank reads the blocks its slices are in, so the task's data
is read once per rank; the Ray-free loop, the unit tier and one machine without Ray use it."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from convsts.io.read_ahead import read_ahead
from convsts.ray_jobs.training.data_feed import FeedStream
from convsts.ray_jobs.training.feed_order import FeedOrder
from convsts.ray_jobs.training.feed_reader import Read, Reader, Unit, in_processes, in_this_process


class LocalStream(FeedStream):
    """Endless batches of one task for one rank, epoch after epoch, in the task's order (FeedOrder):
    rank `share[0]` of the task's `share[1]` ranks takes its slice of each global batch of
    `ranks x batch_size` rows. Its position is the rows of the epoch's trained order before its next
    global batch, with the order's inputs, so a stream opened at that position, at any number of
    ranks and any batch size, goes on with the next row and reads only the blocks (or, bucketed, the
    windows) that hold what it yields. A position recorded under other inputs starts the epoch over
    (`order_changed` says so). The rows are read and tokenized ahead of the consumer: in a thread, or
    in `processes` processes (the same batches either way)."""

    def __init__(
        self,
        task: str,
        order: FeedOrder,
        encode: Callable[[pa.Table], dict[str, np.ndarray]],
        batch_size: int,
        share: tuple[int, int],
        device,
        position: dict[str, Any] | None = None,
        processes: int = 0,
    ):
        super().__init__(task, order, batch_size, share, device, position)
        self.reader = Reader(order, encode, batch_size, self.index)
        units = self._units()
        read = in_processes(self.reader, units, processes) if processes else in_this_process(self.reader, units)
        self._it = read_ahead(self._positioned(read))

    def _units(self) -> Generator[Unit, None, None]:
        """The global batches from the stream's position on."""
        step = self.ranks * self.batch_size  # rows of a global batch
        epoch, rows = self.epoch, self.rows
        while True:
            while rows + step <= self.order.rows:
                yield epoch, rows
                rows += step
            epoch, rows = epoch + 1, 0

    def _positioned(self, read: Iterator[tuple[Unit, Read]]) -> Generator[tuple, None, None]:
        """(the position after the batch, the batch, the rows of the shards read for it)."""
        step = self.ranks * self.batch_size
        try:
            for (epoch, start), (batch, rows_read) in read:
                yield (epoch, start + step), batch, rows_read
        finally:
            read.close()  # type: ignore[attr-defined]  # a generator: its processes end with it

    def __next__(self) -> dict[str, torch.Tensor]:
        return self._took(*next(self._it))

    def close(self) -> None:
        """Stop reading ahead (and the processes that read)."""
        self._it.close()  # type: ignore[attr-defined]  # read_ahead's generator
