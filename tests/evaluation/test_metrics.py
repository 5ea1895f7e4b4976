import math

import numpy as np
import pytest

from convsts.ray_jobs.evaluation import metrics as M


def test_pearson_on_a_tiny_set():
    # x = [1, 2, 3], y = [1, 3, 2]: r = 0.5 by hand.
    assert M.pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert math.isnan(M.pearson([1, 1, 1], [1, 2, 3]))


def test_angular_score():
    from convsts.models.similarity import angular_score, angular_score_np

    u = np.array([[1.0, 0.0], [1.0, 0.0]])
    v = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert angular_score_np(u, v) == pytest.approx([5.0, 2.5])
    # The torch version (the tuned matrix's loss) agrees, up to its clamp away from cos = +-1.
    import torch

    assert angular_score(torch.tensor(u), torch.tensor(v)).numpy() == pytest.approx([5.0, 2.5], abs=1e-2)


def test_precision_at_n_ties_count_against():
    scores = np.array(
        [
            [0.9, 0.1, 0.2, 0.3],  # rank 1
            [0.5, 0.5, 0.1, 0.1],  # tie with one negative -> rank 2
            [0.1, 0.2, 0.3, 0.4],  # rank 4
        ]
    )
    p = M.precision_at_n(scores, (1, 3))
    assert p[1] == pytest.approx(1 / 3)
    assert p[3] == pytest.approx(2 / 3)


def test_average_precision_with_ties_and_no_relevant():
    # Sorted by score: rel, non, rel -> AP = (1/1 + 2/3) / 2
    assert M.average_precision([0.9, 0.5, 0.1], [True, False, True]) == pytest.approx((1 + 2 / 3) / 2)
    # Tie between a relevant and an irrelevant item: the given order is kept.
    assert M.average_precision([0.5, 0.5], [False, True]) == pytest.approx(0.5)
    assert M.average_precision([0.5, 0.5], [True, False]) == pytest.approx(1.0)
    assert M.average_precision([0.3, 0.2], [False, False]) == 0.0
    assert M.mean_average_precision([([0.9, 0.1], [True, False]), ([0.9, 0.1], [False, False])]) == pytest.approx(0.5)


def test_accuracy():
    assert M.accuracy(np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]]), [1, 1]) == 0.5


def _scorer_map(queries, th=10):
    """MAP the way the SemEval-2016/2017 Task 3 scorer (ev.py) computes it, written out
    independently: rank by score (stable), precision at each 'true' within the first th,
    averaged over the 'true' ones found; a query with none scores 0 and still counts."""
    total = 0.0
    for scores, relevant in queries:
        ranked = [r for _, r in sorted(zip(scores, relevant), key=lambda t: -t[0])]
        precisions, correct = [], 0
        for i, rel in enumerate(ranked[:th]):
            if rel:
                correct += 1
                precisions.append(correct / (i + 1))
        total += sum(precisions) / len(precisions) if precisions else 0.0
    return total / len(queries)


def test_map_matches_the_official_scorer_definition():
    rng = np.random.default_rng(0)
    queries = []
    for _ in range(200):
        n = int(rng.integers(1, 15))  # some lists longer than the scorer's cut-off of 10
        scores = rng.integers(0, 4, size=n) / 4.0  # many ties
        relevant = rng.random(n) < 0.3  # some queries have no relevant item
        queries.append((list(scores), list(relevant)))
    assert any(not any(r) for _, r in queries) and any(len(s) > 10 for s, _ in queries)
    assert M.mean_average_precision(queries) == pytest.approx(_scorer_map(queries), abs=1e-12)


def test_pearson_of_huge_scores_is_their_correlation_not_an_overflow():
    # Gold scores near 1e306 (a damaged or foreign STS file): their squares overflow a float64.
    pred, gold = [0.1, 0.2, 0.3, 0.45], [1e306, 2e306, 3e306, 4.5e306]
    assert M.pearson(pred, gold) == pytest.approx(1.0)
    assert M.pearson(pred, [-g for g in gold]) == pytest.approx(-1.0)
    assert math.isnan(M.pearson(pred, [1e306] * 4))  # constant: no correlation


def test_sts_metrics_by_genre_match_a_hand_computation():
    """stsb/<split>/<genre>/pearson: Pearson's r over the pairs of that genre only, as computed by hand."""
    import pandas as pd

    from convsts.ray_jobs.evaluation.sts import sts_metrics_from_scores

    frame = pd.DataFrame(
        {
            "genre": ["news", "captions", "news", "forums", "captions", "news", "captions", "forums"],
            "score": [1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 3.5, 1.5],
        }  # fmt: skip
    )
    scores = np.array([0.2, 0.1, 0.9, 0.8, 0.7, 0.3, 0.2, 0.4])

    def r(x, y):  # Pearson by hand: covariance over the product of standard deviations
        x, y = np.asarray(x) - np.mean(x), np.asarray(y) - np.mean(y)
        return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))

    out = sts_metrics_from_scores(scores, frame, "stsb/test")
    assert out["stsb/test/pearson"] == pytest.approx(r(scores, frame["score"]))
    for genre in ("captions", "forums", "news"):
        rows = (frame["genre"] == genre).to_numpy()
        assert out[f"stsb/test/{genre}/pearson"] == pytest.approx(r(scores[rows], frame["score"][rows]))
