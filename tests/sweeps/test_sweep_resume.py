"""Sweeps run again after their driver died, and the documented custom space, on a real local Ray
instance at a tiny size (a file of their own: scripts/test.sh hands out whole files to its two
processes, and these are long)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from testkit.tiny import TINY_SWEEP_MODEL, trial_runs

from convsts.models.checkpoint import save_checkpoint
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_sweep_whose_driver_is_killed_mid_trial_restarts_the_trial_from_its_own_checkpoint(
    ray_session, sample_prepared, mlflow_uri, tmp_path
):
    """`convsts tune` SIGKILLed (not Ctrl+C) while a training trial runs, after it has checkpointed;
    the same command again restores the sweep and the trial goes on from its own newest complete
    checkpoint (Ray Train's snapshot in the trial's folder names only checkpoints whose upload
    finished), each step logged once in the trial's MLflow run."""
    from testkit.local_cluster import ray_processes

    experiment = "tune-driver-killed"
    reddit_cfg = load_config(None, [*TINY_SWEEP_MODEL, "trainer.steps=0", "trainer.task_weights={reddit: 1.0}"])
    from convsts.ray_jobs.training.data_feed import build_tokenizer
    from convsts.ray_jobs.training.start_weights import initial_model

    tokenizer = build_tokenizer(reddit_cfg, str(sample_prepared))
    reddit = save_checkpoint(tmp_path / "reddit", initial_model(reddit_cfg, tokenizer), tokenizer, reddit_cfg.to_dict())
    out, store = tmp_path / "sweep", tmp_path / "store"
    cmd = [sys.executable, "-m", "convsts", "tune", "--space", "snli_fraction", "--out", str(out),
           "--reddit-checkpoint", str(reddit), "--prepared", str(sample_prepared), "--param",
           "data.snli_fraction=[1.0]", "--param", "seed=[0]", "--max-concurrent", "1", *TINY_SWEEP_MODEL, "trainer.steps=60",
           "trainer.checkpoint_every=20", "trainer.log_every=5", "trainer.cpus_per_worker=0.4", "name=killed",
           f"trainer.storage_path={store}", f"mlflow.tracking_uri={mlflow_uri}", f"mlflow.experiment={experiment}"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while len(list(store.glob("killed/*/checkpoint-*/manifest.json"))) < 2 and first.poll() is None:
            assert time.time() < deadline, "the trial never checkpointed twice"
            time.sleep(0.2)
        assert first.poll() is None, first.communicate()[0][-3000:]
        first.kill()
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    deadline = time.time() + 60  # Ray ends the dead driver's trial and its workers
    while ray_processes(b"ray::RayTrainWorker") and time.time() < deadline:
        time.sleep(0.5)
    trial_folders = [p.name for p in (store / "killed").iterdir()]
    assert len(trial_folders) == 1, trial_folders

    second = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-4000:]
    assert [p.name for p in (store / "killed").iterdir()] == trial_folders  # the same trial, its own folder
    results = json.loads((out / "results.json").read_text())
    parent = results["mlflow_run_id"]
    # The trial's own time counts both sittings (Tune's time_total_s); `seconds` is the second command's.
    assert results["trial_seconds"] > 0 and results["seconds"] > 0, results
    children = trial_runs(mlflow_uri, experiment, parent)
    assert list(children) == trial_folders and children[trial_folders[0]].info.status == "FINISHED"
    client = tracking.client(mlflow_uri)
    run_id = children[trial_folders[0]].info.run_id
    restarts = [int(m.value) for m in client.get_metric_history(run_id, "train/restarted_at_step")]
    starts = [line for line in second.stdout.splitlines() if "start step" in line or "snapshot" in line]
    assert len(restarts) == 1 and restarts[0] >= 20 and restarts[0] % 20 == 0, (restarts, starts, second.stdout[-3000:])
    steps = [m.step for m in client.get_metric_history(run_id, "reddit/loss")]
    assert len(steps) == len(set(steps)) and max(steps) == 60 and min(steps) < 20, sorted(steps)  # each step once


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
           "trainer.checkpoint_every=4", "trainer.cpus_per_worker=0.4", f"mlflow.tracking_uri={mlflow_uri}",
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
