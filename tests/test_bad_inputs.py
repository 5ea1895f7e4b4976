"""Bad inputs and faults (issue: nothing lost silently, no silent resume). Each case names what it
guards; every one failed on the code before it was fixed."""

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import zstandard

from convsts.io import errors
from convsts.io.compression import open_lines
from convsts.io.errors import BadInputError, ConfigError
from convsts.ray_jobs.config.schema import load_config
from convsts.ray_jobs.tasks.prepared_folder import verify_prepared

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO / "tests")}


def _dump_lines(n: int) -> bytes:
    rows = [
        {
            "id": f"c{i}",
            "parent_id": f"t1_c{i - 1}" if i % 2 else "t3_x",
            "link_id": f"t3_{i // 2}",
            "author": "someone",
            "body": f"comment number {i} with a few words",
            "subreddit": "test",
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _cut_zst(path: Path, share: float = 0.6) -> Path:
    data = zstandard.ZstdCompressor().compress(_dump_lines(20000))
    path.write_bytes(data[: int(len(data) * share)])
    return path


def _run(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        cwd=cwd or REPO,
        timeout=300,
    )


# ---- 1. truncated or corrupt .zst


def test_truncated_zst_raises_naming_the_file_and_offset(tmp_path):
    cut = _cut_zst(tmp_path / "RC_cut.zst")
    with pytest.raises(
        BadInputError, match=r"RC_cut.zst: truncated zstd file: the data ends inside a frame at byte \d+"
    ):
        sum(1 for _ in open_lines(str(cut)))
    corrupt = bytearray(zstandard.ZstdCompressor().compress(_dump_lines(2000)))
    corrupt[40:60] = b"\x00" * 20
    (tmp_path / "RC_bad.zst").write_bytes(bytes(corrupt))
    with pytest.raises(BadInputError, match="RC_bad.zst: corrupt zstd data near byte"):
        sum(1 for _ in open_lines(str(tmp_path / "RC_bad.zst")))
    whole = zstandard.ZstdCompressor().compress(_dump_lines(10)) + zstandard.ZstdCompressor().compress(_dump_lines(5))
    (tmp_path / "RC_two.zst").write_bytes(whole)  # two frames, both read
    assert sum(1 for _ in open_lines(str(tmp_path / "RC_two.zst"))) == 15


@pytest.mark.slow
def test_prepare_on_a_truncated_zst_fails_in_one_line_and_writes_no_shards(tmp_path):
    cut = _cut_zst(tmp_path / "RC_2015-01.zst")
    out = tmp_path / "prepared"
    # Through Ray Data (data.dump_local_bytes=0): the failed read task's error reaches the driver as one line.
    result = _run(
        "-m",
        "convsts",
        "prepare",
        "reddit",
        "--input",
        str(cut),
        "--out",
        str(out),
        "data.dump_local_bytes=0",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    # The command's own report is one line, and Ray Data's log of the failed task is not printed.
    assert last.startswith("convsts prepare: ") and "RC_2015-01.zst: truncated zstd file" in last
    assert "Traceback" not in result.stdout + result.stderr and "internal code" not in result.stdout + result.stderr
    assert not list(out.rglob("*.parquet")) and not (out / "manifest.json").exists()


def test_prepare_on_a_truncated_zst_in_the_local_engine_fails_in_one_line_and_leaves_nothing(tmp_path):
    """The same file through the streaming engine (the default for a dump this size): the error raised in
    its read-ahead thread is the command's one line; no shard, no manifest, no spill folder left behind."""
    cut = _cut_zst(tmp_path / "RC_2015-01.zst")
    out, spill = tmp_path / "prepared", tmp_path / "spill"
    spill.mkdir()
    result = _run(
        "-m",
        "convsts",
        "prepare",
        "reddit",
        "--input",
        str(cut),
        "--out",
        str(out),
        env={"TMPDIR": str(spill)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("convsts prepare: ") and "RC_2015-01.zst: truncated zstd file" in last
    assert "Traceback" not in result.stdout + result.stderr
    assert not list(out.rglob("*.parquet")) and not (out / "manifest.json").exists()
    assert not list(spill.iterdir())


# ---- 2. half-written prepared folders


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


@pytest.mark.slow
def test_a_folder_prepared_with_other_filters_or_split_is_refused_before_any_run(sample_prepared, tmp_path):
    from convsts.ray_jobs.tasks import get_task

    reddit = get_task("reddit")
    assert verify_prepared(reddit, str(sample_prepared), load_config(None))["split_salt"] == "convsts"  # same settings
    out = tmp_path / "run"
    result = _run(
        "-m",
        "convsts",
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
    assert sorted(out.iterdir()) == []


def test_a_folder_prepared_from_other_raw_inputs_is_refused_before_any_run(ray_session, tmp_path):
    """Guards: a prepared folder was checked against the run's settings but not its raw inputs, so
    `convsts train --config B --out R --fresh` after a run of config A into R trained on A's data
    (R/prepared) without a word. The manifest now records each raw file's size and time, and a run
    whose inputs are other files (by name and size), or files changed in place since, is refused
    before it starts. The same bytes copied anew to the same place are accepted by their sha256, and
    a copy elsewhere with the same name and size must hold those bytes too."""
    import hashlib
    import os
    import shutil

    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.training.run import run_training

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
    assert sorted(out.iterdir()) == []  # refused before the run exists
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
    from convsts.models import save_checkpoint
    from convsts.models.checkpoint import build_model, read_meta
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


# ---- 3. a used --out is not silently resumed


def test_a_second_run_into_a_used_out_is_refused_unless_resumed_or_fresh(tmp_path):
    from convsts.ray_jobs.training.run import claim_output

    cfg = load_config(None, [])
    claim_output(tmp_path, cfg, fresh=False)  # empty: fine
    _tiny_checkpoint(tmp_path / "checkpoint")
    (tmp_path / "train.json").write_text("{}")
    with pytest.raises(
        FileExistsError, match="already holds a training run .*checkpoint is .*checkpoint; pass --resume latest to"
    ):
        claim_output(tmp_path, cfg, fresh=False)
    claim_output(tmp_path, load_config(None, [f"trainer.resume_from={tmp_path / 'checkpoint'}"]), fresh=False)
    claim_output(tmp_path, cfg, fresh=True)
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "train.json").exists()


def test_resume_names_what_differs_from_the_checkpoint(tmp_path):
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models import save_checkpoint
    from convsts.models.checkpoint import build_model
    from convsts.ray_jobs.training.run import resume_mismatches

    cfg = load_config(
        None,
        [
            "model.dan.output_dim=6",
            "model.dan.embedding_dim=4",
            "model.dan.hidden_sizes=[4]",
            "tokenizer.bigram_buckets=11",
        ],
    )
    tok = DanTokenizer.build(count_words(["a b c"]), cfg.tokenizer)
    save_checkpoint(
        tmp_path / "c", build_model(cfg.model, tok), tok, cfg.to_dict(), provenance={"data": {"reddit": "aaa"}}
    )
    assert resume_mismatches(str(tmp_path / "c"), cfg, {"reddit": "aaa"}) == []
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    del meta["run_config"]["model"]["symmetric_loss"]  # a checkpoint written before that setting existed
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    assert resume_mismatches(str(tmp_path / "c"), cfg, {"reddit": "aaa"}) == []
    other = load_config(
        None,
        [
            "model.dan.output_dim=8",
            "model.dan.embedding_dim=4",
            "model.dan.hidden_sizes=[4]",
            "tokenizer.bigram_buckets=11",
            "tokenizer.word_vocab_size=10",
        ],
    )
    differs = resume_mismatches(str(tmp_path / "c"), other, {"reddit": "bbb"})
    assert "model.dan.output_dim=6 (this run: 8)" in differs
    assert "tokenizer.word_vocab_size=50000 (this run: 10)" in differs
    assert "the prepared reddit data differs from the data the checkpoint was trained on" in differs


# ---- 5. numbers in the run config


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.steps=-5", "trainer.steps"),
        ("trainer.stages=[{start_step: 0, batch_size: 0, lr: 0.01}]", "trainer.stages[0].batch_size"),
        ("trainer.stages=[{start_step: 0, batch_size: 8, lr: -1}]", "trainer.stages[0].lr"),
        ("trainer.stages=[{start_step: 0, batch_size: 8, lr: .nan}]", "trainer.stages[0].lr"),
        ("trainer.task_weights={reddit: .nan, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.task_weights={reddit: .inf, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.task_weights={reddit: 0, snli: 0.05}", "trainer.task_weights.reddit"),
        ("trainer.log_every=0", "trainer.log_every"),
        ("trainer.checkpoint_every=0", "trainer.checkpoint_every"),
        ("trainer.eval_every=-1", "trainer.eval_every"),
        ("trainer.cpus_per_worker=0", "trainer.cpus_per_worker"),
        ("trainer.torch_threads=-1", "trainer.torch_threads"),
        ("trainer.grad_clip=-1", "trainer.grad_clip"),
        ("model.dan.output_dim=0", "model.dan.output_dim"),
        ("model.dan.hidden_sizes=[16, 0]", "model.dan.hidden_sizes[1]"),
        ("model.transformer.num_heads=3", "model.transformer.hidden_size"),
        ("tokenizer.max_words=0", "tokenizer.max_words"),
        ("data.rows_per_shard=0", "data.rows_per_shard"),
    ],
)
def test_out_of_range_numbers_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=re.escape(f"config key '{key}'")):
        load_config(None, [override])


def test_zero_steps_is_allowed_and_means_untrained():
    assert load_config(None, ["trainer.steps=0"]).trainer.steps == 0


# ---- 7. one line, no traceback, through both entry points


CONFIG_ERRORS = {
    "yaml_list": "the top level must be a mapping",
    "unknown_key": "config key 'trainer.stepz'",
    "bad_number": "config key 'trainer.steps': must be >= 0",
}


@pytest.mark.parametrize(
    "entry, case, expected", [(["-m", "convsts", "train"], case, expected) for case, expected in CONFIG_ERRORS.items()]
)
def test_config_errors_print_one_line_without_traceback(tmp_path, entry, case, expected):
    config = tmp_path / "c.yaml"
    config.write_text(
        {"yaml_list": "- a\n- b\n", "unknown_key": "trainer:\n  stepz: 3\n", "bad_number": "trainer:\n  steps: -5\n"}[
            case
        ]
    )
    result = _run(*entry, "--config", str(config), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    if case == "yaml_list":  # --debug shows the traceback (one case is enough: a subprocess costs seconds)
        debug = _run(*entry, "--config", str(config), "--out", str(tmp_path / "out"), "--debug")
        assert "Traceback" in debug.stderr


# ---- 4. lines counted as read; duplicate comment ids dropped with their own counter


def test_duplicate_comment_ids_make_no_second_pair_and_the_manifest_adds_up(tmp_path):
    from convsts.ray_jobs.tasks import get_task

    def comment(cid, parent, body):
        return json.dumps(
            {"id": cid, "parent_id": parent, "link_id": "t3_a", "author": "someone", "body": body, "subreddit": "test"}
        )

    root, reply = comment("c1", "t3_a", "what do you all think of this"), comment("c2", "t1_c1", "i think it is fine")
    lines = [
        root,
        reply,
        reply,
        root,  # dumps repeat comments: c1 and c2 twice each
        comment("c3", "t1_c2", "fine is an understatement"),
        comment("c4", "t1_c1", "[deleted]"),
        "{not json",
    ]
    dump = tmp_path / "RC_dup"
    dump.write_text("\n".join(lines) + "\n")
    m = get_task("reddit").prepare([str(dump)], str(tmp_path / "out"), load_config(None, ["data.test_share=0"]))
    assert m["lines_read"] == 7  # the file's lines, not a sum of what the join produced
    assert m["duplicate_ids"] == 2 and m["malformed"] == 1 and m["filtered_by_rule"]["deleted"] == 1
    assert m["unpaired_by_reason"] == {"unpaired_parent_is_submission": 1} and m["pairs"] == 2
    assert m["lines_read"] == (
        m["malformed"] + m["duplicate_ids"] + sum(m["filtered_by_rule"].values()) + m["unpaired"] + m["pairs"]
    )
    pairs = pd.read_parquet(tmp_path / "out" / "train")
    assert sorted(zip(pairs["context"], pairs["response"])) == [
        ("i think it is fine", "fine is an understatement"),
        ("what do you all think of this", "i think it is fine"),
    ]


# ---- 6. credentials in URIs are redacted everywhere a config or URI is written or logged

SECRETS = ("AKIAPLANTED", "PlAnTeDsEcReT", "PlAnTeDqUeRy")
PLANTED = "s3://AKIAPLANTED:PlAnTeDsEcReT@bucket/dumps/RC_x.zst?secret_key=PlAnTeDqUeRy&region=eu"


def _leaks(text: str) -> list:
    return [secret for secret in SECRETS if secret in text]


@pytest.mark.parametrize(
    "text, expected",
    [
        (PLANTED, "s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu"),
        ("http://alice:pw@mlflow:5000", "http://***@mlflow:5000"),
        ("gs://b/p?access_token=T1&X-Amz-Signature=S1", "gs://b/p?access_token=***&X-Amz-Signature=***"),
        (
            "s3://bucket/p?endpoint_override=minio:9000&scheme=http",
            "s3://bucket/p?endpoint_override=minio:9000&scheme=http",
        ),
        ("trainer.steps=5 alice@example.com", "trainer.steps=5 alice@example.com"),
        (
            "s3://b/p?secret_key=PlAnTeDqUeRy: Unexpected query parameter",
            "s3://b/p?secret_key=***: Unexpected query parameter",
        ),
        # The user-info ends at the authority's last "@", as URL parsers split it: a password with "@",
        # ":" or quotes is redacted whole.
        ("http://alice:p@ssW0rd@head:8265/api/jobs", "http://***@head:8265/api/jobs"),
        ("'http://alice:pa\"ss'w0rd@head:8265' refused", "'http://***@head:8265' refused"),
        # A URI whose "//" a path library collapsed.
        ("s3:/KEY:SECRET@bucket/x.yaml not found", "s3:/***@bucket/x.yaml not found"),
        ("see http://head:8265 and alice@example.com", "see http://head:8265 and alice@example.com"),
    ],
)
def test_redact_removes_userinfo_and_secret_query_values(text, expected):
    from convsts.io.redaction import redact, redact_tree

    assert redact(text) == expected
    assert redact_tree({"a": [text], text: 1}) == {"a": [expected], expected: 1}


def test_job_commands_print_no_password_of_the_ray_address(tmp_path):
    """`jobs` and `submit` against an address with user-info (nothing listens there): the error line
    names the address without the password, whichever way it is given."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"http://alice:p@ss'W0rd@127.0.0.1:{port}"
    for args, env in (
        (["jobs", "list", "--address", address], {}),
        (["jobs", "logs", "some-job", "--address", address], {}),
        (["submit", "--address", address, "train", "--out", str(tmp_path / "o")], {}),
        (["jobs", "list"], {"RAY_ADDRESS": address}),
    ):
        result = _run("-m", "convsts", *args, env=env)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "ss'W0rd" not in result.stdout + result.stderr and "p@ss" not in result.stdout + result.stderr
        assert f"http://***@127.0.0.1:{port}" in result.stderr, result.stderr[-2000:]
    config = _run("-m", "convsts", "train", "--config", "s3://KEY:PlAnTeDsEcReT@bucket/x.yaml",
                  "--out", str(tmp_path / "c"), env={"AWS_EC2_METADATA_DISABLED": "true"})  # fmt: skip
    assert config.returncode == 2 and "s3://***@bucket/x.yaml" in config.stderr and "PlAnTeD" not in config.stderr


def test_log_lines_and_error_lines_are_redacted(tmp_path):
    import io
    import logging

    from convsts.ray_jobs.runtime.process import RedactingFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("convsts.test_redaction")
    logger.addHandler(handler)
    try:
        logger.warning("reading %s", PLANTED)
    finally:
        logger.removeHandler(handler)
    assert "s3://***@bucket" in stream.getvalue() and not _leaks(stream.getvalue())
    # A user error that names the URI names it redacted.
    result = _run(
        "-m",
        "convsts",
        "prepare",
        "reddit",
        "--input",
        str(tmp_path / "x?secret_key=PlAnTeDqUeRy"),
        "--out",
        str(tmp_path / "out"),
    )
    assert result.returncode == 2 and "secret_key=***" in result.stderr and not _leaks(result.stderr)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # one subprocess per command
def test_unreachable_storage_is_one_line_naming_the_uri_for_every_command(tmp_path):
    """Guards: a URI whose store cannot be reached (no server, a wrong endpoint) ended every command in
    pyarrow's OSError traceback. Each command now prints one line naming the URI (credentials
    redacted) and exits 2; the library raises StorageError, an OSError."""
    from convsts.io import storage

    port = _closed_port()  # nothing listens: the connection is refused at once
    base = f"s3://AKIAPLANTED:PlAnTeDsEcReT@bucket/p?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    with pytest.raises(errors.StorageError, match=r"^s3://\*\*\*@bucket/p/reddit\?endpoint_override") as caught:
        storage.is_dir(storage.join(base, "reddit"))
    assert not _leaks(str(caught.value)) and isinstance(caught.value, OSError)
    with pytest.raises(errors.StorageError, match="Unexpected query parameter"):
        storage.is_dir("s3://bucket/p?no_such_option=1")
    for command in (
        ["prepare", "reddit", "--input", storage.join(base, "RC_*.zst"), "--out", str(tmp_path / "p")],
        ["train", "--prepared", base, "--out", str(tmp_path / "t")],
    ):
        result = _run("-m", "convsts", *command)
        lines = [line for line in result.stderr.splitlines() if line.startswith("convsts ")]
        assert result.returncode == 2, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and not _leaks(result.stderr + result.stdout)
        assert len(lines) == 1 and "s3://***@bucket/p" in lines[0] and "NETWORK_CONNECTION" in lines[0], lines


@pytest.mark.slow  # subprocesses beside an S3 server
def test_a_store_that_fails_in_the_middle_of_a_read_is_one_line_and_the_same_command_then_prepares(tmp_path):
    """Guards: a store that stopped answering while a dump was being read (the connection dropped,
    after pyarrow's own retries) ended `convsts prepare` in pyarrow's traceback, which named no
    file. It is now one line naming the file and the byte reached, exit 2, nothing written; the
    same command run again once the store answers prepares the folder."""
    import random
    import string

    from s3_server import CuttingProxy, s3_endpoint, upload

    rng = random.Random(0)
    rows = [
        {
            "id": f"c{i}",
            "parent_id": f"t1_c{i - 1}" if i % 2 else "t3_x",
            "link_id": f"t3_{i // 2}",
            "author": "someone",
            "subreddit": "test",
            "body": " ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(25)),
        }
        for i in range(3000)
    ]
    dump = tmp_path / "RC_2015-01.zst"
    dump.write_bytes(zstandard.ZstdCompressor().compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows)))
    size = dump.stat().st_size
    assert 300_000 < size < 1 << 20  # one GET reads it: the format check, then the read of its lines
    with s3_endpoint("convsts-data") as s3_env:
        uri = "s3://convsts-data/raw/RC_2015-01.zst"
        upload(dump, uri)
        command = ["-m", "convsts", "prepare", "reddit", "--input", uri, "--out", str(tmp_path / "p")]
        proxy = CuttingProxy(s3_env["AWS_ENDPOINT_URL"], response_bytes=size * 3 // 2)  # half-way into the second read
        try:
            cut = subprocess.run(
                [sys.executable, *command],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=300,
                env={**ENV, **s3_env, "AWS_ENDPOINT_URL": proxy.url},
            )
        finally:
            proxy.close()
        lines = [line for line in cut.stderr.splitlines() if line.startswith("convsts ")]
        assert cut.returncode == 2 and "Traceback" not in cut.stderr, cut.stderr[-3000:]
        assert (
            len(lines) == 1 and f"{uri}: reading stopped at byte " in lines[0] and "NETWORK_CONNECTION" in lines[0]
        ), lines
        assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())
        again = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, cwd=REPO, timeout=300, env={**ENV, **s3_env}
        )
        assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["lines_read"] == len(rows) and manifest["pairs"] == len(rows) // 2


def test_an_unreachable_tracking_server_is_refused_before_any_work(tmp_path):
    """Guards: with MLFLOW_TRACKING_URI at a server that is not there, `evaluate` did all its work,
    then spent MLflow's retries (4 minutes here) and ended in a traceback that printed the URI's
    password. Each command now makes one request first and refuses in one line, credentials redacted."""
    url = f"http://alice:PlAnTeDsEcReT@127.0.0.1:{_closed_port()}"
    env = {**ENV, "MLFLOW_TRACKING_URI": url}
    for command in (
        ["evaluate", "--baseline", "bow", "--out", str(tmp_path / "e")],
        ["train", "--out", str(tmp_path / "t"), "trainer.steps=0"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "convsts", *command],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
        )
        lines = [line for line in result.stderr.splitlines() if line.startswith("convsts ")]
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert (
            len(lines) == 1
            and "MLFLOW_TRACKING_URI: no MLflow tracking server answers at http://***@127.0.0.1" in lines[0]
        )
        assert not _leaks(result.stderr + result.stdout)
        assert not (tmp_path / command[command.index("--out") + 1] / "prepared").exists()  # refused before prepare
    from convsts.io.errors import ConfigError
    from convsts.ray_jobs.runtime.process import check_tracking_server

    for broken in ("http://", "http://alice:PlAnTeDsEcReT@[bad", "https://host:notaport"):  # were requests' tracebacks
        with pytest.raises(ConfigError, match="is not a valid tracking server URL") as caught:
            check_tracking_server(broken, "MLFLOW_TRACKING_URI")
        assert not _leaks(str(caught.value))


def _self_signed_certificate(folder: Path) -> tuple:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


def test_a_tracking_server_behind_a_self_signed_certificate_is_not_refused(tmp_path):
    """The reachability check is not a TLS check: a server whose certificate this client does not
    trust answered, and MLflow's own settings (MLFLOW_TRACKING_INSECURE_TLS, ..._CERT_PATH) decide."""
    import http.server
    import ssl
    import threading

    from convsts.io.errors import ConfigError
    from convsts.ray_jobs.runtime.process import check_tracking_server

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed_certificate(tmp_path))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_tracking_server(f"https://127.0.0.1:{server.server_address[1]}", "MLFLOW_TRACKING_URI")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ConfigError, match="no MLflow tracking server answers at https://127.0.0.1"):
        check_tracking_server(f"https://127.0.0.1:{server.server_address[1]}", "MLFLOW_TRACKING_URI")


def test_an_unexpected_error_prints_its_traceback_with_credentials_redacted():
    """Guards: an error run_main does not expect (not a user error) printed Python's own traceback,
    with whatever URI its message held. It prints the traceback redacted and exits 1."""
    code = (
        "from convsts.ray_jobs.runtime.process import run_main\n"
        "def main(argv):\n"
        f"    raise RuntimeError('request to {PLANTED} failed')\n"
        "raise SystemExit(run_main('x', main, []))\n"
    )
    result = _run("-c", code)
    assert (
        result.returncode == 1
        and "Traceback" in result.stderr
        and "RuntimeError: request to s3://***@bucket" in result.stderr
    )
    assert not _leaks(result.stderr)


def test_submit_keeps_credentials_out_of_the_job_spec(monkeypatch):
    from convsts.ray_jobs.runtime.job_api import SubmitError, build_runtime_env, entrypoint

    with pytest.raises(SubmitError, match=r"carries credentials") as refused:
        entrypoint("prepare", ["reddit", "--input", PLANTED])
    assert "s3://***@bucket" in str(refused.value) and not _leaks(str(refused.value))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:PlAnTeDsEcReT@mlflow.example:5000")
    env = build_runtime_env(None)
    assert env["env_vars"]["MLFLOW_TRACKING_URI"] == "https://mlflow.example:5000"
    assert not _leaks(json.dumps(env))


@pytest.mark.slow
def test_a_planted_secret_appears_in_no_log_param_or_artifact(sample_prepared, ray_session, tmp_path):
    from mlflow.tracking import MlflowClient
    from tiny import TINY_TRAIN

    scratch, out = tmp_path / "cwd", tmp_path / "run"
    scratch.mkdir()
    env = {
        **ENV,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",  # MLflow's own setting: samples within a short run
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
    }  # as in a fresh environment: the first plot builds matplotlib's font cache
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "convsts",
            "train",
            "--out",
            str(out),
            "--prepared",
            str(sample_prepared),
            "trainer.task_weights={snli: 1.0}",
            *TINY_TRAIN,
            f"data.reddit_inputs=[{PLANTED}]",
            f"mlflow.run_name=run-from-{PLANTED}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=scratch,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not _leaks(result.stdout + result.stderr)
    output = result.stdout + result.stderr
    assert (
        output.count("[convsts rank 0] step 4/4 ") == 1
    )  # each progress line once (Ray Train's print patch doubled them)
    assert output.count("task split mode=") == 1 and output.count("[convsts rank 0] world size 2; device cpu") == 1
    assert "(RayTrainWorker pid=" in output and "\x1b[" not in output  # worker lines, uncoloured in a captured log
    # Without --verbose, Ray Data's, Ray Train's, MLflow's and matplotlib's info lines stay off the console, in
    # the driver and in every Ray worker (the job's worker_process_setup_hook).
    for chatter in (
        "execution finished",
        "Progress bars disabled",
        "Reporting training result",
        "Checkpoint successfully created",
        "Setting up process group",
        "Creating initial MLflow database",
        "Started monitoring system metrics",
        "RayDeprecationWarning",
        "generated new fontManager",
    ):
        assert chatter not in output, chatter
    # Every file the run wrote (checkpoint config.json, train.json, Ray's results, MLflow's store
    # and artifacts wherever they landed), read as bytes.
    files = [p for root in (out, scratch) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not [s for s in SECRETS if s.encode() in data], path
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(json.loads((out / "train.json").read_text())["mlflow_run_id"])
    assert run.data.params["data.reddit_inputs"] == "['s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu']"
    assert not _leaks(json.dumps([run.data.params, run.data.tags, run.info.run_name]))
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["run_config"]["data"]["reddit_inputs"] == ["s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu"]
    # Nothing lands in the working directory: the sqlite store's artifacts live beside it.
    assert not list(scratch.iterdir())
    assert (out / "mlartifacts").is_dir() and (out / "config.yaml").is_file()
    # Provenance: the commit, the entry command (its secret masked), library versions, the machine.
    import torch

    tags = run.data.tags
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:
        assert tags["mlflow.source.git.commit"].split("-")[0] == head
    assert tags["mlflow.source.name"] == "train.py" and "--prepared" in tags["convsts.command"]
    assert tags["convsts.version.torch"] == torch.__version__ and tags["convsts.machine.cpu_count"] == str(
        os.cpu_count()
    )
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}  # the prepared data as MLflow inputs
    assert set(inputs) == {"snli"} and json.loads(inputs["snli"].profile)["pairs"] > 0
    assert len(inputs["snli"].digest) == 16 and not _leaks(json.dumps([d.profile for d in inputs.values()]))
    assert (
        "system/cpu_utilization_percentage" in run.data.metrics
        and "system/system_memory_usage_megabytes" in run.data.metrics
    )


# ---- 7. one line naming the file for inputs that cannot be read; 9. literal names are not globs


def _tiny_checkpoint(path: Path, embedding_dim: int = 4) -> Path:
    """A tiny DAN checkpoint with a run config and a train state (step 3)."""
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models import save_checkpoint
    from convsts.models.checkpoint import build_model

    cfg = load_config(
        None, ["model.dan.output_dim=6", f"model.dan.embedding_dim={embedding_dim}", "model.dan.hidden_sizes=[4]"]
    )
    tok = DanTokenizer.build(count_words(["a man plays a guitar", "a woman sings"]), cfg.tokenizer)
    return save_checkpoint(path, build_model(cfg.model, tok).eval(), tok, cfg.to_dict(), train_state={"step": 3})


def _damage(case: str, root: Path) -> tuple:
    """Write the bad input of `case` under root; -> (the command's arguments, the expected message)."""
    dump, out = _dump_lines(6), ["--out", str(root / "prepared")]
    if case == "empty_file":
        (root / "RC_empty").write_bytes(b"")
        return [
            "-m",
            "convsts",
            "prepare",
            "reddit",
            "--input",
            str(root / "RC_empty"),
            *out,
        ], "no records in any input"
    if case == "first_line_not_json":
        (root / "RC_x").write_bytes(b"id,body\n" + dump)
        return [
            "-m",
            "convsts",
            "prepare",
            "reddit",
            "--input",
            str(root / "RC_x"),
            *out,
        ], "RC_x:1: not NDJSON"
    if case == "readme_beside_dumps":
        (root / "dumps").mkdir()
        (root / "dumps" / "RC_2015-01").write_bytes(dump)
        (root / "dumps" / "README.md").write_text("# Reddit comments, January 2015\n")
        return [
            "-m",
            "convsts",
            "prepare",
            "reddit",
            "--input",
            str(root / "dumps"),
            *out,
        ], "README.md:1: not NDJSON"
    if case == "non_utf8_sts":
        (root / "bad.tsv").write_bytes(b"sentence1\tsentence2\tscore\nA caf\xe9\tb\t3\n")
        return (
            [
                "-m",
                "convsts",
                "evaluate",
                "--baseline",
                "tfidf",
                "--out",
                str(root / "o"),
                "--sts",
                str(root / "bad.tsv"),
                "data.cqa_test=''",
            ],
            "bad.tsv:2: not UTF-8 text",
        )
    checkpoint = _tiny_checkpoint(root / "ckpt")
    if case == "checkpoint_uri_not_there":
        checkpoint, message = f"file://{root}/nothing_here", f"file://{root}/nothing_here: no files there"
    elif case == "truncated_safetensors":
        weights = checkpoint / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        message = "model.safetensors: not a readable safetensors file"
    elif case == "unknown_bigram_hash":
        tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
        (checkpoint / "tokenizer.json").write_text(json.dumps({**tokenizer, "bigram_hash": "md5"}))
        message = "tokenizer.json: not a tokenizer this version reads (bigram_hash: expected codes|crc32, got 'md5')"
    else:
        (checkpoint / "config.json").write_text("{not json")
        message = "config.json: not valid JSON"
    return [
        "-m",
        "convsts",
        "evaluate",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(root / "o"),
        "data.cqa_test=''",
    ], message


@pytest.mark.parametrize(
    "case",
    [
        "empty_file",
        "first_line_not_json",
        "readme_beside_dumps",
        "non_utf8_sts",
        "checkpoint_uri_not_there",
        "truncated_safetensors",
        "unknown_bigram_hash",
        "config_not_json",
    ],
)
def test_unreadable_inputs_give_one_line_naming_the_file(tmp_path, case):
    args, expected = _damage(case, tmp_path)
    result = _run(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and expected in result.stderr, result.stderr[-2000:]
    # One line, after any progress line of the work done before the file was reached.
    lines = [line for line in result.stderr.strip().splitlines() if " INFO convsts: [eval] " not in line]
    assert len(lines) == 1, result.stderr
    if "--checkpoint" in args:  # a checkpoint that does not load is refused before --out is made
        assert not (tmp_path / "o").exists()


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    from convsts.ray_jobs.tasks import get_task

    dump = tmp_path / "RC_bom"
    dump.write_bytes(b"\xef\xbb\xbf" + _dump_lines(6))
    m = get_task("reddit").prepare([str(dump)], str(tmp_path / "out"), load_config(None, ["data.test_share=0"]))
    assert m["lines_read"] == 6 and m["malformed"] == 0 and m["pairs"] == 3


def test_a_literal_file_name_with_brackets_is_that_file(tmp_path):
    from convsts.io.storage import expand_inputs

    for name in ("RC_[1]", "RC_1", "RC_2"):
        (tmp_path / name).write_bytes(_dump_lines(2))
    assert expand_inputs([str(tmp_path / "RC_[1]")]) == [str(tmp_path / "RC_[1]")]  # not RC_1, as a glob reads it
    assert expand_inputs([str(tmp_path / "RC_[12]")]) == [str(tmp_path / "RC_1"), str(tmp_path / "RC_2")]


# ---- 11. numerical faults


def test_nan_scores_give_nan_metrics_never_a_perfect_score():
    from convsts.ray_jobs.evaluation import metrics as M

    scores = np.array([[np.nan, 0.1, 0.2], [0.9, 0.1, 0.2]])
    assert all(np.isnan(v) for v in M.precision_at_n(scores, (1, 3)).values())
    assert np.isnan(M.accuracy(np.array([[np.nan, 0.0, 0.0]]), [0]))
    assert np.isnan(M.average_precision([np.nan, 0.5], [True, False]))
    assert np.isnan(M.pearson([1.0, np.nan, 3.0], [1, 2, 3])) and np.isnan(M.spearman([1.0, np.nan, 3.0], [1, 2, 3]))


def test_nan_embeddings_make_the_retrieval_and_sts_metrics_nan():
    from convsts.datasets.text import DanTokenizer, TokenizerConfig, count_words
    from convsts.models.checkpoint import build_model
    from convsts.models.config import DanConfig, ModelConfig
    from convsts.models.sentence_encoder import SentenceEncoder
    from convsts.ray_jobs.evaluation.retrieval import precision_at_n_metrics
    from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
    from convsts.ray_jobs.evaluation.sts import sts_metrics

    texts = [f"sentence {i} about thing {i % 5}" for i in range(30)]
    tok = DanTokenizer.build(count_words(texts), TokenizerConfig(bigram_buckets=101))
    model = build_model(ModelConfig(dan=DanConfig(embedding_dim=8, hidden_sizes=[8], output_dim=6)), tok).eval()
    with torch.no_grad():
        model.encoder.dnn[0].weight[0, 0] = float("nan")  # a diverged model
    scorer = EmbeddingScorer(SentenceEncoder(model, tok, {}))
    pairs = pd.DataFrame({"context": texts, "response": texts[::-1]})
    p, items = precision_at_n_metrics(scorer, pairs, 10, 9, 0, "reddit")
    assert p.pop("reddit/queries") == 10 and all(np.isnan(v) for v in p.values()), p  # P@N and its stderr
    assert len(items) == 10 and items["rank"].isna().all()  # no rank either: nothing to compare on
    frame = pd.DataFrame({"sentence1": texts[:10], "sentence2": texts[10:20], "score": np.arange(10.0) / 2})
    assert np.isnan(sts_metrics(scorer, frame, "stsb/dev", by_genre=False)["stsb/dev/pearson"])


def test_a_nan_loss_stops_training_naming_the_step_and_task_and_saves_nothing():
    import test_training_core as core

    from convsts.ray_jobs.training.loop import LoopHooks, NonFiniteLossError

    cfg = load_config(
        None,
        core.TINY
        + [
            "trainer.task_weights={snli: 1.0}",
            "trainer.steps=8",
            "trainer.log_every=4",
            "trainer.checkpoint_every=4",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.001}]",
        ],
    )
    saved = []
    loop, _, _ = core._loop(
        cfg, hooks=LoopHooks(checkpoint=lambda step, m, s: saved.append(step), say=lambda line: None)
    )
    loop.tasks["snli"] = core.snli_with_nan_loss_at(3)
    with pytest.raises(NonFiniteLossError, match="non-finite snli loss .* at step 3"):
        loop.run()
    assert saved == []  # the step-4 checkpoint of a diverged model was never written


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.pop("model"), r"config.json: model: expected an object, got NoneType"),
        (lambda m: m["model"].pop("nli_hidden"), r"config.json: model.nli_hidden: missing"),
        (lambda m: m["model"].update(colour=1), r"config.json: model.colour: not a key of ModelConfig"),
        (
            lambda m: m["model"]["dan"].update(output_dim="6"),
            r"config.json: model.dan.output_dim: expected int, got '6'",
        ),
        # A size that would allocate gigabytes is refused before anything is built.
        (
            lambda m: m["model"]["dan"].update(hidden_sizes=[4, 1e7]),
            r"model.dan.hidden_sizes\[1\]: expected int, got 1",
        ),
        (
            lambda m: m["model"]["dan"].update(hidden_sizes=[4, 10**7]),
            r"model.dan.hidden_sizes\[1\]: 10000000 is not a",
        ),
    ],
)
def test_damaged_checkpoint_metadata_is_one_line_naming_the_key_before_anything_is_built(tmp_path, edit, message):
    from convsts.models.checkpoint import load_model

    checkpoint = _tiny_checkpoint(tmp_path / "c")
    load_model(checkpoint)  # intact: loads
    meta = json.loads((checkpoint / "config.json").read_text())
    edit(meta)
    (checkpoint / "config.json").write_text(json.dumps(meta))
    with pytest.raises(BadInputError, match=message) as refused:
        load_model(checkpoint)
    assert "\n" not in str(refused.value) and "the checkpoint is damaged" in str(refused.value)


