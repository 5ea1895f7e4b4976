"""The order a task's rows are trained in, whichever feed reads them (trainer.feed: the Ray Data
pipeline and its dealer, or the worker's local reader): each epoch's order of the shards' rows
(sample_order.EpochOrder); with length bucketing, each window of `window` rows of that order sorted
by length, cut into chunks of `chunk` rows and the chunks put in a seeded order; the global batches
are `ranks x batch_size` consecutive rows of it from the epoch's start (or a position), the epoch's
last rows that fill none left out, and rank i takes the i-th slice of each. Nothing of this depends
on the group's size, so a position (rows of the epoch trained) goes on at any size with neither a
repeat nor a gap, bucketing included. What fixes the order is kept in every position (`inputs`), so
a resume under other inputs is said, not continued silently."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from convsts.datasets.sample_order import ShardSet

Batch = dict[str, np.ndarray]
ORDER_KEY = "order"  # a position's record of its order's inputs


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FeedOrder:
    """One task's epoch orders: its shards (and the rows a run keeps of them), the order's seed,
    trainer.shuffle_block_rows and, with trainer.bucket_batches, the bucketing window and chunk in
    rows (0: no bucketing)."""

    shards: ShardSet
    seed: int
    block_rows: int
    window: int = 0
    chunk: int = 0
    pad_id: int = 0

    @property
    def rows(self) -> int:
        return self.shards.rows

    def end(self, start: int, step: int) -> int:
        """The row after the epoch's last full global batch of `step` rows counted from `start`."""
        return start + (self.rows - start) // step * step

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The rows of the epoch's order read to give rows [start, end) of the trained order: the
        same, or with bucketing the whole windows that hold them."""
        if not self.window:
            return start, end
        return start // self.window * self.window, min(self.rows, -(-end // self.window) * self.window)

    def bucketed(self, rows: Batch, epoch: int, window_start: int) -> Batch:
        """One window's encoded rows (those of the epoch's order from `window_start`, a window's first
        row) in the trained order: sorted by length (a row's longest text column, `pad_id` not
        counted), cut into chunks, the chunks in a seeded order. The same at any group size."""
        lengths = np.stack([(v != self.pad_id).sum(1) for v in rows.values() if v.ndim == 2]).max(0)  # (W,)
        by_length = np.argsort(lengths, kind="stable")  # (W,) shortest first
        chunks = -(-len(by_length) // self.chunk)
        turns = np.random.default_rng([self.seed, epoch, window_start]).permutation(chunks)
        index = np.concatenate([by_length[j * self.chunk : (j + 1) * self.chunk] for j in turns.tolist()])  # (W,)
        return {k: v[index] for k, v in rows.items()}

    @functools.cached_property
    def inputs(self) -> dict[str, Any]:
        """What fixes the order, kept in each position: the seed, the blocks' rows, the shards (files
        and rows), the rows kept of them (a row filter: data.snli_fraction) and the bucketing."""
        shards = [[s.path.rsplit("/", 1)[-1], s.rows] for s in self.shards.shards]
        kept = [
            None if s.kept is None else hashlib.sha256(s.kept.tobytes()).hexdigest()[:16] for s in self.shards.shards
        ]
        return {
            "seed": self.seed,
            "shuffle_block_rows": self.block_rows,
            "shards": _digest(shards),
            "kept_rows": _digest(kept),
            "bucketing": [self.window, self.chunk],
        }

    def changes(self, saved: dict[str, Any] | None) -> list[str]:
        """The inputs that differ from those a position recorded (none for a position that recorded
        none: written before positions named their order)."""
        if not saved:
            return []
        now = self.inputs
        return [key for key in now if key in saved and saved[key] != now[key]]


# What each input is, as a line says it.
INPUT_NAMES = {
    "seed": "the seed (seed)",
    "shuffle_block_rows": "trainer.shuffle_block_rows",
    "shards": "the prepared shards",
    "kept_rows": "the rows kept of them (data.snli_fraction, data.snli_fraction_seed)",
    "bucketing": "the length bucketing (trainer.bucket_batches, the first stage's batch size)",
}


def reconciled(task: str, order: FeedOrder, position: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the position a stream of `order` goes on from, the one line that says why it is not the
    saved one): a position recorded under other inputs names another order, whose row count means
    nothing in this one, so the task starts that epoch over (docs/reliability.md)."""
    changed = order.changes(position.get(ORDER_KEY))
    if not changed:
        return position, None
    epoch = int(position.get("epoch", 0))
    names = ", ".join(INPUT_NAMES[key] for key in changed)
    line = (
        f"{task}: the checkpoint's data position ({position.get('rows', 0)} rows of epoch {epoch}) counts rows of "
        f"another order ({names} changed since): the task starts epoch {epoch} over"
    )
    return {"epoch": epoch, "rows": 0}, line
