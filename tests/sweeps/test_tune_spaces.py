"""Search spaces and trial configs, no Ray cluster needed; and the documented custom space run as
written on a real local Ray instance (the slow tier)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from ray import tune
from testkit.tiny import TINY_SWEEP_MODEL

from convsts.io.errors import ConfigError
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.sweeps.trials import check_space_keys, grid_overrides, trial_config
from convsts.tune_spaces import TuneSpace, builtin_spaces, get_space
from convsts.tune_spaces.snli_fraction import FRACTIONS

REPO = Path(__file__).resolve().parents[2]


def test_builtin_spaces():
    assert {"sts_matrix", "snli_fraction"} <= set(builtin_spaces())
    sts = get_space("sts_matrix")
    assert sts.objective == "sts_matrix" and sts.metric == "stsb_tuned/dev/pearson" and sts.scheduler == "asha"
    assert set(sts.params()) == {
        "eval.tuned.lr",
        "eval.tuned.weight_decay",
        "eval.tuned.init",
        "eval.tuned.rank",
        "eval.tuned.epochs",
        "eval.tuned.loss",
    }
    snli = get_space("snli_fraction")
    assert snli.objective == "train"
    assert FRACTIONS == [0.0, 0.1, 0.25, 0.5, 1.0]  # the points; 0 = Reddit alone
    assert snli.params()["data.snli_fraction"] == tune.grid_search(FRACTIONS)
    base = load_config()
    for space in (sts, snli):
        check_space_keys(space, base, {})


MY_SPACE = TuneSpace(
    name="mine",
    description="a user's own space",
    objective="sts_matrix",
    metric="stsb_tuned/dev/pearson",
    mode="max",
    params=lambda: {"eval.tuned.lr": tune.choice([0.01, 0.1])},
)
BAD_SPACE = TuneSpace(
    name="bad",
    description="",
    objective="sts_matrix",
    metric="m",
    mode="max",
    params=lambda: {"eval.tuned.learning_rate": 0.1},
)


def test_user_space_by_module_path():
    assert get_space("test_tune_spaces:MY_SPACE") is MY_SPACE
    with pytest.raises(ValueError, match="unknown tune space 'nope'"):
        get_space("nope")
    with pytest.raises(ConfigError, match="'eval.tuned.learning_rate' does not exist"):
        check_space_keys(BAD_SPACE, load_config(), {})


def test_trial_config_applies_dotted_keys_and_rejects_unknown_ones():
    base = load_config(None, ["trainer.steps=7"]).to_dict()
    cfg = trial_config(base, {"data.snli_fraction": 0.3, "eval.tuned.rank": 16}, ["eval.tuned.enabled=false"])
    assert cfg.data.snli_fraction == 0.3 and cfg.eval.tuned.rank == 16 and cfg.trainer.steps == 7
    assert cfg.eval.tuned.enabled is False
    with pytest.raises(ConfigError, match="data.snli_fraction"):
        trial_config(base, {"data.snli_fraction": 1.5})
    # Task weights are replaced whole, as in config files and overrides, whether fixed or swept.
    assert trial_config(base, {}, ["trainer.task_weights={snli: 1.0}"]).trainer.task_weights == {"snli": 1.0}
    assert trial_config(base, {"trainer.task_weights": {"reddit": 1.0}}).trainer.task_weights == {"reddit": 1.0}
    with pytest.raises(ConfigError, match="eval.tuned.nope"):
        trial_config(base, {"eval.tuned.nope": 1})


def test_grid_overrides():
    out = grid_overrides(["data.snli_fraction=[0.5,1.0]", "eval.tuned.epochs=3"])
    assert out == {"data.snli_fraction": tune.grid_search([0.5, 1.0]), "eval.tuned.epochs": 3}
    with pytest.raises(ConfigError, match="expected key=value"):
        grid_overrides(["data.snli_fraction"])


def test_a_sweep_is_resumed_only_by_the_command_that_started_it(tmp_path):
    """Guards: a rerun into a sweep's --out resumed the recorded sweep whatever the command said;
    its unfinished trials then trained with this command's base config and the recorded
    parameters. sweep_record keeps what defines the sweep; every difference is named."""
    from convsts.ray_jobs.sweeps.request import SweepRequest, TrainInputs
    from convsts.ray_jobs.sweeps.tuner import resume_differences, sweep_record

    space = get_space("snli_fraction")
    cfg = load_config(None, ["trainer.steps=10"])

    def record(cfg, param, num_samples, prepared):
        return sweep_record(SweepRequest(space, cfg, tmp_path / "s", TrainInputs(None, prepared), param, num_samples))

    first = record(cfg, grid_overrides(["data.snli_fraction=[0.1,1.0]"]), 1, str(tmp_path / "p"))
    state = {"parent_run_id": "x", "sweep": first}
    same = record(
        load_config(None, ["trainer.steps=10"]),
        grid_overrides(["data.snli_fraction=[0.1,1.0]"]),
        1,
        str(tmp_path / "p"),
    )
    assert resume_differences(state, same) == []
    other = record(
        load_config(None, ["trainer.steps=20", "model.encoder=dan"]),
        grid_overrides(["data.snli_fraction=[0.1,0.5]"]),
        2,
        str(tmp_path / "q"),
    )
    assert resume_differences(state, other) == [
        "--num-samples 1 (this command: 2)",
        f"--prepared {str(tmp_path / 'p')!r} (this command: {str(tmp_path / 'q')!r})",
        "--param data.snli_fraction.grid_search='[0.1, 1.0]' (this command: '[0.1, 0.5]')",
        "trainer.steps=10 (this command: 20)",
    ]
    # A state that records no settings is never taken for this sweep's.
    assert resume_differences({"parent_run_id": "x"}, other) == ["sweep.json records no sweep settings"]
    secret = record(load_config(None, ["mlflow.tracking_uri=http://alice:PlAnTeD@127.0.0.1:5000"]), {}, 1, None)
    assert "PlAnTeD" not in str(secret)


def test_the_task_mix_table_is_the_mean_and_sd_over_seeds_per_mix(tmp_path):
    """table.md of a train space with `table`: a column per task mix (in trial order), a row per report
    metric, each cell the mean ± sample standard deviation over that mix's seeds."""
    import json

    from convsts.ray_jobs.sweeps.results import _mean_table
    from convsts.tune_spaces import get_space

    space = get_space("task_mix")
    assert space.table == "trainer.task_weights" and space.curve == ""
    assert {"stsb/test/captions/pearson", "stsb_tuned/test/news/pearson", "stsb/dev/pearson"} <= set(space.report)
    rows = []
    for mix, values in (({"reddit": 1.0}, [0.5, 0.7]), ({"reddit": 0.95, "snli": 0.05}, [0.6, 0.6, 0.9])):
        for seed, value in enumerate(values):
            row = {"trial": f"t{len(rows)}", "trainer.task_weights": json.dumps(mix, sort_keys=True), "seed": seed}
            rows.append(row | {metric: value for metric in space.report} | {"reddit/p_at_1": float("nan")})
    _mean_table(rows, space, tmp_path)
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert lines[0] == "| metric | reddit 1 | reddit 0.95 + snli 0.05 |"
    assert lines[2] == "| trials | 2 | 3 |"
    assert (
        lines[3] == "| stsb/dev/pearson | 0.6000 ± 0.1414 | 0.7000 ± 0.1732 |"
    )  # sd of (0.5, 0.7), of (0.6, 0.6, 0.9)
    assert "| reddit/p_at_1 | — | — |" in lines
    assert len(lines) == 3 + len(space.report)


