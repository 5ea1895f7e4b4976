"""The training feed over an in-memory frame, without Ray, for single-process loops (tests, and
the benches that time the step alone): a batch tokenized as the workers' feed tokenizes it, and
A feed stream's contract (consecutive batches, epoch after epoch, each epoch's rows shuffled with
seed + epoch, a position counted in rows) over a pandas frame."""

from __future__ import annotations

import numpy as np
import torch

from convsts.datasets.text import encode_columns
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.tasks.base import Task


def frame_batch(
    tokenizer, task: Task, part, width: int, device=None, cfg: RunConfig | None = None
) -> dict[str, torch.Tensor]:
    """One task's batch from rows of a pandas frame, tokenized as the workers' feed does (the text
    columns a run with `cfg` trains on: `task.text_columns(cfg)`)."""
    columns = task.text_columns(cfg)
    ids = encode_columns(tokenizer, {c: part[c].to_numpy() for c in columns}, columns, width)
    batch = {k: torch.from_numpy(v) for k, v in ids.items()}
    if task.label:
        batch[task.label] = torch.tensor(part[task.label].to_numpy())
    return {k: v.to(device) for k, v in batch.items()} if device is not None else batch


class FrameStream:
    """A feed stream's contract over an in-memory frame (no Ray): consecutive batches in the frame's
    order, epoch after epoch, each epoch's rows shuffled with seed + epoch; with `cfg`, the text
    columns that run trains on (a mined Reddit folder's negatives with data.reddit_hard_negatives)."""

    def __init__(
        self,
        task: Task,
        frame,
        tokenizer,
        batch_size: int,
        width: int,
        seed: int = 0,
        position: dict[str, int] | None = None,
        device=None,
        cfg: RunConfig | None = None,
    ):
        if len(frame) < batch_size:
            raise RuntimeError(f"{task.name}: {len(frame)} rows, fewer than one batch ({batch_size})")
        self.task, self.frame, self.tokenizer, self.batch_size, self.width = task, frame, tokenizer, batch_size, width
        self.seed, self.device, self.cfg = seed, device, cfg
        position = position or {}
        self.epoch, self.batch_in_epoch = position.get("epoch", 0), position.get("rows", 0) // batch_size
        self._order = self._shuffled()
        self.opening_rows_read = None  # a frame in memory reads no shard

    def _shuffled(self) -> np.ndarray:
        return np.random.default_rng(self.seed + self.epoch).permutation(len(self.frame))

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if (self.batch_in_epoch + 1) * self.batch_size > len(self.frame):
            self.epoch += 1
            self.batch_in_epoch = 0
            self._order = self._shuffled()
        rows = self._order[self.batch_in_epoch * self.batch_size : (self.batch_in_epoch + 1) * self.batch_size]
        self.batch_in_epoch += 1
        return frame_batch(self.tokenizer, self.task, self.frame.iloc[rows], self.width, self.device, self.cfg)

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "rows": self.batch_in_epoch * self.batch_size, "batch_size": self.batch_size}
