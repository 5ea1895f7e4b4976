"""An sts_matrix sweep whose driver is SIGKILLed at several moments and once stopped by Ctrl+C,
rerun each time with the same command, from its first seconds (its parent run just opened, Tune's
first state just saved) to the middle of a trial: it ends under the parent run it opened, with the
trials an undisturbed sweep of the same seed makes, and MLflow records each trial once, with the
params it ran with (one of the space's, never "without custom configuration") and each metric step
once. Ctrl+C is one line; a trial Tune's state holds finished is never started again; the chosen
matrix goes to the sweep's OUT, never into the checkpoint; the sweep is resumed only by the command
that started it. One module fixture runs the sweep (each sitting is a Tune driver's start, most of
its time) and the tests below read it."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit.checkpoints import sample_dan_checkpoint
from testkit.tiny import trial_runs

from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import load_sts_transform
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[2]
TRIALS = 8  # one at a time: the stops land between trials, inside one, and between Tune's saves
EPOCHS = 30
TRIAL_ID = re.compile(r"_([0-9a-f]{5}_\d{5})_")  # in Tune's trial folder names
# A Pearson score of the same float32 embeddings, computed again in another process (another
# summation order): one CI run differed by 5.3e-7; ten times that still tells a wrong matrix apart.
FLOAT32_RESCORE = 5e-6


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


def _stop_when(cmd: list[str], env: dict, ready: Callable[[], bool], moment: str, signum=signal.SIGKILL):
    """Runs the sweep command until `ready()`, sends it `signum` (SIGINT: Ctrl+C), and waits until
    Ray has ended the actors the stopped driver started (they would otherwise race the rerun).
    Returns the command's exit code and output."""
    before = set(_alive_actors())
    sweep = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while not ready():
            assert sweep.poll() is None, f"{moment}: the sweep ended first\n" + sweep.communicate()[0][-3000:]
            assert time.time() < deadline, f"{moment}: never reached"
            time.sleep(0.1)
        sweep.send_signal(signum)
        output = sweep.communicate(timeout=180)[0]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    deadline = time.time() + 180  # Ray ends a dead driver's actors within seconds, slower under load
    while left := {i: name for i, name in _alive_actors().items() if i not in before}:
        assert time.time() < deadline, f"{moment}: the stopped sweep's actors are still alive: {left}"
        time.sleep(0.5)
    return sweep.returncode, output


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


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


@pytest.fixture(scope="module")
def stopped_sweep(ray_session, mlflow_uri, tmp_path_factory) -> dict:
    """The sweep stopped at each moment below, then run to its end by the same command, and the
    undisturbed sweep of the same seed: the command, its outputs and what had finished at Ctrl+C."""
    from ray.tune import ExperimentAnalysis

    root = tmp_path_factory.mktemp("stopped_sweep")
    checkpoint = sample_dan_checkpoint(root / "ckpt")
    checkpoint_files = _files(checkpoint)
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    out, experiment = root / "stopped", "tune-stopped-sweep"
    cmd = _sweep(checkpoint, out, mlflow_uri, experiment)

    def children():
        return _children(out, mlflow_uri, experiment)

    def finished():
        return {t: r for t, r in children().items() if r.info.status == "FINISHED"}

    def tune_state_saved() -> bool:
        return any((out / "ray_tune" / "sts_matrix").glob("experiment_state*.json"))

    # Each moment is reached again from where the last stop left the sweep.
    _stop_when(cmd, env, (out / "sweep.json").is_file, "the parent run opened")
    parent = json.loads((out / "sweep.json").read_text())["parent_run_id"]
    _stop_when(cmd, env, tune_state_saved, "Tune's first state saved")
    _stop_when(cmd, env, lambda: len(children()) >= 1, "the first trial started")
    _stop_when(cmd, env, lambda: len(children()) >= 3, "the third trial started")
    begun = len(children())  # Ctrl+C once this sitting has started two trials of its own
    ctrl_c = _stop_when(cmd, env, lambda: len(children()) >= begun + 2, "two more trials started", signal.SIGINT)
    # The trials Tune's state holds as finished once Ctrl+C has ended the command (the reruns restore
    # them finished: MLflow closes a trial's run later, so its status does not tell), and how often
    # each had started.
    client, runs = tracking.client(mlflow_uri), children()
    starts_at_ctrl_c = {
        trial.trial_id: len(client.get_metric_history(runs[trial.trial_id].info.run_id, "trial/started"))
        for trial in ExperimentAnalysis(str(out / "ray_tune" / "sts_matrix")).trials
        if trial.status == "TERMINATED"
    }
    _stop_when(cmd, env, lambda: len(finished()) >= 5, "five trials finished")
    last = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )
    assert last.returncode == 0, last.stdout[-4000:]
    reference_out = root / "undisturbed"
    undisturbed = subprocess.run(_sweep(checkpoint, reference_out, mlflow_uri, "tune-undisturbed-sweep"),
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert undisturbed.returncode == 0, undisturbed.stdout[-3000:] + undisturbed.stderr[-3000:]
    return dict(cmd=cmd, env=env, checkpoint=checkpoint, checkpoint_files=checkpoint_files, out=out, parent=parent,
                experiment=experiment, reference_out=reference_out, ctrl_c=ctrl_c,
                starts_at_ctrl_c=starts_at_ctrl_c, last=last, children=children())  # fmt: skip


@pytest.mark.slow
def test_a_sweep_killed_at_several_moments_keeps_its_trials_and_their_mlflow_runs_true(stopped_sweep, mlflow_uri):
    out, parent = stopped_sweep["out"], stopped_sweep["parent"]
    # The trials: every folder of a trial (one per sitting that ran it) holds the same params, and
    # they are the trials the undisturbed sweep of the same seed made, index by index.
    folders, reference = _folders(out), _folders(stopped_sweep["reference_out"])
    assert len(folders) == TRIALS and all(len(r) == 1 for r in reference.values()), (folders, reference)
    for trial, params in folders.items():
        assert all(p == params[0] for p in params), (trial, params)
    assert _by_index({t: p[0] for t, p in folders.items()}) == _by_index({t: p[0] for t, p in reference.items()})

    # MLflow: one FINISHED child run per trial, its params those of the trial's folders, each
    # metric step once, every epoch up to its last (all of them unless ASHA stopped it at a rung).
    runs = stopped_sweep["children"]
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
    # A stop landed inside a trial: that trial started again in a later sitting (its `trial/started`
    # logged twice). Tune restores it in its own folder once its state had saved it, in a new one
    # otherwise, so the folders do not tell.
    started = {t: len(client.get_metric_history(r.info.run_id, "trial/started")) for t, r in runs.items()}
    assert max(started.values()) > 1, f"no trial ran in two sittings: the stops missed {started}"

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
    assert best.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(
        results["stsb_tuned/dev/pearson"], abs=FLOAT32_RESCORE
    )


@pytest.mark.slow
def test_an_interrupted_matrix_sweep_stops_in_one_line_and_the_same_command_resumes_it(stopped_sweep, mlflow_uri):
    """Ctrl+C while a trial runs: exit 130 and the way on in one line; the reruns finish the sweep,
    and no trial that had finished by then started again."""
    code, output = stopped_sweep["ctrl_c"]
    assert code == 130, output[-3000:]
    assert [line for line in output.splitlines() if "rerun the same command to resume" in line], output[-3000:]
    starts = stopped_sweep["starts_at_ctrl_c"]
    assert 1 <= len(starts) < TRIALS, starts
    assert "resuming sweep sts_matrix" in stopped_sweep["last"].stdout
    client = tracking.client(mlflow_uri)
    for trial_id, started in starts.items():
        run = stopped_sweep["children"][trial_id]
        assert len(client.get_metric_history(run.info.run_id, "trial/started")) == started, trial_id


@pytest.mark.slow
def test_a_rerun_into_the_sweeps_out_with_another_dimension_is_refused_naming_it(stopped_sweep):
    cmd, env = stopped_sweep["cmd"], stopped_sweep["env"]
    asked = f"eval.tuned.epochs=[{EPOCHS}]"
    other = [arg if arg != asked else f"eval.tuned.epochs=[{EPOCHS + 1}]" for arg in cmd]
    assert other != cmd
    refused = subprocess.run(other, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("convsts ")]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-3000:]
    named = f"--param eval.tuned.epochs.grid_search='[{EPOCHS}]' (this command: '[{EPOCHS + 1}]')"
    assert named in lines[0] and "--fresh" in lines[0], lines[0]


