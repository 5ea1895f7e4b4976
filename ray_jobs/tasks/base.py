"""What a training task declares: its data, its head and loss, its prepared folder, its metrics.

A task is a `Task` subclass instance bound to the name `TASK` in a module: `ray_jobs/tasks/<name>.py`
for the built-in ones, or any module listed in the run config's `task_modules`. The trainer,
`prepare`, the tokenizer, checkpoint heads, config validation and `evaluate` loop over the tasks
of a run; none of them names a task. Adding one (MNLI, a question-answer task) is a module like
`ray_jobs/tasks/snli.py` plus a `trainer.task_weights` entry (and `data.task_inputs.<name>`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

from convsts.io import storage, tables
from convsts.io.errors import BadInputError
from convsts.ray_jobs.tasks.prepared_folder import config_value, shard_files, write_manifest, write_train_frame

if TYPE_CHECKING:
    import numpy as np
    import torch

    from convsts.ray_jobs.config.schema import RunConfig

    Batch = dict[str, torch.Tensor]


def fields(batch: Batch, prefix: str) -> Batch:
    """The id tensors of one text column: {"words": ..., "bigrams": ...} from "<prefix>__words", ..."""
    head = prefix + "__"
    return {k[len(head) :]: v for k, v in batch.items() if k.startswith(head)}


class Task:
    name: str = ""
    head: str = ""  # head kind in convsts.models.heads.HEADS, or "package.module:Class"
    pair: tuple[str, str] = ("", "")  # the two text columns of a row; both go through the shared encoder
    label: str | None = None  # an integer label column the loss needs
    label_classes: int = 0  # its labels are 0 .. label_classes - 1 (checked before a run; 0: not checked)
    keeps_head_on_warm_start: bool = False  # a warm start copies this task's head along with the encoder
    in_every_vocabulary: bool = False  # its training text is counted into every run's tokenizer
    # The columns its row_filter reads: a run may train on some of its prepared rows only (SNLI's
    # data.snli_fraction); the driver logs how many it keeps as data/<name>_train_pairs.
    filter_columns: tuple[str, ...] = ()
    splits: tuple[str, ...] = ("train",)  # folders `prepare` writes under <prepared>/<name>/
    # Dotted run-config keys whose values decide the rows of this task's prepared shards: `prepare`
    # records them in the manifest (under their last name) and a run refuses a folder prepared with
    # other values. split_keys: those that decide which rows are held out (a subset).
    prepared_keys: tuple[str, ...] = ()
    split_keys: tuple[str, ...] = ()

    # ---- data

    def raw_inputs(self, cfg: RunConfig) -> list[str]:
        """Raw input files of `convsts prepare` for this task."""
        inputs = cfg.data.task_inputs.get(self.name)
        if not inputs:
            raise FileNotFoundError(f"task {self.name}: no raw inputs; set data.task_inputs.{self.name}=[FILE, ...]")
        return list(inputs)

    @property
    def columns(self) -> list[str]:
        """The columns a row of this task holds: the text pair, then the label where it has one."""
        return [*self.pair, *([self.label] if self.label else [])]

    def prepared_dir(self, prepared_root: str) -> str:
        return storage.join(prepared_root, self.name)

    def train_path(self, prepared_root: str) -> str:
        return storage.join(self.prepared_dir(prepared_root), "train")

    def prepared_settings(self, config: dict[str, Any]) -> dict[str, Any]:
        """The values of prepared_keys in a run config (`RunConfig.to_dict()`), under the names the
        manifest records them by."""
        return {key.rpartition(".")[2]: config_value(config, key) for key in self.prepared_keys}

    def prepare(self, inputs: list[str], out_dir: str, cfg: RunConfig) -> dict[str, Any]:
        """Raw inputs -> out_dir/train parquet shards + out_dir/manifest.json. The default reads
        parquet or JSON-lines files holding the pair columns (and the label)."""

        started = time.time()
        columns = self.columns
        frames = []
        files = storage.expand_inputs(inputs)
        for path in files:
            frame = tables.read_table_file(path)
            missing = [c for c in columns if c not in frame.columns]
            if missing:
                raise ValueError(f"{path}: task {self.name} needs columns {columns}; missing {missing}")
            frames.append(frame[columns])
        frame = pd.concat(frames, ignore_index=True)
        shards = {"train": write_train_frame(frame, out_dir, cfg.data.rows_per_shard)}
        manifest = {"inputs": list(inputs), "pairs": len(frame), "seconds": round(time.time() - started, 1)}
        return write_manifest(self, out_dir, {**manifest, "shards": shards}, inputs=files)

    def count_problem(self, manifest: dict[str, Any]) -> str | None:
        """Where the manifest's own counts (beyond its shards' rows, which verify_prepared checks)
        disagree, as 'KEY=N but ...', or None. The default has none."""
        return None

    def manifest_metrics(self, manifest: dict[str, Any]) -> dict[str, float]:
        """Counts from the prepare manifest logged to MLflow as data/... metrics."""
        return {f"data/{self.name}_train_pairs": float(manifest.get("pairs", 0))}

    def train_rows(self, cfg: RunConfig, prepared_root: str):
        """The Ray Dataset of training rows (text columns, before tokenization)."""
        from ray.data import (
            FileShuffleConfig,
        )

        return tables.read_shards(self.train_path(prepared_root), shuffle=FileShuffleConfig(seed=cfg.seed))

    def text_columns(self, cfg: RunConfig | None = None) -> dict[str, str]:
        """Text column -> the prefix of its token-id columns (those a run with `cfg` trains on)."""
        return {column: column for column in self.pair}

    def feed_columns(self, cfg: RunConfig | None = None) -> list[str]:
        """The columns a run with `cfg` reads of its training shards: its text columns and its label."""
        return [*self.text_columns(cfg), *([self.label] if self.label else [])]

    def row_filter(self, cfg: RunConfig) -> Callable[[dict[str, np.ndarray]], np.ndarray] | None:
        """Which of its prepared training rows a run with `cfg` trains on: the filter_columns of a
        shard -> a boolean mask of its rows; None: every row."""
        return None

    def check_feed(self, cfg: RunConfig, prepared_root: str) -> None:
        """Before a run: its training shards hold the columns the run reads (one line naming what
        is missing, missing_columns_line)."""
        shards = shard_files(self.train_path(prepared_root))
        if not shards:
            return
        missing = [c for c in self.feed_columns(cfg) if c not in tables.read_parquet_schema(shards[0]).names]
        if missing:
            raise BadInputError(self.missing_columns_line(missing, prepared_root))

    def missing_columns_line(self, missing: list[str], prepared_root: str) -> str:
        """The line that refuses a run whose training shards lack the columns `missing`."""
        return f"{self.train_path(prepared_root)}: no column {missing}, which the run trains on"

    # ---- model

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, batch accuracy) of one batch; both 0-dim tensors on the model's device."""
        raise NotImplementedError

    # ---- evaluation

    def evaluate(self, scorer, cfg: RunConfig, prepared_root: str | None) -> dict[str, float]:
        """This task's own metrics of a scorer (a model or a lexical baseline)."""
        return {}

    def evaluate_items(
        self, scorer, cfg: RunConfig, prepared_root: str | None
    ) -> tuple[dict[str, float], pd.DataFrame | None]:
        """evaluate's metrics and, for a task that scores items one by one, each item's outcome: a
        frame that two evaluations of the same items are compared on, item by item (`convsts
        evaluate --compare`; the Reddit task: each query's rank); None for a task without one."""
        return self.evaluate(scorer, cfg, prepared_root), None
