"""One run at a time in an --out folder (ray_jobs/runtime/output_lock.py): a second run is refused in one line
naming the holder, before it writes anything; the lock goes with the process that holds it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convsts.ray_jobs.runtime.output_lock import LOCK_FILE, OutputInUse, output_lock

REPO = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys, time; from convsts.ray_jobs.runtime.output_lock import output_lock\n"
    "with output_lock(sys.argv[1], 'train'):\n    print('held', flush=True); time.sleep(120)\n"
)


def _holder(out: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_into_a_held_output_folder_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        with pytest.raises(OutputInUse, match=rf"in use by another run \(`convsts train`, pid {holder.pid} on "):
            with output_lock(out, "demo"):
                pass
        # Through the command: one line, exit 2, nothing of its own written (no store, no prepared data).
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        env.pop("MLFLOW_TRACKING_URI", None)
        done = subprocess.run(
            [sys.executable, "-m", "convsts", "train", "--out", str(out)],
            capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "choose another --out" in lines[0]
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # the holder's, still held
        assert "argv" not in (out / LOCK_FILE).read_text()  # no arguments recorded: they may carry credentials
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The lock went with the killed process: the folder is free again, with no stale lock to remove.
    with output_lock(out, "train"):
        with output_lock(out, "train"):  # re-entrant within one process (a demo's training)
            assert (out / LOCK_FILE).is_file()
    assert list(out.iterdir()) == []  # a finished run leaves no lock file behind


def test_the_lock_is_free_once_the_holder_ends(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    holder.terminate()
    holder.wait()
    deadline = time.time() + 10
    while True:
        try:
            with output_lock(out, "train"):
                break
        except OutputInUse:
            assert time.time() < deadline
            time.sleep(0.1)


def test_a_decorated_run_holds_its_out_dir_from_start_to_end(tmp_path):
    import json

    from convsts.ray_jobs.runtime.output_lock import holds_output

    @holds_output("demo")
    def run(cfg, out_dir, fresh=False):
        return json.loads((Path(out_dir) / LOCK_FILE).read_text())["command"]

    assert run(None, fresh=True, out_dir=tmp_path / "o") == "demo"  # out_dir found by name, as a keyword too
    assert run(None, tmp_path / "o") == "demo"
    assert not (tmp_path / "o").exists()  # made for the run, left empty: gone with its lock


def test_a_refused_run_leaves_no_folder_it_made_and_keeps_every_folder_that_was_there(tmp_path):
    """The folders made for the lock go with it when the run leaves them empty (a refusal); a folder
    that was there, or one the run wrote into, stays."""
    nested = tmp_path / "runs" / "a" / "out"
    with pytest.raises(RuntimeError), output_lock(nested, "train"):
        assert nested.is_dir()
        raise RuntimeError("refused")
    assert list(tmp_path.iterdir()) == []
    with output_lock(nested, "train"):
        (nested / "train.json").write_text("{}")
    assert [p.name for p in nested.iterdir()] == ["train.json"]
    (tmp_path / "kept").mkdir()
    with output_lock(tmp_path / "kept", "train"):
        pass
    assert (tmp_path / "kept").is_dir()
