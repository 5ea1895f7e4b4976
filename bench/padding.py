"""How much of the Transformer's work is padding, with and without length bucketing
(`trainer.bucket_batches`): real Reddit pairs of the embedded sample, tokenized with the subword
tokenizer at width 64, streamed through the trainer's local feed (local_feed.LocalStream, the Ray Data feed's batches) over a parquet shard written for it.

  .venv/bin/python bench/padding.py [--batch 128] [--buckets 0 8 32]

For each setting: the share of token positions that are real after each batch is cut to its own
longest row (as the encoder cuts it), and the share of the encoder's FLOPs spent on real tokens
(per layer: dense work grows with L, attention scores with L^2; at the paper's sizes, hidden 512
and filter 2048, the dense part dominates up to L of a few hundred).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--buckets", type=int, nargs="+", default=[0, 8, 32])
    args = parser.parse_args()

    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.reddit import read_pairs_file
    from convsts.datasets.sample_order import ShardSet
    from convsts.datasets.text import SubwordTokenizer
    from convsts.io.storage import resolve_path
    from convsts.models.config import TransformerConfig
    from convsts.ray_jobs.config.schema import TrainerConfig
    from convsts.ray_jobs.training.feed_order import FeedOrder
    from convsts.ray_jobs.training.local_feed import LocalStream

    pairs = read_pairs_file(resolve_path("{sample}/reddit_pairs.parquet"))
    pairs = pairs[pairs["status"] == ""]
    contexts, responses = list(pairs["context"]), list(pairs["response"])
    tokenizer = SubwordTokenizer.train(contexts + responses, TokenizerConfig(max_words=64))
    ids = {
        f"{side}__ids": tokenizer.encode(texts, width=64)["ids"]
        for side, texts in (("context", contexts), ("response", responses))
    }
    n = len(contexts) // args.batch * args.batch
    t = TransformerConfig()
    h, f = t.hidden_size, t.filter_size

    def flops(length: np.ndarray) -> np.ndarray:  # per row and layer, up to a constant
        return length * (4 * h * h + 2 * h * f) + 2 * length * length * h

    folder = tempfile.mkdtemp(prefix="convsts-bench-padding-")
    pq.write_table(pa.table({k: list(v[:n]) for k, v in ids.items()}), f"{folder}/part-000000.parquet")
    shards = ShardSet.of_folder(folder, [("part-000000.parquet", n)], list(ids))

    def encode(rows: pa.Table) -> dict[str, np.ndarray]:  # already token ids
        return {k: np.stack(rows.column(k).to_numpy(zero_copy_only=False)) for k in ids}

    print(f"{n} Reddit pairs, batch {args.batch}, width 64; Transformer hidden {h}, filter {f}")
    for buckets in args.buckets:
        window = buckets * args.batch if buckets > 1 else 0
        order = FeedOrder(shards, 0, TrainerConfig().shuffle_block_rows, window, args.batch, pad_id=0)
        stream = LocalStream("reddit", order, encode, args.batch, (0, 1), "cpu")
        real = positions = fixed = real_flops = all_flops = 0.0
        for _ in range(n // args.batch):
            batch = next(stream)
            for side in ("context__ids", "response__ids"):
                lengths = (batch[side] != 0).sum(1).numpy()  # (B,)
                width = max(1, int(lengths.max()))
                real += lengths.sum()
                positions += width * len(lengths)
                fixed += 64 * len(lengths)
                real_flops += flops(lengths).sum()
                all_flops += flops(np.full(len(lengths), width)).sum()
        stream.close()
        label = f"bucket_batches={buckets}" if buckets else "no bucketing"
        print(
            f"  {label:<18} real tokens {100 * real / positions:5.1f}% of positions "
            f"({100 * real / fixed:4.1f}% at the fixed width 64)   "
            f"{100 * real_flops / all_flops:5.1f}% of FLOPs on real tokens"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
