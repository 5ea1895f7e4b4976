"""A rank's stream of a task's batches from the task's dealer (trainer.feed=ray_data): the local
stream's interface (local_feed.LocalStream: positions that name their order, the rows read for the
first batch, close), its batches asked for a few ahead."""

from __future__ import annotations

import collections
from typing import Any

from convsts.ray_jobs.training.data_feed import as_tensors, too_few_rows
from convsts.ray_jobs.training.feed_dealer import start
from convsts.ray_jobs.training.feed_order import ORDER_KEY, FeedOrder, reconciled

PREFETCH = 2  # batches a rank asks for ahead of the one it trains on


class DealtStream:
    """A rank's batches of a task from the task's dealer, with the local stream's interface
    (local_feed.LocalStream): positions, the rows read for the first batch, close."""

    def __init__(self, task: str, name: str, order: FeedOrder, encode, batch_size: int, share, device,
                 position: dict[str, Any] | None = None, owner: bool = False):  # fmt: skip
        index, self.ranks = share
        too_few = too_few_rows(task, order.rows, self.ranks, batch_size)
        if too_few:
            raise RuntimeError(too_few)
        position, self.order_changed = reconciled(task, order, position or {})
        self.task, self.order, self.batch_size, self.device, self.index, self.owner = (
            task, order, batch_size, device, index, owner
        )  # fmt: skip
        self.epoch, self.rows = int(position.get("epoch", 0)), int(position.get("rows", 0))
        self.dealer = start(name, order, encode, batch_size, self.ranks, {"epoch": self.epoch, "rows": self.rows})
        self.asked, self.rows_read = 0, 0  # rows_read: those read from storage for the batches taken
        self.pending: collections.deque = collections.deque()
        for _ in range(PREFETCH):
            self._ask()
        self.opening_rows_read: int | None = None

    def _ask(self) -> None:
        self.pending.append(self.dealer.take.remote(self.index, self.asked))
        self.asked += 1

    def __iter__(self):
        return self

    def __next__(self):
        import ray

        ref = self.pending.popleft()
        self._ask()
        (self.epoch, self.rows), batch, read = ray.get(ref)
        if self.opening_rows_read is None:
            self.opening_rows_read = read
        self.rows_read += read
        return as_tensors(batch, self.device)

    def position(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "rows": self.rows,
            "batch_size": self.batch_size,
            "ranks": self.ranks,
            ORDER_KEY: self.order.inputs,
        }

    def stats(self) -> dict[str, Any]:
        import ray

        return ray.get(self.dealer.stats.remote())

    def close(self) -> None:
        """The task's owner rank ends the dealer (and its pipeline); the others drop their requests."""
        import ray

        self.pending.clear()
        if self.owner:
            ray.kill(self.dealer)
