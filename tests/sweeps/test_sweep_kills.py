"""A sweep whose driver is SIGKILLed at several moments and rerun each time with the same command,
from its first seconds (its parent run just opened, Tune's first state just saved) to the middle
of a trial: it ends under the parent run it opened, with the trials an undisturbed sweep of the
same seed makes, and MLflow records each trial once, with the params it ran with (one of the
space's, never "without custom configuration") and each metric step once."""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit.checkpoints import sample_dan_checkpoint
from testkit.tiny import trial_runs

from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[2]
TRIALS = 8  # one at a time: the kills land between trials, inside one, and between Tune's saves
EPOCHS = 30
TRIAL_ID = re.compile(r"_([0-9a-f]{5}_\d{5})_")  # in Tune's trial folder names


def _sweep(checkpoint: Path, out: Path, mlflow_uri: str, experiment: str) -> list[str]:
    return [sys.executable, "-m", "convsts", "tune", "--space", "sts_matrix", "--checkpoint", str(checkpoint),
            "--out", str(out), "--num-samples", str(TRIALS), "--max-concurrent", "1",
            "--param", f"eval.tuned.epochs=[{EPOCHS}]", f"mlflow.tracking_uri={mlflow_uri}",
            f"mlflow.experiment={experiment}"]  # fmt: skip


def _children(out: Path, mlflow_uri: str, experiment: str) -> dict:
    state = out / "sweep.json"
    if not state.is_file():
        return {}
    return trial_runs(mlflow_uri, experiment, json.loads(state.read_text())["parent_run_id"])


def _alive_actors() -> dict[str, str]:
    """This test's Ray instance's live actors: {actor id: class name}."""
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address  # named: other tests' instances run beside it
    return {a.actor_id: a.class_name for a in list_actors(address, filters=[("state", "=", "ALIVE")], limit=10_000)}


def _kill_when(cmd: list[str], env: dict, ready: Callable[[], bool], moment: str) -> None:
    """Runs the sweep command until `ready()`, SIGKILLs it, and waits until Ray has ended the
    actors the killed driver started (they would otherwise race the rerun)."""
    before = set(_alive_actors())
    sweep = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not ready():
            assert sweep.poll() is None, f"{moment}: the sweep ended first\n" + sweep.communicate()[0][-3000:]
            assert time.time() < deadline, f"{moment}: never reached"
            time.sleep(0.1)
        sweep.kill()
        sweep.wait(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    deadline = time.time() + 180  # Ray ends a dead driver's actors within seconds, slower under load
    while left := {i: name for i, name in _alive_actors().items() if i not in before}:
        assert time.time() < deadline, f"{moment}: the killed sweep's actors are still alive: {left}"
        time.sleep(0.5)


def _folders(out: Path) -> dict[str, list[dict]]:
    """Tune's trial folders of a sweep: {trial id: the params.json of each folder it has}."""
    folders: dict[str, list[dict]] = {}
    for params in sorted((out / "ray_tune" / "sts_matrix").glob("*/params.json")):
        trial = TRIAL_ID.search(params.parent.name)
        assert trial, params.parent.name
        folders.setdefault(trial.group(1), []).append(json.loads(params.read_text()))
    return folders


def _by_index(trials: dict) -> dict[str, object]:
    """A sweep's trials keyed by their index (`_00003`), the part two sweeps' ids share."""
    return {trial.rpartition("_")[2]: value for trial, value in trials.items()}


@pytest.mark.slow
def test_a_sweep_killed_at_several_moments_keeps_its_trials_and_their_mlflow_runs_true(
    ray_session, mlflow_uri, tmp_path
):
    checkpoint = sample_dan_checkpoint(tmp_path / "ckpt")
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    out, experiment = tmp_path / "killed", "tune-killed-sweep"
    cmd = _sweep(checkpoint, out, mlflow_uri, experiment)

    def children():
        return _children(out, mlflow_uri, experiment)

    def finished():
        return [r for r in children().values() if r.info.status == "FINISHED"]

    def tune_state_saved() -> bool:
        return any((out / "ray_tune" / "sts_matrix").glob("experiment_state*.json"))

    # Each moment is reached again from where the last kill left the sweep.
    _kill_when(cmd, env, (out / "sweep.json").is_file, "the parent run opened")
    parent = json.loads((out / "sweep.json").read_text())["parent_run_id"]
    _kill_when(cmd, env, tune_state_saved, "Tune's first state saved")
    _kill_when(cmd, env, lambda: len(children()) >= 1, "the first trial started")
    _kill_when(cmd, env, lambda: len(children()) >= 3, "the third trial started")
    _kill_when(cmd, env, lambda: len(finished()) >= 5, "five trials finished")
    last = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )
    assert last.returncode == 0, last.stdout[-4000:]

    reference_out = tmp_path / "undisturbed"
    undisturbed = subprocess.run(_sweep(checkpoint, reference_out, mlflow_uri, "tune-undisturbed-sweep"),
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert undisturbed.returncode == 0, undisturbed.stdout[-3000:] + undisturbed.stderr[-3000:]

    # The trials: every folder of a trial (one per sitting that ran it) holds the same params, and
    # they are the trials the undisturbed sweep of the same seed made, index by index.
    folders, reference = _folders(out), _folders(reference_out)
    assert len(folders) == TRIALS and all(len(r) == 1 for r in reference.values()), (folders, reference)
    for trial, params in folders.items():
        assert all(p == params[0] for p in params), (trial, params)
    assert _by_index({t: p[0] for t, p in folders.items()}) == _by_index({t: p[0] for t, p in reference.items()})
    assert any(len(params) > 1 for params in folders.values()), "no trial ran in two sittings: the kills missed"

    # MLflow: one FINISHED child run per trial, its params those of the trial's folders, each
    # metric step once, every epoch up to its last (all of them unless ASHA stopped it at a rung).
    runs = children()
    assert sorted(runs) == sorted(folders)
    client = tracking.client(mlflow_uri)
    for trial, run in runs.items():
        assert run.info.status == "FINISHED", trial
        expected = tracking.param_values(folders[trial][0])
        assert {k: run.data.params.get(k) for k in expected} == expected, trial
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (trial, key, sorted(steps))
        epochs = [m.step for m in client.get_metric_history(run.info.run_id, "stsb_tuned/dev/pearson_epoch")]
        last = EPOCHS if run.data.tags.get("convsts.stopped_early") != "true" else max(epochs)  # ASHA's rungs
        assert sorted(epochs) == list(range(1, last + 1)), (trial, sorted(epochs))
    assert max(len(client.get_metric_history(r.info.run_id, "trial/started")) for r in runs.values()) > 1

    # The parent: its best-trial tag names the run of best_config.yaml's trial and results.json's.
    results = json.loads((out / "results.json").read_text())
    assert results["mlflow_run_id"] == parent and results["trials"] == TRIALS, results
    parent = client.get_run(parent)
    assert parent.info.status == "FINISHED"
    best = client.get_run(parent.data.tags["convsts.best_trial_run"])
    assert best.data.tags["convsts.trial_id"] in results["best_trial"]
    tuned = load_config(out / "best_config.yaml").eval.tuned
    for key, value in best.data.params.items():
        assert key.startswith("eval.tuned.") and value == str(getattr(tuned, key.rpartition(".")[2])), key
    assert best.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(results["stsb_tuned/dev/pearson"], abs=5e-6)
