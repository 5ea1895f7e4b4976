"""Inputs, prepared shards and evaluation sets read from URIs: file:// and s3:// on a real
S3-protocol server on 127.0.0.1 (tests/s3_server.py), through the same code paths as local files."""

import bz2
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from testkit.local_cluster import run_watching, still_running
from testkit.s3_server import keys, s3_endpoint, upload
from testkit.tiny import TINY_TRAIN

from convsts.datasets import evalsets, pushshift, reddit, snli
from convsts.io import cache, storage, tables
from convsts.io.storage import expand_inputs
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "datasets" / "sample"


def _comment(cid, parent, body, link="t3_s1", author="alice"):
    return {
        "id": cid,
        "parent_id": parent,
        "link_id": link,
        "author": author,
        "body": body,
        "subreddit": "test",
        "created_utc": 1420070400,
    }


def _write_dump(path, rows, extra=(), zst=False):
    data = ("\n".join([json.dumps(r) for r in rows] + list(extra)) + "\n").encode()
    if zst:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


DUMP_ROWS = [
    _comment("c1", "t3_s1", "I think this is a great idea"),
    _comment("c2", "t1_c1", "I completely agree with you"),
    _comment("c3", "t1_c2", "Beep boop I am a bot here", author="helper_bot"),
    _comment("d1", "t3_s2", "another thread starts here", link="t3_s2"),
    _comment("d2", "t1_d1", "and somebody replies to it", link="t3_s2"),
]


def test_uri_spelling():
    assert storage.is_uri("s3://b/k") and storage.is_uri("file:///tmp/x") and not storage.is_uri("/tmp/x")
    assert not storage.is_uri("C://odd")  # one-letter schemes are drive letters
    q = "s3://b/prep?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join(q, "reddit", "train") == "s3://b/prep/reddit/train?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join("/data/prep", "reddit") == "/data/prep/reddit"
    assert storage.name(q) == "prep"
    assert (
        storage.add_suffix("s3://b/q.xml?scheme=http", ".subtaskB.relevancy")
        == "s3://b/q.xml.subtaskB.relevancy?scheme=http"
    )
    # A "?" that is not followed by k=v options is a glob character, not a query.
    assert storage.has_wildcards("s3://b/RC_2015-0?.zst") and not storage.has_wildcards(q)
    assert storage.has_wildcards("/data/RC_*.zst")


def test_file_uris_list_glob_and_read(tmp_path):
    _write_dump(tmp_path / "RC_2015-01.zst", DUMP_ROWS[:3], zst=True)
    _write_dump(tmp_path / "RC_2015-02", DUMP_ROWS[3:])
    (tmp_path / ".hidden").write_text("x")
    folder = f"file://{tmp_path}"
    assert storage.is_dir(folder) and not storage.is_file(folder)
    assert expand_inputs([folder]) == [f"{folder}/RC_2015-01.zst", f"{folder}/RC_2015-02"]
    assert expand_inputs([f"{folder}/RC_*.zst"]) == [f"{folder}/RC_2015-01.zst"]
    with pytest.raises(FileNotFoundError, match="missing.zst"):
        expand_inputs([f"{folder}/missing.zst"])
    bodies = [c for frame in pushshift.read_dump_file(f"{folder}/RC_2015-01.zst") for c in frame["body"]]
    assert bodies == [r["body"] for r in DUMP_ROWS[:3]]
    assert reddit.detect_format(f"{folder}/RC_2015-02") == "pushshift"


