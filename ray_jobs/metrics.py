"""Metrics as pure functions of arrays: each returns plain floats."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
from scipy import stats

from models.similarity import pearson  # the one Pearson, part of this module's API

__all__ = ["accuracy", "average_precision", "mean_average_precision", "pearson", "precision_at_n", "spearman"]


def spearman(pred: Sequence[float], gold: Sequence[float]) -> float:
    pred, gold = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if len(pred) < 2 or not (np.isfinite(pred).all() and np.isfinite(gold).all()) or np.std(pred) == 0 or np.std(gold) == 0:
        return float("nan")
    return float(stats.spearmanr(pred, gold)[0])


def precision_at_n(scores: np.ndarray, ns: Sequence[int] = (1, 3, 10)) -> Dict[int, float]:
    """scores: (q, c) with the true candidate in column 0. A hit at N when the true candidate ranks
    within the top N; ties count against it (rank = 1 + number of candidates scoring >= it, others).
    Any non-finite score makes every P@N NaN: a NaN compares false with everything, and would
    otherwise rank the true candidate first (a diverged model would score 1.0)."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(scores).all():
        return {n: float("nan") for n in ns}
    true = scores[:, :1]  # (q, 1)
    rank = 1 + np.sum(scores[:, 1:] >= true, axis=1)  # (q,)
    return {n: float(np.mean(rank <= n)) for n in ns}


def average_precision(scores: Sequence[float], relevant: Sequence[bool], cutoff: int = 10) -> float:
    """AP of one query as the official SemEval CQA scorer (ev.py, MAP at 10) computes it: candidates
    sorted by score descending (stable: ties keep the given order, as the scorer keeps file order),
    the mean of precision at each relevant candidate within the first `cutoff`; 0 when none of
    those is relevant (such a query still counts in the mean)."""
    scores = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(scores).all():
        return float("nan")
    order = np.argsort(-scores, kind="stable")
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
