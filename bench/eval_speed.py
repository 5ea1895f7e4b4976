"""Evaluation speed: a checkpoint on all of STS-B dev and test (raw, by genre), and the tuned
variant's matrix fit, in one process without Ray.

  .venv/bin/python bench/eval_speed.py --checkpoint DIR [--stsb-dir DIR] [--repeats 5]

Prints the median wall time of each part over the repeats (the checkpoint load is timed once).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convsts.datasets.evalsets import read_stsb, stsb_split_path  # noqa: E402
from convsts.io.storage import resolve_path  # noqa: E402
from convsts.models.sentence_encoder import load  # noqa: E402
from convsts.models.sts_transform import StsTransformConfig, fit_sts_transform  # noqa: E402
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer  # noqa: E402
from convsts.ray_jobs.evaluation.sts import sts_metrics, stsb_embeddings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--stsb-dir", default="{sample}")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    stsb_dir = resolve_path(args.stsb_dir)

    started = time.perf_counter()
    scorer = EmbeddingScorer(load(args.checkpoint))
    load_s = time.perf_counter() - started

    raw, tuned = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        frames = {split: read_stsb(stsb_split_path(stsb_dir, split)) for split in ("dev", "test")}
        results = {}
        for split, frame in frames.items():
            results.update(sts_metrics(scorer, frame, f"stsb/{split}"))
        raw.append(time.perf_counter() - started)

        started = time.perf_counter()
        train = stsb_embeddings(scorer, read_stsb(stsb_split_path(stsb_dir, "train")))
        dev = stsb_embeddings(scorer, frames["dev"])
        fitted = fit_sts_transform(train, dev, StsTransformConfig())
        tuned.append(time.perf_counter() - started)
    pairs = sum(len(f) for f in frames.values())
    print(f"checkpoint {args.checkpoint} ({scorer.encoder.meta['model']['encoder']}), STS-B dev+test = {pairs} pairs")
    print(f"load checkpoint                      {load_s:6.2f} s")
    print(
        f"STS-B dev+test, raw (median of {args.repeats})     {statistics.median(raw):6.2f} s   "
        f"dev r = {results['stsb/dev/pearson']:.4f}, test r = {results['stsb/test/pearson']:.4f}"
    )
    print(
        f"tuned matrix: encode train, fit {fitted.config.epochs} epochs  {statistics.median(tuned):6.2f} s   "
        f"dev r = {fitted.dev_pearson:.4f} (best epoch {fitted.best_epoch})"
    )
    print(f"target < 10 s for dev+test: {'met' if statistics.median(raw) < 10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
