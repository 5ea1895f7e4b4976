"""A Ray worker process that dies unexpectedly while a command's Ray work runs is named in one line,
with whether the work went on without it (the end-to-end case, a Train worker and the parameter
holder killed during a run, is in test_async_groups.py)."""

import json
import logging
import os
import signal
import time

import pytest
import ray
from testkit.local_cluster import ray_head

from convsts.ray_jobs.runtime.worker_deaths import reporting_worker_deaths

LOGGER = "convsts.ray_jobs.runtime.worker_deaths"


@ray.remote(num_cpus=0, max_restarts=1, max_task_retries=-1)
class Victim:
    def pid(self) -> int:
        return os.getpid()


def _abort(victim) -> int:
    """Abort the actor's process as a native crash would (SIGABRT), and wait until Ray has a new one."""
    pid = ray.get(victim.pid.remote())
    os.kill(pid, signal.SIGABRT)
    deadline = time.time() + 60
    while ray.get(victim.pid.remote()) == pid and time.time() < deadline:
        time.sleep(0.2)
    return pid


def _died(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "worker process died" in r.getMessage()]


def test_a_worker_that_dies_while_the_work_goes_on_is_one_line_saying_it_was_replaced(ray_session, caplog):
    """With another Ray instance started on the machine after this process's (Ray's own lookup of
    "the" cluster would find that one), the deaths are this process's cluster's."""
    with ray_head({"RAY_AUTH_MODE": "disabled"}, 1), caplog.at_level(logging.WARNING, logger=LOGGER):
        with reporting_worker_deaths():
            victim = Victim.remote()
            pid = _abort(victim)
            assert ray.get(victim.pid.remote()) != pid  # the actor answers from its replacement
    (line,) = _died(caplog)
    assert f"pid {pid} on " in line and "running Victim" in line and "(SYSTEM_ERROR: " in line, line
    assert line.endswith("Ray started another worker in its place and the work went on"), line


def test_a_worker_death_in_work_that_fails_says_the_work_ended_and_earlier_deaths_are_not_named(ray_session, caplog):
    earlier = _abort(Victim.remote())  # before the work: not its death
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(RuntimeError):
        with reporting_worker_deaths():
            pid = _abort(Victim.remote())
            raise RuntimeError("the work failed")
    (line,) = _died(caplog)
    assert f"pid {pid} on " in line and f"pid {earlier} " not in line
    assert line.endswith("the work ended with it"), line


OTHER_DRIVER = """
import sys, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1], logging_level="ERROR")
print("ready", flush=True)
sys.stdin.readline()
group = placement_group([{"CPU": 48}])  # pending while this driver lives; removed with its job
print("made", group.id.hex(), flush=True)
sys.stdin.read()
"""


def test_a_worker_group_that_waits_for_resources_is_one_line_saying_what_and_for_how_long(ray_session, caplog):
    """A placement group made while the work runs that Ray cannot place (here: more CPUs than the
    instance has) is said once, naming what it asks for and Ray Train's wait; one placed at once is
    not, nor one that was there before, nor one that another driver on the same cluster made meanwhile
    and that waits as long."""
    import subprocess
    import sys

    from ray.util.placement_group import placement_group, remove_placement_group

    from convsts.ray_jobs.runtime.resource_waits import saying_resource_waits

    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_DRIVER, ray_session.get_runtime_context().gcs_address],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    earlier = placement_group([{"CPU": 64}])  # pending before the block: not this work's
    try:
        assert other.stdout.readline().strip() == "ready"
        with caplog.at_level(logging.WARNING, logger="convsts"), saying_resource_waits(after_s=1.0, poll_s=0.2):
            other.stdin.write("go\n")
            other.stdin.flush()
            others = other.stdout.readline().split()[-1]  # the other driver's group, pending from now on
            placed = placement_group([{"CPU": 0.1}])
            ray.get(placed.ready(), timeout=30)
            waiting = placement_group([{"CPU": 64}, {"CPU": 64}])
            time.sleep(3)
            table = ray.util.placement_group_table()
            remove_placement_group(waiting)
            remove_placement_group(placed)
    finally:
        remove_placement_group(earlier)
        other.stdin.close()
        other.wait(timeout=60)
    assert table[others]["state"] == "PENDING"  # it waited as long as this work's, and was not said
    said = [r.getMessage() for r in caplog.records if "waits for resources" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith("the worker group waits for resources Ray cannot place now: 2 worker(s) of {CPU 64}")
    assert "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S" in said[0] and "Ctrl+C stops the run" in said[0]


def test_a_run_whose_workers_wait_says_so_and_ctrl_c_ends_it_killed_in_seconds(ray_session, sample_prepared, tmp_path):
    """`convsts train` joined to an instance whose CPUs another placement group holds: its worker group
    waits, the run says so in one line, and Ctrl+C then ends it within seconds (exit 130), its MLflow
    run KILLED."""
    import subprocess
    import sys
    import threading
    from pathlib import Path

    from mlflow.tracking import MlflowClient
    from ray.util.placement_group import placement_group, remove_placement_group
    from testkit.tiny import TINY_DAN

    holder = placement_group([{"CPU": 2}])
    ray.get(holder.ready(), timeout=60)
    out = tmp_path / "run"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    command = [sys.executable, "-m", "convsts", "train", "--out", str(out), "--prepared", str(sample_prepared),
               "trainer.num_workers=1", "trainer.cpus_per_worker=1", "trainer.steps=40", *TINY_DAN]  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.time() + 180
        while not any("waits for resources" in line for line in lines) and proc.poll() is None:
            assert time.time() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        assert proc.poll() is None, "".join(lines)[-3000:]
        stopped = time.time()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C in a terminal
        proc.wait(timeout=60)
        took = time.time() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        remove_placement_group(holder)
    reader.join(timeout=10)
    said = [line for line in lines if "waits for resources" in line]
    assert len(said) == 1 and "1 worker(s) of {CPU 1}" in said[0], "".join(lines)[-3000:]
    assert proc.returncode == 130 and took < 30, (proc.returncode, took, "".join(lines)[-3000:])
    run_id = json.loads((out / "run.json").read_text())["runs"][-1]["run_id"]
    assert MlflowClient(f"sqlite:///{out / 'mlflow.db'}").get_run(run_id).info.status == "KILLED"
