"""An --out folder's earlier runs, as the next run into it finds them (a real sqlite MLflow store,
real checkpoints, the local S3 server): a MLflow run left RUNNING ends KILLED, a checkpoint is
complete or it is not resumed, the refusal names the newest complete checkpoint wherever the runs
kept theirs (OUT, or their own folders in a bucket that OUT/run.json records), `--resume latest`
finds it, and a checkpoint in a bucket is read in a few large requests. The chain of runs itself:
tests/training/test_run_chain.py."""

import json
import math
import shutil
from pathlib import Path

import pytest
from testkit.checkpoints import chain_checkpoint
from testkit.s3_server import keys, request_log, s3_endpoint

from convsts.io import storage
from convsts.io.errors import BadInputError, ConfigError
from convsts.models.checkpoint import folder_name
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.lineage import (
    ENDED_BY_TAG,
    DamagedRecord,
    RunStart,
    RunStorage,
    close_abandoned_runs,
    decide_start,
    join_chain,
    new_link,
    remove_earlier_outputs,
    run_storage,
)


def _record(out: Path, run_id: str, cfg, folder: str, chain=()) -> None:
    """OUT/run.json as a run whose checkpoints go to `folder` writes it before its first step."""
    out.mkdir(parents=True, exist_ok=True)
    location = RunStorage(*folder.rsplit("/", 1))
    join_chain(out, RunStart("", None, location, tuple(chain)), new_link(out, run_id, cfg, location))


def _killed_run(out: Path, folder: str, cfg, source: Path) -> list[str]:
    """What a `convsts train` killed during its third checkpoint's upload leaves: OUT/run.json, two
    complete checkpoints in the run's folder (local or in a bucket: checkpoint-2, checkpoint-3), and a
    newest one without its train state (the upload stopped there)."""
    _record(out, "0123456789abcdef", cfg, folder)
    kept = []
    for step in (2, 3, 4):
        target = storage.join(folder, folder_name(step))
        storage.copy_tree(source, target)
        kept.append(target)
    storage.write_text(storage.join(folder, "checkpoint_manager_snapshot.json"), "{}")  # Ray Train's, beside them
    cut = storage.join(kept[-1], "train_state.pt")
    if storage.is_uri(cut):
        fs, inner = storage.resolve(cut)
        fs.delete_file(inner)
    else:
        Path(cut).unlink()
    return kept