@pytest.mark.slow
def test_the_resumed_matrix_sweep_writes_the_chosen_matrix_to_its_out_and_nothing_into_the_checkpoint(
    stopped_sweep,
):
    """Every trial finished; the chosen matrix is in the sweep's --out beside results.json, and the
    checkpoint is as it was before the sweep (every file, byte for byte: a read-only folder or a
    bucket is never written); best_config.yaml is a loadable run config."""
    checkpoint, out = stopped_sweep["checkpoint"], stopped_sweep["out"]
    results = json.loads((out / "results.json").read_text())
    assert results["trials"] == TRIALS and results["trials_failed"] == 0
    for name in ("stsb_tuned/dev/pearson", "stsb_tuned/test/pearson", "stsb_tuned/test/news/pearson"):
        assert -1 <= results[name] <= 1, name
    assert _files(checkpoint) == stopped_sweep["checkpoint_files"]
    assert results["sts_matrix"] == str(out / "sts_transform.safetensors")
    transform = load_sts_transform(out)
    assert transform is not None and load_sts_transform(checkpoint) is None
    encoded = load(checkpoint).encode("a man plays", tuned=results["sts_matrix"])
    assert encoded.shape == (transform.matrix.shape[1],)
    assert transform.dev_pearson == pytest.approx(results["stsb_tuned/dev/pearson"], abs=FLOAT32_RESCORE)
    assert load_config(out / "best_config.yaml").eval.tuned == transform.config


@pytest.mark.slow
def test_the_matrix_sweep_is_a_parent_run_with_a_child_run_per_trial_each_run_once(stopped_sweep, mlflow_uri):
    out = stopped_sweep["out"]
    results = json.loads((out / "results.json").read_text())
    client = tracking.client(mlflow_uri)
    parent = client.get_run(results["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.params["tune.space"] == "sts_matrix"
    assert parent.data.metrics["stsb_tuned/dev/pearson"] == pytest.approx(results["stsb_tuned/dev/pearson"])
    assert {"best_config.yaml", "results.json"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    children = trial_runs(mlflow_uri, stopped_sweep["experiment"], parent.info.run_id)
    assert len(children) == TRIALS and all(r.info.status == "FINISHED" for r in children.values())
    assert all("eval.tuned.lr" in r.data.params for r in children.values())
    # A trial names the command that started the sweep, not the Ray worker that ran it.
    for child in children.values():
        assert child.data.tags["mlflow.source.name"] == parent.data.tags["mlflow.source.name"] == "convsts"
        assert child.data.tags["convsts.command"] == parent.data.tags["convsts.command"]
