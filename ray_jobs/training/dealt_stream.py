"""A rank's stream of a task's batches from the task's dealer (trainer.feed=ray_data): the local
stream's interface (local_feed.LocalStream: positions that name their order, the rows read for the
first batch, close), its batches asked for a few ahead."""

from __future__ import annotations

import collections
from typing import Any

from convsts.ray_jobs.training.data_feed import FeedStream
from convsts.ray_jobs.training.feed_dealer import start
from convsts.ray_jobs.training.feed_order import FeedOrder

PREFETCH = 2  # batches a rank asks for ahead of the one it trains on


class DealtStream(FeedStream):
    """A rank's batches of a task from the task's dealer, with the local stream's interface
    (data_feed.FeedStream): positions, the rows read for the first batch, close."""

    def __init__(self, task: str, name: str, order: FeedOrder, encode, batch_size: int, share, device,
                 position: dict[str, Any] | None = None, owner: bool = False, pipelines: int = 1):  # fmt: skip
        """`pipelines`: the group's tasks, whose pipelines share the CPUs the workers left."""
        super().__init__(task, order, batch_size, share, device, position)
        self.owner = owner
        at = {"epoch": self.epoch, "rows": self.rows}
        self.dealer = start(name, order, encode, batch_size, self.ranks, at, pipelines)
        self.asked = 0
        self.pending: collections.deque = collections.deque()
        for _ in range(PREFETCH):
            self._ask()

    def _ask(self) -> None:
        self.pending.append(self.dealer.take.remote(self.index, self.asked))
        self.asked += 1

    def __next__(self):
        import ray

        ref = self.pending.popleft()
        self._ask()
        return self._took(*ray.get(ref))

    def close(self) -> None:
        """The task's owner rank ends the dealer (and its pipeline); the others drop their requests."""
        import ray

        self.pending.clear()
        if self.owner:
            ray.kill(self.dealer)
