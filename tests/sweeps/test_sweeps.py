"""Sweeps on a real local Ray instance at a tiny size, with MLflow parent/child runs: the task-mix
table over its seeds, and ASHA's stopped-early tag. The sts_matrix sweep stopped by Ctrl+C and
SIGKILL, then resumed, is tests/sweeps/test_sweep_kills.py's."""

import pandas as pd
import pytest
from testkit.checkpoints import sample_dan_checkpoint
from testkit.tiny import TINY_SWEEP_MODEL, trial_runs

from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking


@pytest.mark.slow
def test_a_trial_that_ran_to_max_t_is_not_tagged_as_stopped_early(ray_session, mlflow_uri, tmp_path):
    """ASHA stops a trial at a rung (stopped early) and also at max_t (its end: it ran whole); only the
    first is tagged `convsts.stopped_early=true`."""
    from convsts.ray_jobs.sweeps.request import MatrixInputs, SweepRequest
    from convsts.ray_jobs.sweeps.trials import grid_overrides
    from convsts.ray_jobs.sweeps.tuner import run_sweep
    from convsts.tune_spaces import get_space

    experiment = "tune-max-t-test"
    cfg = load_config(None, [*TINY_SWEEP_MODEL, f"mlflow.tracking_uri={mlflow_uri}", f"mlflow.experiment={experiment}"])
    space = get_space("testkit.small_spaces:STS_MATRIX_MAX_T_6")  # max_t = the trials' 6 epochs; ASHA rungs at 1 and 3
    results = run_sweep(
        SweepRequest(
            space,
            cfg,
            tmp_path / "sweep",
            MatrixInputs(str(sample_dan_checkpoint(tmp_path / "ckpt"))),
            num_samples=6,
            max_concurrent=1,
            param_overrides=grid_overrides(["eval.tuned.epochs=[6]"]),
        )
    )
    children = trial_runs(mlflow_uri, experiment, results["mlflow_run_id"])
    client = tracking.client(mlflow_uri)
    ran = {
        t: max(m.step for m in client.get_metric_history(r.info.run_id, "stsb_tuned/dev/pearson_epoch"))
        for t, r in children.items()
    }
    assert len(children) == 6 and all(r.info.status == "FINISHED" for r in children.values())
    for trial_id, child in children.items():
        tag = child.data.tags.get("convsts.stopped_early", "false")
        assert tag == str(ran[trial_id] < 6).lower(), (trial_id, ran[trial_id], tag)
    assert max(ran.values()) == 6, ran  # at least the first trial runs whole


@pytest.mark.slow
def test_the_task_mix_sweep_tabulates_a_mix_over_its_seeds(ray_session, sample_prepared, mlflow_uri, tmp_path):
    """Table 4's sweep at a tiny size (its 95/5 mix x two seeds, from scratch; a column per mix is
    test_tune_spaces.py's): every trial reports STS-B by genre, raw and tuned; table.md holds the mix's
    mean ± sd over its seeds and is the parent run's description."""
    from convsts.ray_jobs.sweeps.request import SweepRequest, TrainInputs
    from convsts.ray_jobs.sweeps.trials import grid_overrides
    from convsts.ray_jobs.sweeps.tuner import run_sweep
    from convsts.tune_spaces import get_space

    space = get_space("task_mix")
    cfg = load_config(
        None,
        TINY_SWEEP_MODEL
        + [f"mlflow.tracking_uri={mlflow_uri}", "mlflow.experiment=tune-task-mix-test", "trainer.num_workers=1"]
        + ["trainer.steps=4", "trainer.checkpoint_every=4", "eval.tuned.epochs=2"],
    )
    mix = grid_overrides(["trainer.task_weights=[{reddit: 0.95, snli: 0.05}]", "seed=[0,1]"])
    out = tmp_path / "mix"
    results = run_sweep(
        SweepRequest(space, cfg, out, TrainInputs(prepared_dir=str(sample_prepared)), param_overrides=mix)
    )
    assert results["trials"] == 2 and results["failed_trials"] == []

    trials = pd.read_csv(out / "trials.csv")
    assert len(trials) == 2 and set(space.report) <= set(trials.columns)
    for genre in ("", "captions/", "forums/", "news/"):  # every trial scored on each genre, raw and tuned
        for kind in ("stsb", "stsb_tuned"):
            assert trials[f"{kind}/test/{genre}pearson"].between(-1, 1).all(), (kind, genre)
    table = (out / "table.md").read_text()
    lines = table.splitlines()
    assert lines[0] == "| metric | reddit 0.95 + snli 0.05 |" and lines[2] == "| trials | 2 |"
    # The cell is the mean ± sample sd of the two seeds, as trials.csv holds them.
    test = trials["stsb/test/pearson"]
    assert f"| stsb/test/pearson | {test.mean():.4f} ± {test.std(ddof=1):.4f} |" in lines
    client = tracking.client(mlflow_uri)
    assert table in client.get_run(results["mlflow_run_id"]).data.tags["mlflow.note.content"]
