"""`convsts mine-negatives`: a prepared folder whose Reddit training pairs each carry a hard negative.

  convsts mine-negatives --checkpoint C --prepared IN --out OUT [--pairs N]
                         [--range-min 10] [--range-max 100] [--margin M] [--seed 0]
                         [--embeddings DIR] [--workers N [--cpus-per-worker C] [--gpus-per-worker G]]

Encodes the contexts (`encode`) and the responses (`encode_responses`: the two sides of the Reddit
score) of N training pairs of IN (all by default; otherwise a seeded sample) with checkpoint C, and
gives each pair one negative: another pair's response that C ranks in [range-min, range-max) for
this context (rank 0 = the best) and, with --margin, scores at least M below the true response
(datasets/negatives.py).
OUT is a complete prepared folder: the other tasks and the Reddit test split copied as they are,
reddit/train holding the mined pairs with a `negative` column. Train on it with
`--prepared OUT data.reddit_hard_negatives=true`: each context's softmax then runs over the batch's
responses and its negatives. Pairs with no eligible candidate are left out of OUT and counted in
OUT/reddit/manifest.json under "negatives".

Encoding is the slow part (about 120 sentences/s for all-MiniLM-L6-v2 on 2 CPU cores). With
--workers N it runs on N Ray Data actors, each holding a copy of the model and taking one chunk of
sentences at a time: on a GPU cluster, `--workers 4 --gpus-per-worker 1` encodes on four GPUs.
The scoring and the draw run on the driver.

With --embeddings DIR the encoded sentences are kept in DIR, chunk by chunk, beside a key of the
checkpoint's weights and the pairs' text: a killed run resumes from its last whole chunk, and a
re-run with other --range-min/--range-max/--margin encodes nothing. A DIR holding another
checkpoint's or other pairs' embeddings is refused, never reused.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from convsts.datasets.negatives import MiningConfig
from convsts.ray_jobs.pipelines.hard_negatives import (
    EncodePool,
    mine_prepared,
)
from convsts.ray_jobs.runtime.logs import log, setup_logging


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts mine-negatives", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = MiningConfig()
    parser.add_argument("--checkpoint", required=True, help="the model that scores the candidates")
    parser.add_argument("--prepared", required=True, help="a folder written by `convsts prepare`")
    parser.add_argument("--out", required=True, help="a new folder (local or a URI)")
    parser.add_argument(
        "--pairs", type=int, default=0, help="mine a seeded sample of this many training pairs (0 = all)"
    )
    parser.add_argument("--range-min", type=int, default=defaults.range_min)
    parser.add_argument("--range-max", type=int, default=defaults.range_max)
    parser.add_argument(
        "--margin",
        type=float,
        default=defaults.margin,
        help="skip candidates scoring above the true response's score minus this (default: no filter)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per encode batch")
    parser.add_argument(
        "--embeddings",
        default="",
        help="keep the encoded sentences in this folder (local or a URI): a killed run resumes, "
        "a re-run with other ranges or margin encodes nothing",
    )
    pool = EncodePool()
    parser.add_argument(
        "--workers",
        type=int,
        default=pool.workers,
        help="encode on this many Ray Data actors, each with its own copy of the model (0 = in "
        "this process); with --gpus-per-worker, one GPU each on a GPU cluster",
    )
    parser.add_argument("--cpus-per-worker", type=float, default=pool.cpus_per_worker)
    parser.add_argument("--gpus-per-worker", type=float, default=pool.gpus_per_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mining = MiningConfig(range_min=args.range_min, range_max=args.range_max, margin=args.margin, seed=args.seed)
    try:
        mining.validate()
    except ValueError as err:
        parser.error(str(err).replace("negatives: ", "").replace("range_", "--range-"))
    if args.pairs < 0:
        parser.error(f"--pairs: must be >= 0 (0 = all), got {args.pairs}")
    pool = EncodePool(args.workers, args.cpus_per_worker, args.gpus_per_worker)
    try:
        pool.validate()
    except ValueError as err:
        parser.error(str(err))
    setup_logging()
    manifest = mine_prepared(
        args.checkpoint,
        args.prepared,
        args.out,
        mining,
        args.pairs,
        args.batch_size,
        embeddings=args.embeddings,
        pool=pool,
    )
    log.info(
        "wrote %s: %d Reddit training pairs with a negative (%.0f s)",
        args.out,
        manifest["negatives"]["mined_pairs"],
        manifest["negatives"]["seconds"],
    )
    return 0
