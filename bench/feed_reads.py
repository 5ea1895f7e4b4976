"""How often each feed reads a task's shards: rows read from storage in one epoch divided by the epoch's
rows, for the Ray Data feed (trainer.feed=ray_data: one pipeline per task, dealt to the ranks) and
the local feed (trainer.feed=local: each rank reads its own slices, in a thread or in processes), at
1, 2 and 4 ranks, on the Reddit pairs beside the project prepared as a run prepares them. Starts a
local Ray instance.

  .venv/bin/python bench/feed_reads.py [--input ../shared/data/reddit] [--ranks 1 2 4] [--processes 0 2]

Prints one row a feed and number of ranks: the rows read, the epoch's rows and their ratio (the goal
for ray_data is 1.0; the local feed reads the epoch once a rank).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", default=[str(Path(__file__).resolve().parents[2] / "shared/data/reddit")])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--processes", type=int, nargs="+", default=[0, 2], help="the local feed's feed_processes")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rows", type=int, default=100_000, help="the epoch's rows (the first shards' pairs)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from convsts.datasets.sample_order import ShardSet
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.runtime.ray_start import ensure_ray
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.data_feed import batch_encoder, feed_order
    from convsts.ray_jobs.training.dealt_stream import DealtStream
    from convsts.ray_jobs.training.local_feed import LocalStream

    cfg = load_config(None, ["data.driver_bytes=100000000000", "data.rows_per_shard=20000"])
    reddit = get_task("reddit")
    work = Path(tempfile.mkdtemp(prefix="convsts-bench-reads-"))
    manifest = reddit.prepare(args.input, str(work / "reddit"), cfg)
    records, total = [], 0
    for s in sorted((s["file"], int(s["rows"])) for s in manifest["shards"]["train"]):
        if total >= args.rows:
            break
        records.append(s)
        total += s[1]
    folder, columns = str(work / "reddit" / "train"), reddit.feed_columns(cfg)
    sample = ShardSet.of_folder(folder, records[:1], columns)
    texts = [t for c in ("context", "response") for t in sample.read(0).column(c).to_pylist()]
    tokenizer = DanTokenizer.build(count_words(texts), cfg.tokenizer)
    encode = batch_encoder(reddit, tokenizer, cfg.tokenizer.max_words, cfg)
    ensure_ray()

    def order():
        return feed_order(cfg, "reddit", ShardSet.of_folder(folder, records, columns), tokenizer.pad_id)

    rows = order().rows
    print(f"{rows} Reddit training pairs in {len(records)} shards; batch {args.batch} a rank; one epoch")
    print("| feed | ranks | rows read | epoch rows | read / epoch |")
    print("|---|---|---|---|---|")
    for ranks in args.ranks:
        steps = rows // (ranks * args.batch)
        name = uuid.uuid4().hex
        dealt = [
            DealtStream("reddit", name, order(), encode, args.batch, (i, ranks), "cpu", None, i == 0)
            for i in range(ranks)
        ]
        for _ in range(steps):
            for stream in dealt:
                next(stream)
        read = dealt[0].rows_read
        for stream in dealt:
            stream.close()
        print(f"| ray_data | {ranks} | {read} | {rows} | {read / rows:.2f} |")
        for processes in args.processes:
            local = [
                LocalStream("reddit", order(), encode, args.batch, (i, ranks), "cpu", None, processes)
                for i in range(ranks)
            ]
            for _ in range(steps):
                for stream in local:
                    next(stream)
            read = sum(stream.rows_read for stream in local)
            for stream in local:
                stream.close()
            print(f"| local, feed_processes={processes} | {ranks} | {read} | {rows} | {read / rows:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
