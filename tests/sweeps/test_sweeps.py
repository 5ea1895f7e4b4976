"""Both sweeps on a real local Ray instance at a tiny size, with MLflow parent/child runs, and a
sweep interrupted midway (SIGINT, as Ctrl+C) then resumed without rerunning finished trials."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from testkit.checkpoints import sample_dan_checkpoint
from testkit.tiny import TINY_SWEEP_MODEL, trial_runs

from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import load_sts_transform
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[2]
# Trials of the interrupted sts_matrix sweep: on an idle machine a trial takes about 0.4 s, and
# the Ctrl+C must land while some are left (ten all finished before a poll of MLflow saw two).
TRIALS = 30
# A Pearson score of the same float32 embeddings, computed again in another process (another
# summation order): one CI run differed by 5.3e-7; ten times that still tells a wrong matrix apart.
FLOAT32_RESCORE = 5e-6


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def resumed_matrix_sweep(ray_session, mlflow_uri, tmp_path_factory) -> dict:
    """An sts_matrix sweep of TRIALS trials, one at a time, stopped by Ctrl+C once two have finished,
    then run again with the same command: the command, both outputs and what had finished."""
    root = tmp_path_factory.mktemp("matrix_sweep")
    checkpoint, out, experiment = sample_dan_checkpoint(root / "ckpt"), root / "sweep", "tune-sts-matrix-test"
    checkpoint_files = _files(checkpoint)
    cmd = [sys.executable, "-m", "convsts", "tune", "--space", "sts_matrix", "--checkpoint", str(checkpoint),
           "--out", str(out), "--num-samples", str(TRIALS), "--max-concurrent", "1", "--param", "eval.tuned.epochs=[6]",
           f"mlflow.tracking_uri={mlflow_uri}", f"mlflow.experiment={experiment}"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Interrupt once two trials have finished; trials run one at a time, so the others leave a margin.
    finished_before = {}
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        if (out / "sweep.json").is_file():
            parent = json.loads((out / "sweep.json").read_text())["parent_run_id"]
            runs = trial_runs(mlflow_uri, experiment, parent)
            finished_before = {t: r for t, r in runs.items() if r.info.status == "FINISHED"}
            if len(finished_before) >= 2:
                break
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    log_first = first.communicate(timeout=180)[0]
    second = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400
    )
    return dict(cmd=cmd, env=env, checkpoint=checkpoint, out=out, experiment=experiment, first=first,
                log_first=log_first, finished_before=finished_before, second=second,
                checkpoint_files=checkpoint_files)  # fmt: skip


@pytest.mark.slow
def test_an_interrupted_matrix_sweep_stops_in_one_line_and_the_same_command_resumes_it(resumed_matrix_sweep):
    first, log_first, second = (resumed_matrix_sweep[k] for k in ("first", "log_first", "second"))
    assert first.returncode == 130, log_first[-3000:]
    assert "rerun the same command to resume" in log_first
    assert 2 <= len(resumed_matrix_sweep["finished_before"]) < TRIALS
    assert second.returncode == 0, second.stdout[-3000:]
    assert "resuming sweep sts_matrix" in second.stdout


@pytest.mark.slow
def test_a_rerun_into_the_sweeps_out_with_another_dimension_is_refused_naming_it(resumed_matrix_sweep):
    cmd, env = resumed_matrix_sweep["cmd"], resumed_matrix_sweep["env"]
    other = [arg if arg != "eval.tuned.epochs=[6]" else "eval.tuned.epochs=[7]" for arg in cmd]
    refused = subprocess.run(other, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("convsts ")]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
    assert "--param eval.tuned.epochs.grid_search='[6]' (this command: '[7]')" in lines[0] and "--fresh" in lines[0]


@pytest.mark.slow
def test_the_resumed_matrix_sweep_writes_the_chosen_matrix_to_its_out_and_nothing_into_the_checkpoint(
    resumed_matrix_sweep,
):
    """Every trial finished; the chosen matrix is in the sweep's --out beside results.json, and the
    checkpoint is as it was before the sweep (every file, byte for byte: a read-only folder or a
    bucket is never written); best_config.yaml is a loadable run config."""
    checkpoint, out = resumed_matrix_sweep["checkpoint"], resumed_matrix_sweep["out"]
    results = json.loads((out / "results.json").read_text())
    assert results["trials"] == TRIALS and results["trials_failed"] == 0
    for name in ("stsb_tuned/dev/pearson", "stsb_tuned/test/pearson", "stsb_tuned/test/news/pearson"):
        assert -1 <= results[name] <= 1, name
    assert _files(checkpoint) == resumed_matrix_sweep["checkpoint_files"]
    assert results["sts_matrix"] == str(out / "sts_transform.safetensors")
    transform = load_sts_transform(out)
    assert transform is not None and load_sts_transform(checkpoint) is None
    encoded = load(checkpoint).encode("a man plays", tuned=results["sts_matrix"])
    assert encoded.shape == (transform.matrix.shape[1],)
    assert transform.dev_pearson == pytest.approx(results["stsb_tuned/dev/pearson"], abs=FLOAT32_RESCORE)
    assert load_config(out / "best_config.yaml").eval.tuned == transform.config


@pytest.mark.slow
def test_the_matrix_sweep_is_a_parent_run_with_a_child_run_per_trial_each_run_once(resumed_matrix_sweep, mlflow_uri):
    out, experiment = resumed_matrix_sweep["out"], resumed_matrix_sweep["experiment"]
    results = json.loads((out / "results.json").read_text())
    client = tracking.client(mlflow_uri)
    parent = client.get_run(results["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.params["tune.space"] == "sts_matrix"
    assert parent.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(results["stsb_tuned/dev/pearson"])
    assert {"best_config.yaml", "results.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    children = trial_runs(mlflow_uri, experiment, parent.info.run_id)
    assert len(children) == TRIALS and all(r.info.status == "FINISHED" for r in children.values())
    assert all("eval.tuned.lr" in r.data.params for r in children.values())
    # A trial names the command that started the sweep, not the Ray worker that ran it.
    for child in children.values():
        assert child.data.tags["mlflow.source.name"] == parent.data.tags["mlflow.source.name"] == "convsts"
        assert child.data.tags["convsts.command"] == parent.data.tags["convsts.command"]
    # Trials that had finished before the interruption were not run again: one start each.
    for trial_id in resumed_matrix_sweep["finished_before"]:
        assert len(client.get_metric_history(children[trial_id].info.run_id, "trial/started")) == 1, trial_id
    best_child = client.get_run(parent.data.tags["convsts.best_trial_run"])
    # The trial logged its own float32 score; the sweep re-scores the saved matrix in another process,
    # which can differ in the 7th digit (as transform.dev_pearson does).
    assert best_child.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(
        results["stsb_tuned/dev/pearson"], abs=FLOAT32_RESCORE
    )


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
