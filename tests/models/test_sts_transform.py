import numpy as np
import pytest
import torch

from convsts.models.sts_transform import (
    StsTransformConfig,
    angular_score,
    angular_score_np,
    fit_sts_transform,
    initial_matrix,
    load_sts_transform,
)


def _pairs(n, dim, matrix, rng):
    """Synthetic STS pairs whose gold score is the angular score after a known linear map."""
    u = rng.normal(size=(n, dim))
    v = u + rng.normal(scale=1.2, size=(n, dim))  # a spread of similarities
    return {"u": u.astype(np.float32), "v": v.astype(np.float32), "score": angular_score_np(u @ matrix, v @ matrix)}


def test_angular_score_by_hand():
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # cos = 1, 0, -1 -> 5, 2.5, 0 (the clamp moves the ends by well under 1e-2)
    assert angular_score(u, v).tolist() == pytest.approx([5.0, 2.5, 0.0], abs=1e-2)
    assert angular_score_np(u.numpy(), v.numpy()) == pytest.approx([5.0, 2.5, 0.0])


def test_initial_matrices():
    assert torch.equal(initial_matrix(4, StsTransformConfig()), torch.eye(4))
    low = initial_matrix(4, StsTransformConfig(rank=2))
    assert torch.equal(low, torch.eye(4)[:, :2])
    rand = initial_matrix(4, StsTransformConfig(init="random", seed=3))
    assert torch.allclose(rand.T @ rand, torch.eye(4), atol=1e-5)  # orthonormal columns


@pytest.mark.parametrize("loss", ["mse", "pearson"])
def test_recovers_a_known_linear_map(loss):
    rng = np.random.default_rng(0)
    dim = 6
    true = np.diag([3.0, 3.0, 1.0, 1.0, 0.2, 0.2]) @ np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    train, dev, test = (_pairs(n, dim, true, rng) for n in (3000, 500, 500))
    before = np.corrcoef(angular_score_np(test["u"], test["v"]), test["score"])[0, 1]
    cfg = StsTransformConfig(lr=0.03, epochs=40, loss=loss, batch_size=128)
    fitted = fit_sts_transform(train, dev, cfg)
    after = np.corrcoef(fitted.score(test["u"], test["v"]), test["score"])[0, 1]
    assert before < 0.95 and after > 0.99
    assert fitted.best_epoch >= 1 and fitted.dev_pearson == pytest.approx(max(fitted.history))
    # Angles are unchanged by rotations and scale of W, so W W^T is the true map's Gram matrix up to scale.
    gram, true_gram = fitted.matrix @ fitted.matrix.T, true @ true.T
    gram, true_gram = gram / np.linalg.norm(gram), true_gram / np.linalg.norm(true_gram)
    assert np.abs(gram - true_gram).max() < 0.05


def test_low_rank_and_selection_on_dev(tmp_path):
    rng = np.random.default_rng(1)
    dim = 6
    true = np.zeros((dim, dim))
    true[0, 0] = true[1, 1] = 1.0  # only two coordinates carry the score: rank 2 suffices
    train, dev = _pairs(2000, dim, true, rng), _pairs(400, dim, true, rng)
    fitted = fit_sts_transform(train, dev, StsTransformConfig(rank=2, init="random", lr=0.05, epochs=30))
    assert fitted.matrix.shape == (dim, 2)
    assert fitted.dev_pearson > 0.98
    # Round trip through the checkpoint-side file keeps the matrix, the config and the dev score.
    fitted.save(tmp_path)
    back = load_sts_transform(tmp_path)
    assert np.array_equal(back.matrix, fitted.matrix.astype(np.float32))
    assert back.config == fitted.config and back.dev_pearson == fitted.dev_pearson
    assert back.best_epoch == fitted.best_epoch and back.history == fitted.history
    assert load_sts_transform(tmp_path / "nothing-here") is None


def test_weight_decay_keeps_the_matrix_near_its_start():
    rng = np.random.default_rng(2)
    dim = 5
    true = np.diag([4.0, 1.0, 1.0, 1.0, 0.1])
    train, dev = _pairs(1000, dim, true, rng), _pairs(300, dim, true, rng)
    free = fit_sts_transform(train, dev, StsTransformConfig(lr=0.05, epochs=10))
    held = fit_sts_transform(train, dev, StsTransformConfig(lr=0.05, epochs=10, weight_decay=10.0))
    assert np.linalg.norm(held.matrix - np.eye(dim)) < np.linalg.norm(free.matrix - np.eye(dim))


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="eval.tuned.init"):
        StsTransformConfig(init="zeros").validate()
    with pytest.raises(ValueError, match="eval.tuned.loss"):
        StsTransformConfig(loss="hinge").validate()


def test_named_matrices_live_beside_the_default_one(tmp_path):
    from convsts.models.sts_transform import StsTransform, StsTransformConfig, load_sts_transform

    first = StsTransform(np.eye(4, dtype=np.float32), StsTransformConfig(), 0.5, 1)
    second = StsTransform(2 * np.eye(4, dtype=np.float32), StsTransformConfig(lr=0.01), 0.6, 2)
    assert first.save(tmp_path).name == "sts_transform.safetensors"
    assert second.save(tmp_path, "sweep").name == "sts_transform_sweep.safetensors"
    np.testing.assert_array_equal(load_sts_transform(tmp_path).matrix, first.matrix)  # not replaced
    np.testing.assert_array_equal(load_sts_transform(tmp_path, "sweep").matrix, second.matrix)
    assert load_sts_transform(tmp_path, "other") is None
    # A matrix file read by its path (a sweep's DIR/sts_transform.safetensors; encode(tuned=PATH)).
    from convsts.models.sts_transform import read_sts_transform

    again = read_sts_transform(tmp_path / "sts_transform_sweep.safetensors")
    np.testing.assert_array_equal(again.matrix, second.matrix)
    assert (again.config, again.dev_pearson, again.best_epoch) == (second.config, 0.6, 2)
