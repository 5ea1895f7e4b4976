"""Figures: the STS-B scatter (the paper's Figure 7) and the SNLI-fraction curve (Figure 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Sequence

import numpy as np
import pandas as pd

from models.similarity import pearson


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def scatter_plot(predicted: np.ndarray, frame: pd.DataFrame, path: Path, title: str = "STS-B test") -> None:
    """Predicted angular score (0-5) against gold, one colour per genre, on the same 0-5 axes for
    every system (model, baselines, raw or tuned), with the y = x line; Pearson r in the title."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    genres = frame["genre"] if "genre" in frame.columns else pd.Series(["all"] * len(frame))
    gold = frame["score"].to_numpy()
    for genre in sorted(genres.unique()):
        mask = (genres == genre).to_numpy()
        ax.scatter(gold[mask], predicted[mask], s=5, alpha=0.45,
                   label=f"{genre} (r = {pearson(predicted[mask], gold[mask]):.3f}, n = {int(mask.sum())})")
    ax.plot([0, 5], [0, 5], color="0.3", linewidth=1, linestyle="--", label="y = x")
    ax.set_xlim(-0.1, 5.1)
    ax.set_ylim(-0.1, 5.1)
    ax.set_aspect("equal")
    ax.set_xlabel("gold similarity (0-5)")
    ax.set_ylabel("predicted: 5 (1 - arccos(cos) / pi)")
    ax.set_title(f"{title}\nPearson r = {pearson(predicted, gold):.3f}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fraction_curve_plot(rows: Sequence[Dict[str, Any]], metrics: Sequence[str], path: Path) -> None:
    """A metric against the SNLI fraction (the paper's Figure 8): mean over seeds, one line per metric,
    each seed as a faint dot. `rows`: dicts with "fraction" and the metric names."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in metrics:
        points = [(float(r["fraction"]), float(r[name])) for r in rows if np.isfinite(float(r.get(name, np.nan)))]
        if not points:
            continue
        fractions = sorted({f for f, _ in points})
        means = [np.mean([v for f, v in points if f == x]) for x in fractions]
        line, = ax.plot(fractions, means, marker="o", label=name)
        ax.scatter([f for f, _ in points], [v for _, v in points], s=8, alpha=0.3, color=line.get_color())
    ax.set_xlabel("fraction of SNLI train")
    ax.set_ylabel("Pearson r")
    ax.set_title("STS Benchmark vs. SNLI data in multitask training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
