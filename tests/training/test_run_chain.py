"""OUT's chain of runs, as users fail, copy and move it (real checkpoints, a real sqlite MLflow store,
the local S3 server): `--resume latest` is the newest complete checkpoint by step across every run
into OUT, a run killed before its first checkpoint hides none, a damaged run.json is refused naming
it, a moved OUT still resumes, a copied OUT reads and writes only its own folder."""

import json
import logging
import shutil
from pathlib import Path

import pytest
from testkit.checkpoints import chain_checkpoint
from testkit.s3_server import request_log, s3_endpoint

from convsts.io import storage
from convsts.io.errors import BadInputError, ConfigError
from convsts.models.checkpoint import folder_name
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.run_folder import RunFolder
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.lineage import (
    AlreadyFinished,
    DamagedRecord,
    RunStart,
    chain_runs,
    decide_start,
    join_chain,
    new_link,
    read_chain,
    remove_earlier_outputs,
    run_storage,
)
from convsts.ray_jobs.training.reporting import log_loss_curves

BUCKET = "s3://convsts-chain/runs"


def _run(out: Path, cfg, run_id: str, steps: list[int], source: Path, chain=(), cut: int | None = None) -> list[str]:
    """A run into OUT as `convsts train` makes it: it joins OUT's chain before its first step, then
    reports a complete checkpoint at each of `steps` (`cut`: one more whose upload stopped, no
    manifest). Returns the complete checkpoints' paths."""
    resumed = cfg.trainer.resume_from or ("x" if chain else "")  # a resumed run gets a folder of its own
    location = run_storage(RunStart(resumed, None, None).config(cfg), out)  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    join_chain(out, RunStart("", None, location, tuple(chain)), new_link(out, run_id, cfg, location))
    paths = []
    for step in [*steps, *([cut] if cut else [])]:
        local = chain_checkpoint(source / f"{run_id}-{step}", step=step, run_id=run_id)
        target = storage.join(*location, folder_name(step))
        storage.copy_tree(local, target)
        paths.append(target)
    if cut:
        storage.delete_file(storage.join(paths.pop(), "manifest.json"))
    return paths


@pytest.fixture(params=["local", "bucket"])
def where(request, tmp_path):
    """A run config whose checkpoints go to OUT/ray_results, or to a bucket (trainer.storage_path)."""
    if request.param == "local":
        yield load_config(None, ["name=long"])
        return
    with s3_endpoint("convsts-chain"):
        yield load_config(None, [f"trainer.storage_path={BUCKET}", "name=long"])


def _latest(cfg):
    latest = load_config(None, ["trainer.resume_from=latest", "name=long"])
    latest.trainer.storage_path = cfg.trainer.storage_path
    return latest


def test_a_resumed_run_that_dies_again_is_continued_from_its_own_newest_checkpoint(tmp_path, where):
    """A finishes at step 20 (OUT/checkpoint); B continues it to 60 and is killed after its step-35
    checkpoint, during the upload of step 40's. The next --resume latest continues B's step 35,
    written by B, not A's step 20; the plain command names it."""
    out, source = tmp_path / "out", tmp_path / "src"
    a = _run(out, where, "run-a", [10, 20], source)
    storage.copy_tree(a[-1], str(out / "checkpoint"))
    (out / "train.json").write_text(json.dumps({"mlflow_run_id": "run-a"}))
    b = _run(out, where, "run-b", [25, 35], source, chain=read_chain(out), cut=40)

    assert [k.run_id for k in read_chain(out)] == ["run-a", "run-b"]
    start = decide_start(out, _latest(where))
    assert (start.resume_from, start.continues) == (b[-1], "run-b")
    assert [k.run_id for k in start.chain] == ["run-a", "run-b"]
    with pytest.raises(FileExistsError) as refused:
        decide_start(out, where)
    assert f"its newest complete checkpoint is {b[-1]} (step 35); pass --resume latest" in str(refused.value)