def test_prepare_reads_and_writes_file_uris(ray_session, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _write_dump(raw / "RC_2015-01.zst", DUMP_ROWS[:3], extra=["not json"], zst=True)
    _write_dump(raw / "RC_2015-02", DUMP_ROWS[3:])
    cfg = load_config(None, ["data.test_share=0.0"])
    out = f"file://{tmp_path}/prepared/reddit"
    manifest = get_task("reddit").prepare([f"file://{raw}/RC_*"], out, cfg)
    assert manifest["lines_read"] == 6 and manifest["malformed"] == 1 and manifest["pairs"] == 2
    assert manifest["malformed_examples"] == [f"file://{raw}/RC_2015-01.zst:4"]
    assert json.loads(storage.read_text(storage.join(out, "manifest.json")))["pairs"] == 2
    pairs = pq.read_table(tmp_path / "prepared" / "reddit" / "train").to_pandas()
    assert set(zip(pairs["context"], pairs["response"])) == {
        ("I think this is a great idea", "I completely agree with you"),
        ("another thread starts here", "and somebody replies to it"),
    }


def test_readers_on_s3(tmp_path):
    """Dumps, paired tables, SNLI, STS-B and CQA read from s3:// as from local files."""
    _write_dump(tmp_path / "RC_2015-01.zst", DUMP_ROWS, zst=True)
    lines = [
        json.dumps({"sentence1": "A man sleeps.", "sentence2": "A person rests.", "gold_label": "entailment"}),
        json.dumps({"sentence1": "A dog runs.", "sentence2": "A cat sits.", "gold_label": "-"}),
    ]
    (tmp_path / "snli.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "RC_2015-02.bz2").write_bytes(bz2.compress("".join(json.dumps(r) + "\n" for r in DUMP_ROWS).encode()))
    (tmp_path / "sts-dev.csv").write_text("main-news\tfile\t2012\t1\t4.2\tA cat sat.\tA cat was sitting.\textra\n")
    with s3_endpoint("convsts-data"):
        base = "s3://convsts-data/raw"
        for name in ("RC_2015-01.zst", "snli.jsonl", "sts-dev.csv", "RC_2015-02.bz2"):
            upload(tmp_path / name, f"{base}/{name}")
        upload(SAMPLE / "reddit_pairs.parquet", f"{base}/pairs/reddit_pairs.parquet")
        upload(SAMPLE / "cqa2016_test.parquet", f"{base}/cqa.parquet")

        assert expand_inputs([f"{base}/RC_*.zst"]) == [f"{base}/RC_2015-01.zst"]
        assert expand_inputs([f"{base}/pairs"]) == [f"{base}/pairs/reddit_pairs.parquet"]
        with pytest.raises(FileNotFoundError, match="s3://convsts-data/raw/nothing"):
            expand_inputs([f"{base}/nothing"])
        assert reddit.detect_format(f"{base}/RC_2015-01.zst") == "pushshift"
        assert reddit.detect_format(f"{base}/pairs/reddit_pairs.parquet") == "pairs"
        comments = next(pushshift.read_dump_file(f"{base}/RC_2015-01.zst"))
        assert list(comments["id"]) == [r["id"] for r in DUMP_ROWS]
        assert list(comments["line"]) == list(range(1, len(DUMP_ROWS) + 1))  # malformed lines are named by it
        pairs = reddit.read_pairs_file(f"{base}/pairs/reddit_pairs.parquet")
        assert len(pairs) == pq.read_metadata(SAMPLE / "reddit_pairs.parquet").num_rows
        frame = snli.read_snli(f"{base}/snli.jsonl")
        assert frame.to_dict("records") == [{"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": 0}]
        older = next(pushshift.read_dump_file(f"{base}/RC_2015-02.bz2"))  # an older month's compression, streamed
        assert list(older["id"]) == [r["id"] for r in DUMP_ROWS]
        split = evalsets.stsb_split_path(base, "dev")
        assert split == f"{base}/sts-dev.csv"
        sts = evalsets.read_stsb(split)
        assert sts.to_dict("records") == [
            {"genre": "news", "sentence1": "A cat sat.", "sentence2": "A cat was sitting.", "score": 4.2}
        ]
        cqa = evalsets.read_cqa(f"{base}/cqa.parquet")
        assert len(cqa) == pq.read_metadata(SAMPLE / "cqa2016_test.parquet").num_rows
        storage.write_text(f"{base}/out/note.txt", "written")
        assert storage.read_text(f"{base}/out/note.txt") == "written"
        assert storage.has_entries(f"{base}/out") and not storage.has_entries(f"{base}/empty")
        # A folder at a URI copied to this machine once, and again only when a file there changed.
        storage.write_text(f"{base}/out/second.txt", "two")
        listed = storage.folder_stats(f"{base}/out")  # names, sizes and times from the one listing
        assert [(n, size) for n, size, _ in listed] == [("note.txt", 7), ("second.txt", 3)]
        assert all(mtime > 0 for _, _, mtime in listed)
        local = cache.local_copy(f"{base}/out", "test")
        assert sorted(p.name for p in local.iterdir() if not p.name.startswith(".")) == ["note.txt", "second.txt"]
        assert (local / "note.txt").read_text() == "written"
        (local / "note.txt").write_text("a local edit")  # the cache is not read again while the URI is unchanged
        assert cache.local_copy(f"{base}/out", "test") == local and (local / "note.txt").read_text() == "a local edit"
        storage.write_text(f"{base}/out/note.txt", "written again")
        again = cache.local_copy(f"{base}/out", "test")
        assert again != local and (again / "note.txt").read_text() == "written again"
        with pytest.raises(FileNotFoundError, match="s3://convsts-data/raw/empty: no files there"):
            cache.local_copy(f"{base}/empty", "test")
        storage.delete_folder(f"{base}/out")  # what `prepare` does with an interrupted prepare's shards
        assert not storage.has_entries(f"{base}/out") and storage.has_entries(base)


@pytest.fixture(scope="module")
def trained_on_s3(tmp_path_factory):
    """`convsts train` with every input, the prepared shards and Ray Train's storage in a bucket of a
    local S3 server (kept up for the module's tests): the bucket, the data overrides, the command's
    environment, its --out and its completed process."""
    tmp_path = tmp_path_factory.mktemp("s3_run")
    with s3_endpoint("convsts-data") as s3_env:
        bucket = "s3://convsts-data"
        files = {
            "reddit_pairs.parquet": "raw/reddit/reddit_pairs.parquet",
            "snli_train.parquet": "raw/snli/train.parquet",
            "snli_dev.parquet": "raw/snli/dev.parquet",
            "stsb_train.parquet": "raw/stsb/stsb_train.parquet",
            "stsb_dev.parquet": "raw/stsb/stsb_dev.parquet",
            "stsb_test.parquet": "raw/stsb/stsb_test.parquet",
            "cqa2016_test.parquet": "raw/cqa/test.parquet",
        }
        for local, key in files.items():
            upload(SAMPLE / local, f"{bucket}/{key}")
        data = [
            f"data.reddit_inputs=[{bucket}/raw/reddit/]",
            f"data.snli_train={bucket}/raw/snli/train.parquet",
            f"data.snli_dev={bucket}/raw/snli/dev.parquet",
            f"data.stsb_dir={bucket}/raw/stsb",
            f"data.cqa_test={bucket}/raw/cqa/test.parquet",
            f"data.prepared_dir={bucket}/prepared",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "MLFLOW_TRACKING"))}
        env.update(s3_env, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        out = tmp_path / "run"
        # Its own local Ray instance, under a temp dir of its own (short: Ray's sockets live under it),
        # whose processes are watched while it runs.
        temp = Path(tempfile.mkdtemp(prefix="cvs3", dir="/tmp"))
        command = [sys.executable, "-m", "convsts", "train", "--out", str(out), *data, *TINY_TRAIN,
                   "trainer.eval_every=2",  # STS-B dev read from the bucket inside training
                   f"trainer.storage_path={bucket}/ray_results"]  # fmt: skip
        train, instance = run_watching(command, str(temp), cwd=REPO, env={**env, "RAY_TMPDIR": str(temp)}, timeout=600)
        yield {"bucket": bucket, "data": data, "env": env, "out": out, "train": train, "instance": instance}
        shutil.rmtree(temp, ignore_errors=True)


def _convsts(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`python -m convsts ARGS` from the project folder in `env`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "convsts", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def _last_checkpoint_uri(bucket: str) -> str:
    """The URI of the newest checkpoint Ray Train kept in the bucket."""
    saved = {k.rsplit("/", 1)[0] for k in keys(f"{bucket}/ray_results") if k.endswith("/model.safetensors")}
    return "s3://" + max(saved, key=lambda folder: folder.rsplit("/", 1)[1])


@pytest.mark.slow
def test_train_with_data_and_checkpoints_on_s3(trained_on_s3):
    """The prepared shards and Ray Train's checkpoints are in the bucket; the final checkpoint is
    copied to --out and the bucket's loads from its URI as that copy does."""
    bucket, out, train = trained_on_s3["bucket"], trained_on_s3["out"], trained_on_s3["train"]
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-4000:]
    # Its own local Ray instance (no RAY_ADDRESS) runs Ray Train without the preemption watcher,
    # whose start printed a core_worker.cc error line on every run (ray-project/ray#53727).
    assert "PreemptionWatcher" not in train.stdout + train.stderr
    # The test session's own Ray instance runs beside this one: Ray's helpers in this run's workers
    # find their own cluster (RAY_ADDRESS set by convsts' worker setup), not "multiple instances".
    assert "multiple active Ray instances" not in train.stdout + train.stderr
    # Nothing of a finished run goes on after its command: every process of its own Ray instance
    # (its task workers among them) ends with it, and its MLflow run ended with its last step.
    assert len(trained_on_s3["instance"]) > 5, trained_on_s3["instance"]
    assert not still_running(trained_on_s3["instance"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(json.loads((out / "train.json").read_text())["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "reddit/loss")) == 4
    # Its checkpoints are in a folder of its own under the shared storage path, as train.json says.
    storage_folder = json.loads((out / "train.json").read_text())["storage"]
    assert storage_folder.startswith(f"{bucket}/ray_results/") and keys(storage_folder)

    prepared = keys(f"{bucket}/prepared")
    assert "convsts-data/prepared/reddit/manifest.json" in prepared
    assert any(k.startswith("convsts-data/prepared/reddit/train/") and k.endswith(".parquet") for k in prepared)
    assert any(k.startswith("convsts-data/prepared/reddit/test/") for k in prepared)
    assert any(k.startswith("convsts-data/prepared/snli/train/") for k in prepared)
    manifest = json.loads(storage.read_text(f"{bucket}/prepared/reddit/manifest.json"))
    assert manifest["inputs"] == [f"{bucket}/raw/reddit/reddit_pairs.parquet"]
    assert manifest["pairs"] == manifest["train_pairs"] + manifest["test_pairs"] > 0
    # Ray Train kept its checkpoints in the bucket; the final one was copied to --out.
    assert any("/checkpoint-" in k and k.endswith("model.safetensors") for k in keys(f"{bucket}/ray_results"))
    assert not (out / "ray_results").exists()
    assert (out / "checkpoint" / "model.safetensors").is_file()
    # The bucket's last checkpoint loads from its URI as the copy in --out does.
    uri = _last_checkpoint_uri(bucket)
    texts = ["a man is playing a guitar", "how do I cook rice"]
    assert np.array_equal(load(uri).encode(texts), load(out / "checkpoint").encode(texts))
    # In-training evaluation on: the best checkpoint by STS-B dev is kept beside the last.
    train_info = json.loads((out / "train.json").read_text())
    assert train_info["best_checkpoint"] == str(out / "best_checkpoint")
    assert (out / "best_checkpoint" / "model.safetensors").is_file()
    assert not any(Path(out).glob("prepared"))  # nothing prepared locally


@pytest.mark.slow
def test_evaluate_a_checkpoint_in_the_bucket_on_the_held_out_split_read_back_from_it(trained_on_s3):
    bucket, data, env, out = (trained_on_s3[k] for k in ("bucket", "data", "env", "out"))
    uri = _last_checkpoint_uri(bucket)
    evaluation = _convsts(
        env, "evaluate", "--checkpoint", uri, "--prepared", f"{bucket}/prepared", "--out", str(out / "eval"), *data
    )
    assert evaluation.returncode == 0, evaluation.stdout[-3000:] + evaluation.stderr[-4000:]
    results = json.loads((out / "eval" / "results.json").read_text())
    assert 0.0 <= results["reddit/p_at_1"] <= 1.0  # scored on the held-out split read from the bucket
    assert -1.0 <= results["stsb/dev/pearson"] <= 1.0
    assert 0.0 <= results["cqa2016/map"] <= 1.0
    assert 0.0 <= results["snli/dev/accuracy"] <= 1.0
    # The tuned STS matrix of a checkpoint read from a URI is written to --out only.
    assert -1.0 <= results["stsb_tuned/test/pearson"] <= 1.0 and (out / "eval" / "sts_transform.safetensors").is_file()
    assert not (REPO / "s3:").exists()


@pytest.mark.slow
def test_mine_negatives_with_a_checkpoint_in_the_bucket_into_a_prepared_folder_there(trained_on_s3):
    bucket, env = trained_on_s3["bucket"], trained_on_s3["env"]
    uri = _last_checkpoint_uri(bucket)
    # `convsts mine-negatives` reads the same checkpoint and prepared folder from the bucket and
    # writes its prepared folder there.
    mined = _convsts(
        env,
        "mine-negatives",
        "--checkpoint",
        uri,
        "--prepared",
        f"{bucket}/prepared",
        "--out",
        f"{bucket}/mined",
        "--pairs",
        "300",
    )
    assert mined.returncode == 0, mined.stdout[-3000:] + mined.stderr[-4000:]
    manifest = json.loads(storage.read_text(f"{bucket}/mined/reddit/manifest.json"))
    assert manifest["negatives"]["checkpoint"] == uri and manifest["negatives"]["sampled_pairs"] == 300
    assert 0 < manifest["negatives"]["mined_pairs"] == manifest["train_pairs"] <= 300
    table = tables.read_parquet_table(f"{bucket}/mined/reddit/train")
    assert "negative" in table.column_names and table.num_rows == manifest["train_pairs"]
    assert any(k.startswith("convsts-data/mined/snli/train/") for k in keys(f"{bucket}/mined"))


@pytest.mark.slow
def test_two_reddit_ranks_read_each_shard_from_the_bucket_once_an_epoch_as_one_rank_does(trained_on_s3, caplog):
    """The fit's checkpoint resumed with two Reddit ranks (trainer.feed=ray_data) for more than an
    epoch of Reddit rows: beyond the driver's checks before Ray starts (the same at any group size),
    the GET requests the S3 server answers for each Reddit training shard are one read of it (measured
    here, read as the feed reads it) for each epoch the task's one pipeline covers, as one rank
    reads it; ranks that each read the data themselves (the local feed) read it once a rank an
    epoch. Resumed, the run reads its tokenizer from the checkpoint, not from the shards."""
    from testkit.s3_server import request_log

    from convsts.datasets.sample_order import ShardSet
    from convsts.models.checkpoint import load_train_state
    from convsts.ray_jobs.training.data_feed import check_prepared
    from convsts.ray_jobs.training.feed_dealer import PIPELINE_ROWS

    bucket, data, env, out = (trained_on_s3[k] for k in ("bucket", "data", "env", "out"))
    folder, manifest = (
        f"{bucket}/prepared/reddit/train",
        json.loads(storage.read_text(f"{bucket}/prepared/reddit/manifest.json")),
    )
    records = [(s["file"], int(s["rows"])) for s in manifest["shards"]["train"]]
    cfg = load_config(None, [*data, *TINY_TRAIN])
    task = get_task("reddit")
    shards = ShardSet.of_folder(folder, records, task.feed_columns(cfg))
    with request_log() as once:  # one read of each shard, the feed's own read
        for index in range(len(records)):
            shards.read(index)
    with request_log() as checks, caplog.at_level("INFO", logger="convsts"):  # the driver's checks before Ray starts
        check_prepared(f"{bucket}/prepared", {"reddit": task}, cfg)
        task.check_feed(cfg, f"{bucket}/prepared")
    # The shards are listed at the times `prepare` recorded, so the prepared folder's check reads none
    # of them (the feed's check reads one footer): a folder in a bucket is not downloaded on every start.
    assert manifest["shard_times"]["train"] == {n: t for n, _, t in storage.folder_stats(folder)}
    assert "read whole for their sha256" not in caplog.text
    train_path = "/" + folder.removeprefix("s3://") + "/"

    def gets(seen) -> dict[str, int]:
        counts: dict[str, int] = {}
        for method, path in seen:
            if method == "GET" and path.startswith(train_path) and "?" not in path:
                counts[path] = counts.get(path, 0) + 1
        return counts

    one_read, rows = gets(once), manifest["train_pairs"]
    assert sorted(one_read) == sorted(train_path + name for name, _ in records), once
    uri = _last_checkpoint_uri(bucket)
    start = next(p["reddit"]["rows"] for p in load_train_state(uri).positions if "reddit" in p)  # its Reddit rank's
    covered, epochs = rows - start, 1  # the rows the task's first pipeline deals: whole epochs' rests
    while covered < PIPELINE_ROWS:
        covered, epochs = covered + rows, epochs + 1
    steps = 4 + (rows * 5 // 4) // 64 + 1  # past the checkpoint's step 4: 1.25 epochs at 2 x 32 rows
    assert rows - start < (steps - 4) * 64 <= covered and epochs >= 2  # more than an epoch, one pipeline
    with request_log() as seen:
        resumed = _convsts(env, "train", "--out", str(out.parent / "two_ranks"), "--resume", uri, *data, *TINY_TRAIN,
                           "trainer.feed=ray_data", "trainer.num_workers=3", "trainer.task_workers={reddit: 2, snli: 1}",
                           f"trainer.steps={steps}", f"trainer.checkpoint_every={steps}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-4000:]
    checked = gets(checks)
    read = {path: n - checked.get(path, 0) for path, n in gets(seen).items()}
    assert read and set(read) <= set(one_read), read
    # Each shard read at least once and at most once an epoch of the pipeline; two ranks that each
    # read the trained rows themselves read every shard twice an epoch (here 4 reads: 2 x 2 epochs).
    assert all(one_read[path] <= read[path] <= epochs * one_read[path] for path in read), (read, one_read, epochs)


def test_the_cache_of_uri_folders_keeps_the_most_recently_used_copies(tmp_path, monkeypatch):
    """Each checkpoint read from a bucket is copied once to this machine; evaluating a sweep's
    checkpoints one after another must not fill the disk: past CACHE_ENTRIES copies per kind, the
    least recently used go, but never the one just made nor one used within CACHE_IN_USE_S (another
    process may be reading it), and an unfinished copy only once it is that old."""
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    folders = []
    for i in range(cache.CACHE_ENTRIES + 3):
        (tmp_path / "bucket" / f"ckpt{i}").mkdir(parents=True)
        (tmp_path / "bucket" / f"ckpt{i}" / "weights").write_text(f"weights {i}")
        folders.append(f"file://{tmp_path}/bucket/ckpt{i}")
    hours_ago = time.time() - 2 * cache.CACHE_IN_USE_S
    copies = [cache.local_copy(folder, "checkpoints") for folder in folders[:-1]]  # all in use: none removed
    assert len({c.parent for c in copies}) == 1 and all((c / "weights").is_file() for c in copies)
    for i, copy in enumerate(copies):
        os.utime(copy / ".complete", (hours_ago + i, hours_ago + i))  # used in that order, hours ago
    cache.local_copy(folders[0], "checkpoints")  # the oldest copy is used again now
    unfinished = copies[0].parent / "0123456789abcdef"  # a copy a stopped process left half-written
    unfinished.mkdir()
    os.utime(unfinished, (hours_ago, hours_ago))
    newest = cache.local_copy(folders[-1], "checkpoints")
    kept = {p.name for p in newest.parent.iterdir()}
    # The 8 most recently used stay: the new copy, copy 0 (used again just now) and copies 4 .. 9; copies
    # 1 .. 3, unused for hours, and the unfinished one are gone.
    assert kept == {newest.name, copies[0].name} | {c.name for c in copies[4:]}
    assert (newest / "weights").read_text() == f"weights {len(folders) - 1}"
    assert cache.local_copy(folders[1], "checkpoints").joinpath("weights").read_text() == "weights 1"  # fetched again


def test_results_json_holds_null_for_a_metric_that_could_not_be_computed(tmp_path):
    storage.write_results(tmp_path / "results.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": "s3://K:S@b/x"})
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [1.5, None], "c": "s3://***@b/x"}
