"""A task's dealer (trainer.feed=ray_data): one small actor per task and group start that consumes the
task's Ray Data pipeline (feed_pipeline) in order, buckets its windows, cuts the trained order into
global batches of `ranks x batch_size` rows and hands rank i the i-th slice of each, a few global
batches ahead of the slowest rank; and the stream each rank reads it through (DealtStream). The
rows cross storage once per task and epoch and reach each rank's node once, as its own batches."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from convsts.ray_jobs.training import feed_pipeline
from convsts.ray_jobs.training.feed_order import Batch, FeedOrder

NAMESPACE = "convsts-feed"  # the dealers' Ray namespace
AHEAD = 16  # global batches the dealer holds ahead of its slowest rank (at least a rank's call: dealt_stream.CHUNK)
# Rows a pipeline reads at least (whole epochs' rests) before the dealer starts the next one, once it
# has dealt them: a pipeline's start costs about a second, and its tasks run through its rows as fast
# as its CPUs allow, so this bounds how far the feed tokenizes ahead of training (an epoch's rest at
# most beyond it). One pipeline, not one ahead of need: Ray Data's scheduling loop spins while an
# output budget holds it back (docs/performance.md).
PIPELINE_ROWS = 16384
STOP_S = 10.0  # how long a stop waits for the pipeline to shut down before the dealer is killed


class _Rows:
    """Rows in order, from `blocks` (the pipeline's) or pushed, taken `count` at a time: views of one
    piece where they lie in one, else the pieces joined; with the rows read from storage for them."""

    def __init__(self, blocks: Iterator[Batch] | None = None):
        self.blocks, self.offset = blocks or iter(()), 0
        self.pieces: collections.deque[Batch] = collections.deque()
        self.count = 0  # rows pushed and not yet taken

    def push(self, piece: Batch) -> None:
        self.pieces.append(piece)
        self.count += _length(piece)

    def take(self, count: int) -> tuple[Batch, int]:
        out, read = [], 0
        while count:
            if not self.pieces:
                self.push(next(self.blocks))
            head = self.pieces[0]
            n = min(count, _length(head) - self.offset)
            piece = {k: v[self.offset : self.offset + n] for k, v in head.items()}
            read += int(piece.pop(feed_pipeline.READ_COLUMN, np.zeros(1, dtype=np.int64)).sum())
            out.append(piece)
            self.offset, count, self.count = self.offset + n, count - n, self.count - n
            if self.offset == _length(head):
                self.pieces.popleft()
                self.offset = 0
        rows = out[0] if len(out) == 1 else {k: np.concatenate([p[k] for p in out]) for k in out[0]}
        return rows, read


def _length(batch: Batch) -> int:
    return len(next(iter(batch.values())))


class Dealer:
    """The actor (feed_dealer.start makes it): a thread runs the task's pipelines from the position on
    and keeps up to AHEAD global batches; take(rank, k) gives rank `rank` its slice of global batch k
    (counted from the position), with the position after it and the rows read from storage for it."""

    def __init__(
        self, order: FeedOrder, encode, batch_size: int, ranks: int, position: dict[str, Any], cpus: float, left: float
    ):
        """`cpus`: each pipeline task's CPUs (feed_cpus); `left`: this pipeline's share of the CPUs the workers left."""
        import ray.data

        self.order, self.encode, self.batch_size, self.ranks = order, encode, batch_size, ranks
        self.cpus = cpus
        feed_pipeline.configure(ray.data.DataContext.get_current(), left if cpus else 0.0)
        # global batch k -> (the position after it, its ranks' slices, the rows read for it, the ranks yet to take it)
        self.ready: dict[int, tuple[tuple[int, int], list[Batch], int, set[int]]] = {}
        self.produced = 0
        self.error: BaseException | None = None
        self.changed = threading.Condition()
        self.stopped = False
        start = (int(position.get("epoch", 0)), int(position.get("rows", 0)))
        self.producer = threading.Thread(target=self._produce, args=start, daemon=True, name="convsts-dealer")
        self.producer.start()

    def _produce(self, epoch: int, start: int) -> None:
        step = self.ranks * self.batch_size
        try:
            while not self.stopped:
                parts, items = feed_pipeline.stretches(self.order, epoch, start, step, PIPELINE_ROWS)
                ds = feed_pipeline.dataset(self.order, self.encode, items, self.cpus)
                batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2))
                try:
                    rows = _Rows(batches)
                    for part in parts:
                        self._deal(part, rows, step)
                finally:  # on a stop too: Ray Data shuts its execution down and cancels its running tasks
                    batches.close()  # Ray Data's generator
                epoch, start = parts[-1].epoch + 1, 0
        except _Stopped:
            return
        except BaseException as err:  # noqa: BLE001 - handed to the ranks, raised there
            with self.changed:
                self.error = err
                self.changed.notify_all()

    def _deal(self, part: feed_pipeline.Stretch, rows: _Rows, step: int) -> None:
        """The stretch's global batches, from its rows read a window at a time (bucketed), else a
        block's worth at a time."""
        window = self.order.window or max(step, self.order.block_rows // step * step)
        kept, read, at = _Rows(), 0, part.start  # `at`: the trained order's row of the next global batch
        row = part.lo
        while row < part.hi:
            stop = min(part.hi, (row // window + 1) * window)
            got, got_read = rows.take(stop - row)
            if self.order.window:
                got = self.order.bucketed(got, part.epoch, row)
            first, last = max(row, part.start) - row, min(stop, part.end) - row
            if last > first:
                kept.push({k: v[first:last] for k, v in got.items()})
            read += got_read
            while kept.count >= step:
                batch, _ = kept.take(step)
                at += step
                slices = [
                    {k: v[i * self.batch_size : (i + 1) * self.batch_size] for k, v in batch.items()}
                    for i in range(self.ranks)
                ]
                self._put((part.epoch, at), slices, read)
                read = 0
            row = stop

    def _put(self, position: tuple[int, int], slices: list[Batch], read: int) -> None:
        with self.changed:
            while not self.stopped and self.produced - min(self.ready, default=self.produced) >= AHEAD:
                self.changed.wait()
            if self.stopped:
                raise _Stopped
            self.ready[self.produced] = (position, slices, read, set(range(self.ranks)))
            self.produced += 1
            self.changed.notify_all()

    def take(self, rank: int, k: int, count: int = 1) -> list[tuple[tuple[int, int], Batch, int]]:
        """Rank `rank`'s slices of global batches k .. k+count-1, each with the position after it and
        the rows read from storage for it; once all are produced (those produced before a failure of
        the pipeline, which is raised where none is)."""
        with self.changed:
            while k + count > self.produced and self.error is None:
                self.changed.wait()
            if k >= self.produced:
                raise RuntimeError(f"the feed's pipeline failed: {self.error!r}") from self.error
            out = []
            for i in range(k, min(k + count, self.produced)):
                position, slices, read, waiting = self.ready[i]
                waiting.discard(rank)
                if not waiting:
                    del self.ready[i]
                out.append((position, slices[rank], read))
            self.changed.notify_all()
            return out

    def stop(self) -> None:
        """The pipeline shut down (Ray Data cancels its running tasks), then the actor ends the way
        Ray lets an actor end on its own, once the tasks it owns have ended: killed, it would take
        the workers running them with it (Ray ends them with a SIGTERM, mid-task)."""
        import ray

        with self.changed:
            self.stopped = True
            self.changed.notify_all()
        self.producer.join(timeout=STOP_S)
        ray.actor.exit_actor()


class _Stopped(Exception):
    """The dealer was stopped: its producer ends."""


def feed_cpus(cpus_left: float) -> float:
    """The CPUs of each pipeline task: one where the pipeline's share of the CPUs the trainers left
    is one or more; else none (the tasks share the trainers' CPUs, as the local feed's reading does,
    one at a time, rather than wait for a CPU another task's pipeline holds)."""
    return 1.0 if cpus_left >= 1.0 else 0.0


@dataclass(frozen=True)
class CpuShare:
    """How a group's pipelines share the CPUs its workers left: `pipelines` (one a task) split them,
    less the CPUs of the workers an elastic group may still grow by (`grow_by` more, each asking
    `per_worker`, as many as the cluster's free resources hold now): a pipeline's task that took a
    CPU of a free node would keep the group from growing onto it."""

    pipelines: int = 1
    grow_by: int = 0
    per_worker: tuple[tuple[str, float], ...] = (("CPU", 1.0),)

    def cpus_left(self, available: dict[str, float]) -> float:
        """Each pipeline's CPUs of `available` (Ray's free resources, cluster-wide)."""
        need = dict(self.per_worker)
        room = min([self.grow_by, *(int(available.get(k, 0.0) // v) for k, v in need.items() if v > 0)])
        free = available.get("CPU", 0.0) - max(room, 0) * need.get("CPU", 0.0)
        return max(free, 0.0) / max(self.pipelines, 1)


def start(
    name: str,
    order: FeedOrder,
    encode,
    batch_size: int,
    ranks: int,
    position: dict[str, Any],
    cpus: CpuShare | None = None,
):
    """The dealer named `name` (every rank of the task asks for it with the same arguments; the first
    makes it, the others get it), its pipeline's tasks sized to its share of the CPUs the trainers
    left (`cpus`)."""
    import ray

    left = (cpus or CpuShare()).cpus_left(ray.available_resources())
    actor = ray.remote(Dealer).options(
        name=name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_concurrency=2 * ranks + 4
    )
    return actor.remote(order, encode, batch_size, ranks, position, feed_cpus(left), left)