def test_a_run_killed_before_its_first_checkpoint_leaves_the_earlier_ones_resumable(tmp_path, where, caplog):
    """A is killed after its step-10 checkpoint; B (--resume latest) is killed before its first. The
    plain command is refused naming A's step 10 (with a bucket too: never a silent restart),
    --resume latest continues it, and --fresh says what it removes."""
    out, source = tmp_path / "out", tmp_path / "src"
    a = _run(out, where, "run-a", [5, 10], source)
    _run(out, where, "run-b", [], source, chain=read_chain(out))

    with pytest.raises(FileExistsError) as refused:
        decide_start(out, where)
    message = str(refused.value)
    assert "an interrupted training run" in message and "\n" not in message
    assert f"its newest complete checkpoint is {a[-1]} (step 10)" in message
    start = decide_start(out, _latest(where))
    assert (start.resume_from, start.continues) == (a[-1], "run-a")

    with caplog.at_level(logging.INFO, logger="convsts"):
        remove_earlier_outputs(decide_start(out, where, fresh=True))
    assert not RunFolder(out).run_record.exists()
    if not where.trainer.storage_path:
        assert "--fresh: removed 2 complete checkpoint(s), up to step 10" in caplog.text
        assert not (out / "ray_results").exists()
    else:  # the runs' own folders in the bucket stay: --fresh reads no link
        assert "--fresh: removed 0 complete checkpoint(s)" in caplog.text
        assert storage.is_file(storage.join(a[-1], "manifest.json"))


@pytest.mark.parametrize(
    "damage",
    [
        "{}",
        '{"format": 3, "runs": [{"run_id": "a", "sto',
        "\xff\xfe",
        '{"format": 2, "runs": [{"run_id": "a"}]}',
        '{"format": 3, "runs": [{"run_id": "a", "storage": "s", "base": "out", "folder": "f", "ray_train_run": 7}]}',
    ],
)
def test_a_damaged_run_record_is_refused_in_one_line_naming_it(tmp_path, damage):
    out, source = tmp_path / "out", tmp_path / "src"
    cfg = load_config(None, ["name=long"])
    a = _run(out, cfg, "run-a", [5, 10], source)
    RunFolder(out).run_record.write_bytes(damage.encode("latin-1"))
    for asked in (cfg, _latest(cfg)):
        with pytest.raises(DamagedRecord) as refused:
            decide_start(out, asked)
        message = str(refused.value)
        assert (
            message.startswith(f"{RunFolder(out).run_record}: not a run record this version reads")
            and "\n" not in message
        )
        assert "--resume CHECKPOINT" in message and "--fresh" in message
        assert isinstance(refused.value, ConfigError)  # the commands' one line, exit 2
    named = load_config(None, ["name=long", f"trainer.resume_from={a[-1]}"])
    assert (decide_start(out, named).resume_from, decide_start(out, named).continues) == (a[-1], "run-a")
    remove_earlier_outputs(decide_start(out, cfg, fresh=True))
    assert not RunFolder(out).run_record.exists() and not (out / "ray_results").exists()


def test_a_moved_out_resumes_and_a_copied_out_reads_and_writes_only_itself(tmp_path):
    """The chain names OUT's folders relative to OUT, and the MLflow store in OUT names its artifact
    folder beside it: `mv OUT OUT2` resumes OUT2's checkpoints; in `cp -r OUT OUT3` a new run logs
    its artifacts into OUT3 and the original's store is unchanged."""
    out, source = tmp_path / "out", tmp_path / "src"
    cfg = load_config(None, ["name=long"])
    uri = tracking_uri("", out)
    run_id = tracking.start_run(uri, "chain", "a")
    (tmp_path / "plot.txt").write_text("a plot")
    tracking.log_artifact(uri, run_id, str(tmp_path / "plot.txt"))
    _run(out, cfg, run_id, [5, 10], source)

    copied = tmp_path / "copied"
    shutil.copytree(out, copied)
    moved = tmp_path / "moved"
    out.rename(moved)
    assert decide_start(moved, _latest(cfg)).resume_from == str(moved / "ray_results" / "long" / folder_name(10))

    out = moved
    shutil.rmtree(copied)
    shutil.copytree(out, copied)
    assert decide_start(copied, _latest(cfg)).resume_from == str(copied / "ray_results" / "long" / folder_name(10))
    copy_uri = tracking_uri("", copied)
    new = tracking.start_run(copy_uri, "chain", "b")
    tracking.log_artifact(copy_uri, new, str(tmp_path / "plot.txt"))
    assert (copied / "mlartifacts" / new / "artifacts" / "plot.txt").is_file()
    assert not (out / "mlartifacts" / new).exists()
    earlier = tracking.client(copy_uri).get_run(run_id).info.artifact_uri  # the copy's own artifacts
    assert earlier == (copied / "mlartifacts" / run_id / "artifacts").as_uri()
    moved_uri = tracking_uri("", out)  # the moved OUT's next run finds its own artifacts, untouched by the copy
    tracking.start_run(moved_uri, "chain", "c")
    assert (
        tracking.client(moved_uri).get_run(run_id).info.artifact_uri
        == (out / "mlartifacts" / run_id / "artifacts").as_uri()
    )