def test_a_damaged_train_state_is_one_line_in_the_driver(tmp_path):
    from convsts.models.checkpoint import load_train_state

    checkpoint = _tiny_checkpoint(tmp_path / "c")
    assert load_train_state(checkpoint)["step"] == 3
    state = checkpoint / "train_state.pt"
    state.write_bytes(state.read_bytes()[:40])  # cut short
    with pytest.raises(BadInputError, match=r"train_state.pt: not a train state this version reads \(\w+\)"):
        load_train_state(checkpoint)
    torch.save({"step": 3, "run": Fraction(1, 3)}, state)  # an object weights_only will not build
    with pytest.raises(BadInputError, match="not a train state this version reads") as refused:
        load_train_state(checkpoint)
    assert "weights_only" not in str(refused.value)  # not torch's advice to load it unsafely
    torch.save({"position": 3}, state)
    with pytest.raises(BadInputError, match="no int 'step'"):
        load_train_state(checkpoint)


def test_a_full_disk_is_one_line_naming_the_file_even_under_the_error_it_caused(tmp_path):
    """ENOSPC (here: /dev/full, a device that is always full) prints one line and exits 2, also when a
    store's write failed while handling it (before: sqlite's 'database or disk is full' traceback hid it)."""
    code = (
        "import shutil, sqlite3, sys\n"
        "from convsts.ray_jobs.runtime.process import run_main\n"
        "def main(argv):\n"
        "    try:\n"
        "        shutil.copyfile(sys.executable, '/dev/full')\n"
        "    except OSError:\n"
        "        raise sqlite3.OperationalError('database or disk is full')\n"
        "raise SystemExit(run_main('x', main, []))\n"
    )
    result = _run("-c", code)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    # shutil's write names no file; the library's own writes do (storage.writing, below).
    assert lines[0].startswith("convsts x: [Errno 28] No space left on device")


