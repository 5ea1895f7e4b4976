"""The training feed: the tokenizer counted or trained from the prepared text, and the endless
per-task batch streams a worker reads from its tasks' prepared shards itself (one global order per
epoch at any number of ranks; a position is a count of rows, and a stream opened at one seeks)."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from convsts.datasets.sample_order import ShardSet
from convsts.datasets.text import TOKENIZERS, fit_tokenizer, words
from convsts.io import storage, tables
from convsts.io.read_ahead import read_ahead
from convsts.models.encoders import encoder_class
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks import Task, prepared_tasks, trained_tasks
from convsts.ray_jobs.tasks.prepared_folder import MANIFEST, shard_files, verify_prepared
from convsts.ray_jobs.training.feed_reader import BatchEncoder, Read, Reader, Unit, in_processes, in_this_process


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


# ---------------------------------------------------------------------------------------------
# Tokenizer


# Training text up to this many parquet bytes (all shards of every task in the vocabulary) is read
# in the driver: Ray Data's tasks take seconds to start, more than a folder this small takes to read.
DRIVER_READ_BYTES = 64 * 2**20


def _word_counts(batch: dict[str, np.ndarray], columns: Sequence[str], lowercase: bool) -> Counter:
    counts: Counter = Counter()
    for column in columns:
        for text in batch[column]:
            counts.update(words(str(text), lowercase))
    return counts


def _count_batch(batch: dict[str, np.ndarray], columns: Sequence[str], lowercase: bool) -> dict[str, np.ndarray]:
    counts = _word_counts(batch, columns, lowercase)
    return {"word": np.array(list(counts.keys()), dtype=object), "count": np.array(list(counts.values()))}


def _train_bytes(tasks: Sequence[Task], prepared_root: str) -> int:
    """The parquet bytes of the tasks' training shards (one listing per task)."""
    return sum(size for task in tasks for _, size, _ in storage.folder_stats(task.train_path(prepared_root)))


def _driver_batches(task: Task, prepared_root: str) -> Iterator[dict[str, np.ndarray]]:
    """The task's text columns, shard by shard, read in this process."""
    for path in shard_files(task.train_path(prepared_root)):
        table = tables.read_parquet_table(path, columns=list(task.pair))
        yield {column: table.column(column).to_numpy(zero_copy_only=False) for column in task.pair}


def build_tokenizer(cfg: RunConfig, prepared_root: str, driver_read_bytes: int = DRIVER_READ_BYTES):
    """The tokenizer the encoder needs, fitted on the training text of every task in the vocabulary
    (prepared_tasks: those trained plus those in every vocabulary), counted or trained in Ray Data,
    or read in the driver when the text is at most `driver_read_bytes` of parquet (the same tokenizer:
    the DAN's vocabulary ranks counts, ties by the word)."""
    kind = encoder_class(cfg.model.encoder).tokenizer_kind
    tasks = list(prepared_tasks(cfg).values())
    in_driver = _train_bytes(tasks, prepared_root) <= driver_read_bytes

    def batches(task: Task) -> Iterator[dict[str, np.ndarray]]:
        if in_driver:
            return _driver_batches(task, prepared_root)
        return task.train_rows(cfg, prepared_root).iter_batches(batch_size=4096, batch_format="numpy")

    if not TOKENIZERS[kind].fits_from_counts:  # WordPiece trained on the texts, or the pretrained model's own

        def texts():  # read only when the tokenizer is trained
            for task in tasks:
                for batch in batches(task):
                    for col in task.pair:
                        yield from (str(t) for t in batch[col])

        return fit_tokenizer(kind, texts(), cfg.tokenizer, cfg.model)
    total: Counter = Counter()
    for task in tasks:
        if in_driver:
            for batch in batches(task):
                total.update(_word_counts(batch, task.pair, cfg.tokenizer.lowercase))
            continue
        ds = task.train_rows(cfg, prepared_root)
        partial = ds.map_batches(_count_batch, fn_args=(list(task.pair), cfg.tokenizer.lowercase), batch_size=4096)
        for batch in partial.iter_batches(batch_size=None, batch_format="numpy"):
            # A block may hold the outputs of several map batches, so a word can occur more than
            # once in it: every occurrence adds (a dict of the pairs would keep only the last).
            for word, count in zip(batch["word"].tolist(), batch["count"].tolist()):
                total[word] += count
    return TOKENIZERS[kind].build(total, cfg.tokenizer)  # type: ignore[union-attr]  # a kind that fits from counts


# ---------------------------------------------------------------------------------------------
# Feeds: each worker reads its tasks' shards itself, in one global order per epoch (sample_order)


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


# ---------------------------------------------------------------------------------------------
# Streams