def test_the_loss_curves_follow_the_chain_back_through_runs_that_logged_nothing(tmp_path):
    """A run resumed from its chain's last step logs no point, and so does the run that continues it:
    OUT/loss_curves.png still shows the chain's steps, from the runs before them."""
    out = tmp_path / "out"
    uri = tracking_uri("", out)
    cfg = load_config(None, ["name=long", "trainer.steps=40"])
    first = tracking.start_run(uri, "chain", "a")
    for step in (10, 20, 30, 40):
        tracking.log_metrics(uri, first, {"reddit/loss": 4.0 - step / 40, "snli/loss": 1.1}, step)
    middle = tracking.start_run(uri, "chain", "b")
    last = tracking.start_run(uri, "chain", "c")
    chain = []
    for run_id in (first, middle, last):  # each joins OUT/run.json, the one record of the chain
        chain = [*chain, new_link(out, run_id, cfg, run_storage(cfg, out, run_id))]
        join_chain(out, RunStart("", None, run_storage(cfg, out), tuple(chain[:-1])), chain[-1])
    assert chain_runs(out, last) == [first, middle, last] and chain_runs(out, middle) == [first, middle]
    log_loss_curves(cfg, uri, last, out)
    assert (out / "loss_curves.png").stat().st_size > 0
    logged = tracking.client(uri).list_artifacts(last, "plots")
    assert [a.path for a in logged] == ["plots/loss_curves.png"]


def test_a_link_outside_out_or_the_storage_path_is_refused_in_one_line(tmp_path):
    """A record whose folder leaves its base (another run's OUT, an absolute path, a URI) is refused
    naming the entry: a run resumes only checkpoints of its own chain."""
    out, source = tmp_path / "out", tmp_path / "src"
    cfg = load_config(None, ["name=long"])
    _run(out, cfg, "run-a", [5], source)
    record = json.loads(RunFolder(out).run_record.read_text())
    for folder in ("../other/ray_results/long", str(tmp_path / "other"), "s3://elsewhere/long/k"):
        record["runs"][0]["folder"] = folder
        RunFolder(out).run_record.write_text(json.dumps(record))
        with pytest.raises(DamagedRecord) as refused:
            decide_start(out, _latest(cfg))
        message = str(refused.value)
        assert f"runs[0].folder {folder!r} lies outside OUT" in message and "\n" not in message


def test_a_fallback_an_incomplete_final_checkpoint_and_a_damaged_config_are_each_one_line(tmp_path, caplog):
    """--resume latest says where it does not take the last run's newest (its checkpoints cut short)
    and that it skipped an incomplete OUT/checkpoint; a named checkpoint whose config.json is not
    JSON is refused in one line naming the file."""
    out, source = tmp_path / "out", tmp_path / "src"
    cfg = load_config(None, ["name=long"])
    a = _run(out, cfg, "run-a", [10, 20], source)
    _run(out, cfg, "run-b", [], source, chain=read_chain(out), cut=30)  # B's only checkpoint: cut short
    storage.copy_tree(a[-1], str(out / "checkpoint"))
    (out / "checkpoint" / "manifest.json").unlink()  # a final copy that stopped
    with caplog.at_level(logging.INFO, logger="convsts"):
        start = decide_start(out, _latest(cfg))
    assert (start.resume_from, start.continues) == (a[-1], "run-a")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith(f"{out / 'checkpoint'}: skipped, not a complete checkpoint (no manifest.json") for m in warned
    )
    assert any(
        m.endswith(
            "skipped, not a complete checkpoint (no manifest.json (written last, once every file of the checkpoint is in place))"
        )
        and "checkpoint-30" in m
        for m in warned
    )
    assert [m for m in warned if "falls" in m or "continuing run" in m] == [
        f"--resume latest: the last run into {out} (run-b) left no newer complete checkpoint; "
        "continuing run run-a's at step 20"
    ]
    assert start.chain_run_ids == ("run-a", "run-b")  # neither's logged steps are logged again

    damaged = Path(a[0])
    (damaged / "config.json").write_text("{not json")
    named = load_config(None, ["name=long", f"trainer.resume_from={damaged}"])
    with pytest.raises(BadInputError) as refused:
        decide_start(out, named)
    assert str(refused.value).startswith(f"{damaged / 'config.json'}: not a checkpoint's config")
    assert "\n" not in str(refused.value)


