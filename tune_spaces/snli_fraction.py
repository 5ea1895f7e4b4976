"""How much SNLI the multitask model needs (the paper's Figure 8): fractions 0.1..1.0 of SNLI train
(nested subsets), times seeds of the subset draw; each trial warm-starts from one Reddit checkpoint."""

from ray import tune

from convsts.tune_spaces import CURVE_METRICS, TuneSpace

FRACTIONS = [round(0.1 * k, 1) for k in range(1, 11)]


def params():
    return {
        "data.snli_fraction": tune.grid_search(FRACTIONS),
        "data.snli_fraction_seed": tune.grid_search([0]),
    }


SPACE = TuneSpace(
    name="snli_fraction",
    description="STS-B against the share of SNLI train in multitask training (nested subsets x seeds)",
    objective="train",
    metric="stsb/dev/pearson",
    mode="max",
    params=params,
    fixed=["eval.tuned.enabled=false"],
    curve="data.snli_fraction",
    report=[*CURVE_METRICS, "snli/dev/accuracy", "data/snli_train_pairs"],
)
