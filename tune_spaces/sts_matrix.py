"""How to fit the tuned STS matrix: learning rate, weight decay, initialization, rank, epochs, loss."""

from ray import tune

from convsts.tune_spaces import TuneSpace


def params():
    return {
        "eval.tuned.lr": tune.loguniform(1e-3, 1e-1),
        "eval.tuned.weight_decay": tune.choice([0.0, 1e-4, 1e-3, 1e-2]),
        "eval.tuned.init": tune.choice(["identity", "random"]),
        "eval.tuned.rank": tune.choice([0, 256, 128]),
        "eval.tuned.epochs": tune.choice([10, 30, 60]),
        "eval.tuned.loss": tune.choice(["mse", "pearson"]),
    }


SPACE = TuneSpace(
    name="sts_matrix",
    description="the STS-B transformation matrix, fit on embeddings computed once and shared by all trials",
    objective="sts_matrix",
    metric="stsb_tuned/dev/pearson",
    mode="max",
    params=params,
    num_samples=16,
    scheduler="asha",
    max_t=60,
    report=["stsb_tuned/dev/pearson"],
)
