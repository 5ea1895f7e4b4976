"""The training feed: the tokenizer counted or trained from the prepared text, one tokenized Ray
Dataset per task, the DataConfig that splits each over its task's ranks, and the endless per-task
batch streams a worker draws from."""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from convsts.datasets.text import TOKENIZERS, encode_columns, fit_tokenizer, words
from convsts.io import storage, tables
from convsts.models.encoders import encoder_class
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks import Task, prepared_tasks, trained_tasks
from convsts.ray_jobs.tasks.prepared_folder import MANIFEST, shard_files, verify_prepared
from convsts.ray_jobs.training.task_groups import plan_for


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
# Datasets


def _tokenize_batch(
    batch: dict[str, np.ndarray], tokenizer, columns: dict[str, str], width: int, passthrough: Sequence[str]
) -> dict[str, np.ndarray]:
    out = encode_columns(tokenizer, batch, columns, width)
    for name in passthrough:
        out[name] = np.asarray(batch[name])
    return out


def tokenized(task: Task, rows, tokenizer, width: int, cfg: RunConfig | None = None):
    """A task's rows -> token-id columns (<column>__<field>) plus its label, in Ray Data tasks
    (the text columns the run trains on: `task.text_columns(cfg)`)."""
    passthrough = (task.label,) if task.label else ()
    # The tokenizer object travels once per Ray Data task and serves every batch of it (rebuilding
    # a 50k-word vocabulary from its dict per batch would cost a quarter of the DAN tokenizer's time).
    return rows.map_batches(
        _tokenize_batch, fn_args=(tokenizer, task.text_columns(cfg), width, passthrough), batch_size=1024
    )


def task_datasets(cfg: RunConfig, prepared_root: str, tokenizer) -> dict[str, Any]:
    """{task: tokenized Ray Dataset} for the tasks with a weight; small tasks are materialized."""
    tasks = trained_tasks(cfg)
    out = {}
    for name, task in tasks.items():
        ds = tokenized(task, task.train_rows(cfg, prepared_root), tokenizer, cfg.tokenizer.max_words, cfg)
        if task.materialize:  # its blocks kept in the order of its files, as the streamed tasks are fed
            ds.context.execution_options.preserve_order = cfg.trainer.preserve_order
            ds = ds.materialize()
        out[name] = ds
    return out


def task_split_data_config(trainer):
    """A DataConfig that splits each task's dataset over that task's ranks only (other ranks get
    None), planned for the world size of each group Ray starts (an elastic group's size changes at
    every restart; `trainer`: the run config's section, plan_for). trainer.preserve_order: Ray Data
    hands each task's rows over in the order of its (seeded) file order rather than as its read and
    tokenize tasks finish."""
    from ray.train import DataConfig

    class TaskSplitDataConfig(DataConfig):
        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            plan = plan_for(trainer, world_size)
            output: list[dict[str, Any]] = [{} for _ in range(world_size)]
            for name, ds in datasets.items():
                if ds.name is None:
                    ds.set_name(name)
                ds = ds.copy(ds)
                ds.context.execution_options = self._resolve_execution_options(name)
                ranks = plan.ranks_of(name)
                hints = [worker_node_ids[r] for r in ranks] if worker_node_ids else None
                for r in range(world_size):
                    output[r][name] = None
                for r, split in zip(ranks, ds.streaming_split(len(ranks), equal=True, locality_hints=hints)):
                    output[r][name] = split
            return output

    options = DataConfig.default_ingest_options()
    options.preserve_order = trainer.preserve_order
    return TaskSplitDataConfig(execution_options=options)


# ---------------------------------------------------------------------------------------------
# Streams


class TaskStream:
    """Endless batches of one task's Ray Data shard, epoch after epoch; remembers its position.
    With `bucket_batches` > 1, each window of that many batches is sorted by length (the longest
    text column of a row, `pad_id` not counted), cut back into batches and yielded in a seeded order."""

    def __init__(
        self,
        task: str,
        shard,
        batch_size: int,
        device,
        seed: int,
        epoch: int = 0,
        skip: int = 0,
        bucket_batches: int = 0,
        pad_id: int = 0,
    ):
        self.task, self.shard, self.batch_size, self.device, self.seed = task, shard, batch_size, device, seed
        self.bucket_batches, self.pad_id = bucket_batches, pad_id
        self.epoch, self.batch_in_epoch = epoch, 0
        self._it = self._batches(skip)

    def _epoch(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = self.shard.iter_torch_batches(
            batch_size=self.batch_size,
            drop_last=True,
            device=self.device,
            local_shuffle_buffer_size=4 * self.batch_size,
            local_shuffle_seed=self.seed + self.epoch,
        )
        if self.bucket_batches <= 1:
            yield from batches
            return
        window: list[dict[str, torch.Tensor]] = []
        for number, batch in enumerate(batches):
            window.append(batch)
            if len(window) == self.bucket_batches:
                yield from self._bucketed(window, number)
                window = []
        if window:
            yield from self._bucketed(window, -1)

    def _bucketed(self, window: list[dict[str, torch.Tensor]], salt: int) -> Iterator[dict[str, torch.Tensor]]:
        rows = {k: torch.cat([b[k] for b in window]) for k in window[0]}  # {name: (W*B, ...)}
        # The longest text column of each row: every column's batch is cut to its own longest row, and
        # rows whose longest side is alike share a batch.
        lengths = torch.stack([(v != self.pad_id).sum(1) for v in rows.values() if v.dim() == 2]).amax(0)  # (W*B,)
        order = torch.argsort(lengths, stable=True)  # (W*B,) shortest first
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 7_919 + salt)
        for j in torch.randperm(len(window), generator=generator).tolist():
            idx = order[j * self.batch_size : (j + 1) * self.batch_size]  # (B,)
            yield {k: v[idx] for k, v in rows.items()}

    def _batches(self, skip: int) -> Generator[dict[str, torch.Tensor], None, None]:
        while True:
            produced = 0
            for batch in self._epoch():
                produced += 1
                self.batch_in_epoch += 1
                if skip > 0:
                    skip -= 1
                    continue
                yield batch
            if produced == 0:
                raise RuntimeError(
                    f"{self.task}: this worker's shard has fewer rows than one batch ({self.batch_size})"
                )
            self.epoch += 1
            self.batch_in_epoch = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        return next(self._it)

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "batch_size": self.batch_size}

    def close(self) -> None:
        """Stop reading the shard (while Ray is still up: the iterator reports its stats on close)."""
        self._it.close()
