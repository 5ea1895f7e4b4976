"""How much of the Transformer's work is padding, with and without length bucketing
(`trainer.bucket_batches`): real Reddit pairs of the embedded sample, tokenized with the subword
tokenizer at width 64, streamed through the trainer's own TaskStream over a Ray Data dataset.

  .venv/bin/python bench/padding.py [--batch 128] [--buckets 0 8 32]

For each setting: the share of token positions that are real after each batch is cut to its own
longest row (as the encoder cuts it), and the share of the encoder's FLOPs spent on real tokens
(per layer: dense work grows with L, attention scores with L^2; at the paper's sizes, hidden 512
and filter 2048, the dense part dominates up to L of a few hundred).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--buckets", type=int, nargs="+", default=[0, 8, 32])
    args = parser.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import numpy as np
    import ray

    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.reddit import read_pairs_file
    from convsts.datasets.text import SubwordTokenizer
    from convsts.io.storage import resolve_path
    from convsts.models.config import TransformerConfig
    from convsts.ray_jobs.training.data_feed import TaskStream

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

    import logging

    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_items([{k: v[i] for k, v in ids.items()} for i in range(n)])
        print(f"{n} Reddit pairs, batch {args.batch}, width 64; Transformer hidden {h}, filter {f}")
        for buckets in args.buckets:
            stream = TaskStream("reddit", ds.iterator(), args.batch, "cpu", 0, bucket_batches=buckets, pad_id=0)
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
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
