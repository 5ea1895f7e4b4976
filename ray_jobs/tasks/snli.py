"""SNLI: 3-way classification on (u, v, |u - v|, u * v) of the shared encoder's embeddings.
Training uses a nested seeded subset (`data.snli_fraction`); metrics: accuracy on dev and test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from convsts.datasets import snli
from convsts.datasets.snli import fraction_rank
from convsts.io import storage, tables
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.tasks.base import Task, fields
from convsts.ray_jobs.tasks.prepared_folder import write_manifest, write_train_frame


def _kept(batch: dict[str, np.ndarray], fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of the rows in the nested subset `fraction` drawn with `seed`."""
    return np.array(
        [fraction_rank(str(p), str(h), seed) < fraction for p, h in zip(batch["premise"], batch["hypothesis"])],
        dtype=bool,
    )


def _fraction_filter(batch: dict[str, np.ndarray], fraction: float, seed: int) -> dict[str, np.ndarray]:
    keep = _kept(batch, fraction, seed)
    return {name: np.asarray(values)[keep] for name, values in batch.items()}


class SnliTask(Task):
    name = "snli"
    head = "nli"
    pair = ("premise", "hypothesis")
    label = "label"
    label_classes = len(snli.LABELS)
    # A Reddit-only run's tokenizer is reused by the multitask runs warm-started from it, so SNLI
    # text is in every vocabulary.
    in_every_vocabulary = True
    filter_columns = ("premise", "hypothesis")

    def raw_inputs(self, cfg) -> list[str]:
        return [cfg.data.snli_train]

    def prepare(self, inputs: list[str], out_dir: str, cfg) -> dict[str, Any]:
        """Every input file (files, folders, globs; each file once), in sorted order, as one table."""
        files = storage.expand_inputs(inputs)
        reads = [snli.read_snli(path) for path in files]
        without_gold = sum(read.attrs["without_gold"] for read in reads)
        frame = snli.with_fraction_rank(pd.concat(reads, ignore_index=True), cfg.data.snli_fraction_seed)
        shards = {"train": write_train_frame(frame, out_dir, cfg.data.rows_per_shard)}
        manifest = {
            "shards": shards,
            "inputs": files,
            "pairs": len(frame),
            "labels": snli.label_counts(frame),
            "without_gold": without_gold,
            "fraction_seed": cfg.data.snli_fraction_seed,
        }
        log.info("snli: %d pairs -> %s (%d without a gold label left out)", len(frame), out_dir, without_gold)
        return write_manifest(self, out_dir, manifest, inputs=files)

    def count_problem(self, manifest: dict[str, Any]) -> str | None:
        labels = manifest.get("labels")
        if not isinstance(labels, dict) or any(type(n) is not int for n in labels.values()):
            return f"labels: not a mapping of counts ({labels!r})"
        if sum(labels.values()) != manifest["pairs"]:
            return f"labels add up to {sum(labels.values())} but pairs={manifest['pairs']}"
        return None

    def train_rows(self, cfg, prepared_root: str):
        """SNLI train shards, cut to the nested subset `data.snli_fraction` drawn with `data.snli_fraction_seed`."""
        ds = tables.read_shards(self.train_path(prepared_root))
        if cfg.data.snli_fraction >= 1.0:
            return ds
        return ds.map_batches(
            _fraction_filter, fn_args=(float(cfg.data.snli_fraction), int(cfg.data.snli_fraction_seed)), batch_size=4096
        )

    def row_filter(self, cfg):
        """The nested subset `data.snli_fraction` drawn with `data.snli_fraction_seed`."""
        if cfg.data.snli_fraction >= 1.0:
            return None
        fraction, seed = float(cfg.data.snli_fraction), int(cfg.data.snli_fraction_seed)
        return lambda columns: _kept(columns, fraction, seed)

    def loss(self, model, batch):
        from convsts.models.losses import nli_loss

        u, v = model.encode_both(fields(batch, "premise"), fields(batch, "hypothesis"))  # (B, D) each
        logits = model.heads[self.name](u, v)  # (B, 3)
        labels = batch[self.label].long()  # (B,)
        return nli_loss(logits, labels), (logits.argmax(1) == labels).float().mean()

    def evaluate(self, scorer, cfg, prepared_root: str | None) -> dict[str, float]:
        from convsts.ray_jobs.evaluation.nli import (
            nli_accuracy,
        )

        if not hasattr(scorer, "nli_logits"):
            return {}
        results: dict[str, float] = {}
        for split, path in (("dev", cfg.data.snli_dev), ("test", cfg.data.snli_test)):
            if path:
                results.update(nli_accuracy(scorer, path, f"{self.name}/{split}"))
        return results


TASK = SnliTask()
