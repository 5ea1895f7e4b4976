"""The tokenizer a run trains with, counted or trained from the prepared training text of every task in
its vocabulary, apart from the feed that later reads the text: in the driver for a small folder, in
Ray Data for a large one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np

from convsts.datasets.text import TOKENIZERS, fit_tokenizer, words
from convsts.io import storage, tables
from convsts.models.encoders import encoder_class
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks import Task, prepared_tasks
from convsts.ray_jobs.tasks.prepared_folder import shard_files

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
