"""Hard negatives for the Reddit in-batch softmax: for each context, one response of another pair
that a model already scores close to it, chosen as sentence-transformers' `mine_hard_negatives`
chooses (a rank window, optionally a margin below the true response's score, random sampling in
the window)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class MiningConfig:
    # Candidates are the other pairs' responses ranked by the model's context . response score
    # (rank 0 = the best); ranks [range_min, range_max) are eligible (skipping the very top avoids
    # replies that would answer this context as well as its own: false negatives).
    range_min: int = 10
    range_max: int = 100
    # When set, an eligible candidate scoring above the true response's score minus this is skipped
    # (None: no such filter, as in sentence-transformers; a margin of 0 leaves out every pair whose
    # true response ranks below range_max, the pairs the model finds hardest).
    margin: float | None = None
    seed: int = 0
    chunk: int = 1024  # contexts scored at once: (chunk, n) floats in memory

    def validate(self) -> MiningConfig:
        if not 0 <= self.range_min < self.range_max:
            raise ValueError(f"negatives: need 0 <= range_min < range_max, got {self.range_min}, {self.range_max}")
        if self.margin is not None and not np.isfinite(self.margin):
            raise ValueError(f"negatives: margin must be finite, got {self.margin}")
        return self


def mine(context: torch.Tensor, response: torch.Tensor, config: MiningConfig) -> np.ndarray:
    """context, response: (n, D) embeddings of n pairs (row i's true response is response[i]).
    Returns (n,) int64: the index of the response mined as row i's negative, or -1 where no
    candidate in the window passes the margin (the caller counts those)."""
    config.validate()
    n = context.shape[0]
    window = min(config.range_max, n - 1)
    out = np.full(n, -1, dtype=np.int64)
    generator = torch.Generator().manual_seed(config.seed)
    for start in range(0, n, config.chunk):
        rows = torch.arange(start, min(start + config.chunk, n))  # (c,)
        scores = context[rows] @ response.T  # (c, n)
        positive = scores[torch.arange(len(rows)), rows].clone()  # (c,)
        scores[torch.arange(len(rows)), rows] = -torch.inf  # a pair's own response is not a candidate
        top, index = scores.topk(window, dim=1)  # (c, window) best first
        eligible = torch.isfinite(top)  # (c, window)
        if config.margin is not None:
            eligible &= top <= (positive - config.margin)[:, None]
        eligible[:, : config.range_min] = False
        # A uniform draw among each row's eligible ranks: the largest random key wins.
        keys = torch.rand(top.shape, generator=generator).masked_fill(~eligible, -1.0)  # (c, window)
        pick = keys.argmax(dim=1)  # (c,)
        found = eligible.any(dim=1)  # (c,)
        chosen = index[torch.arange(len(rows)), pick]  # (c,)
        out[rows.numpy()] = torch.where(found, chosen, torch.full_like(chosen, -1)).numpy()
    return out