def test_a_checkpoint_is_complete_only_with_its_manifest_and_every_file_it_lists(tmp_path):
    from convsts.models.checkpoint import MANIFEST_FILE, incomplete_reason, verified_folder

    ckpt = chain_checkpoint(tmp_path / "ckpt")
    listed = json.loads((ckpt / MANIFEST_FILE).read_text())["files"]
    assert sorted(listed) == ["config.json", "model.safetensors", "tokenizer.json", "train_state.pt"]
    assert incomplete_reason(ckpt) is None and verified_folder(ckpt) == ckpt

    cut = tmp_path / "cut"  # a copy stopped during its largest file
    shutil.copytree(ckpt, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert incomplete_reason(cut) == f"model.safetensors has {len(data) // 2:,} bytes, its manifest {len(data):,}"
    (cut / "model.safetensors").unlink()
    assert incomplete_reason(cut) == "model.safetensors is missing"
    (cut / MANIFEST_FILE).unlink()  # the manifest is written last: before it, nothing is complete
    assert incomplete_reason(cut).startswith(f"no {MANIFEST_FILE}")
    with pytest.raises(BadInputError) as refused:
        verified_folder(cut)  # no folder is read without its manifest
    assert str(refused.value).startswith(f"{cut}: not a complete checkpoint or model folder (no {MANIFEST_FILE}")
    assert "\n" not in str(refused.value)

    damaged = tmp_path / "damaged"  # the same size, other bytes: the digest tells
    shutil.copytree(ckpt, damaged)
    state = bytearray((damaged / "train_state.pt").read_bytes())
    state[-1] ^= 0xFF
    (damaged / "train_state.pt").write_bytes(bytes(state))
    assert incomplete_reason(damaged) is None
    with pytest.raises(BadInputError, match="train_state.pt differs from its manifest's sha256"):
        verified_folder(damaged)


def test_a_killed_runs_mlflow_run_ends_killed_and_the_refusal_names_a_complete_checkpoint(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "out"
    cfg = load_config(None)
    root, name = run_storage(cfg, out)
    kept = _killed_run(out, storage.join(root, name), cfg, chain_checkpoint(tmp_path / "src"))
    run_id = tracking.start_run(uri, "previous-test", "killed")
    _record(out, run_id, cfg, storage.join(root, name))

    # The refusal names the newest complete checkpoint (not the newest folder: its upload stopped).
    with pytest.raises(FileExistsError) as refused:
        decide_start(out, cfg)
    message = str(refused.value)
    assert "an interrupted training run" in message and "\n" not in message
    assert f"its newest complete checkpoint is {kept[1]} (step 3); pass --resume latest to continue it" in message
    assert "--fresh" in message

    # The next run into OUT closes the run the killed process left RUNNING, saying why.
    assert tracking.run_status(uri, run_id) == "RUNNING"
    close_abandoned_runs(out, uri, None, [run_id])
    run = tracking.client(uri).get_run(run_id)
    assert run.info.status == "KILLED" and "its process ended with the run open" in run.data.tags[ENDED_BY_TAG]
    # A run that ended is left as it is.
    finished = tracking.start_run(uri, "previous-test", "finished")
    tracking.end_run(uri, finished)
    _record(out, finished, cfg, storage.join(root, name))
    close_abandoned_runs(out, uri, None, [run_id, finished])
    assert tracking.run_status(uri, finished) == "FINISHED"

    # --resume latest takes the newest complete checkpoint; with --fresh the local outputs go.
    latest = load_config(None, ["trainer.resume_from=latest"])
    assert latest.trainer.resume_from == "latest"  # not made a path in the working directory
    start = decide_start(out, latest)
    assert start.resume_from == kept[1] and start.config(latest).trainer.resume_from == kept[1]
    assert latest.trainer.resume_from == "latest"  # the decision changes no config in place
    remove_earlier_outputs(decide_start(out, cfg, fresh=True))
    assert not (out / "ray_results").exists() and not RunFolder(out).run_record.exists()


def test_a_finished_runs_checkpoint_comes_first_and_a_folder_without_one_says_so(tmp_path):
    out = tmp_path / "out"
    cfg = load_config(None)
    source = chain_checkpoint(tmp_path / "src")
    _killed_run(out, storage.join(*run_storage(cfg, out)), cfg, source)
    shutil.copytree(source, out / "checkpoint")
    (out / "train.json").write_text("{}")
    latest = load_config(None, ["trainer.resume_from=latest"])
    assert decide_start(out, latest).resume_from == str(out / "checkpoint")  # the same step: the local copy

    bare = tmp_path / "bare"  # a run killed before its first checkpoint, or one made by hand
    (bare / "ray_results" / "convsts").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="it left no complete checkpoint to resume: --fresh to start over"):
        decide_start(bare, cfg)
    with pytest.raises(ConfigError, match=f"--resume latest: {bare} records no run with a complete checkpoint"):
        decide_start(bare, latest)


def test_a_run_record_that_is_not_ours_is_refused_naming_it(tmp_path):
    RunFolder(tmp_path).run_record.write_text("[1, 2]")
    with pytest.raises(DamagedRecord, match=f"{RunFolder(tmp_path).run_record}: not a run record this version reads"):
        decide_start(tmp_path, load_config(None))


def test_a_killed_run_in_a_bucket_is_found_from_its_record_and_read_in_large_requests(tmp_path):
    """The case of a cluster run: OUT holds only run.json, the checkpoints are in the run's own folder
    in a bucket. The plain rerun is refused naming the newest complete one; `--resume latest` finds
    it; reading it (as `--resume`, `evaluate --checkpoint` and `load` do) costs about one
    request per 8 MiB of each file."""
    from convsts.models.checkpoint import load_train_state, verified_folder
    from convsts.models.sentence_encoder import load

    with s3_endpoint("convsts-resume"):
        cfg = load_config(None, ["trainer.storage_path=s3://convsts-resume/runs", "name=long"])
        out = tmp_path / "out"
        root, key = run_storage(cfg, out)
        source = chain_checkpoint(tmp_path / "src", bigram_buckets=400_000)  # 400k x 16 floats: a 25.6 MB table
        kept = _killed_run(out, storage.join(root, key), cfg, source)
        record = json.loads(RunFolder(out).run_record.read_text())["runs"]
        assert [(r["storage"], r["base"], r["folder"]) for r in record] == [
            (f"s3://convsts-resume/runs/long/{key}", "storage_path", f"long/{key}")
        ]

        with pytest.raises(FileExistsError) as refused:
            decide_start(out, cfg)
        message = str(refused.value)
        assert f"checkpoints in s3://convsts-resume/runs/long/{key}" in message
        assert f"its newest complete checkpoint is {kept[1]} (step 3); pass --resume latest" in message
        latest = load_config(
            None, ["trainer.storage_path=s3://convsts-resume/runs", "name=long", "trainer.resume_from=latest"]
        )
        sizes = {name: size for name, size, _ in storage.folder_stats(kept[1])}
        assert sizes["model.safetensors"] > 3 * 8 * 2**20
        # --resume latest reads the chosen checkpoint once (its files checked against their manifest's
        # sha256): into the local copy that every later read of it takes.
        with request_log() as seen:
            assert decide_start(out, latest).resume_from == kept[1]
        with request_log() as later:
            encoder = load(kept[1])
            assert load_train_state(kept[1]).step == 3  # from the local copy: no request
        assert encoder.encode("a man plays a guitar").shape == (6,)
        folder = kept[1].rsplit("/", 1)[1]
        reread = [p for m, p in later if m == "GET" and f"/{folder}/" in p and "?" not in p]
        assert reread == [], later  # no file of it read again
        with pytest.raises(
            BadInputError, match="not a complete checkpoint or model folder \\(train_state.pt is missing\\)"
        ):
            verified_folder(kept[2])  # the one cut short, named by hand
        # Each file in requests of 8 MiB (a HEAD, then the GETs); the two small files also once before,
        # as each run's newest complete checkpoint is found: its manifest (incomplete_reason), its step
        # and run (Checkpoint.at).
        owner = {"manifest.json": 2, "config.json": 2}
        for name, size in sizes.items():
            asked = [m for m, path in seen if path.endswith(f"{key}/{folder}/{name}")]
            assert asked and len(asked) <= math.ceil(size / (8 * 2**20)) + 2 + owner.get(name, 0), (name, size, asked)
        files = sum(math.ceil(s / (8 * 2**20)) + 2 for s in sizes.values()) + sum(owner.values())
        assert len(seen) <= files + 3, seen  # + listings
        assert keys(root)  # nothing was removed from the bucket
