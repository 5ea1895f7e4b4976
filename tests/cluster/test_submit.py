"""`convsts submit` / `convsts jobs` against a real Ray head started with `ray start --head` on
127.0.0.1 (own temp dir) with Ray's token authentication, logging to a real MLflow server: a
submitted job trains, streams its logs, is listed, stopped, refused and resumed (a job's driver runs
the same `convsts train` as the multi-node cluster's runs in tests/cluster/multinode/)."""

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.local_cluster import mlflow_server, pids_matching, ray_head
from testkit.tiny import TINY_TRAIN

from convsts.ray_jobs.runtime.ray_start import PREEMPTION_WATCHER_ENV

REPO = Path(__file__).resolve().parents[2]


def convsts(args, env, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "convsts", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def client_env(tmp_path, address, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "MLFLOW_TRACKING"))}
    env.update({"RAY_ADDRESS": address, "HOME": str(tmp_path / "home")}, **extra)  # no ~/.ray/auth_token
    return env


@pytest.mark.slow
def test_submitted_jobs_with_token_auth_train_stream_list_and_stop(sample_prepared, tmp_path):
    token = secrets.token_hex(16)  # made up for this test cluster only
    with (
        # A one-node head is never drained: its runs start no preemption watcher, as a local instance's.
        ray_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, PREEMPTION_WATCHER_ENV: "0"}) as head,
        mlflow_server(tmp_path / "mlflow") as mlflow_url,
    ):
        # Without the token the client is refused, with a message that says what to do.
        refused = convsts(["jobs", "list"], client_env(tmp_path, head["address"]))
        assert refused.returncode == 2 and "token authentication" in refused.stderr, refused.stderr
        assert "no token was sent" in refused.stderr
        # A wrong token is named as rejected, not as missing.
        wrong = convsts(["jobs", "list"], client_env(tmp_path, head["address"], RAY_AUTH_TOKEN=secrets.token_hex(16)))
        assert wrong.returncode == 2 and "rejected the token this client sent (from RAY_AUTH_TOKEN)" in wrong.stderr, (
            wrong.stderr
        )

        env = client_env(tmp_path, head["address"], RAY_AUTH_TOKEN=token)
        out = tmp_path / "long"
        # A long training job, with asynchronous task groups (the parameter holder is an actor of the
        # submitted job), is stopped through `convsts jobs stop` once it has checkpointed twice;
        # following it then reports failure.
        long_job = ["train", "--out", str(out), "--prepared", str(sample_prepared), *TINY_TRAIN,
                    "trainer.steps=100000", "trainer.checkpoint_every=10", "trainer.task_split=async",
                    f"mlflow.tracking_uri={mlflow_url}", "mlflow.experiment=submitted"]  # fmt: skip
        started = convsts(["submit", "--no-wait", "--submission-id", "convsts-test-long", *long_job], env)
        assert started.returncode == 0, started.stderr
        deadline = time.time() + 420  # a job's start and first steps take minutes on a busy 2-core machine
        while len(list(out.glob("ray_results/*/checkpoint-*/manifest.json"))) < 2:
            assert time.time() < deadline, convsts(["jobs", "logs", "convsts-test-long"], env).stdout[-3000:]
            time.sleep(0.5)
        stopped = convsts(["jobs", "stop", "convsts-test-long"], env)
        assert stopped.returncode == 0 and "stop requested" in stopped.stdout
        followed = convsts(["jobs", "logs", "--follow", "convsts-test-long"], env)
        assert followed.returncode == 1
        # The job's driver took the stop's SIGTERM as Ctrl+C: one line, its MLflow run ended KILLED (below).
        assert "convsts train: stopped by SIGTERM; add --resume latest to the same command to go on" in followed.stdout
        listed = convsts(["jobs", "list"], env).stdout
        assert any("convsts-test-long" in line and "STOPPED" in line for line in listed.splitlines()), listed

        # The same job again is refused (its driver died; OUT records the run); `--resume` alone
        # continues it from its newest complete checkpoint to the trainer.steps it is given, its
        # logs streamed until it SUCCEEDS.
        again = convsts(["submit", "--submission-id", "convsts-test-long-again", *long_job], env)
        assert again.returncode == 1 and "already holds an interrupted training run" in again.stdout, again.stdout
        assert "pass --resume latest to continue it" in again.stdout
        kept = out.glob("ray_results/*/checkpoint-*/manifest.json")
        newest = max(kept, key=lambda m: int(m.parent.name.rsplit("-", 1)[1])).parent  # by step
        at = json.loads((newest / "config.json").read_text())["step"]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(mlflow_url)
        exp = client.get_experiment_by_name("submitted")
        [stopped_run] = client.search_runs([exp.experiment_id])
        # The continuing run logs only the steps the stopped one had not: it goes 4 steps past them.
        steps = max(m.step for m in client.get_metric_history(stopped_run.info.run_id, "reddit/loss")) + 4
        resume = ["submit", "--submission-id", "convsts-test-resumed", *long_job, f"trainer.steps={steps}", "--resume"]
        done = convsts(resume, env)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        assert "job convsts-test-resumed: SUCCEEDED" in done.stdout
        assert f"--resume latest: {newest}" in done.stdout and f"start step {at}" in done.stdout
        assert "task split mode=async" in done.stdout  # the job's logs were streamed
        train = json.loads((out / "train.json").read_text())
        assert json.loads((out / "checkpoint" / "config.json").read_text())["step"] == steps
        assert (out / "checkpoint" / "model.safetensors").is_file()
        run = client.get_run(train["mlflow_run_id"])
        assert run.info.status == "FINISHED" and run.data.params["trainer.steps"] == str(steps)
        assert run.data.metrics["async/reddit/updates"] + run.data.metrics["async/snli/updates"] == steps
        # It continues the stopped job's run, which was closed as KILLED and holds both tasks' losses.
        assert run.data.tags["convsts.continues"] == stopped_run.info.run_id
        stopped_run = client.get_run(stopped_run.info.run_id)
        assert stopped_run.info.status == "KILLED"
        assert "reddit/loss" in stopped_run.data.metrics and "snli/loss" in stopped_run.data.metrics
        # The run's model, a logged model in the server's artifact root.
        assert [o.model_id for o in run.outputs.model_outputs] == [
            m.model_id for m in client.search_logged_models([exp.experiment_id]) if m.source_run_id == run.info.run_id
        ]
        assert run.outputs.model_outputs

        listed = convsts(["jobs", "list"], env)
        assert listed.returncode == 0 and "convsts-test-resumed" in listed.stdout and "SUCCEEDED" in listed.stdout
        logs = convsts(["jobs", "logs", "convsts-test-resumed"], env)
        assert logs.returncode == 0 and "mlflow_run_id" in logs.stdout
        temp_dir = head["temp_dir"]
    assert pids_matching(temp_dir) == []  # the head's processes are gone, stopped by pid
