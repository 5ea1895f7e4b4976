"""A task's Ray Data pipeline (trainer.feed=ray_data): the blocks of its epoch orders that a stretch of
training needs, each read once from storage, its rows put in the block's seeded order and
tokenized, in Ray Data tasks that run on any node with CPUs, in order (preserve_order) and within
the CPUs the trainers left (DataContext.execution_options). Its dealer (feed_dealer) consumes it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from convsts.datasets.sample_order import EpochOrder
from convsts.ray_jobs.training.feed_order import Batch, FeedOrder

READ_COLUMN = "__rows_read"  # a block's rows read from storage, on its first row (0 on the others)
# Rows a pipeline task reads at least: blocks of fewer rows go several to a task (a task's start costs
# more than reading a small block).
TASK_ROWS = 16384
# Rows a task encodes and hands on at a time, each its own output (Ray Data streams a task's outputs
# as they come, joined up to OUTPUT_BYTES; its default target is 128 MiB): the first batch waits for
# one chunk, not a whole block. The pipeline's read-ahead is not bounded by an output budget: Ray
# Data's scheduling loop spins while a budget holds a task's ready outputs back (a CPU of its own).
CHUNK_ROWS = 2048
OUTPUT_BYTES = 4 << 20


@dataclass(frozen=True)
class Stretch:
    """Rows [lo, hi) of epoch `epoch`'s order, read to train rows [start, end) of its trained order
    (feed_order.FeedOrder.span: the same rows, or the whole bucketing windows that hold them)."""

    epoch: int
    start: int
    end: int
    lo: int
    hi: int


def stretches(order: FeedOrder, epoch: int, start: int, step: int, rows: int) -> tuple[list[Stretch], list[dict]]:
    """The stretches of the epochs from row `start` of epoch `epoch` on, in global batches of `step`
    rows, until they read at least `rows` rows (at least one stretch: the rest of an epoch), and their
    block items: one a block of each stretch, with the epoch, the block and its rows read (within the
    block)."""
    parts: list[Stretch] = []
    items: list[dict] = []
    covered = 0  # the rows the items read
    while covered < rows or not parts:
        end = order.end(start, step)
        if end > start:
            part = Stretch(epoch, start, end, *order.span(start, end))
            epoch_order = EpochOrder(order.shards, order.seed, epoch, order.block_rows)
            items += [
                {"epoch": epoch, "block": b, "first": lo, "last": hi}
                for b, lo, hi in epoch_order.blocks_in(part.lo, part.hi)
            ]
            covered += part.hi - part.lo
            parts.append(part)
        epoch, start = epoch + 1, 0
    return parts, items


@dataclass
class BlockReader:
    """Ray Data's map over block items: each block read whole from its shards (the order's ShardSet),
    its rows in the block's seeded order, the item's rows of it encoded and handed on CHUNK_ROWS at a
    time; READ_COLUMN holds the rows read from storage for the block (on its first chunk's first row)."""

    order: FeedOrder
    encode: Callable[[pa.Table], Batch]
    chunk_rows: int = CHUNK_ROWS

    def __call__(self, items: dict[str, np.ndarray]) -> Iterator[Batch]:
        for epoch, block, first, last in zip(items["epoch"], items["block"], items["first"], items["last"]):
            epoch_order = EpochOrder(self.order.shards, self.order.seed, int(epoch), self.order.block_rows)
            before = self.order.shards.rows_read
            rows = epoch_order.block(int(block))
            read = self.order.shards.rows_read - before
            for lo in range(int(first), int(last), self.chunk_rows):
                n = min(self.chunk_rows, int(last) - lo)
                counted = np.zeros(n, dtype=np.int64)  # (n,)
                counted[0], read = read, 0
                yield {**self.encode(rows.slice(lo, n)), READ_COLUMN: counted}


# The name Ray gives the pipeline's tasks (Ray Data's map over BlockReader): a dealer that goes with
# a group ended abruptly ends the workers running them (runtime.worker_deaths passes over those deaths).
TASK_NAME = f"MapBatches({BlockReader.__name__})"


def dataset(order: FeedOrder, encode: Callable[[pa.Table], Batch], items: Sequence[dict], cpus: float):
    """The Ray Data dataset of the block items' rows (stretches), in order: each block (or several small
    ones: TASK_ROWS) read by a task of `cpus` CPUs (0: the CPUs the trainers reserved are shared, as the local feed shares them, by
    one task at a time: nothing else bounds how many tasks of no CPU Ray starts)."""
    import ray.data

    blocks_a_task = max(1, TASK_ROWS // order.block_rows)
    ds = ray.data.from_items(list(items), override_num_blocks=-(-len(items) // blocks_a_task))
    return ds.map_batches(
        BlockReader(order, encode),
        batch_size=blocks_a_task,
        num_cpus=cpus,
        compute=None if cpus else ray.data.TaskPoolStrategy(size=1),
        zero_copy_batch=True,
    )


def configure(context, cpus_left: float) -> None:
    """The dealer's DataContext: blocks in order, at most the CPUs the trainers left, outputs of at
    most OUTPUT_BYTES, no progress bars in the workers' logs."""
    from ray.data import ExecutionResources

    context.execution_options.preserve_order = True
    context.execution_options.resource_limits = ExecutionResources(cpu=max(cpus_left, 0.0))
    context.target_max_block_size = OUTPUT_BYTES
    context.execution_options.verbose_progress = False
    context.enable_progress_bars = False
