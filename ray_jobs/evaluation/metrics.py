"""Metrics as pure functions of arrays: each returns plain floats."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from convsts.models.similarity import pearson  # the one Pearson, part of this module's API

__all__ = [
    "accuracy",
    "average_precision",
    "mean_average_precision",
    "paired_difference",
    "pearson",
    "precision_at_n",
    "spearman",
    "true_ranks",
]


def spearman(pred: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray) -> float:
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if len(x) < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()) or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    from scipy import stats  # here: a training worker imports this module for its STS-B probe, scipy costs a second

    return float(stats.spearmanr(x, y)[0])


def precision_at_n(scores: np.ndarray, ns: Sequence[int] = (1, 3, 10)) -> dict[int, float]:
    """scores: (q, c) with the true candidate in column 0. A hit at N when the true candidate ranks
    within the top N; ties count against it (rank = 1 + number of candidates scoring >= it, others).
    Any non-finite score makes every P@N NaN: a NaN compares false with everything, and would
    otherwise rank the true candidate first (a diverged model would score 1.0)."""
    rank = true_ranks(scores)  # (q,)
    if rank is None:
        return {n: float("nan") for n in ns}
    return {n: float(np.mean(rank <= n)) for n in ns}


def true_ranks(scores: np.ndarray) -> np.ndarray | None:
    """scores: (q, c) with the true candidate in column 0 -> its rank in each row (1 = first), ties
    against it; None when any score is non-finite (precision_at_n says why)."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(scores).all():
        return None
    true = scores[:, :1]  # (q, 1)
    return 1 + np.sum(scores[:, 1:] >= true, axis=1)  # (q,)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Mean of a - b over the same items (e.g. two models' P@1 hits on the same queries and
    candidates) and its standard error: the paired test, much tighter than comparing two means
    with their own standard errors, since both systems meet the same easy and hard items."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(
            f"paired difference needs two equal-length series of 2 or more items, got {x.shape} and {y.shape}"
        )
    d = x - y  # (n,)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))


def average_precision(scores: Sequence[float], relevant: Sequence[bool], cutoff: int = 10) -> float:
    """AP of one query as the official SemEval CQA scorer (ev.py, MAP at 10) computes it: candidates
    sorted by score descending (stable: ties keep the given order, as the scorer keeps file order),
    the mean of precision at each relevant candidate within the first `cutoff`; 0 when none of
    those is relevant (such a query still counts in the mean)."""
    values = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(values).all():
        return float("nan")
    order = np.argsort(-values, kind="stable")
    rel = np.asarray(relevant, dtype=bool)[order][:cutoff]
    if not rel.any():
        return 0.0
    hits = np.cumsum(rel)
    precisions = hits[rel] / (np.flatnonzero(rel) + 1)
    return float(np.mean(precisions))


def mean_average_precision(queries: Sequence[tuple]) -> float:
    """queries: [(scores, relevant), ...] -> MAP over all queries."""
    if not queries:
        return float("nan")
    return float(np.mean([average_precision(s, r) for s, r in queries]))


def accuracy(logits: np.ndarray, labels: Sequence[int]) -> float:
    """NaN when any logit is not finite (argmax would pick class 0 and look like a score)."""
    logits = np.asarray(logits)
    if not np.isfinite(logits).all():
        return float("nan")
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))
