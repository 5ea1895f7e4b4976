"""Reddit input-response prediction: in-batch softmax over dot products, the response side
through its own feed-forward network (the paper's main task). Metrics: P@1/3/10 on held-out threads."""

from __future__ import annotations

import time
from typing import Any

from convsts.datasets import pushshift, reddit
from convsts.io import storage
from convsts.io.errors import BadInputError
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.runtime.resources import cluster_cpus
from convsts.ray_jobs.tasks.base import Task, fields
from convsts.ray_jobs.tasks.prepared_folder import write_manifest

NEGATIVE = "negative"  # the column of mined hard negatives (`convsts mine-negatives`)


class RedditTask(Task):
    name = "reddit"
    head = "response"
    pair = ("context", "response")
    keeps_head_on_warm_start = True  # the Reddit-only checkpoint's response network carries over
    splits = ("train", "test")
    split_keys = ("data.test_share", "data.split_salt")
    prepared_keys = split_keys + ("filters",)

    def raw_inputs(self, cfg) -> list[str]:
        return list(cfg.data.reddit_inputs)

    def prepare(self, inputs: list[str], out_dir: str, cfg) -> dict[str, Any]:
        """Reddit inputs -> out_dir/{train,test} shards + out_dir/manifest.json (local or a URI)."""

        started = time.time()
        files = storage.expand_inputs(inputs)
        fmt = cfg.data.reddit_format
        formats = {f: (reddit.detect_format(f) if fmt == "auto" else fmt) for f in files}
        kinds = {kind for kind in formats.values() if kind is not None}
        if not kinds:
            raise BadInputError(f"no records in any input ({', '.join(files)})")
        for f in [f for f, kind in formats.items() if kind is None]:
            log.warning("reddit: %s has no records (0 lines counted)", f)
        if len(kinds) != 1:
            raise BadInputError(f"mixed input formats {sorted(kinds)}; prepare them separately: {formats}")
        kind = kinds.pop()
        stored = sum(stat[0] for f in files if (stat := storage.file_stat(f)) is not None)  # files: they exist
        in_driver = stored <= (cfg.data.dump_local_bytes if kind == "pushshift" else cfg.data.driver_bytes)
        log.info(
            "reddit: %d %s file(s) -> %s (%s)",
            len(files),
            kind,
            out_dir,
            "in this process" if in_driver else ("Ray tasks" if kind == "pushshift" else "Ray Data"),
        )
        counts = _prepare_pairs(kind, in_driver, files, stored, out_dir, cfg)
        manifest = {
            "format": kind,
            "inputs": files,
            **counts,
            **self.prepared_settings(cfg.to_dict()),
            "seconds": round(time.time() - started, 1),
        }
        manifest = write_manifest(self, out_dir, manifest, inputs=files)
        log.info(
            "reddit: %d lines read, %d pairs (%d train / %d test), %d filtered, %d unpaired, "
            "%d duplicate ids, %d malformed",
            manifest["lines_read"],
            manifest["pairs"],
            manifest["train_pairs"],
            manifest["test_pairs"],
            sum(manifest["filtered_by_rule"].values()),
            manifest["unpaired"],
            manifest["duplicate_ids"],
            manifest["malformed"],
        )
        return manifest

    def count_problem(self, manifest: dict[str, Any]) -> str | None:
        return reddit.manifest_bucket_problem(manifest)

    def manifest_metrics(self, manifest: dict[str, Any]) -> dict[str, float]:
        return {
            "data/reddit_train_pairs": float(manifest["train_pairs"]),
            "data/reddit_test_pairs": float(manifest["test_pairs"]),
        }

    def text_columns(self, cfg=None) -> dict[str, str]:
        columns = super().text_columns(cfg)
        if cfg is not None and cfg.data.reddit_hard_negatives:
            columns[NEGATIVE] = NEGATIVE
        return columns

    def missing_columns_line(self, missing: list[str], prepared_root: str) -> str:
        if NEGATIVE in missing:
            return (
                f"{self.train_path(prepared_root)}: no '{NEGATIVE}' column, which "
                f"data.reddit_hard_negatives=true trains on; write one with `convsts mine-negatives "
                f"--prepared {prepared_root} --out NEW` and train on NEW"
            )
        return super().missing_columns_line(missing, prepared_root)

    def train_rows(self, cfg, prepared_root: str):
        self.check_feed(cfg, prepared_root)
        return super().train_rows(cfg, prepared_root)

    def loss(self, model, batch):
        from convsts.models.losses import (
            in_batch_accuracy,
            in_batch_softmax_loss,
        )

        sides = [fields(batch, "context"), fields(batch, "response")]
        negatives = fields(batch, NEGATIVE)  # mined hard negatives, when the run trains on them
        context, response, *negative = model.encode_all(sides + ([negatives] if negatives else []))  # (B, D) each
        response = model.heads[self.name](response)  # (B, D)
        negative = model.heads[self.name](negative[0]) if negative else None  # (B, D)
        loss = in_batch_softmax_loss(context, response, model.config.score_scale, model.config.symmetric_loss, negative)
        return loss, in_batch_accuracy(context, response)

    def evaluate(self, scorer, cfg, prepared_root: str | None) -> dict[str, float]:
        return self.evaluate_items(scorer, cfg, prepared_root)[0]

    def evaluate_items(self, scorer, cfg, prepared_root: str | None):
        from convsts.ray_jobs.evaluation.retrieval import (
            heldout_pairs,
            precision_at_n_metrics,
        )

        heldout = heldout_pairs(storage.join(self.prepared_dir(prepared_root), "test")) if prepared_root else None
        if heldout is None:
            return {}, None
        return precision_at_n_metrics(
            scorer, heldout, cfg.eval.reddit_pairs, cfg.eval.reddit_negatives, cfg.eval.seed, prefix=self.name
        )


TASK = RedditTask()


def _prepare_pairs(kind: str, in_driver: bool, files: list[str], stored: int, out_dir: str, cfg) -> dict[str, Any]:
    """The pairs of `files` into out_dir's shards, by the path chosen for their format and size: the
    streaming engine or a pandas frame in this process, Ray tasks or Ray Data on the cluster."""
    args = (files, cfg.filters, cfg.data.test_share, cfg.data.split_salt)
    if in_driver and kind == "pushshift":
        parts = pushshift.spill_partitions(stored)
        return pushshift.prepare_local(*args, out_dir, cfg.data.rows_per_shard, parts=parts)
    if in_driver:
        annotated, lines_read = reddit.pairs_frame(*args)
        return reddit.write_pairs_frame(annotated, lines_read, out_dir, cfg.data.rows_per_shard)
    ensure_ray()
    if kind == "pushshift":
        from convsts.ray_jobs.runtime.worker_deaths import reporting_worker_deaths

        cpus = cluster_cpus()
        parts = pushshift.cluster_partitions(stored, cpus, pushshift.row_bytes_estimate(files, cfg.filters))
        with reporting_worker_deaths():
            return pushshift.prepare_distributed(*args, out_dir, cfg.data.rows_per_shard, parts=parts, cpus=cpus)
    annotated, lines_read = reddit.pairs_dataset(*args)
    return reddit.write_pairs(annotated, lines_read, out_dir, cfg.data.rows_per_shard)
