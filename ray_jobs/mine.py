"""`convsts mine-negatives`: a prepared folder whose Reddit training pairs each carry a hard negative.

  convsts mine-negatives --checkpoint C --prepared IN --out OUT [--pairs N]
                         [--range-min 10] [--range-max 100] [--margin M] [--seed 0]

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
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Sequence

import numpy as np

from datasets import storage
from datasets.storage import BadInputError
from datasets.negatives import MiningConfig, mine
from ray_jobs.config import load_config
from ray_jobs.runtime import log, setup_logging
from ray_jobs.tasks.reddit import NEGATIVE, TASK as REDDIT


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="convsts mine-negatives", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = MiningConfig()
    parser.add_argument("--checkpoint", required=True, help="the model that scores the candidates")
    parser.add_argument("--prepared", required=True, help="a folder written by `convsts prepare`")
    parser.add_argument("--out", required=True, help="a new folder (local or a URI)")
    parser.add_argument("--pairs", type=int, default=0, help="mine a seeded sample of this many training pairs (0 = all)")
    parser.add_argument("--range-min", type=int, default=defaults.range_min)
    parser.add_argument("--range-max", type=int, default=defaults.range_max)
    parser.add_argument("--margin", type=float, default=defaults.margin,
                        help="skip candidates scoring above the true response's score minus this (default: no filter)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per encode batch")
    parser.add_argument("--config", default=None, help="run config (data.rows_per_shard of the new shards)")
    parser.add_argument("overrides", nargs="*")
    return parser


def top_level(folder: str) -> list:
    """The names of a folder's entries (local or a URI)."""
    import pyarrow.fs as pafs

    inner, fs = storage.path_and_filesystem(folder)
    infos = (fs or pafs.LocalFileSystem()).get_file_info(pafs.FileSelector(inner, recursive=False))
    return sorted(info.base_name for info in infos)


def copy_tree(source: str, target: str) -> None:
    """A folder copied file by file (local or URIs)."""
    import pyarrow.fs as pafs

    src, src_fs = storage.path_and_filesystem(source)
    dst, dst_fs = storage.path_and_filesystem(target)
    dst_fs = dst_fs or pafs.LocalFileSystem()
    dst_fs.create_dir(dst, recursive=True)
    pafs.copy_files(src, dst, source_filesystem=src_fs or pafs.LocalFileSystem(), destination_filesystem=dst_fs)


def mine_prepared(checkpoint: str, prepared: str, out: str, mining: MiningConfig, pairs: int, batch_size: int, cfg):
    """The work of the command; returns OUT's Reddit manifest."""
    import models

    mining.validate()
    if pairs < 0:
        raise ValueError(f"--pairs: must be >= 0 (0 = all), got {pairs}")
    if storage.has_entries(out):
        raise FileExistsError(f"{out} is not empty; choose a new --out folder")
    started = time.time()
    encoder = models.load(checkpoint)  # a wrong checkpoint fails before the data is read
    manifest = REDDIT.verify_prepared(prepared)
    frame = storage.read_parquet_table(REDDIT.train_path(prepared)).to_pandas()
    # Shard order from Ray Data is not fixed: sort so that the seeded sample is reproducible.
    frame = frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)
    total = len(frame)
    if pairs and pairs < total:
        keep = np.sort(np.random.default_rng(mining.seed).choice(total, size=pairs, replace=False))
        frame = frame.iloc[keep].reset_index(drop=True)
    if len(frame) <= mining.range_min:
        raise BadInputError(f"{REDDIT.train_path(prepared)}: {len(frame)} pairs to mine, need more than "
                            f"--range-min ({mining.range_min})")
    log.info("mine-negatives: encoding %d contexts and %d responses with %s", len(frame), len(frame), checkpoint)
    context = encoder.encode(frame["context"].tolist(), batch_size=batch_size, convert_to_tensor=True)  # (n, D)
    response = encoder.encode_responses(frame["response"].tolist(), batch_size=batch_size,
                                        convert_to_tensor=True)  # (n, D)
    chosen = mine(context.cpu().float(), response.cpu().float(), mining)  # (n,)
    found = chosen >= 0
    frame[NEGATIVE] = frame["response"].to_numpy()[np.where(found, chosen, 0)]
    mined = frame[found].reset_index(drop=True)
    log.info("mine-negatives: %d of %d pairs got a negative; %d had no candidate in ranks [%d, %d)%s (left out)",
             len(mined), len(frame), int((~found).sum()), mining.range_min, mining.range_max,
             "" if mining.margin is None else f" scoring {mining.margin:g} below their response")

    for entry in top_level(prepared):  # every other task's folder (custom tasks too), as it is
        if entry != REDDIT.name:
            copy_tree(storage.join(prepared, entry), storage.join(out, entry))
    reddit_out = REDDIT.prepared_dir(out)
    copy_tree(storage.join(REDDIT.prepared_dir(prepared), "test"), storage.join(reddit_out, "test"))
    REDDIT.write_train_frame(mined, reddit_out, cfg)
    manifest = {k: v for k, v in manifest.items() if k != "shards"}
    manifest.update(train_pairs=len(mined), pairs=len(mined) + manifest.get("test_pairs", 0), negatives={
        "checkpoint": checkpoint, "from": prepared, "of_train_pairs": total, "sampled_pairs": len(frame),
        "mined_pairs": len(mined), "without_negative": int((~found).sum()),
        **{k: v for k, v in dataclasses.asdict(mining).items() if k != "chunk"},
        "seconds": round(time.time() - started, 1)})
    return REDDIT.write_manifest(reddit_out, manifest)


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
    setup_logging()
    cfg = load_config(args.config, args.overrides)
    manifest = mine_prepared(args.checkpoint, args.prepared, args.out, mining, args.pairs, args.batch_size, cfg)
    log.info("wrote %s: %d Reddit training pairs with a negative (%.0f s)", args.out,
             manifest["negatives"]["mined_pairs"], manifest["negatives"]["seconds"])
    return 0


if __name__ == "__main__":
    from ray_jobs.runtime import run_main

    raise SystemExit(run_main("mine-negatives", main))
