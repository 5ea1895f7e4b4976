"""The SNLI-fraction sweep run again after its driver died, on a real local Ray instance at a tiny
size (the documented custom space runs in tests/sweeps/test_tune_spaces.py)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from testkit.tiny import TINY_SWEEP_MODEL, trial_runs

from convsts.datasets.snli import fraction_rank
from convsts.io.errors import ConfigError
from convsts.models.checkpoint import save_checkpoint
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_snli_fraction_sweep_killed_mid_trial_restarts_the_trial_and_gives_its_curve(
    ray_session, sample_prepared, mlflow_uri, tmp_path
):
    """`convsts tune --space snli_fraction` (two fractions, trials warm-started from a Reddit-only
    checkpoint, asynchronous task groups) SIGKILLed (not Ctrl+C) while its first trial runs, after
    that trial has checkpointed twice; the same command again restores the sweep: the trial goes on
    from its own newest complete checkpoint (Ray Train's snapshot in the trial's folder names only
    checkpoints whose upload finished), each step logged once in its MLflow run, and the second
    trial runs. The curve is over nested SNLI subsets, with its table, plot and best config."""
    from testkit.local_cluster import ray_processes

    from convsts.ray_jobs.sweeps.request import SweepRequest, TrainInputs
    from convsts.ray_jobs.sweeps.tuner import run_sweep
    from convsts.ray_jobs.training.start_weights import initial_model
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer
    from convsts.tune_spaces import get_space

    experiment = "tune-snli-fraction"
    # The Reddit-only checkpoint the trials warm-start from: what a Reddit-only run with
    # trainer.steps=0 saves (its tokenizer and seeded weights), without a Ray Train job of its own.
    reddit_cfg = load_config(None, [*TINY_SWEEP_MODEL, "trainer.steps=0", "trainer.task_weights={reddit: 1.0}"])
    tokenizer = build_tokenizer(reddit_cfg, str(sample_prepared))
    reddit = save_checkpoint(tmp_path / "reddit", initial_model(reddit_cfg, tokenizer), tokenizer, reddit_cfg.to_dict())
    # Two workers of 1 CPU and the trial function's 0.1 do not fit this 2-CPU instance: refused
    # before any trial.
    trials = [*TINY_SWEEP_MODEL, "trainer.num_workers=2", "trainer.task_split=async", "trainer.steps=60",
              "trainer.checkpoint_every=20", "trainer.log_every=5"]  # fmt: skip
    with pytest.raises(ConfigError, match="trainer.cpus_per_worker"):
        run_sweep(
            SweepRequest(
                get_space("snli_fraction"),
                load_config(None, [*trials, "trainer.cpus_per_worker=1", f"mlflow.tracking_uri={mlflow_uri}"]),
                tmp_path / "infeasible",
                TrainInputs(str(reddit), str(sample_prepared)),
            )
        )
    out, store = tmp_path / "sweep", tmp_path / "store"  # a storage path shared by the trials, as a bucket
    cmd = [sys.executable, "-m", "convsts", "tune", "--space", "snli_fraction", "--out", str(out),
           "--reddit-checkpoint", str(reddit), "--prepared", str(sample_prepared), "--param",
           "data.snli_fraction=[0.5,1.0]", "--param", "seed=[0]", "--max-concurrent", "1", *trials,
           "trainer.cpus_per_worker=0.4", "name=killed", f"trainer.storage_path={store}",
           f"mlflow.tracking_uri={mlflow_uri}", f"mlflow.experiment={experiment}"]  # fmt: skip
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
    killed = [p.name for p in (store / "killed").iterdir()]
    assert len(killed) == 1, killed

    second = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-4000:]
    results = json.loads((out / "results.json").read_text())
    # The trial's own time counts both sittings (Tune's time_total_s); `seconds` is the second command's.
    assert results["trial_seconds"] > 0 and results["seconds"] > 0, results
    children = trial_runs(mlflow_uri, experiment, results["mlflow_run_id"])
    # Each trial trained in a checkpoint folder of its own; the killed one kept its folder.
    assert killed[0] in children and sorted(p.name for p in (store / "killed").iterdir()) == sorted(children)
    client = tracking.client(mlflow_uri)
    for trial_id, run in children.items():
        assert run.info.status == "FINISHED"
        assert run.data.tags["convsts.storage"] == str(store / "killed" / trial_id)
        restarts = [int(m.value) for m in client.get_metric_history(run.info.run_id, "train/restarted_at_step")]
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "reddit/loss")]
        assert len(steps) == len(set(steps)) and max(steps) == 60 and min(steps) < 20, sorted(steps)  # each step once
        if trial_id == killed[0]:  # from its own checkpoint, once
            assert len(restarts) == 1 and restarts[0] >= 20 and restarts[0] % 20 == 0, (restarts, second.stdout[-3000:])
        else:
            assert restarts == [], restarts
        assert {"reddit/loss", "snli/loss", "stsb/dev/pearson", "data/snli_train_pairs"} <= set(run.data.metrics)
        assert run.data.params["trainer.warm_start"] == str(reddit.resolve())
        assert run.data.params["trainer.task_split"] == "async" and "async/snli/updates" in run.data.metrics

    curve = pd.read_csv(out / "curve.csv")
    assert list(curve["fraction"]) == [0.5, 1.0] and list(curve["seed"]) == [0, 0]
    for name in ("stsb/dev/pearson", "stsb/dev/captions/pearson", "stsb/test/pearson", "stsb/test/captions/pearson"):
        assert curve[name].between(-1, 1).all(), name
    # Nested subsets: the 0.5 trial trained on exactly the rows whose seeded rank is below 0.5.
    snli = pq.read_table(sample_prepared / "snli" / "train").to_pandas()
    half = sum(fraction_rank(p, h, 0) < 0.5 for p, h in zip(snli["premise"], snli["hypothesis"]))
    assert list(curve["data/snli_train_pairs"]) == [half, len(snli)]
    assert (out / "curve.png").stat().st_size > 0
    best = load_config(out / "best_config.yaml")
    assert best.trainer.warm_start == str(reddit.resolve()) and best.data.snli_fraction in (0.5, 1.0)
    assert results["trials"] == 2 and -1 <= results["stsb/dev/pearson"] <= 1
    assert results["checkpoint"].startswith(str(out / "trials"))  # kept with the sweep, not in Ray's temp dir
    parent = client.get_run(results["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert {"curve.png", "curve.csv", "best_config.yaml"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
