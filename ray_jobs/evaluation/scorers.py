"""What the benchmarks score through: a trained encoder or a lexical baseline, behind one interface
(`embed`, `embed_responses`, and `nli_logits` for models with an NLI head)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from convsts.datasets.text import words
from convsts.models.similarity import cosine
from convsts.ray_jobs.evaluation import BASELINES


class EmbeddingScorer:
    """Scores through a checkpoint: cosine-based STS and CQA, the trained dot product for Reddit."""

    def __init__(self, encoder, batch_size: int = 512):
        self.encoder = encoder
        self.batch_size = batch_size
        self.name = "model"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode(list(texts), batch_size=self.batch_size)

    def embed_responses(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode_responses(list(texts), batch_size=self.batch_size)

    def nli_logits(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        return self.encoder.classify_nli(list(premises), list(hypotheses), batch_size=self.batch_size)


class LexicalScorer:
    """The STS 2017 baseline (binary bag of words) or TF-IDF, as sparse vectors; cosine everywhere."""

    KINDS = BASELINES

    def __init__(self, kind: str, fit_texts: Sequence[str]):
        if kind not in self.KINDS:
            raise ValueError(f"unknown baseline {kind!r}: expected {' or '.join(self.KINDS)}")
        self.kind = kind
        self.name = kind
        df: Counter = Counter()
        for text in fit_texts:
            df.update(set(words(text)))
        self.vocab = {w: i for i, w in enumerate(sorted(df))}
        n = max(len(fit_texts), 1)
        self.idf = np.array([np.log((1 + n) / (1 + df[w])) + 1.0 for w in sorted(df)], dtype=np.float32)

    def _vectors(self, texts: Sequence[str]):
        from scipy import sparse  # here: a training worker imports this module for its STS-B probe alone

        rows, cols, vals = [], [], []
        for r, text in enumerate(texts):
            counts: dict[int, int] = {}
            for w in words(text):
                if w in self.vocab:
                    counts[self.vocab[w]] = counts.get(self.vocab[w], 0) + 1
            for c, k in counts.items():
                rows.append(r)
                cols.append(c)
                vals.append(1.0 if self.kind == "bow" else k * float(self.idf[c]))
        m = sparse.csr_matrix((vals, (rows, cols)), shape=(len(texts), len(self.vocab)), dtype=np.float32)
        norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
        return sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ m

    def embed(self, texts: Sequence[str]):
        return self._vectors(texts)

    embed_responses = embed


def pair_cosine(a, b) -> np.ndarray:
    """Row-wise cosine of dense embeddings or of the baselines' unit-length sparse rows -> (n,)."""
    if isinstance(a, np.ndarray):
        return cosine(a, b)
    return np.asarray(a.multiply(b).sum(axis=1)).ravel()


def scores_matrix(q, c) -> np.ndarray:
    """(q, c) dot products of queries with candidates, dense or sparse."""
    if isinstance(q, np.ndarray):
        return q @ c.T
    return (q @ c.T).toarray()
