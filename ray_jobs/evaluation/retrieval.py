"""Response retrieval (the paper's Reddit P@N): one true response among `negatives` random ones from
the held-out threads, ranked by the model's context . response score."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from convsts.io import storage, tables
from convsts.ray_jobs.evaluation.metrics import precision_at_n, true_ranks
from convsts.ray_jobs.evaluation.scorers import scores_matrix


def heldout_pairs(test_dir: str) -> pd.DataFrame | None:
    """The held-out pairs of a prepared folder's test split (local or a URI), or None when absent."""
    if not storage.is_dir(test_dir):
        return None
    frame = tables.read_parquet_table(test_dir).to_pandas()
    # Shard order from Ray Data is not fixed: sort so that the seeded P@N sample is reproducible.
    return frame.sort_values(["thread_key", "context", "response"], kind="stable").reset_index(drop=True)


def precision_at_n_metrics(
    scorer, pairs: pd.DataFrame, n_queries: int, negatives: int, seed: int, prefix: str
) -> tuple[dict[str, float], pd.DataFrame]:
    """P@1/3/10 of `scorer` on `n_queries` held-out pairs, each against `negatives` random responses,
    and each query's outcome (query_rows): two evaluations with the same seed and held-out pairs
    rank the same queries among the same candidates, so `convsts evaluate --compare` pairs them."""
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
    rows = query_rows(pairs, candidates, true_ranks(scores))
    # The binomial standard error of P@1 over these queries: 0.016 at 1,000 queries and P@1 0.5, 0.007 at 5,000.
    # Two models scored with the same seed rank the same queries and candidates, so their difference is
    # better judged paired; this says how far one figure can move with the sample.
    p1 = out[f"{prefix}/p_at_1"]
    out[f"{prefix}/p_at_1_stderr"] = float(np.sqrt(p1 * (1 - p1) / len(queries)))
    out[f"{prefix}/queries"] = float(len(queries))
    return out, rows


def query_rows(pairs: pd.DataFrame, candidates: np.ndarray, ranks: np.ndarray | None) -> pd.DataFrame:
    """One row per query: `query` (a 64-bit hash of the query pair's values), `candidates` (a hash of
    its candidate pairs, the true one first, in the order ranked) and `rank` (the true response's,
    1 = first; NaN for every query when a score was not finite)."""
    keys = pd.util.hash_pandas_object(pairs, index=False).to_numpy()  # (pairs,) uint64
    ranked = keys[candidates]  # (q, 1 + negatives)
    return pd.DataFrame(
        {
            "query": ranked[:, 0],
            "candidates": np.array(
                [int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little") for row in ranked],
                dtype=np.uint64,
            ),
            "rank": ranks.astype(np.float64) if ranks is not None else np.full(len(candidates), np.nan),
        }
    )
