"""Prepared folders that are damaged, half-written or prepared otherwise than a run expects: refused
before any work, naming the folder and what differs."""

import json
import os

import pandas as pd
import pytest
from testkit.faults import REPO, run_convsts

from convsts.io.errors import BadInputError
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks.prepared_folder import copy_prepared, verify_prepared


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_manifest", "has shards but no manifest.json: an interrupted or older `convsts prepare`"),
        ("missing_shard", "shards do not match"),
        ("extra_shard", "shards do not match"),
        ("corrupt_shard", "not a readable parquet file"),
        # Other rows of the same count: a byte of the data changed (size, rows and footer as written), or
        # the shard rewritten with its labels all 0 and premises reversed.
        ("other_bytes", r"snli/train/.*\.parquet: its bytes differ from the shard `prepare` wrote \(sha256\); delete "),
        ("other_rows", r"snli/train/.*\.parquet: (its bytes differ|\d+ bytes, the manifest says)"),
        # A folder whose manifest was made to match rows the task cannot read: one line naming the shard.
        ("label_out_of_range", r"\.parquet: row 0: label 7 is not a class of task snli \(0-2\); delete "),
        ("column_missing", r"\.parquet: no column\(s\) \['hypothesis'\], which task snli reads; delete "),
        # A hand-edited manifest: one line naming the entry, not a KeyError or TypeError.
        ("shard_without_rows", r"manifest.json: shards.train\[0\]: no int 'rows'; delete "),
        ("input_without_size", r"manifest.json: input_files\[0\]: no int 'size'; delete "),
        ("manifest_a_list", r"manifest.json: not a JSON object but list; delete "),
    ],
)
def test_a_damaged_prepared_folder_is_refused(sample_prepared, tmp_path, damage, message):
    import shutil

    from convsts.ray_jobs.tasks import get_task

    root = tmp_path / "p"
    shutil.copytree(sample_prepared / "snli", root / "snli")  # the session's sample stays intact
    snli = get_task("snli")
    verify_prepared(snli, str(root))  # intact: accepted
    shard = sorted((root / "snli" / "train").glob("*.parquet"))[0]
    if damage == "no_manifest":
        (root / "snli" / "manifest.json").unlink()
    elif damage == "missing_shard":
        shard.unlink()
    elif damage == "extra_shard":
        shutil.copy(shard, shard.with_name("zz-extra.parquet"))
    elif damage in ("shard_without_rows", "input_without_size", "manifest_a_list"):
        path = root / "snli" / "manifest.json"
        manifest = json.loads(path.read_text())
        if damage == "shard_without_rows":
            del manifest["shards"]["train"][0]["rows"]
        elif damage == "input_without_size":
            del manifest["input_files"][0]["size"]
        else:
            manifest = [manifest]
        path.write_text(json.dumps(manifest))
    elif damage == "other_bytes":
        data = bytearray(shard.read_bytes())
        data[len(data) // 3] ^= 0xFF  # inside the column data; the footer (rows) stays readable
        shard.write_bytes(bytes(data))
    elif damage == "other_rows":
        frame = pd.read_parquet(shard)
        frame["label"], frame["premise"] = 0, frame["premise"].str[::-1]
        frame.to_parquet(shard)
    elif damage in ("label_out_of_range", "column_missing"):
        from convsts.ray_jobs.tasks.prepared_folder import shard_record

        frame = pd.read_parquet(shard)
        if damage == "label_out_of_range":
            frame.loc[0, "label"] = 7
        else:
            frame = frame.drop(columns=["hypothesis"])
        frame.to_parquet(shard)
        path = root / "snli" / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["shards"]["train"] = [shard_record(str(f)) for f in sorted(shard.parent.glob("*.parquet"))]
        path.write_text(json.dumps(manifest))
    else:
        shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(BadInputError, match=message):
        verify_prepared(snli, str(root))


def test_a_shard_listed_as_prepare_wrote_it_is_not_read_again_and_a_copy_is_read_for_its_sha256(
    sample_prepared, tmp_path, caplog
):
    """A run's check reads a shard whole for its sha256 only where the store lists it at another
    size or time than `prepare` recorded (the manifest's `shard_times`): a folder trained from where
    it was prepared (at paper scale, a bucket) is not downloaded on every start. A copy with new
    times is read for its sha256, on every run, and one line says so; a rewrite is refused."""
    import shutil

    from convsts.ray_jobs.tasks import get_task

    snli = get_task("snli")
    root = tmp_path / "p"
    shutil.copytree(sample_prepared / "snli", root / "snli")  # sizes and times kept
    shards = sorted((root / "snli" / "train").glob("*.parquet"))
    manifest = json.loads((root / "snli" / "manifest.json").read_text())
    assert sorted(manifest["shard_times"]["train"]) == [s.name for s in shards]
    with caplog.at_level("INFO", logger="convsts"):
        verify_prepared(snli, str(root))
    assert "read whole for their sha256" not in caplog.text
    # Its bytes are not read: a byte changed with the size and time put back (which no writer does)
    # passes, as `make` and `rsync` take a file at its recorded size and time for unchanged.
    stat, data = shards[0].stat(), bytearray(shards[0].read_bytes())
    data[len(data) // 3] ^= 0xFF
    shards[0].write_bytes(bytes(data))
    os.utime(shards[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    verify_prepared(snli, str(root))
    os.utime(shards[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # listed at another time: read, refused
    with pytest.raises(BadInputError, match=r"its bytes differ from the shard `prepare` wrote \(sha256\)"):
        verify_prepared(snli, str(root))
    # copy_prepared (mine-negatives' copy of the other tasks) gives the copies of the shards listed as
    # written their new times, and not the changed one's: that copy is still read, and refused.
    copy_prepared(str(root / "snli"), str(tmp_path / "relay" / "snli"))
    relayed = json.loads((tmp_path / "relay" / "snli" / "manifest.json").read_text())["shard_times"]["train"]
    assert sorted(relayed) == [s.name for s in shards[1:]]
    with pytest.raises(BadInputError, match=rf"{shards[0].name}: its bytes differ from the shard `prepare` wrote"):
        verify_prepared(snli, str(tmp_path / "relay"))
    # A copy with new times (cp, a fresh download): every shard read for its sha256, one line saying so.
    copy = tmp_path / "copy"
    (copy / "snli" / "train").mkdir(parents=True)
    shutil.copyfile(sample_prepared / "snli" / "manifest.json", copy / "snli" / "manifest.json")
    for shard in shards:
        shutil.copyfile(sample_prepared / "snli" / "train" / shard.name, copy / "snli" / "train" / shard.name)
    caplog.clear()
    with caplog.at_level("INFO", logger="convsts"):
        verify_prepared(snli, str(copy))
    assert f"{copy / 'snli'}: {len(shards)} shard(s) listed at other times than `prepare` wrote them" in caplog.text
    data = bytearray((copy / "snli" / "train" / shards[1].name).read_bytes())
    data[len(data) // 3] ^= 0xFF
    (copy / "snli" / "train" / shards[1].name).write_bytes(bytes(data))
    with pytest.raises(BadInputError, match=rf"{shards[1].name}: its bytes differ from the shard `prepare` wrote"):
        verify_prepared(snli, str(copy))


@pytest.mark.slow
def test_a_folder_prepared_with_other_filters_or_split_is_refused_before_any_run(sample_prepared, tmp_path):
    from convsts.ray_jobs.tasks import get_task

    reddit = get_task("reddit")
    assert verify_prepared(reddit, str(sample_prepared), load_config(None))["split_salt"] == "convsts"  # same settings
    out = tmp_path / "run"
    result = run_convsts(
        "train",
        "--out",
        str(out),
        "--prepared",
        str(sample_prepared),
        "filters.max_chars=200",
        "data.split_salt=other",
        "trainer.steps=2",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("convsts train: ") and f"{sample_prepared / 'reddit' / 'manifest.json'}: prepared with " in last
    )
    assert "data.split_salt='convsts' (this run: 'other'); filters.max_chars=350 (this run: 200)" in last
    assert "Traceback" not in result.stderr
    # Refused before the run exists: no MLflow run, no checkpoint, no Ray Train folder.
    assert not out.exists()  # nothing written: the folder made for the run went with its lock


def test_a_folder_prepared_from_other_raw_inputs_is_refused_before_any_run(ray_session, tmp_path):
    """Guards: a prepared folder was checked against the run's settings but not its raw inputs, so
    `convsts train --config B --out R --fresh` after a run of config A into R trained on A's data
    (R/prepared) without a word. The manifest now records each raw file's size and time, and a run
    whose inputs are other files (by name and size), or files changed in place since, is refused
    before it starts. The same bytes copied anew to the same place are accepted by their sha256, and
    a copy elsewhere with the same name and size must hold those bytes too."""
    import hashlib
    import shutil

    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.driver import run_training

    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(REPO / "datasets" / "sample" / "snli_train.parquet", raw / "a.parquet")
    shutil.copy(raw / "a.parquet", raw / "b.parquet")
    snli = get_task("snli")

    def config(path):
        return load_config(
            None, [f"data.snli_train={path}", "trainer.task_weights={snli: 1.0}", "trainer.eval_every=0"]
        )

    prepared = tmp_path / "p"
    manifest = snli.prepare([str(raw / "a.parquet")], str(prepared / "snli"), config(raw / "a.parquet"))
    assert [r["file"] for r in manifest["input_files"]] == [str(raw / "a.parquet")]
    verify_prepared(snli, str(prepared), config(raw / "a.parquet"))  # the same file: accepted
    verify_prepared(snli, str(prepared), config(tmp_path / "elsewhere.parquet"))  # not on this machine: not compared
    size = (raw / "a.parquet").stat().st_size
    with pytest.raises(
        BadInputError,
        match=rf"prepared from other raw inputs than this run's: other files: 1 of the "
        rf"folder's not among this run's \(a.parquet \({size} bytes\)\), 1 of this run's",
    ):
        verify_prepared(snli, str(prepared), config(raw / "b.parquet"))
    (tmp_path / "copy").mkdir()  # the same file elsewhere (a submitted job's copy of the project): the same input
    shutil.copy(raw / "a.parquet", tmp_path / "copy" / "a.parquet")
    verify_prepared(snli, str(prepared), config(tmp_path / "copy" / "a.parquet"))
    copied = bytearray((tmp_path / "copy" / "a.parquet").read_bytes())
    copied[len(copied) // 3] ^= 0xFF  # a copy with the same name and size but other bytes is another input
    (tmp_path / "copy" / "a.parquet").write_bytes(bytes(copied))
    with pytest.raises(
        BadInputError,
        match=r"other raw inputs than this run's: .*copy/a.parquet: the name and size of "
        r"a file the folder was prepared from, other bytes \(sha256 [0-9a-f]{12}, "
        r"prepared [0-9a-f]{12}\)",
    ):
        verify_prepared(snli, str(prepared), config(tmp_path / "copy" / "a.parquet"))
    # The same bytes copied anew (a fresh copy of the data: same size, a new time) are the same input:
    # the manifest holds each local file's sha256.
    assert manifest["input_files"][0]["sha256"] == hashlib.sha256((raw / "a.parquet").read_bytes()).hexdigest()
    stat = (raw / "a.parquet").stat()
    os.utime(raw / "a.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    verify_prepared(snli, str(prepared), config(raw / "a.parquet"))
    data = bytearray((raw / "a.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF  # rewritten since: the same size, other bytes
    (raw / "a.parquet").write_bytes(bytes(data))
    out = tmp_path / "run"
    with pytest.raises(
        BadInputError,
        match=r"a.parquet changed since it was prepared \(size (\d+) -> \1, modified "
        r".* -> .*, other bytes\)",
    ):
        run_training(config(raw / "a.parquet"), out, prepared_dir=prepared)
    assert not out.exists()  # refused before the run exists: the folder made for it went with its lock
    del manifest["input_files"][0]["sha256"]  # a folder prepared before digests were recorded: the time decides
    (prepared / "snli" / "manifest.json").write_text(json.dumps(manifest))
    os.utime(raw / "a.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    verify_prepared(snli, str(prepared), config(raw / "a.parquet"))
    os.utime(raw / "a.parquet", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(
        BadInputError,
        match=r"a.parquet changed since it was prepared \(size (\d+) -> \1, modified "
        r"[^,]*\)",
    ):
        verify_prepared(snli, str(prepared), config(raw / "a.parquet"))


@pytest.mark.slow
def test_a_checkpoint_is_not_scored_on_a_folder_split_otherwise_than_its_training_run(sample_prepared, tmp_path):
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import build_model, read_meta, save_checkpoint
    from convsts.ray_jobs.pipelines.evaluate import check_held_out, run_evaluation
    from convsts.ray_jobs.tasks import get_task

    reddit = get_task("reddit")
    manifest = verify_prepared(reddit, str(sample_prepared))
    tiny = [
        "model.dan.output_dim=6",
        "model.dan.embedding_dim=4",
        "model.dan.hidden_sizes=[4]",
        "tokenizer.bigram_buckets=11",
    ]
    tok = DanTokenizer.build(count_words(["a b c"]), load_config(None, tiny).tokenizer)
    checkpoints = {}
    for name, extra in (
        ("same", []),
        ("salted", ["data.split_salt=other"]),
        ("share", ["data.test_share=0.2"]),
        ("snli_only", ["data.split_salt=other", "trainer.task_weights={snli: 1.0}"]),
    ):
        cfg = load_config(None, tiny + extra)
        checkpoints[name] = str(save_checkpoint(tmp_path / name, build_model(cfg.model, tok), tok, cfg.to_dict()))
    for name in ("same", "snli_only"):  # split as in training, or never trained on Reddit: scored
        check_held_out(reddit, manifest, str(sample_prepared), checkpoints[name], read_meta(checkpoints[name]))
    with pytest.raises(BadInputError, match=r"test_share=0.1 \(.*share trained with: 0.2\)"):
        check_held_out(reddit, manifest, str(sample_prepared), checkpoints["share"], read_meta(checkpoints["share"]))
    with pytest.raises(
        BadInputError,
        match=r"reddit/manifest.json: held out with data.split_salt='convsts' "
        r"\(.*salted trained with: 'other'\); its held-out rows may be in the "
        r"checkpoint's training data",
    ):
        run_evaluation(
            load_config(None),
            tmp_path / "eval",
            checkpoints["salted"],
            prepared_dir=sample_prepared,
            log_to_mlflow=False,
        )
    assert not (tmp_path / "eval").exists()  # refused before anything is written


def _counted_folder(root):
    """A Reddit folder prepared in this process from a small pushshift dump (no Ray)."""
    from testkit.faults import dump_lines

    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.tasks.prepared_folder import prepare_into

    (root / "raw").mkdir(parents=True)
    (root / "raw" / "RC_2015-01").write_bytes(dump_lines(60) + b"not json\n")
    prepare_into(get_task("reddit"), [str(root / "raw" / "RC_2015-01")], str(root / "p" / "reddit"), load_config(None))
    return root / "p"


@pytest.mark.parametrize(
    "key, edit, message",
    [
        ("train_pairs", lambda n: n + 1, r"train_pairs=\d+ but its shards hold \d+ rows"),
        ("pairs", lambda n: n - 1, r"pairs=\d+ but its shards hold \d+ rows"),
        ("lines_read", lambda n: n + 5, r"lines_read=66 but what its lines became \(malformed, .*\) adds up to 61"),
        ("malformed", lambda n: 0, r"lines_read=61 but what its lines became .* adds up to 60"),
        (
            "unpaired_by_reason",
            lambda d: {**d, "unpaired_parent_missing": 9},
            r"unpaired=\d+ but unpaired_by_reason adds up",
        ),
        ("lines_read", lambda n: str(n), r"lines_read: not a count \('61'\)"),
    ],
)
def test_a_manifest_whose_counts_disagree_with_its_shards_is_refused_naming_the_key(tmp_path, key, edit, message):
    from convsts.ray_jobs.tasks import get_task

    prepared = _counted_folder(tmp_path)
    reddit = get_task("reddit")
    verify_prepared(reddit, str(prepared))  # as written: accepted
    path = prepared / "reddit" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest[key] = edit(manifest[key])
    path.write_text(json.dumps(manifest))
    with pytest.raises(BadInputError, match=f"manifest.json: {message}"):
        verify_prepared(reddit, str(prepared))


def test_train_and_evaluate_refuse_a_folder_whose_counts_were_edited_in_one_line(tmp_path):
    from testkit.faults import tiny_checkpoint

    prepared = _counted_folder(tmp_path)
    path = prepared / "reddit" / "manifest.json"
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "train_pairs": manifest["train_pairs"] + 1}))
    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    train = ("train", "--out", str(tmp_path / "run"), "--prepared", str(prepared), "trainer.task_weights={reddit: 1.0}")
    evaluate = ("evaluate", "--checkpoint", str(checkpoint), "--prepared", str(prepared), "--out", str(tmp_path / "ev"))
    for args in (train, evaluate):
        result = run_convsts(*args)
        lines = [line for line in result.stderr.splitlines() if line.startswith(f"convsts {args[0]}: ")]
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
        assert f"{path}: train_pairs={manifest['train_pairs'] + 1} but its shards hold" in lines[0], lines
        assert "Traceback" not in result.stderr