def test_a_write_that_fails_on_a_full_disk_names_its_file(tmp_path, capsys):
    """A write() or close() that fails for space says only "No space left on device": storage.writing
    names the file (here a real ENOSPC from /dev/full), and run_main prints it in one line."""
    from convsts.io import storage
    from convsts.ray_jobs.runtime.process import run_main

    def main(argv):
        with storage.writing(tmp_path / "out" / "results.json"), open("/dev/full", "wb") as full:
            full.write(b"x" * 65536)

    assert run_main("x", main, []) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("convsts x: [Errno 28] No space left on device")
    assert str(tmp_path / "out" / "results.json") in line


def test_a_checkpoint_that_does_not_fit_names_the_file_and_leaves_no_part_of_it(tmp_path):
    """Checkpoint files are serialized in memory and written by storage.write_bytes (safetensors' and
    torch's own writers raise errors that name no file, torch's without saying it is space). Here no
    file over 4 kB may be written (RLIMIT_FSIZE: EFBIG, a limit like a full disk): the error names
    the weights file, and no partial file is left."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large") as caught:
            _tiny_checkpoint(tmp_path / "ckpt", embedding_dim=256)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert caught.value.filename == str(tmp_path / "ckpt" / "model.safetensors")
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_the_final_checkpoint_is_placed_whole_or_not_at_all(tmp_path):
    """A copy that fails half-way (here: no file over 4 kB may be written, RLIMIT_FSIZE's soft limit,
    so the 64 kB weights fail as on a full disk) leaves the earlier checkpoint whole and nothing beside
    it; a copy that succeeds replaces it whole."""
    import resource
    import signal

    from ray.train import Checkpoint

    from convsts.ray_jobs.training.run import _place

    source, target = tmp_path / "ray" / "checkpoint_1", tmp_path / "out" / "checkpoint"
    source.mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "model.safetensors").write_bytes(b"n" * 65536)
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"old weights")
    (target / "old_only.txt").write_text("from the earlier run")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large"):
            _place(Checkpoint.from_directory(str(source)), target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert (target / "model.safetensors").read_bytes() == b"old weights"  # the earlier one, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint"]  # no half copy beside it
    _place(Checkpoint.from_directory(str(source)), target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["checkpoint"]


def test_a_missing_file_or_checkpoint_folder_says_it_is_not_there(tmp_path):
    """Not only the path (pyarrow's FileNotFoundError is the path alone), and not a missing
    config.json for a folder that is not there at all."""
    from convsts.datasets import snli
    from convsts.models.checkpoint import read_meta

    with pytest.raises(FileNotFoundError, match=r"none\.parquet: no such file or folder$"):
        snli.read_snli(tmp_path / "none.parquet")
    with pytest.raises(FileNotFoundError, match=r"nothing: no such checkpoint folder$"):
        read_meta(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"is not a convsts checkpoint: .*config\.json is missing"):
        read_meta(tmp_path / "empty")


def test_a_missing_raw_input_is_named_before_any_task_is_prepared(tmp_path):
    """Before: SNLI's missing file was found after Reddit had been prepared (40 s). Now every task's raw
    inputs are checked first, so nothing is prepared (and no Ray started) for a run that cannot go on."""
    from convsts.ray_jobs.config.schema import load_config
    from convsts.ray_jobs.pipelines.inputs import ensure_prepared, prepare_all

    cfg = load_config(None, [f"data.snli_train={tmp_path / 'none.parquet'}"])
    for prepare in (prepare_all, ensure_prepared):
        with pytest.raises(FileNotFoundError, match=r"input not found: .*none\.parquet$"):
            prepare(cfg, str(tmp_path / "prepared"))
        assert not (tmp_path / "prepared").exists()


# ---- faults round 4: an input named twice is read once; every SNLI input is read


def test_an_input_named_twice_is_read_once_and_every_snli_input_is_read(tmp_path):
    import pyarrow.parquet as pq

    sample = REPO / "datasets" / "sample"
    pairs, link = sample / "reddit_pairs.parquet", tmp_path / "link.parquet"
    link.symlink_to(pairs)
    once = _run("-m", "convsts", "prepare", "reddit", "--input", str(pairs), "--out", str(tmp_path / "once"))
    assert once.returncode == 0, once.stderr[-2000:]
    twice = _run("-m", "convsts", "prepare", "reddit", "--input", str(pairs), str(pairs), str(link),
                 "--out", str(tmp_path / "twice"))  # fmt: skip
    assert twice.returncode == 0, twice.stderr[-2000:]
    counts = [json.loads((tmp_path / d / "manifest.json").read_text())["pairs"] for d in ("once", "twice")]
    assert counts[0] == counts[1] > 0
    assert twice.stderr.count("named more than once by the inputs; read once") == 2

    train, dev = sample / "snli_train.parquet", sample / "snli_dev.parquet"
    both = _run("-m", "convsts", "prepare", "snli", "--input", str(train), str(dev), "--out", str(tmp_path / "s"))
    assert both.returncode == 0, both.stderr[-2000:]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    rows = sum(pq.read_metadata(p).num_rows for p in (train, dev))
    assert manifest["inputs"] == sorted([str(train), str(dev)])
    assert manifest["pairs"] + manifest["without_gold"] == rows


def test_a_lone_surrogate_escape_is_repaired_not_fatal(tmp_path):
    """A comment whose body ends in half an emoji ("\\ud83d", as real dumps have) and a paired JSON-lines
    row the same: the half becomes U+FFFD and the prepare goes on with every row."""
    import pyarrow.parquet as pq

    rows = json.loads("[" + ",".join(_dump_lines(40).decode().splitlines()) + "]")
    rows[7]["body"] = "a cut emoji \ud83d at the end of a long enough comment"
    (tmp_path / "RC_2015-01").write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes "\\ud83d"
    assert b"\\ud83d" in (tmp_path / "RC_2015-01").read_bytes()
    dump = _run("-m", "convsts", "prepare", "reddit", "--input", str(tmp_path / "RC_2015-01"),
                "--out", str(tmp_path / "dump"))  # fmt: skip
    assert dump.returncode == 0, dump.stderr[-2000:]
    manifest = json.loads((tmp_path / "dump" / "manifest.json").read_text())
    assert manifest["malformed"] == 0 and manifest["pairs"] == 20
    texts = pq.read_table(tmp_path / "dump" / "train").to_pandas()
    texts = pd.concat([texts, pq.read_table(tmp_path / "dump" / "test").to_pandas()])
    assert "a cut emoji \ufffd at the end of a long enough comment" in set(texts["context"]) | set(texts["response"])

    lines = [
        {"context": f"context number {i} of the table", "response": f"a reply number {i} to it"} for i in range(30)
    ]
    lines[3]["context"] = "context \ud83d number three of the table"
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    paired = _run("-m", "convsts", "prepare", "reddit", "--input", str(tmp_path / "pairs.jsonl"),
                  "--out", str(tmp_path / "paired"))  # fmt: skip
    assert paired.returncode == 0, paired.stderr[-2000:]
    manifest = json.loads((tmp_path / "paired" / "manifest.json").read_text())
    assert manifest["lines_read"] == 30 and manifest["malformed"] == 0 and manifest["pairs"] > 0


def test_a_store_that_fails_after_the_work_loses_no_results_and_what_can_be_checked_first_is(tmp_path):
    """An evaluation whose MLflow store fails at its first write (a file that is not a database) keeps
    its results.json and says so in one line; a web server that is not MLflow, an experiment name MLflow
    refuses and a database store without its driver are refused before any work."""
    import http.server
    import threading

    from convsts.io.errors import ConfigError
    from convsts.ray_jobs.runtime.process import tracking_uri

    (tmp_path / "not_a_db.db").write_bytes(b"this is not an sqlite database, only bytes " * 100)
    out = tmp_path / "e"
    late = _run("-m", "convsts", "evaluate", "--baseline", "bow", "--out", str(out), "data.cqa_test=''",
                f"mlflow.tracking_uri=sqlite:///{tmp_path / 'not_a_db.db'}")  # fmt: skip
    lines = [line for line in late.stderr.splitlines() if line.startswith("convsts ")]
    assert late.returncode == 2 and len(lines) == 1 and "Traceback" not in late.stderr, late.stderr[-3000:]
    assert f"the results are in {out / 'results.json'} and results.md" in lines[0] and "did not take them" in lines[0]
    results = json.loads((out / "results.json").read_text())
    assert -1 <= results["stsb/test/pearson"] <= 1 and "mlflow_run_id" not in results

    class NotMlflow(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ConfigError, match="is not an MLflow tracking server .*HTTP 404 with text/html"):
            tracking_uri(url, None)
    finally:
        server.shutdown()
    for name, length in (("", 0), ("x" * 600, 600)):
        with pytest.raises(ConfigError, match=f"'mlflow.experiment': must be 1 to 500 characters, got {length}"):
            load_config(None, [f"mlflow.experiment={name}" if name else "mlflow.experiment=''"])
    with pytest.raises(ConfigError, match="needs the database driver .* \\(not installed here\\)") as refused:
        tracking_uri("postgresql://alice:PlAnTeDsEcReT@127.0.0.1:5432/mlflow", None)
    assert "PlAnTeD" not in str(refused.value)


def test_sigterm_stops_a_prepare_in_one_line_and_spill_folders_of_ended_prepares_are_removed(tmp_path):
    """SIGTERM (what `timeout` and schedulers send) during a pushshift prepare: one line, exit 143, its
    spill folder removed. A spill folder whose process is gone (a SIGKILL) is removed by the next prepare."""
    import signal
    import time

    temp = tmp_path / "tmp"
    temp.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    abandoned = temp / f"convsts-pushshift-{dead.pid}-abc123"
    (abandoned / "node").mkdir(parents=True)
    (abandoned / "node" / "part-0.arrow").write_bytes(b"x" * 1000)
    (tmp_path / "RC_2015-01").write_bytes(_dump_lines(400_000))
    proc = subprocess.Popen(
        [sys.executable, "-m", "convsts", "prepare", "reddit", "--input", str(tmp_path / "RC_2015-01"),
         "--out", str(tmp_path / "p")],
        env={**ENV, "TMPDIR": str(temp)}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 120
    while not list(temp.glob(f"convsts-pushshift-{proc.pid}-*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert not abandoned.exists()  # the ended process's spill, removed before this one spilled
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("convsts ")]
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert lines == ["convsts prepare: stopped by SIGTERM; run the same command again to go on"], err[-2000:]
    assert list(temp.iterdir()) == []


def test_a_warm_start_that_does_not_fit_the_model_is_refused_in_the_driver(tmp_path):
    from convsts.io.errors import ConfigError
    from convsts.ray_jobs.training.run import check_warm_start

    dan = _tiny_checkpoint(tmp_path / "dan")  # a DAN, embedding_dim 4
    other = load_config(None, [f"trainer.warm_start={dan}", "model.encoder=transformer"])
    with pytest.raises(
        ConfigError, match=f"trainer.warm_start: {dan} holds a dan encoder; this run's model.encoder is transformer"
    ):
        check_warm_start(other)
    wider = load_config(None, [f"trainer.warm_start={dan}", "model.dan.output_dim=6", "model.dan.embedding_dim=8",
                               "model.dan.hidden_sizes=[4]"])  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"its encoder's .*embedding.weight is \(\d+, 4\), this run's model makes \(\d+, 8\)"
    ):
        check_warm_start(wider)
    check_warm_start(load_config(None, [f"trainer.warm_start={dan}", "model.dan.output_dim=6", "model.dan.embedding_dim=4",
                                        "model.dan.hidden_sizes=[4]"]))  # fmt: skip


def test_a_file_named_for_one_compression_holding_another_is_named_by_what_it_holds(tmp_path):
    import gzip

    (tmp_path / "RC_2015-01.zst").write_bytes(gzip.compress(_dump_lines(50)))
    result = _run("-m", "convsts", "prepare", "reddit", "--input", str(tmp_path / "RC_2015-01.zst"),
                  "--out", str(tmp_path / "p"))  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{tmp_path / 'RC_2015-01.zst'}: named .zst but holds .gz data; rename it to end in .gz" in result.stderr


def test_a_list_where_a_mapping_is_expected_names_the_key():
    from convsts.io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"config key 'trainer.task_weights': expected a mapping \({key: value"):
        load_config(None, ["trainer.task_weights=[1,2]"])


def test_an_sts_row_missing_a_sentence_is_counted_and_left_out(tmp_path):
    from convsts.datasets.evalsets import read_sts_file

    (tmp_path / "sts.tsv").write_text(
        "sentence1\tsentence2\tscore\nA cat sits.\tA cat is sitting.\t4.5\nA dog runs.\t\t2.0\nOnly one field\n"
        "A man sings.\tA man is singing.\t5.0\n"
    )
    frame = read_sts_file(tmp_path / "sts.tsv")
    assert list(frame["sentence1"]) == ["A cat sits.", "A man sings."]
    assert frame.attrs["without_text"] == 2 and frame.attrs["without_gold"] == 0


def test_a_line_longer_than_any_comment_is_counted_malformed_not_held(tmp_path):
    from convsts.datasets.pushshift import MAX_LINE_BYTES

    lines = _dump_lines(40).splitlines(keepends=True)
    huge = json.dumps({"id": "big", "body": "x" * (3 * MAX_LINE_BYTES), "parent_id": "t3_x"}).encode() + b"\n"
    (tmp_path / "RC_2015-01").write_bytes(b"".join(lines[:20]) + huge + b"".join(lines[20:]))
    result = _run("-m", "convsts", "prepare", "reddit", "--input", str(tmp_path / "RC_2015-01"),
                  "--out", str(tmp_path / "p"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["lines_read"] == 41 and manifest["malformed"] == 1 and manifest["pairs"] == 20
    assert manifest["malformed_examples"] == [f"{tmp_path / 'RC_2015-01'}:21"]  # named by its line


def test_a_full_spill_disk_names_the_spill_folder_and_an_unwritable_out_is_one_line(tmp_path):
    """No file over 4 kB may be written (RLIMIT_FSIZE: EFBIG, as a full TMPDIR): the error names the
    spill folder in TMPDIR. An --out that cannot be written (EPERM here; a read-only file system's
    EROFS is the same kind of error) is one line for prepare, train and evaluate, before any input is read."""
    import errno
    import resource
    import signal

    from convsts.datasets.pushshift import prepare_local
    from convsts.datasets.reddit import RedditFilterConfig
    from convsts.ray_jobs.runtime.process import find_user_error

    (tmp_path / "RC").write_bytes(_dump_lines(20000))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError, match="File too large") as caught:
            prepare_local([str(tmp_path / "RC")], RedditFilterConfig(), 0.1, "s", tmp_path / "out", 500, 2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert "convsts-pushshift-" in caught.value.filename and "(the spill folder, in TMPDIR)" in caught.value.filename

    read_only = OSError(errno.EROFS, "Read-only file system", "/mnt/ro/out")
    assert find_user_error(RuntimeError("the store's write failed too")) is None
    assert find_user_error(read_only) is read_only
    for command in (["prepare", "reddit", "--input", str(tmp_path / "RC"), "--out", "/sys/convsts-out/p"],
                    ["train", "--out", "/sys/convsts-out/t", "trainer.steps=0"],
                    ["evaluate", "--baseline", "bow", "--out", "/sys/convsts-out/e"]):  # fmt: skip
        result = _run("-m", "convsts", *command)
        lines = [line for line in result.stderr.splitlines() if line.startswith("convsts ")]
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "/sys/convsts-out" in lines[0], lines


def test_an_interrupted_prepare_behind_a_symlinked_out_is_prepared_again(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    (real / "train").mkdir(parents=True)
    (real / "train" / "part-00000.parquet").write_bytes(b"PAR1 half a shard")
    (real / ".convsts-prepare").write_text('{"task": "reddit"}\n')  # what a killed prepare leaves
    link.symlink_to(real, target_is_directory=True)
    pairs = REPO / "datasets" / "sample" / "reddit_pairs.parquet"
    result = _run("-m", "convsts", "prepare", "reddit", "--input", str(pairs), "--out", str(link))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "removed, prepared again" in result.stderr and link.is_symlink()
    assert json.loads((real / "manifest.json").read_text())["pairs"] > 0 and not (real / ".convsts-prepare").exists()


def test_a_checkpoint_config_is_held_to_the_run_configs_size_rules():
    """One rule set for the architecture: a config.json whose Transformer no run would build (hidden
    size not a multiple of the heads) is refused at load, as the run config refuses it."""
    import dataclasses

    from convsts.io.errors import ConfigError
    from convsts.models.checkpoint import model_config_from_dict
    from convsts.models.config import ModelConfig

    meta = dataclasses.asdict(ModelConfig(encoder="transformer"))
    meta["transformer"].update(num_heads=3, hidden_size=64)
    with pytest.raises(ValueError, match=r"'model.transformer.hidden_size': must be a multiple of .*num_heads \(3\)"):
        model_config_from_dict(meta)
    with pytest.raises(ConfigError, match=r"'model.transformer.hidden_size': must be a multiple"):
        load_config(None, ["model.transformer.num_heads=3", "model.transformer.hidden_size=64"])
