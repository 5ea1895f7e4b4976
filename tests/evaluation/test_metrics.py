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


def test_ap_and_p_at_n_agree_with_scikit_learn_where_their_definitions_meet():
    """Distinct scores (no tie rule in play), at most 10 candidates (no cut-off) and a relevant one in
    each list: the scorer's AP is scikit-learn's average_precision_score, and P@N its top_k_accuracy_score."""
    from sklearn.metrics import average_precision_score, top_k_accuracy_score

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 11))
        scores = rng.permutation(n) / n + rng.random() * 1e-3  # distinct
        relevant = rng.random(n) < 0.4
        relevant[int(rng.integers(n))] = True
        assert M.average_precision(scores, relevant) == pytest.approx(average_precision_score(relevant, scores))
    scores = rng.random((300, 12))  # (queries, candidates): the true one in column 0, distinct scores
    p = M.precision_at_n(scores, (1, 3, 10))
    for n in (1, 3, 10):
        assert p[n] == pytest.approx(top_k_accuracy_score(np.zeros(300), scores, k=n, labels=range(12)))


def test_map_and_p_at_n_on_small_lists_worked_out_by_hand():
    """The SemEval-2016 Task 3 scorer's rules (ev.py): rank by score, ties in file order; precision at
    each relevant candidate within the first 10, averaged over those; a query with none scores 0 and
    still counts. Each expected value is worked out in the comment beside it."""
    queries = [
        # ranked: rel, non, rel, non -> (1/1 + 2/3) / 2 = 5/6
        ([0.9, 0.8, 0.7, 0.1], [True, False, True, False]),
        # a tie keeps file order: non(0.5), rel(0.5), rel(0.2) -> (1/2 + 2/3) / 2 = 7/12
        ([0.5, 0.5, 0.2], [False, True, True]),
        # no relevant candidate: 0
        ([0.3, 0.2], [False, False]),
        # 12 candidates, relevant at ranks 2 and 11: only rank 2 is within the first 10 -> (1/2) / 1 = 1/2
        ([12 - i for i in range(12)], [i in (1, 10) for i in range(12)]),
    ]
    expected = [5 / 6, 7 / 12, 0.0, 1 / 2]
    assert [M.average_precision(s, r) for s, r in queries] == pytest.approx(expected)
    assert M.mean_average_precision(queries) == pytest.approx(23 / 48)  # (10/12 + 7/12 + 0 + 6/12) / 4
    # P@N, the true candidate in column 0: ranks 1; 3 (a tie with one other counts against it); 2
    scores = np.array([[0.9, 0.1, 0.2], [0.4, 0.4, 0.6], [0.5, 0.7, 0.1]])
    assert M.precision_at_n(scores, (1, 2, 3)) == pytest.approx({1: 1 / 3, 2: 2 / 3, 3: 1.0})


def test_pearson_and_spearman_agree_with_scipy():
    from scipy import stats

    rng = np.random.default_rng(1)
    gold = rng.integers(0, 6, size=400).astype(float)  # STS gold scores 0-5: many ties
    pred = gold + rng.normal(0, 2, size=400)
    assert M.pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold).statistic, abs=1e-12)
    assert M.spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold).statistic, abs=1e-12)


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
