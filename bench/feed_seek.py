"""How long a restart's feed takes to give its first batch, early and late in an epoch: the Reddit
pairs beside the project prepared as a run prepares them, a worker's local stream (local_feed.LocalStream) opened at a position
(it seeks: it reads the block of shards that holds its next row), against reading the epoch from its
start up to that position and dropping what it skips (what a feed that cannot seek does).

  .venv/bin/python bench/feed_seek.py [--input ../shared/data/reddit] [--at 0.05 0.5 0.95] [--ranks 1 4]

Prints, for each position and number of ranks, the seconds to the first batch with the seek and with
the read-through, and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", default=[str(Path(__file__).resolve().parents[2] / "shared/data/reddit")])
    parser.add_argument(
        "--at", type=float, nargs="+", default=[0.05, 0.5, 0.95], help="positions, as shares of an epoch"
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()

    from convsts.datasets.sample_order import ShardSet
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.data_feed import batch_encoder, feed_order
    from convsts.ray_jobs.training.local_feed import LocalStream

    cfg = load_config(None, ["data.driver_bytes=100000000000"])  # prepared in this process, no Ray
    reddit = get_task("reddit")
    work = Path(tempfile.mkdtemp(prefix="convsts-bench-seek-"))
    manifest = reddit.prepare(args.input, str(work / "reddit"), cfg)
    records = sorted((s["file"], s["rows"]) for s in manifest["shards"]["train"])
    folder = str(work / "reddit" / "train")
    columns = reddit.feed_columns(cfg)
    sample = ShardSet.of_folder(folder, records[:2], columns)
    texts = [
        t
        for i in range(len(sample.shards))
        for c in ("context", "response")
        for t in sample.read(i).column(c).to_pylist()
    ]
    tokenizer = DanTokenizer.build(count_words(texts), cfg.tokenizer)
    encode = batch_encoder(reddit, tokenizer, cfg.tokenizer.max_words, cfg)
    rows = sum(r for _, r in records)
    print(f"{rows} Reddit training pairs in {len(records)} shards; batch {args.batch} a rank")

    def first_batch(ranks: int, position: dict[str, int]) -> tuple[float, int]:
        shards = ShardSet.of_folder(folder, records, columns)
        started = time.perf_counter()
        order = feed_order(cfg, "reddit", shards, tokenizer.pad_id)
        stream = LocalStream("reddit", order, encode, args.batch, (0, ranks), "cpu", position)
        next(stream)
        seconds = time.perf_counter() - started
        stream.close()
        return seconds, shards.rows_read

    def read_through(ranks: int, target: int) -> float:
        shards = ShardSet.of_folder(folder, records, columns)
        started = time.perf_counter()
        order = feed_order(cfg, "reddit", shards, tokenizer.pad_id)
        stream = LocalStream("reddit", order, encode, args.batch, (0, ranks), "cpu")
        while stream.position()["rows"] < target:
            next(stream)
        next(stream)
        seconds = time.perf_counter() - started
        stream.close()
        return seconds

    print("| ranks | position in the epoch | seek: first batch | rows read | read-through: first batch | ratio |")
    print("|---|---|---|---|---|---|")
    for ranks in args.ranks:
        step = ranks * args.batch
        for share in args.at:
            target = int(rows * share) // step * step
            seek, read = first_batch(ranks, {"epoch": 0, "rows": target})
            through = read_through(ranks, target)
            print(
                f"| {ranks} | {share:.0%} (row {target:,}) | {seek:.2f} s | {read:,} | {through:.1f} s | {through / seek:.0f}x |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
