"""How much SNLI the multitask model needs (the paper's Figure 8): Reddit plus a nested subset of
SNLI train (fraction 0 = Reddit alone, the curve's origin; up to all of it), times training seeds.
Trials train from scratch, as the paper's models do, unless the command names a warm start
(--reddit-checkpoint: the Reddit part shared, only the SNLI share varies). The subset is drawn with
data.snli_fraction_seed (search it with --param to vary the draw too)."""

from ray import tune

from convsts.tune_spaces import CURVE_METRICS, TuneSpace

FRACTIONS = [0.0, 0.1, 0.25, 0.5, 1.0]
SEEDS = [0, 1]


def params():
    return {"data.snli_fraction": tune.grid_search(FRACTIONS), "seed": tune.grid_search(SEEDS)}


SPACE = TuneSpace(
    name="snli_fraction",
    description="STS-B against the share of SNLI train in multitask training (nested subsets x training seeds)",
    objective="train",
    metric="stsb/dev/pearson",
    mode="max",
    params=params,
    fixed=["eval.tuned.enabled=false"],
    curve="data.snli_fraction",
    report=[*CURVE_METRICS, "snli/dev/accuracy", "data/snli_train_pairs", "reddit/p_at_1"],
)
