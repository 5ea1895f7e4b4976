"""Raw inputs that cannot be read, and what `prepare` does with them: one line naming the file,
row or key; nothing half-written left behind; counted, never silently dropped."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import zstandard
from testkit.faults import ENV, REPO, cut_zst, dump_lines, run_convsts, start_python, tiny_checkpoint

from convsts.io.compression import open_lines
from convsts.io.errors import BadInputError
from convsts.models.checkpoint import write_manifest
from convsts.ray_jobs.config.loader import load_config


def test_truncated_zst_raises_naming_the_file_and_offset(tmp_path):
    cut = cut_zst(tmp_path / "RC_cut.zst")
    with pytest.raises(
        BadInputError, match=r"RC_cut.zst: truncated zstd file: the data ends inside a frame at byte \d+"
    ):
        sum(1 for _ in open_lines(str(cut)))
    corrupt = bytearray(zstandard.ZstdCompressor().compress(dump_lines(2000)))
    corrupt[40:60] = b"\x00" * 20
    (tmp_path / "RC_bad.zst").write_bytes(bytes(corrupt))
    with pytest.raises(BadInputError, match="RC_bad.zst: corrupt zstd data near byte"):
        sum(1 for _ in open_lines(str(tmp_path / "RC_bad.zst")))
    whole = zstandard.ZstdCompressor().compress(dump_lines(10)) + zstandard.ZstdCompressor().compress(dump_lines(5))
    (tmp_path / "RC_two.zst").write_bytes(whole)  # two frames, both read
    assert sum(1 for _ in open_lines(str(tmp_path / "RC_two.zst"))) == 15


@pytest.mark.slow
def test_prepare_on_a_truncated_zst_fails_in_one_line_and_writes_no_shards(tmp_path):
    cut = cut_zst(tmp_path / "RC_2015-01.zst")
    out = tmp_path / "prepared"
    # Through Ray Data (data.dump_local_bytes=0): the failed read task's error reaches the driver as one line.
    result = run_convsts("prepare", "reddit", "--input", str(cut), "--out", str(out), "data.dump_local_bytes=0")
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    # The command's own report is one line, and Ray Data's log of the failed task is not printed.
    assert last.startswith("convsts prepare: ") and "RC_2015-01.zst: truncated zstd file" in last
    assert "Traceback" not in result.stdout + result.stderr and "internal code" not in result.stdout + result.stderr
    assert not list(out.rglob("*.parquet")) and not (out / "manifest.json").exists()
    # Nothing is said of steps after the read that failed.
    assert "read and partitioned" not in result.stderr and "repeated ids" not in result.stderr


def test_prepare_on_a_truncated_zst_in_the_local_engine_fails_in_one_line_and_leaves_nothing(tmp_path):
    """The same file through the streaming engine (the default for a dump this size): the error raised in
    its read-ahead thread is the command's one line; no shard, no manifest, no spill folder left behind."""
    cut = cut_zst(tmp_path / "RC_2015-01.zst")
    out, spill = tmp_path / "prepared", tmp_path / "spill"
    spill.mkdir()
    result = run_convsts("prepare", "reddit", "--input", str(cut), "--out", str(out), env={"TMPDIR": str(spill)})
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("convsts prepare: ") and "RC_2015-01.zst: truncated zstd file" in last
    assert "Traceback" not in result.stdout + result.stderr
    assert not list(out.rglob("*.parquet")) and not (out / "manifest.json").exists()
    assert not list(spill.iterdir())


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


