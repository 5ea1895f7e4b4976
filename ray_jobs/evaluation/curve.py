"""Figure 8 from checkpoints: STS-B of each against the data.snli_fraction (and seed) in its config.json."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from convsts.models.checkpoint import CONFIG_FILE
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.evaluation.plots import fraction_curve_plot
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
from convsts.ray_jobs.evaluation.sts import read_stsb_split, sts_metrics
from convsts.tune_spaces import CURVE_METRICS

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig


def fraction_curve(checkpoints: Sequence[str], cfg: RunConfig, out_dir: Path) -> list[dict[str, Any]]:
    """Writes out_dir/curve.csv and out_dir/curve.png; returns the rows."""
    frames = {split: read_stsb_split(cfg, split) for split in ("dev", "test")}
    rows = []
    for checkpoint in checkpoints:
        encoder = load(checkpoint)
        data = encoder.meta.get("run_config", {}).get("data", {})
        if "snli_fraction" not in data:
            raise ValueError(
                f"{checkpoint}: its {CONFIG_FILE} has no data.snli_fraction (not a convsts training checkpoint)"
            )
        scorer = EmbeddingScorer(encoder, cfg.eval.batch_size)
        row: dict[str, Any] = {
            "fraction": data["snli_fraction"],
            "seed": data.get("snli_fraction_seed", 0),
            "checkpoint": str(checkpoint),
        }
        for split, frame in frames.items():
            row.update(sts_metrics(scorer, frame, f"stsb/{split}"))
        rows.append({k: row[k] for k in ["fraction", "seed", *CURVE_METRICS, "checkpoint"]})
    return write_curve(rows, CURVE_METRICS, out_dir)


def write_curve(rows: list[dict[str, Any]], metrics: Sequence[str], out_dir: Path) -> list[dict[str, Any]]:
    """The curve's points (each with its fraction and seed) sorted by both, as out_dir/curve.csv (the
    rows' columns) and out_dir/curve.png (`metrics`, mean and each seed); returns them sorted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: (r["fraction"], r["seed"]))
    if rows:
        pd.DataFrame(rows).to_csv(out_dir / "curve.csv", index=False)
        fraction_curve_plot(rows, metrics, out_dir / "curve.png")
    return rows