def test_fresh_and_a_named_checkpoint_read_no_links_folder(tmp_path):
    """--fresh and --resume CHECKPOINT decide without reading any run's folder: an old run's bucket
    (unreachable, say) is never asked; --resume latest reads it."""
    out, source = tmp_path / "out", tmp_path / "src"
    with s3_endpoint("convsts-chain"):
        cfg = load_config(None, [f"trainer.storage_path={BUCKET}", "name=long"])
        a = _run(out, cfg, "run-a", [5, 10], source)
        local = chain_checkpoint(tmp_path / "mine", step=4)
        named = load_config(None, [f"trainer.storage_path={BUCKET}", "name=long", f"trainer.resume_from={local}"])
        with request_log() as seen:
            fresh = decide_start(out, cfg, fresh=True)
            chosen = decide_start(out, named)
        assert seen == [] and fresh.chain == () and fresh.fresh_removes == (RunFolder(out).run_record,)
        assert chosen.resume_from == str(local) and [k.run_id for k in chosen.chain] == ["run-a"]
        with request_log() as seen:
            assert decide_start(out, _latest(cfg)).resume_from == a[-1]
        assert seen


def test_resume_latest_on_a_finished_out_says_so_and_exits_0_without_ray(tmp_path):
    """A finished run's OUT, resumed to the same trainer.steps: one line naming the step and what
    to raise, exit 0, nothing written and no Ray started (RAY_ADDRESS names a port where nothing
    listens: joining it would fail)."""
    from testkit.faults import run_python

    out, source = tmp_path / "out", tmp_path / "src"
    cfg = load_config(None, ["name=long"])
    a = _run(out, cfg, "run-a", [10, 20], source)
    storage.copy_tree(a[-1], str(out / "checkpoint"))
    (out / "train.json").write_text(json.dumps({"mlflow_run_id": "run-a"}))
    latest = load_config(None, ["trainer.resume_from=latest", "name=long", "trainer.steps=20"])
    with pytest.raises(AlreadyFinished, match="already finished at step 20 .*; raise trainer.steps to go on"):
        decide_start(out, latest)
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*") if p.suffix != ".lock")
    done = run_python(
        "-m", "convsts", "train", "--out", str(out), "--resume", "latest", "name=long", "trainer.steps=20",
        env={"RAY_ADDRESS": "127.0.0.1:9"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "already finished" in line]
    assert len(said) == 1, done.stderr[-2000:]
    assert said[0].endswith(f"{out}: already finished at step 20 ({out / 'checkpoint'}); raise trainer.steps to go on")
    after = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*") if p.suffix != ".lock")
    assert [p for p in after if p not in before and not str(p[0]).startswith(("mlflow.db", "mlartifacts"))] == []


def test_a_link_under_another_storage_path_is_not_looked_at_and_says_so(tmp_path, caplog):
    """A run recorded under one trainer.storage_path, resumed with another: its folder cannot be
    rebuilt from this run's config, so it is not looked at, in one line naming the run."""
    out, source = tmp_path / "out", tmp_path / "src"
    with s3_endpoint("convsts-chain"):
        cfg = load_config(None, [f"trainer.storage_path={BUCKET}", "name=long"])
        _run(out, cfg, "run-a", [5], source)
        moved = load_config(None, ["trainer.storage_path=s3://convsts-chain/elsewhere", "name=long"])
        with caplog.at_level(logging.INFO, logger="convsts"), pytest.raises(ConfigError, match="records no run"):
            decide_start(out, _latest(moved))
    said = [r.getMessage() for r in caplog.records if "not looked at" in r.getMessage()]
    assert said == [
        f"{RunFolder(out).run_record}: run run-a's checkpoints ({BUCKET}/long/{read_chain(out)[0].folder.split('/')[-1]}) "
        "are not looked at: they are under another trainer.storage_path than this run's "
        "(trainer.storage_path=s3://convsts-chain/elsewhere)"
    ]


def test_a_damaged_newest_checkpoint_falls_back_like_a_missing_file_and_a_named_one_stays_refused(
    tmp_path, where, caplog
):
    """--resume latest takes a checkpoint whose file differs from its manifest's sha256 (bytes flipped
    in place: its size unchanged) as it takes one missing a file: skipped in one line saying which and
    why, and the run's next older complete checkpoint resumed; `--resume` naming it is refused."""
    from convsts.ray_jobs.training.start_checks import check_initial_weights

    out, source = tmp_path / "out", tmp_path / "src"
    a = _run(out, where, "run-a", [10, 20, 30], source)
    weights = storage.join(a[-1], "model.safetensors")
    data = bytearray(storage.read_bytes(weights))
    data[-16:] = bytes(255 - b for b in data[-16:])
    storage.write_bytes(weights, bytes(data))
    storage.delete_file(storage.join(a[-2], "model.safetensors"))  # the one before: a file missing
    with caplog.at_level(logging.INFO, logger="convsts"):
        start = decide_start(out, _latest(where))
    assert (start.resume_from, start.continues) == (a[0], "run-a")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned[0] == (
        f"{a[-1]}: skipped, its model.safetensors differs from its manifest's sha256 (replaced or damaged after "
        "it was written)"
    ), warned
    assert warned[1].startswith(f"{a[-2]}: skipped, not a complete checkpoint (") and len(warned) == 2, warned
    named = load_config(None, ["name=long", f"trainer.resume_from={a[-1]}"])
    named.trainer.storage_path = where.trainer.storage_path
    with pytest.raises(BadInputError, match="model.safetensors differs from its manifest's sha256"):
        check_initial_weights(decide_start(out, named).config(named))


def test_an_older_checkpoint_resumed_with_other_settings_logs_the_steps_after_it_and_supersedes_the_rest(
    tmp_path, mlflow_uri, caplog
):
    """The chain logged to step 100; checkpoint-10 resumed with another learning rate (a new
    trajectory): the history is the chain's up to step 10 only, the run logs every step after it, and
    the chain's runs that logged past it are tagged superseded there by the new run. The same
    checkpoint with only trainer.steps raised goes on as its run would have: the chain's steps stay
    history, and none is logged again."""
    from convsts.ray_jobs.tracking.runs import chain_logged
    from convsts.ray_jobs.training.lineage import SUPERSEDED_TAG, mark_superseded
    from convsts.ray_jobs.training.start_checks import history_until
    from convsts.ray_jobs.training.worker import worker_hooks

    out, source = tmp_path / "out", tmp_path / "src"
    client = tracking.client(mlflow_uri)
    experiment = client.create_experiment("older-checkpoint-other-settings")
    first, second, new = (client.create_run(experiment).info.run_id for _ in range(3))
    cfg = load_config(None, ["name=long"])
    a = _run(out, cfg, first, [10, 20], source)
    _run(out, cfg, second, [60], source, chain=read_chain(out))
    for step in range(5, 101, 5):  # the chain's losses: the first run to 30, the second from 25 on
        tracking.log_metrics(mlflow_uri, first if step <= 30 else second, {"reddit/loss": 1.0 / step}, step)
    same = load_config(None, ["name=long", "trainer.steps=200", f"trainer.resume_from={a[0]}"])
    assert history_until(same) is None
    resumed = decide_start(out, same)  # an older checkpoint of the chain, named: it continues its run
    assert resumed.continues == first and resumed.chain_run_ids == (first, second)
    other = load_config(
        None, ["name=long", "trainer.stages=[{start_step: 0, batch_size: 128, lr: 0.5}]", f"trainer.resume_from={a[0]}"]
    )
    assert history_until(other) == 10
    start = decide_start(out, other)
    assert start.continues == first and start.chain_run_ids == (first, second)
    assert mark_superseded(mlflow_uri, new, start, 10) == [first, second]
    for run_id in (first, second):
        tags = client.get_run(run_id).data.tags
        assert tags[SUPERSEDED_TAG] == "10" and tags["convsts.superseded_by"] == new
    # The new run's hooks log every step after 10; before it, none.
    chain = [start.continues, *start.chain_run_ids]
    loop_config = {"tracking_uri": mlflow_uri, "run_id": new, "continues": first}
    hooks = worker_hooks(
        {**loop_config, "chain_logged": chain_logged(mlflow_uri, new, chain, 10)},
        load_config(None, ["trainer.eval_every=0"]),
        None,
        None,
        0,
    )
    for step in (10, 15, 30, 95):
        hooks.log({"reddit/loss": 2.0}, step)
    assert sorted(m.step for m in client.get_metric_history(new, "reddit/loss")) == [15, 30, 95]
    # Without a new trajectory the chain's steps are history: none logged again.
    again = client.create_run(experiment).info.run_id
    logged = chain_logged(mlflow_uri, again, chain, None)
    hooks = worker_hooks(
        {**loop_config, "run_id": again, "chain_logged": logged},
        load_config(None, ["trainer.eval_every=0"]),
        None,
        None,
        0,
    )
    for step in (15, 95, 105):
        hooks.log({"reddit/loss": 2.0}, step)
    assert [m.step for m in client.get_metric_history(again, "reddit/loss")] == [105]