def _damage(case: str, root: Path) -> tuple:
    """Write the bad input of `case` under root; -> (the command's arguments, the expected message)."""
    dump, out = dump_lines(6), ["--out", str(root / "prepared")]

    def prepare(path: Path) -> list[str]:
        return ["-m", "convsts", "prepare", "reddit", "--input", str(path), *out]

    if case == "empty_file":
        (root / "RC_empty").write_bytes(b"")
        return prepare(root / "RC_empty"), "no records in any input"
    if case == "first_line_not_json":
        (root / "RC_x").write_bytes(b"id,body\n" + dump)
        return prepare(root / "RC_x"), "RC_x:1: not NDJSON"
    if case == "readme_beside_dumps":
        (root / "dumps").mkdir()
        (root / "dumps" / "RC_2015-01").write_bytes(dump)
        (root / "dumps" / "README.md").write_text("# Reddit comments, January 2015\n")
        return prepare(root / "dumps"), "README.md:1: not NDJSON"
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
    checkpoint = tiny_checkpoint(root / "ckpt")
    if case == "checkpoint_uri_not_there":
        checkpoint, message = f"file://{root}/nothing_here", f"file://{root}/nothing_here: no files there"
    elif case == "truncated_safetensors":  # cut after its manifest was written: the manifest tells
        weights = checkpoint / "model.safetensors"
        size = weights.stat().st_size
        weights.write_bytes(weights.read_bytes()[: size // 2])
        message = f"not a complete checkpoint or model folder (model.safetensors has {size // 2:,} bytes, its manifest {size:,})"
    elif case == "truncated_safetensors_listed":  # written cut, its manifest made over it (another program)
        weights = checkpoint / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        write_manifest(checkpoint)
        message = "model.safetensors: not a readable safetensors file"
    elif case == "unknown_bigram_hash":
        tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
        (checkpoint / "tokenizer.json").write_text(json.dumps({**tokenizer, "bigram_hash": "md5"}))
        write_manifest(checkpoint)
        message = "tokenizer.json: not a tokenizer this version reads (bigram_hash: expected codes, got 'md5')"
    else:
        (checkpoint / "config.json").write_text("{not json")
        write_manifest(checkpoint)
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


CASES = (
    "empty_file",
    "first_line_not_json",
    "readme_beside_dumps",
    "non_utf8_sts",
    "checkpoint_uri_not_there",
    "truncated_safetensors",
    "truncated_safetensors_listed",
    "unknown_bigram_hash",
    "config_not_json",
)


@pytest.fixture(scope="module", autouse=True)
def refused_commands(tmp_path_factory):
    """Every case's command, each a fresh process as a user runs it, all started at once when this
    module starts (they spend their time importing, beside the module's other tests) and checked by
    its last test: {case: (args, expected message, its folder, the process)}."""
    started = {}
    for case in CASES:
        root = tmp_path_factory.mktemp(case)
        args, expected = _damage(case, root)
        started[case] = (args, expected, root, start_python(*args))
    yield started
    for *_, process in started.values():
        if process.poll() is None:
            process.kill()


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    from convsts.ray_jobs.tasks import get_task

    dump = tmp_path / "RC_bom"
    dump.write_bytes(b"\xef\xbb\xbf" + dump_lines(6))
    m = get_task("reddit").prepare([str(dump)], str(tmp_path / "out"), load_config(None, ["data.test_share=0"]))
    assert m["lines_read"] == 6 and m["malformed"] == 0 and m["pairs"] == 3


def test_a_literal_file_name_with_brackets_is_that_file(tmp_path):
    from convsts.io.storage import expand_inputs

    for name in ("RC_[1]", "RC_1", "RC_2"):
        (tmp_path / name).write_bytes(dump_lines(2))
    assert expand_inputs([str(tmp_path / "RC_[1]")]) == [str(tmp_path / "RC_[1]")]  # not RC_1, as a glob reads it
    assert expand_inputs([str(tmp_path / "RC_[12]")]) == [str(tmp_path / "RC_1"), str(tmp_path / "RC_2")]


def test_a_missing_raw_input_is_named_before_any_task_is_prepared(tmp_path):
    """Every task's raw inputs are checked first, so nothing is prepared (and no Ray started) for a
    run that cannot go on (SNLI's missing file is not found only after Reddit's prepare)."""
    from convsts.ray_jobs.config.loader import load_config
    from convsts.ray_jobs.pipelines.inputs import ensure_prepared, prepare_all

    cfg = load_config(None, [f"data.snli_train={tmp_path / 'none.parquet'}"])
    for prepare in (prepare_all, ensure_prepared):
        with pytest.raises(FileNotFoundError, match=r"input not found: .*none\.parquet$"):
            prepare(cfg, str(tmp_path / "prepared"))
        assert not (tmp_path / "prepared").exists()


def test_an_input_named_twice_is_read_once_and_every_snli_input_is_read(tmp_path):
    import pyarrow.parquet as pq

    sample = REPO / "datasets" / "sample"
    pairs, link = sample / "reddit_pairs.parquet", tmp_path / "link.parquet"
    link.symlink_to(pairs)
    once = run_convsts("prepare", "reddit", "--input", str(pairs), "--out", str(tmp_path / "once"))
    assert once.returncode == 0, once.stderr[-2000:]
    twice = run_convsts("prepare", "reddit", "--input", str(pairs), str(pairs), str(link),
                 "--out", str(tmp_path / "twice"))  # fmt: skip
    assert twice.returncode == 0, twice.stderr[-2000:]
    counts = [json.loads((tmp_path / d / "manifest.json").read_text())["pairs"] for d in ("once", "twice")]
    assert counts[0] == counts[1] > 0
    assert twice.stderr.count("named more than once by the inputs; read once") == 2

    train, dev = sample / "snli_train.parquet", sample / "snli_dev.parquet"
    both = run_convsts("prepare", "snli", "--input", str(train), str(dev), "--out", str(tmp_path / "s"))
    assert both.returncode == 0, both.stderr[-2000:]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    rows = sum(pq.read_metadata(p).num_rows for p in (train, dev))
    assert manifest["inputs"] == sorted([str(train), str(dev)])
    assert manifest["pairs"] + manifest["without_gold"] == rows


def test_a_lone_surrogate_escape_is_repaired_not_fatal(tmp_path):
    """A comment whose body ends in half an emoji ("\\ud83d", as real dumps have) and a paired JSON-lines
    row the same: the half becomes U+FFFD and the prepare goes on with every row."""
    import pyarrow.parquet as pq

    rows = json.loads("[" + ",".join(dump_lines(40).decode().splitlines()) + "]")
    rows[7]["body"] = "a cut emoji \ud83d at the end of a long enough comment"
    (tmp_path / "RC_2015-01").write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes "\\ud83d"
    assert b"\\ud83d" in (tmp_path / "RC_2015-01").read_bytes()
    dump = run_convsts("prepare", "reddit", "--input", str(tmp_path / "RC_2015-01"),
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
    paired = run_convsts("prepare", "reddit", "--input", str(tmp_path / "pairs.jsonl"),
                  "--out", str(tmp_path / "paired"))  # fmt: skip
    assert paired.returncode == 0, paired.stderr[-2000:]
    manifest = json.loads((tmp_path / "paired" / "manifest.json").read_text())
    assert manifest["lines_read"] == 30 and manifest["malformed"] == 0 and manifest["pairs"] > 0


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
    (tmp_path / "RC_2015-01").write_bytes(dump_lines(400_000))
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


def test_a_file_named_for_one_compression_holding_another_is_named_by_what_it_holds(tmp_path):
    import gzip

    (tmp_path / "RC_2015-01.zst").write_bytes(gzip.compress(dump_lines(50)))
    result = run_convsts("prepare", "reddit", "--input", str(tmp_path / "RC_2015-01.zst"),
                  "--out", str(tmp_path / "p"))  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{tmp_path / 'RC_2015-01.zst'}: named .zst but holds .gz data; rename it to end in .gz" in result.stderr


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
    from convsts.datasets.pushshift.reading import MAX_LINE_BYTES

    lines = dump_lines(40).splitlines(keepends=True)
    huge = json.dumps({"id": "big", "body": "x" * (3 * MAX_LINE_BYTES), "parent_id": "t3_x"}).encode() + b"\n"
    (tmp_path / "RC_2015-01").write_bytes(b"".join(lines[:20]) + huge + b"".join(lines[20:]))
    result = run_convsts("prepare", "reddit", "--input", str(tmp_path / "RC_2015-01"),
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

    from convsts.datasets.config import RedditFilterConfig
    from convsts.datasets.pushshift import prepare_local
    from convsts.ray_jobs.runtime.entry import find_user_error

    (tmp_path / "RC").write_bytes(dump_lines(20000))
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
    started = [start_python("-m", "convsts", *command)  # each a fresh process, all at once
               for command in (["prepare", "reddit", "--input", str(tmp_path / "RC"), "--out", "/sys/convsts-out/p"],
                               ["train", "--out", "/sys/convsts-out/t", "trainer.steps=0"],
                               ["evaluate", "--baseline", "bow", "--out", "/sys/convsts-out/e"])]  # fmt: skip
    for process in started:
        stderr = process.communicate(timeout=300)[1]
        lines = [line for line in stderr.splitlines() if line.startswith("convsts ")]
        assert process.returncode == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
        assert "/sys/convsts-out" in lines[0], lines


def test_an_interrupted_prepare_behind_a_symlinked_out_is_prepared_again(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    (real / "train").mkdir(parents=True)
    (real / "train" / "part-00000.parquet").write_bytes(b"PAR1 half a shard")
    (real / ".convsts-prepare").write_text('{"task": "reddit"}\n')  # what a killed prepare leaves
    link.symlink_to(real, target_is_directory=True)
    pairs = REPO / "datasets" / "sample" / "reddit_pairs.parquet"
    result = run_convsts("prepare", "reddit", "--input", str(pairs), "--out", str(link))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("removed, prepared again") == 1 and link.is_symlink()  # said once
    assert json.loads((real / "manifest.json").read_text())["pairs"] > 0 and not (real / ".convsts-prepare").exists()


# Last in this module: the commands ran beside the tests above.
@pytest.mark.parametrize("case", CASES)
def test_unreadable_inputs_give_one_line_naming_the_file(refused_commands, case):
    args, expected, root, process = refused_commands[case]
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, stderr[-2000:]
    assert "Traceback" not in stderr and expected in stderr, stderr[-2000:]
    # One line, after any progress line of the work done before the file was reached.
    lines = [line for line in stderr.strip().splitlines() if " INFO convsts: [eval] " not in line]
    assert len(lines) == 1, stderr
    if "--checkpoint" in args:  # a checkpoint that does not load is refused before --out is made
        assert not (root / "o").exists()
