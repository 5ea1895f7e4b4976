"""A `convsts train` on its own local Ray instance, stopped by Ctrl+C (SIGINT to its process
group) or by SIGKILL: once the command has exited, nothing of the run goes on (SIGTERM takes Ctrl+C's
path, SigtermAsInterrupt: its line and exit code are the chain's, in
tests/training/test_run_chain_resume.py, and a stopped job's, in tests/cluster/test_submit.py; a run
on its own instance that reaches its end is tests/data/test_storage.py's run in a bucket). No step is logged and no checkpoint written after the command marked its MLflow run KILLED
(the driver stops the worker group first), and no process of the command's own Ray instance is left
(the instance's temp dir under RAY_TMPDIR names every one of them); after SIGKILL, which marks
nothing, the instance's processes end within a minute and nothing is logged after them."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit.local_cluster import pids_matching
from testkit.tiny import TINY_DAN

from convsts.io.processes import alive

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(out: Path) -> str | None:
    try:
        return json.loads((out / "run.json").read_text())["runs"][-1]["run_id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def _last_step(client, run_id: str) -> int:
    return max((m.step for m in client.get_metric_history(run_id, "reddit/loss")), default=-1)


def _checkpoints(out: Path) -> list[str]:
    return sorted(glob.glob(str(out / "ray_results" / "**" / "checkpoint-*"), recursive=True))


@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL"])
def test_nothing_of_a_stopped_or_finished_run_goes_on_after_its_command(stop, sample_prepared, tmp_path):
    from mlflow.tracking import MlflowClient

    out, temp = tmp_path / "run", Path("/tmp") / f"cvstop{os.getpid()}{stop[-3:]}"  # short: Ray's sockets live under it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_"))}
    env["RAY_TMPDIR"] = str(temp)
    command = [sys.executable, "-m", "convsts", "train", "--out", str(out), "--prepared", str(sample_prepared),
               "trainer.steps=100000", "trainer.log_every=5", "trainer.checkpoint_every=20", "trainer.eval_every=0",
               "trainer.num_workers=1", *TINY_DAN]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        client, deadline = None, time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            run_id = _run(out)
            if run_id and (out / "mlflow.db").exists():
                client = client or MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
                if _last_step(client, run_id) >= 25:  # past a checkpoint, still training
                    break
            time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        instance = pids_matching(str(temp))  # the instance's processes, its task workers among them
        if stop == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C in a terminal
        else:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    expected = {"SIGINT": 130, "SIGKILL": -9}[stop]
    assert proc.returncode == expected, err[-3000:]
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run_id = _run(out)
    assert run_id is not None
    status, last, checkpoints = client.get_run(run_id).info.status, _last_step(client, run_id), _checkpoints(out)
    deadline = time.time() + 60  # the instance's own processes end with its driver
    while time.time() < deadline and (left := [p for p in instance if alive(p)]):
        time.sleep(0.5)
    left = [p for p in instance if alive(p)]
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left]
    if stop == "SIGKILL":  # no run was marked: what the workers logged until the instance went is the run's
        last, checkpoints = _last_step(client, run_id), _checkpoints(out)
    time.sleep(3)  # what a worker left running would log or write meanwhile
    assert _last_step(client, run_id) == last and _checkpoints(out) == checkpoints, (stop, last, checkpoints)
    assert client.get_run(run_id).info.status == status
    if stop == "SIGINT":
        assert status == "KILLED", status
