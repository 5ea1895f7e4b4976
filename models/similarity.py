"""The one STS score and the one Pearson correlation, for numpy (scoring) and torch (the tuned
matrix's differentiable loss). Everything that scores sentence pairs goes through these.

The STS score is the paper's angular similarity on the 0-5 scale, 5 (1 - arccos(cos(u, v)) / pi).
It is a positive affine map of sim = -arccos(cos), so Pearson and Spearman are the same for both.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def cosine(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (n, d) arrays -> (n,)."""
    un = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)  # (n, d)
    vn = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)  # (n, d)
    return np.sum(un * vn, axis=1)  # (n,)


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of every row of (n1, d) against every row of (n2, d) -> (n1, n2)."""
    an = torch.nn.functional.normalize(a, dim=-1)  # (n1, d)
    bn = torch.nn.functional.normalize(b, dim=-1)  # (n2, d)
    return an @ bn.T  # (n1, n2)


def angular_score_from_cosine(cos: np.ndarray) -> np.ndarray:
    """5 (1 - arccos(cos) / pi) in [0, 5]; NaN cosines stay NaN."""
    return 5.0 * (1.0 - np.arccos(np.clip(cos, -1.0, 1.0)) / np.pi)


def angular_score_np(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The STS score of row pairs of (n, d) arrays -> (n,)."""
    return angular_score_from_cosine(cosine(u, v))


def angular_score(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same score in torch; cosines clamped away from +-1 so arccos has a gradient."""
    cos = torch.nn.functional.cosine_similarity(u, v, dim=-1).clamp(-1 + 1e-6, 1 - 1e-6)  # (B,)
    return 5.0 * (1.0 - torch.arccos(cos) / math.pi)  # (B,)


def pearson(pred, gold) -> float:
    """Pearson r; NaN when fewer than 2 values, either side is constant, or a value is not finite.
    Each side is scaled by its largest magnitude first (r does not change): values near 1e306 would
    overflow the squares."""
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if len(x) < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return float("nan")
    x, y = x / (np.abs(x).max() or 1.0), y / (np.abs(y).max() or 1.0)
    if np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def pearson_t(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Differentiable Pearson r of two (B,) tensors (the tuned matrix's loss)."""
    xc, yc = x - x.mean(), y - y.mean()
    return (xc * yc).sum() / (xc.norm() * yc.norm() + 1e-12)
