"""Which tasks to train on (the paper's Table 4): Reddit only, SNLI only, and Reddit+SNLI at 95/5,
each with several training seeds, from scratch unless the command names a warm start. The sweep's
table.md gives every STS-B metric of `report` (dev and test, raw and tuned, by genre) as the mean
and standard deviation over the seeds of each task mix."""

from ray import tune

from convsts.tune_spaces import TuneSpace

MIXES = [{"reddit": 1.0}, {"snli": 1.0}, {"reddit": 0.95, "snli": 0.05}]
SEEDS = [0, 1, 2]
GENRES = ("", "captions/", "forums/", "news/")  # "": every pair of the split


def params():
    return {"trainer.task_weights": tune.grid_search(MIXES), "seed": tune.grid_search(SEEDS)}


SPACE = TuneSpace(
    name="task_mix",
    description="Reddit only, SNLI only, Reddit+SNLI (95/5), each over training seeds: STS-B by genre, raw and tuned",
    objective="train",
    metric="stsb/dev/pearson",
    mode="max",
    params=params,
    report=[
        *(
            f"{kind}/{split}/{genre}pearson"
            for kind in ("stsb", "stsb_tuned")
            for split in ("dev", "test")
            for genre in GENRES
        ),
        "reddit/p_at_1",
        "snli/dev/accuracy",
    ],
    table="trainer.task_weights",
)
