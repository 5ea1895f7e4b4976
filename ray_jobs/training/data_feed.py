"""The training feed's parts that both feeds share (trainer.feed): what a worker reads of each task
(its listing, its shards and the rows kept of them, its encoder), the task's order (feed_order), and
the stream a worker opens for a task: from the task's Ray Data pipeline through its dealer
(feed_dealer), or read by the worker itself (local_feed). Both give the same batches."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch

from convsts.datasets.sample_order import ShardSet
from convsts.io import storage
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks import Task, trained_tasks
from convsts.ray_jobs.tasks.prepared_folder import MANIFEST, verify_prepared
from convsts.ray_jobs.training.feed_order import ORDER_KEY, FeedOrder, reconciled
from convsts.ray_jobs.training.feed_reader import Batch, BatchEncoder


def check_prepared(
    prepared_root: str, tasks: dict[str, Task], cfg: RunConfig, present_only: bool = False
) -> dict[str, dict[str, Any]]:
    """Every task's prepared folder is complete (its manifest matches its shards and counts) and was
    prepared with the run's settings (Task.prepared_keys); {task: manifest}. `present_only`: the
    tasks whose folder holds a manifest, the others left out."""
    if present_only:
        tasks = {
            n: t for n, t in tasks.items() if storage.is_file(storage.join(t.prepared_dir(prepared_root), MANIFEST))
        }
    return {name: verify_prepared(task, prepared_root, cfg) for name, task in tasks.items()}


def task_listings(cfg: RunConfig, prepared_root: str, manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a worker reads of each trained task: {task: {"folder": its train folder, "shards":
    [(file, rows), ...] in file order}}, from the manifests the driver verified (no listing, no
    footer read in the workers)."""
    out = {}
    for name, task in trained_tasks(cfg).items():
        records = sorted((s["file"], int(s["rows"])) for s in manifests[name]["shards"]["train"])
        out[name] = {"folder": task.train_path(prepared_root), "shards": records}
    return out


def task_shards(task: Task, cfg: RunConfig, listing: dict[str, Any]) -> ShardSet:
    """A task's training shards as a run with `cfg` reads them: the columns it trains on, the rows
    its filter keeps (SNLI's data.snli_fraction)."""
    keep = task.row_filter(cfg)
    return ShardSet.of_folder(
        listing["folder"], listing["shards"], task.feed_columns(cfg), keep, task.filter_columns if keep else ()
    )


def batch_encoder(task: Task, tokenizer, width: int, cfg: RunConfig) -> BatchEncoder:
    """Rows of a task -> its token-id columns (<column>__<field>, the text columns a run with `cfg`
    trains on) and its label."""
    return BatchEncoder(tokenizer, task.text_columns(cfg), width, task.label)


def order_seed(seed: int, task: str) -> int:
    """The seed of a task's epoch orders: the run's seed and the task, the same on every rank."""
    return seed * 1_000_003 + zlib.crc32(task.encode())


def feed_order(cfg: RunConfig, task: str, shards: ShardSet, pad_id: int) -> FeedOrder:
    """`task`'s order in a run with `cfg`: seeded by the run's seed and the task, blocks of
    trainer.shuffle_block_rows, and with trainer.bucket_batches a window of that many of the first
    stage's batches cut into chunks of one (a stage's batch size may change; the order may not)."""
    chunk = cfg.trainer.stages[0].batch_size
    window = cfg.trainer.bucket_batches * chunk if cfg.trainer.bucket_batches > 1 else 0
    return FeedOrder(shards, order_seed(cfg.seed, task), cfg.trainer.shuffle_block_rows, window, chunk, pad_id)


class FeedStream:
    """What both feeds' streams of one task for one rank share (local_feed.LocalStream,
    dealt_stream.DealtStream): rank `share[0]` of the task's `share[1]` ranks, a start position
    reconciled with the task's order (`order_changed`: the line when it counted another order's
    rows), the position after each batch taken with the order's inputs, and the rows read from
    storage for the batches taken (`opening_rows_read`: for the first, None before it)."""

    def __init__(self, task: str, order: FeedOrder, batch_size: int, share: tuple[int, int], device, position):
        self.index, self.ranks = share
        if order.rows < self.ranks * batch_size:
            raise RuntimeError(
                f"{task}: {order.rows} training rows, fewer than one batch of its {self.ranks} rank(s) "
                f"({self.ranks} x {batch_size})"
            )
        self.task, self.order, self.batch_size, self.device = task, order, batch_size, device
        start, self.order_changed = reconciled(task, order, position or {})
        self.epoch, self.rows = int(start.get("epoch", 0)), int(start.get("rows", 0))
        self.opening_rows_read: int | None = None
        self.rows_read = 0

    def _took(self, position: tuple[int, int], batch: Batch, read: int) -> dict[str, torch.Tensor]:
        """A batch taken: the position after it, the rows read for it; its arrays as tensors."""
        self.epoch, self.rows = position
        if self.opening_rows_read is None:  # the first batch: what reaching the stream's position read
            self.opening_rows_read = read
        self.rows_read += read
        return {k: torch.from_numpy(np.require(v, requirements=["C", "W"])).to(self.device) for k, v in batch.items()}

    def __iter__(self):
        return self

    def position(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "rows": self.rows,
            "batch_size": self.batch_size,
            "ranks": self.ranks,
            ORDER_KEY: self.order.inputs,
        }
