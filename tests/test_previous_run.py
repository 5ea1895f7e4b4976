"""An --out folder's earlier training run, as the next run into it finds it (a real sqlite MLflow
store, the folders a killed run leaves): its MLflow run left RUNNING ends KILLED, the refusal
names a checkpoint that exists, a resumed run knows the run it continues."""

import pytest

from convsts.ray_jobs import tracking
from convsts.ray_jobs.config import load_config
from convsts.ray_jobs.training.previous import (
    ENDED_BY_TAG,
    close_abandoned_run,
    record_run,
    recorded_run,
    resumable_checkpoint,
)
from convsts.ray_jobs.training.run import claim_output


def _killed_run_folder(out, name="convsts"):
    """What `convsts train --out OUT` leaves when killed after two checkpoints: Ray Train's checkpoint
    folders (named by time), no OUT/checkpoint and no train.json."""
    kept = []
    for stamp in ("2026-11-26_04-17-30.539163", "2026-11-26_04-17-31.105457"):
        folder = out / "ray_results" / name / f"checkpoint_{stamp}"
        folder.mkdir(parents=True)
        (folder / "train_state.pt").write_bytes(b"state")
        kept.append(folder)
    return kept


def test_a_killed_runs_mlflow_run_ends_killed_and_the_refusal_names_a_checkpoint_that_exists(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    out.mkdir()
    run_id = tracking.start_run(uri, "previous-test", "killed")
    record_run(out, run_id)
    newest = _killed_run_folder(out)[-1]

    # The refusal names the newest checkpoint the killed run left (before: OUT/checkpoint, not there).
    with pytest.raises(FileExistsError) as refused:
        claim_output(out, load_config(None, []), fresh=False)
    message = str(refused.value)
    assert f"--resume {newest} to continue it" in message and "--fresh" in message
    assert resumable_checkpoint(out, "convsts") == newest

    # The next run into OUT closes the run the killed process left RUNNING, saying why.
    assert tracking.run_status(uri, run_id) == "RUNNING"
    assert close_abandoned_run(out, uri) == run_id
    run = tracking.client(uri).get_run(run_id)
    assert run.info.status == "KILLED" and "its process ended with the run open" in run.data.tags[ENDED_BY_TAG]
    # A run that ended is left as it is.
    finished = tracking.start_run(uri, "previous-test", "finished")
    tracking.end_run(uri, finished)
    record_run(out, finished)
    assert close_abandoned_run(out, uri) == finished and tracking.run_status(uri, finished) == "FINISHED"


def test_a_finished_runs_checkpoint_comes_first_and_a_folder_without_one_says_so(tmp_path):
    out = tmp_path / "out"
    _killed_run_folder(out)
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "train_state.pt").write_bytes(b"state")
    (out / "train.json").write_text("{}")
    assert resumable_checkpoint(out, "convsts") == out / "checkpoint"

    bare = tmp_path / "bare"  # a run killed before its first checkpoint, or one made by hand
    (bare / "ray_results" / "convsts").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="it left no checkpoint to resume: --fresh to start over"):
        claim_output(bare, load_config(None, []), fresh=False)


def test_a_run_record_that_is_not_ours_is_ignored(tmp_path):
    (tmp_path / "mlflow_run.json").write_text("[1, 2]")
    assert recorded_run(tmp_path) is None
    assert close_abandoned_run(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}") is None