def test_the_snli_curve_starts_at_no_snli_and_its_table_is_per_fraction(tmp_path):
    """snli_fraction: fractions from 0 (Reddit alone) to 1 x training seeds; a fraction-0 trial
    reports no SNLI pair count: trials.csv, curve.csv and the plot have it at 0 pairs; table.md has
    a column per fraction in the curve's order, each cell the mean ± sd over the seeds (a count that
    all share once; a score keeps its spread even when it is a whole number)."""
    import pandas as pd

    from convsts.ray_jobs.sweeps.results import _curve, _mean_table, _trials_table
    from convsts.tune_spaces import get_space

    space = get_space("snli_fraction")
    assert space.params()["seed"]["grid_search"] == [0, 1]
    grid = []
    for fraction, pairs, values in ((0.5, 10_000.0, [0.6, 0.8]), (0.0, None, [1.0, 1.0])):
        for seed, value in enumerate(values):
            metrics = {m: value for m in space.report if m != "data/snli_train_pairs"}
            if pairs is not None:  # a fraction-0 trial trained no SNLI pair and reports no count
                metrics["data/snli_train_pairs"] = pairs
            config = {"data.snli_fraction": fraction, "seed": seed, "data.snli_fraction_seed": 0}
            grid.append(tune.Result(metrics | {"config": config}, None, None, f"/sweep/t{len(grid)}"))
    rows = _trials_table(grid, space, tmp_path)
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert list(trials["data/snli_train_pairs"]) == [10_000.0, 10_000.0, 0.0, 0.0]  # as curve.csv has them
    ordered = _curve(rows, space, tmp_path)
    assert [(r["data.snli_fraction"], r["seed"]) for r in ordered] == [(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]
    curve = pd.read_csv(tmp_path / "curve.csv")
    assert list(curve["fraction"]) == [0.0, 0.0, 0.5, 0.5] and list(curve["seed"]) == [0, 1, 0, 1]
    assert list(curve["data/snli_train_pairs"]) == [0.0, 0.0, 10_000.0, 10_000.0]
    assert (tmp_path / "curve.png").stat().st_size > 10_000
    _mean_table(ordered, space, tmp_path)
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert lines[0] == "| metric | snli_fraction 0.0 | snli_fraction 0.5 |"
    assert lines[2] == "| trials | 2 | 2 |"
    assert "| stsb/dev/pearson | 1.0000 ± 0.0000 | 0.7000 ± 0.1414 |" in lines  # a score keeps its spread
    assert "| data/snli_train_pairs | 0 | 10000 |" in lines  # a count that every seed shares, once


def test_a_resumed_sweep_says_it_keeps_the_concurrency_it_started_with(tmp_path, mlflow_uri, caplog):
    """Ray Tune restores a sweep with its first command's max_concurrent_trials: a rerun that would
    run another number at once says which number runs (not the one the new command asked for)."""
    import json
    import logging

    from convsts.ray_jobs.sweeps.request import SweepRequest, TrainInputs
    from convsts.ray_jobs.sweeps.tuner import STATE_FILE, open_sweep

    cfg = load_config(None, ["trainer.steps=10", "mlflow.experiment=resume-concurrency"])
    request = SweepRequest(get_space("snli_fraction"), cfg, tmp_path / "s", TrainInputs(), {}, 1)
    request.out_dir.mkdir()
    opened = open_sweep(request, mlflow_uri, False, 10, 1)
    parent, expected, at_once = opened.parent, opened.expected_trials, opened.trials_at_once
    assert (expected, at_once) == (10, 1)
    assert json.loads((tmp_path / "s" / STATE_FILE).read_text())["trials_at_once"] == 1
    with caplog.at_level(logging.WARNING, logger="convsts"):
        reopened = open_sweep(request, mlflow_uri, True, 10, 3)
        resumed, at_once = reopened.parent, reopened.trials_at_once
    assert resumed.run_id == parent.run_id and at_once == 1
    assert "resumed with the 1 trial(s) at once it was started with, not 3" in caplog.text


def test_a_sweep_takes_the_inputs_its_objective_uses_and_refuses_the_others():
    from convsts.ray_jobs.sweeps.request import MatrixInputs, TrainInputs, sweep_inputs

    matrix, train = get_space("sts_matrix"), get_space("snli_fraction")
    assert sweep_inputs(matrix, "C", None, None) == MatrixInputs("C")
    assert sweep_inputs(train, None, "R", "P") == TrainInputs("R", "P") and TrainInputs("R").starts_from == "R"
    with pytest.raises(ConfigError, match="space sts_matrix needs --checkpoint"):
        sweep_inputs(matrix, None, None, None)
    with pytest.raises(ConfigError, match="--reddit-checkpoint, --prepared would do nothing"):
        sweep_inputs(matrix, "C", "R", "P")
    with pytest.raises(ConfigError, match="space snli_fraction trains: --checkpoint names an sts_matrix sweep"):
        sweep_inputs(train, "C", None, None)


def test_a_trial_run_again_logs_only_the_steps_its_run_lacks(mlflow_uri):
    """A trial's second attempt (a resumed sweep) writes into its run only the steps the first did
    not reach: each metric step once, the values of the first kept."""
    from convsts.ray_jobs.sweeps.trials import TrialRun
    from convsts.ray_jobs.tracking import runs as tracking

    run_id = tracking.start_run(mlflow_uri, "trial-steps", "trial", {"eval.tuned.lr": 0.01})
    first = TrialRun(mlflow_uri, run_id, tracking.last_logged_steps(mlflow_uri, run_id))
    for epoch in (1, 2, 3):
        first.log({"stsb_tuned/dev/pearson": 0.1 * epoch}, step=epoch)
    again = TrialRun(mlflow_uri, run_id, tracking.last_logged_steps(mlflow_uri, run_id))
    for epoch in (1, 2, 3, 4, 5):
        again.log({"stsb_tuned/dev/pearson": 0.1 * epoch + 0.001, "epoch": epoch}, step=epoch)
    history = tracking.client(mlflow_uri).get_metric_history(run_id, "stsb_tuned/dev/pearson")
    assert sorted((m.step, round(m.value, 4)) for m in history) == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.3),
        (4, 0.401),
        (5, 0.501),
    ]
    assert sorted(m.step for m in tracking.client(mlflow_uri).get_metric_history(run_id, "epoch")) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_the_last_logged_step_of_each_metric_is_its_highest_step_in_one_request(store, mlflow_uri, tmp_path):
    """last_logged_steps reads a run's latest metrics (one request, no metric history): each metric's
    highest step, whatever order the steps were logged in, in a sqlite store and through an MLflow
    server on 127.0.0.1."""
    from testkit.local_cluster import mlflow_server

    from convsts.ray_jobs.tracking import runs as tracking

    def check(uri: str) -> None:
        run_id = tracking.start_run(uri, "last-steps", "run")
        for step in (10, 5, 20, 15):  # a restart replays earlier steps after later ones were logged
            tracking.log_metrics(uri, run_id, {"reddit/loss": 1.0 / step}, step)
        tracking.log_metrics(uri, run_id, {"lr": 0.1}, 0)
        assert tracking.last_logged_steps(uri, run_id) == {"reddit/loss": 20, "lr": 0}
        assert tracking.last_logged_steps(uri, "0" * 32) == {}

    if store == "sqlite":
        check(mlflow_uri)
        return
    with mlflow_server(tmp_path / "server") as url:
        check(url)


