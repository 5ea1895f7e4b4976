"""Data pipeline throughput: `prepare reddit` on a corpus, and the training feed against what one
DAN training process consumes.

  .venv/bin/python bench/data_pipeline.py [--input ../shared/data/reddit] [--rows 100000] [--processes 0 2]

Prints: prepare rows/s (lines read / wall time, Ray start-up excluded); the DAN tokenizer's rows/s in
one process; the feed's rows/s (the shards read in the epoch's order and tokenized in a thread of
the process or in --processes processes, as a training worker reads them: local_feed.LocalStream,
first batch included and reported); DAN pairs/s of a single-process training step (batch 128, paper sizes) on
already-tokenized batches; and the ratio feed / consumption (the target is at least 3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]


def main() -> int:
    from convsts.datasets.text import DanTokenizer, count_words

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", default=[str(Path(__file__).resolve().parents[2] / "shared/data/reddit")])
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the feed to stream")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[0], help="trainer.feed_processes values to time (0: a thread)"
    )
    parser.add_argument(
        "--config", default=None, help="run config (filters, tokenizer, optimizer); default: the defaults"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.optimizer=adam")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray.data
    from testkit.frames import frame_batch

    from convsts.datasets.sample_order import ShardSet
    from convsts.models.checkpoint import build_model
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.runtime.ray_start import ensure_ray
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.data_feed import batch_encoder, feed_order
    from convsts.ray_jobs.training.local_feed import LocalStream
    from convsts.ray_jobs.training.task_groups import GradientCombiner, plan_tasks
    from convsts.ray_jobs.training.train_step import Optimizers, seed_everything, train_step

    ensure_ray()
    ray.data.DataContext.get_current().enable_progress_bars = False
    work = Path(tempfile.mkdtemp(prefix="convsts-bench-data-"))
    paper_sizes = [] if args.config else ["tokenizer.word_vocab_size=50000", "tokenizer.bigram_buckets=100000"]
    cfg = load_config(args.config, [*paper_sizes, *args.overrides])

    started = time.perf_counter()
    reddit = get_task("reddit")
    manifest = reddit.prepare(args.input, str(work / "reddit"), cfg)
    prep_s = time.perf_counter() - started
    print(
        f"prepare reddit: {manifest['lines_read']} lines -> {manifest['pairs']} pairs in {prep_s:.1f} s = "
        f"{manifest['lines_read'] / prep_s:,.0f} lines/s  (filtered {json.dumps(manifest['filtered_by_rule'])})"
    )

    import pyarrow.parquet as pq

    train_text = pq.read_table(str(work / "reddit" / "train"), columns=["context", "response"]).to_pandas()
    tokenizer = DanTokenizer.build(
        count_words(list(train_text["context"]) + list(train_text["response"])), cfg.tokenizer
    )
    texts = train_text.iloc[:20_000]
    best = 0.0
    for _ in range(3):  # one process, one core: both columns of each row, batches of 1024 as the feed tokenizes
        start = time.perf_counter()
        for i in range(0, len(texts), 1024):
            for column in ("context", "response"):
                tokenizer.encode(list(texts[column].iloc[i : i + 1024]), width=cfg.tokenizer.max_words)
        best = max(best, len(texts) / (time.perf_counter() - start))
    print(f"DAN tokenizer, one process: {best:,.0f} rows/s")
    records = sorted((s["file"], s["rows"]) for s in manifest["shards"]["train"])
    encode = batch_encoder(reddit, tokenizer, cfg.tokenizer.max_words, cfg)
    feeds = {}  # processes -> (rows/s over the stream, rows/s after the first batch)
    for processes in args.processes:
        started = time.perf_counter()
        shards = ShardSet.of_folder(str(work / "reddit" / "train"), records, reddit.feed_columns(cfg))
        order = feed_order(cfg, reddit.name, shards, tokenizer.pad_id)
        stream = LocalStream("reddit", order, encode, args.batch, (0, 1), "cpu", processes=processes)
        first = 0.0
        rows = 0
        while rows < args.rows:
            rows += len(next(stream)["context__words"])
            first = first or time.perf_counter() - started
        stream.close()
        feed_s = time.perf_counter() - started
        feeds[processes] = (rows / feed_s, rows / max(feed_s - first, 1e-9))
        where = f"{processes} processes" if processes else "the worker's thread"
        print(
            f"tokenized feed ({where}): {rows} rows in {feed_s:.1f} s = {feeds[processes][0]:,.0f} rows/s "
            f"(first batch after {first:.1f} s; {feeds[processes][1]:,.0f} rows/s after it)"
        )

    seed_everything(0)
    model = build_model(cfg.model, tokenizer)
    opts = Optimizers.build(cfg.trainer, model, [reddit.name], cfg.trainer.stages[0].lr)
    combiner = GradientCombiner(plan_tasks({reddit.name: 1.0}, 1), 0)
    frame = pq.read_table(str(work / "reddit" / "train")).slice(0, 40 * args.batch).to_pandas()
    batches = [
        frame_batch(
            tokenizer, reddit, frame.iloc[i * args.batch : (i + 1) * args.batch], cfg.tokenizer.max_words, cfg=cfg
        )
        for i in range(40)
    ]
    times = []
    for batch in batches:
        start = time.perf_counter()
        train_step(model, reddit, batch, opts, combiner)
        times.append(time.perf_counter() - start)
    consume = args.batch / statistics.median(times[5:])
    print(f"DAN training step (one process, batch {args.batch}, {cfg.trainer.optimizer}): {consume:,.0f} pairs/s")
    for processes, (feed, steady) in feeds.items():
        print(
            f"ratio feed ({processes} processes) / DAN consumption: {feed / consume:.1f} (whole stream), "
            f"{steady / consume:.1f} (after the first batch); target >= 3"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
