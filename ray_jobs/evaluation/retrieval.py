"""Response retrieval (the paper's Reddit P@N): one true response among `negatives` random ones from
the held-out threads, ranked by the model's context . response score."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pandas as pd

from datasets import storage
from ray_jobs.evaluation.scorers import scores_matrix
from ray_jobs.metrics import precision_at_n


def heldout_pairs(test_dir: str) -> Optional[pd.DataFrame]:
    """The held-out pairs of a prepared folder's test split (local or a URI), or None when absent."""
    if not storage.is_dir(test_dir):
        return None
    frame = storage.read_parquet_table(test_dir).to_pandas()
    # Shard order from Ray Data is not fixed: sort so that the seeded P@N sample is reproducible.
    return frame.sort_values(["thread_key", "context", "response"], kind="stable").reset_index(drop=True)


def precision_at_n_metrics(scorer, pairs: pd.DataFrame, n_queries: int, negatives: int, seed: int,
                           prefix: str) -> Dict[str, float]:
    rng = np.random.default_rng(seed)
    if len(pairs) < negatives + 1:
        raise ValueError(f"{prefix} P@N needs at least {negatives + 1} held-out pairs, found {len(pairs)}")
    queries = rng.choice(len(pairs), size=min(n_queries, len(pairs)), replace=False)
    candidates = np.empty((len(queries), negatives + 1), dtype=np.int64)
    for row, q in enumerate(queries):
        others = rng.choice(len(pairs) - 1, size=negatives, replace=False)
        others[others >= q] += 1  # skip the true pair itself
        candidates[row] = np.concatenate([[q], others])
    needed = np.unique(candidates)
    ctx = scorer.embed(pairs["context"].iloc[queries].tolist())
    rsp = scorer.embed_responses(pairs["response"].iloc[needed].tolist())
    position = {int(i): k for k, i in enumerate(needed)}
    full = scores_matrix(ctx, rsp)  # (q, |needed|)
    cols = np.vectorize(position.get)(candidates)
    scores = np.take_along_axis(full, cols, axis=1)  # (q, 1 + negatives); true response in column 0
    out = {f"{prefix}/p_at_{n}": v for n, v in precision_at_n(scores, (1, 3, 10)).items()}
    # The binomial standard error of P@1 over these queries: 0.016 at 1,000 queries and P@1 0.5, 0.007 at 5,000.
    # Two models scored with the same seed rank the same queries and candidates, so their difference is
    # better judged paired; this says how far one figure can move with the sample.
    p1 = out[f"{prefix}/p_at_1"]
    out[f"{prefix}/p_at_1_stderr"] = float(np.sqrt(p1 * (1 - p1) / len(queries)))
    out[f"{prefix}/queries"] = float(len(queries))
    return out
