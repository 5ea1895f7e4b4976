"""A rank's stream of a task's batches from the task's dealer (trainer.feed=ray_data): the local
stream's interface (local_feed.LocalStream: positions that name their order, the rows read for the
first batch, close), its batches asked for a few ahead."""

from __future__ import annotations

import collections
from typing import Any

from convsts.ray_jobs.training.data_feed import FeedStream
from convsts.ray_jobs.training.feed_dealer import STOP_S, CpuShare, start
from convsts.ray_jobs.training.feed_order import FeedOrder

CHUNK = 4  # batches a rank takes in one call to its dealer (a call costs more than handing a batch over)
PREFETCH = 2  # calls a rank keeps asking ahead of the batches it trains on


class DealtStream(FeedStream):
    """A rank's batches of a task from the task's dealer, with the local stream's interface
    (data_feed.FeedStream): positions, the rows read for the first batch, close."""

    def __init__(self, task: str, name: str, order: FeedOrder, encode, batch_size: int, share, device,
                 position: dict[str, Any] | None = None, owner: bool = False, cpus: CpuShare | None = None):  # fmt: skip
        """`cpus`: how the group's pipelines share the CPUs the workers left (feed_dealer.CpuShare)."""
        super().__init__(task, order, batch_size, share, device, position)
        self.owner = owner
        at = {"epoch": self.epoch, "rows": self.rows}
        self.dealer = start(name, order, encode, batch_size, self.ranks, at, cpus or CpuShare())
        self.asked = 0
        self.pending: collections.deque = collections.deque()  # calls asked, oldest first
        self.taken: collections.deque = collections.deque()  # batches received, not yet trained on
        for _ in range(PREFETCH):
            self._ask()

    def _ask(self) -> None:
        self.pending.append(self.dealer.take.remote(self.index, self.asked, CHUNK))
        self.asked += CHUNK

    def __next__(self):
        import ray

        if not self.taken:
            ref = self.pending.popleft()
            self._ask()
            self.taken.extend(ray.get(ref))
        return self._took(*self.taken.popleft())

    def close(self) -> None:
        """The task's owner rank ends the dealer (and its pipeline, whose running tasks end first: the
        dealer's stop), killing it where the stop takes longer than feed_dealer.STOP_S; the others drop
        their requests."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        self.pending.clear()
        self.taken.clear()
        if self.owner:
            try:
                ray.get(self.dealer.stop.remote(), timeout=2 * STOP_S)
            except (RayActorError, GetTimeoutError):  # RayActorError: it ended, as the stop ends it
                pass
            ray.kill(self.dealer)
