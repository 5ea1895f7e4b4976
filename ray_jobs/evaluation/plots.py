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
    """Predicted angular score (0-5) against gold."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(frame["score"], predicted, s=4, alpha=0.4)
    ax.set_xlabel("gold similarity")
    ax.set_ylabel("5 (1 - arccos(cos) / pi)")
    ax.set_title(f"{title}, r = {pearson(predicted, frame['score']):.3f}")
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