def _doc_block(path: Path, heading: str) -> str:
    """The first ```python block under `heading` in a markdown file, as written there."""
    text = path.read_text(encoding="utf-8").split(f"## {heading}", 1)[1]
    return text.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_documented_custom_space_runs_as_written(ray_session, sample_prepared, mlflow_uri, tmp_path):
    """docs/tune.md's "Your own space" (a train space over trainer.stages), its module written as the
    docs show it and passed as --space module:SPACE: no --reddit-checkpoint needed (trials train from
    scratch), every trial in trials.csv with its searched stages, no fraction curve asked of it."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "my_spaces.py").write_text(_doc_block(REPO / "docs" / "tune.md", "Your own space"))
    out = tmp_path / "sweep"
    # The space as written, its grid of three stages cut to its middle one (--param): a trial's fixed
    # cost (a TorchTrainer starting) is most of a minute here.
    one = "trainer.stages=[[{start_step: 0, batch_size: 128, lr: 0.001}]]"
    cmd = [sys.executable, "-m", "convsts", "tune", "--space", "my_spaces:SPACE", "--out", str(out),
           "--param", one, "--prepared", str(sample_prepared), "--max-concurrent", "1", *TINY_SWEEP_MODEL, "trainer.steps=4",
           "trainer.checkpoint_every=4", "trainer.num_workers=1", "trainer.cpus_per_worker=0.4", f"mlflow.tracking_uri={mlflow_uri}",
           "mlflow.experiment=tune-custom-space"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every trial starts from scratch (seeded)" in done.stdout + done.stderr
    trials = pd.read_csv(out / "trials.csv")
    assert [json.loads(stages)[0]["lr"] for stages in trials["trainer.stages"]] == [0.001], trials
    assert not (out / "curve.csv").exists()
    results = json.loads((out / "results.json").read_text())
    assert results["trials"] == 1 and -1 <= results["stsb/dev/pearson"] <= 1
