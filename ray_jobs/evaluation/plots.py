"""Figures: the STS-B scatter (the paper's Figure 7) and the SNLI-fraction curve (Figure 8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from convsts.io import storage
from convsts.models.similarity import pearson


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
        ax.scatter(
            gold[mask],
            predicted[mask],
            s=5,
            alpha=0.45,
            label=f"{genre} (r = {pearson(predicted[mask], gold[mask]):.3f}, n = {int(mask.sum())})",
        )
    ax.plot([0, 5], [0, 5], color="0.3", linewidth=1, linestyle="--", label="y = x")
    ax.set_xlim(-0.1, 5.1)
    ax.set_ylim(-0.1, 5.1)
    ax.set_aspect("equal")
    ax.set_xlabel("gold similarity (0-5)")
    ax.set_ylabel("predicted: 5 (1 - arccos(cos) / pi)")
    ax.set_title(f"{title}\nPearson r = {pearson(predicted, gold):.3f}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    with storage.write_errors(path):  # a full disk names the file
        fig.savefig(path, dpi=100)
    plt.close(fig)


def loss_curves_plot(histories: Mapping[str, Sequence[tuple]], path: Path, title: str) -> None:
    """Each task's training loss (and batch accuracy, right panel) against the step:
    `histories` maps a metric name ("reddit/loss") to its (step, value) points."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, points in sorted(histories.items()):
        if not points:
            continue
        ax = axes[0] if name.endswith("/loss") else axes[1]
        steps, values = zip(*sorted(points))
        ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=name)
    for ax, label in zip(axes, ("loss", "batch accuracy")):
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    with storage.write_errors(path):  # a full disk names the file
        fig.savefig(path, dpi=100)
    plt.close(fig)


COUNT_PREFIX = "data/"  # a metric that counts data (pairs trained on), not a score
PAIRS_KEY = f"{COUNT_PREFIX}snli_train_pairs"  # what a sweep trial reports: the SNLI pairs it trained on


def fraction_curve_plot(rows: Sequence[dict[str, Any]], metrics: Sequence[str], path: Path) -> None:
    """A metric against the SNLI data in training (the paper's Figure 8): the number of SNLI pairs
    (log scale) when the rows have it (else the fraction), the mean over seeds as a line and their
    range as a band, each seed as a dot. `rows`: dicts with "fraction", the metric names and
    optionally PAIRS_KEY."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    by_pairs = all(np.isfinite(float(r.get(PAIRS_KEY, np.nan))) for r in rows) and bool(rows)
    x_of = (lambda r: float(r[PAIRS_KEY])) if by_pairs else (lambda r: float(r["fraction"]))
    seeds = len({r.get("seed", 0) for r in rows})
    fractions = sorted({float(r["fraction"]) for r in rows})
    # One x per fraction (the seeds' subsets differ by a few pairs): the mean pair count.
    x_at = {f: float(np.mean([x_of(r) for r in rows if float(r["fraction"]) == f])) for f in fractions}
    for name in metrics:
        points = [(x_at[float(r["fraction"])], float(r[name])) for r in rows if np.isfinite(float(r.get(name, np.nan)))]
        if not points:
            continue
        xs = sorted({x for x, _ in points})
        values = [[v for x, v in points if x == at] for at in xs]
        (line,) = ax.plot(xs, [np.mean(v) for v in values], marker="o", label=name)
        ax.fill_between(xs, [min(v) for v in values], [max(v) for v in values], color=line.get_color(), alpha=0.15)
        ax.scatter([x for x, _ in points], [v for _, v in points], s=8, alpha=0.4, color=line.get_color())
    if by_pairs:  # log scale; linear below the smallest count when the curve starts at 0 pairs
        smallest = min((x for x in x_at.values() if x > 0), default=1.0)
        if min(x_at.values()) == 0:
            ax.set_xscale("symlog", linthresh=smallest)
            ax.set_xlabel(f"SNLI training pairs (log scale above {smallest:,.0f}; 0 = no SNLI)")
        else:
            ax.set_xscale("log")
            ax.set_xlabel("SNLI training pairs (log scale)")
    else:
        ax.set_xlabel("fraction of SNLI train")
    ax.set_ylabel("Pearson r")
    ax.set_title(f"STS Benchmark vs. SNLI data in multitask training\nmean and range over {seeds} seed(s)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with storage.write_errors(path):  # a full disk names the file
        fig.savefig(path, dpi=100)
    plt.close(fig)