class TaskStream:
    """Endless batches of one task for one rank, epoch after epoch. Each epoch's rows come in one
    order that does not depend on the number of ranks (EpochOrder); its global batches are
    `ranks x batch_size` rows, and rank `share[0]` of the task's `share[1]` ranks takes its slice
    of each. Its position is the rows of the epoch read before its next global batch, so a stream
    opened at that position, at any number of ranks and any batch size, goes on with the next
    unread row and reads only the blocks that hold what it yields. The last rows of an epoch that
    fill no global batch are left out of it. With `bucket_batches` > 1, each window of that many of
    the rank's batches is sorted by length (the longest text column of a row, `pad_id` not counted),
    cut back into batches and yielded in a seeded order; the position is then the window's start
    and the batches yielded of it (a stream opened at the same ranks and batch size rebuilds the
    window and goes on inside it; at others, it reads the window again from its start). The rows
    are read and tokenized ahead of the consumer: in a thread, or in `processes` processes (the
    same batches either way)."""

    def __init__(
        self,
        task: str,
        shards: ShardSet,
        encode: Callable[[pa.Table], dict[str, np.ndarray]],
        batch_size: int,
        share: tuple[int, int],
        device,
        seed: int,
        block_rows: int,
        position: dict[str, int] | None = None,
        bucket_batches: int = 0,
        pad_id: int = 0,
        processes: int = 0,
    ):
        self.task, self.shards, self.batch_size, self.device = task, shards, batch_size, device
        (index, self.ranks), self.bucket_batches = share, bucket_batches
        self.reader = Reader(shards, encode, seed, block_rows, batch_size, index, pad_id, bucket_batches > 1)
        position = position or {}
        self.epoch, self.rows = int(position.get("epoch", 0)), int(position.get("rows", 0))
        same_window = position.get("batch_size") == batch_size and position.get("ranks") == self.ranks
        self.in_window = int(position.get("in_window", 0)) if same_window and bucket_batches > 1 else 0
        if self.shards.rows < self.ranks * batch_size:
            raise RuntimeError(
                f"{task}: {self.shards.rows} training rows, fewer than one batch of its {self.ranks} "
                f"rank(s) ({self.ranks} x {batch_size})"
            )
        # The rows of the shards read for the stream's first batch (None before it): a stream opened at
        # a position reads the block that holds it, not the rows before it.
        self.opening_rows_read: int | None = None
        units = self._units()
        read = in_processes(self.reader, units, processes) if processes else in_this_process(self.reader, units)
        self._it = read_ahead(self._positioned(read))

    def _units(self) -> Generator[Unit, None, None]:
        """The units of work from the stream's position on: each global batch, or each window."""
        step = self.ranks * self.batch_size  # rows of a global batch
        epoch, rows = self.epoch, self.rows
        while True:
            while rows + step <= self.shards.rows:
                count = min(max(self.bucket_batches, 1), (self.shards.rows - rows) // step)
                yield epoch, tuple(rows + i * step for i in range(count))
                rows += count * step
            epoch, rows = epoch + 1, 0

    def _positioned(self, read: Iterator[tuple[Unit, Read]]) -> Generator[tuple, None, None]:
        """(the position after the batch, the batch, the rows of the shards read for it: those of
        its unit with the unit's first batch, else 0), the first window's yielded batches skipped."""
        step, skip = self.ranks * self.batch_size, self.in_window
        try:
            for (epoch, starts), (batches, rows_read) in read:
                after = starts[-1] + step  # the unit's last global batch read
                for number, batch in enumerate(batches, start=1):
                    done = number == len(batches)
                    if number > skip:
                        yield (
                            self._position(epoch, after if done else starts[0], 0 if done else number),
                            batch,
                            rows_read,
                        )
                        rows_read = 0
                skip = 0
        finally:
            read.close()  # type: ignore[attr-defined]  # a generator: its processes end with it

    def _position(self, epoch: int, rows: int, in_window: int) -> dict[str, int]:
        out = {"epoch": epoch, "rows": rows, "batch_size": self.batch_size, "ranks": self.ranks}
        return {**out, "in_window": in_window} if in_window else out

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        position, batch, rows_read = next(self._it)
        if self.opening_rows_read is None:  # the first batch: what reaching the stream's position read
            self.opening_rows_read = rows_read
        self.epoch, self.rows, self.in_window = position["epoch"], position["rows"], position.get("in_window", 0)
        return {k: torch.from_numpy(np.require(v, requirements=["C", "W"])).to(self.device) for k, v in batch.items()}

    def position(self) -> dict[str, int]:
        return self._position(self.epoch, self.rows, self.in_window)

    def close(self) -> None:
        """Stop reading ahead (and the processes that read)."""
        self._it.close()  # type: ignore[attr-defined]  # read_ahead's generator
