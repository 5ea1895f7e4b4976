"""`convsts prepare` on small files written in the real formats: in the driver (small inputs, no Ray)
and through Ray Data on a real local Ray instance, the two compared shard for shard."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task
from convsts.ray_jobs.tasks.prepared_folder import PREPARE_MARKER, prepare_into


def prepare_reddit(inputs, out, cfg, fmt="auto"):
    """The Reddit task's prepare step as `convsts prepare reddit --format FMT` runs it."""
    cfg.data.reddit_format = fmt
    return prepare_into(get_task("reddit"), [str(i) for i in inputs], str(out), cfg)


def prepare_both_ways(inputs, out, cfg):
    """prepare_reddit in the driver (a small input) and through Ray Data (data.driver_bytes=0 and
    data.dump_local_bytes=0): the same manifest (but its timing and the shards' times), so the same
    shards byte for byte (their sha256). Returns it."""
    manifests = []
    limits = (cfg.data.driver_bytes, cfg.data.dump_local_bytes)
    for way, (driver_bytes, dump_bytes) in (("driver", limits), ("ray", (0, 0))):
        cfg.data.driver_bytes, cfg.data.dump_local_bytes = driver_bytes, dump_bytes
        manifests.append(prepare_reddit(inputs, out / way, cfg))
    driver, ray = (
        {**m, "seconds": 0, "shard_times": None, "malformed_examples": sorted(m["malformed_examples"])}
        for m in manifests
    )
    assert driver == ray
    for split in ("train", "test"):
        assert _shards(out / "driver" / split) == _shards(out / "ray" / split), split
    return manifests[0]


def _pairs_table(path):
    rows = {
        "source_file": ["books_2015-02-02.json"] * 4 + ["books_2015-02-03.json"] * 2,
        "subreddit": ["books"] * 6,
        "question": [
            "What are you reading this week",
            "I am reading Dune again",
            "What are you reading this week",
            "short link",
            "What are you reading this week",
            "I am reading Dune again",
        ],
        "answer": [
            "I am reading Dune again",
            "Dune is a great book",
            "https://example.com/book",
            "x" * 360,
            "I am reading Dune again",
            "Dune is a great book",
        ],
    }
    pq.write_table(pa.table(rows), path)


def test_prepare_paired_table_manifest_adds_up(tmp_path):
    src = tmp_path / "pairs.parquet"
    _pairs_table(src)
    bad = tmp_path / "more.jsonl"
    bad.write_text(
        json.dumps({"question": "Is this a good thread", "answer": "Yes it is a good thread"}) + "\n" + "{broken json\n"
    )
    cfg = load_config(None, ["data.test_share=0.5"])
    manifest = prepare_reddit([str(src), str(bad)], tmp_path / "out", cfg, "pairs")
    assert manifest["lines_read"] == 8
    assert manifest["malformed"] == 1 and manifest["malformed_examples"] == [f"{bad}:2"]
    assert manifest["filtered_by_rule"]["banned_prefix"] == 1
    assert manifest["filtered_by_rule"]["too_long"] == 1
    assert manifest["pairs"] == 5 == manifest["train_pairs"] + manifest["test_pairs"]
    assert manifest["lines_read"] == (
        manifest["pairs"] + manifest["malformed"] + manifest["unpaired"] + sum(manifest["filtered_by_rule"].values())
    )
    written = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert written["pairs"] == 5
    train = pq.read_table(tmp_path / "out" / "train").to_pandas() if manifest["train_pairs"] else None
    test = pq.read_table(tmp_path / "out" / "test").to_pandas() if manifest["test_pairs"] else None
    keys = [set(t["thread_key"]) for t in (train, test) if t is not None]
    # The thread crawled on two days (same root) never straddles the split.
    if len(keys) == 2:
        assert not (keys[0] & keys[1])
    with pytest.raises(FileExistsError, match="already holds a prepared reddit folder"):
        prepare_reddit([str(src)], tmp_path / "out", cfg, "pairs")


def test_prepare_snli_writes_ranked_shards(tmp_path):
    src = tmp_path / "snli.parquet"
    pq.write_table(
        pa.table({"sentence1": ["a", "b", "c"], "sentence2": ["d", "e", "f"], "label": ["entailment", "-", "neutral"]}),
        src,
    )
    manifest = get_task("snli").prepare(
        [str(src)], str(tmp_path / "snli"), load_config(None, ["data.rows_per_shard=1"])
    )
    assert [shard["rows"] for shard in manifest["shards"]["train"]] == [1, 1]  # data.rows_per_shard, as Reddit's
    assert manifest["pairs"] == 2 and manifest["labels"] == {"entailment": 1, "neutral": 1, "contradiction": 0}
    assert manifest["without_gold"] == 1  # the '-' pair: left out, and counted
    table = pq.read_table(tmp_path / "snli" / "train").to_pandas()
    assert set(table.columns) >= {"premise", "hypothesis", "label", "fraction_rank"}
    assert table["fraction_rank"].between(0, 1).all()


def _write_dump(path, rows, extra_lines=(), zst=False):
    data = ("\n".join([json.dumps(r) for r in rows] + list(extra_lines)) + "\n").encode()
    if zst:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def _comment(cid, parent, author="alice", body="a perfectly normal comment", link="t3_s1"):
    return {
        "id": cid,
        "parent_id": parent,
        "link_id": link,
        "author": author,
        "body": body,
        "subreddit": "test",
        "created_utc": 1420070400,
    }


def _edge_case_dumps(folder):
    """Two dumps (one .zst, one plain) with a parent in the other file, a bot, a deleted comment, a
    missing parent, malformed lines and bytes that are not UTF-8; their 11 lines make 2 pairs."""
    first = folder / "RC_2015-01.zst"
    second = folder / "RC_2015-02"
    _write_dump(
        first,
        [
            _comment("c1", "t3_s1", body="I think this is a great idea"),
            _comment("c3", "t1_c2", author="helper_bot", body="Beep boop I am a bot here"),
            _comment("c4", "t1_c3", body="nobody asked you, bot"),
            _comment("c5", "t1_gone", body="replying to a deleted ghost"),
            _comment("c6", "t1_c1", body="[deleted]"),
        ],
        extra_lines=["this is not json", json.dumps({"id": "c9", "parent_id": "t1_c1"})],
        zst=True,
    )
    _write_dump(
        second,
        [
            _comment("c2", "t1_c1", author="bob", body="I completely agree with you"),  # parent in the other file
            _comment("d1", "t3_s2", link="t3_s2", body="another thread starts here"),
            _comment("d2", "t1_d1", link="t3_s2", body="and somebody replies to it"),
        ],
        extra_lines=[],
        zst=False,
    )
    with open(second, "ab") as fh:
        fh.write(b'{"id": "bad", "body": "\xff\xfe"}\n')
    return first, second


EDGE_PAIRS = {
    ("I think this is a great idea", "I completely agree with you", "t3_s1"),
    ("another thread starts here", "and somebody replies to it", "t3_s2"),
}


def test_prepare_pushshift_dumps_joins_parents_across_files(tmp_path):
    first, second = _edge_case_dumps(tmp_path)
    m = prepare_reddit([str(first), str(second)], tmp_path / "out", load_config(None, ["data.test_share=0.5"]))
    assert m["format"] == "pushshift"
    assert m["lines_read"] == 11
    assert m["malformed"] == 3
    assert m["malformed_examples"] == [f"{first}:6", f"{first}:7", f"{second}:4"]
    assert m["filtered_by_rule"]["bot_author"] == 1 and m["filtered_by_rule"]["deleted"] == 1
    assert m["unpaired_by_reason"] == {
        "unpaired_parent_is_submission": 2,
        "unpaired_parent_filtered": 1,
        "unpaired_parent_missing": 1,
    }
    assert m["pairs"] == 2
    assert m["lines_read"] == m["pairs"] + m["malformed"] + m["unpaired"] + sum(m["filtered_by_rule"].values())
    pairs = []
    for split in ("train", "test"):
        if (tmp_path / "out" / split).is_dir():
            pairs += pq.read_table(tmp_path / "out" / split).to_pylist()
    assert {(p["context"], p["response"], p["thread_key"]) for p in pairs} == EDGE_PAIRS


def test_prepare_through_ray_data_writes_the_shards_the_streaming_engine_writes(ray_session, tmp_path):
    """bench/prepare_pushshift.py's synthetic dump (threads of 5-35 comments, repeated and malformed
    lines) with the edge-case dumps beside it, prepared by the streaming engine and through Ray Data:
    the same manifest and shards, and the pairs the plain single-process reference finds in the
    synthetic dump plus the edge cases' two, each on the same side of the split (order-insensitive)."""
    from testkit.dumps import prepare_bench

    from convsts.datasets.reddit import split_of

    bench = prepare_bench()
    dump = tmp_path / "RC_synthetic.zst"
    bench.write_dump(dump, 6000)
    pairs, _, rows = bench.reference(dump, tmp_path / "reference.parquet")
    inputs = [str(dump), *map(str, _edge_case_dumps(tmp_path))]
    m = prepare_both_ways(inputs, tmp_path / "out", load_config(None, ["data.rows_per_shard=300"]))
    assert m["duplicate_ids"] > 0 and m["malformed"] > 3 and m["lines_read"] == 6000 + 11
    assert m["pairs"] == pairs + 2 and pairs > 1000
    edge_rows = {(ctx, rsp, split_of(link, 0.1, "convsts")) for ctx, rsp, link in EDGE_PAIRS}
    assert bench.prepared_rows(tmp_path / "out" / "driver") == rows | edge_rows


def test_the_distributed_prepare_holds_partitions_and_tables_not_the_input(ray_session, tmp_path, caplog):
    """The synthetic dump and the edge cases as Ray tasks in 16 partitions, each read task handing its
    rows over every 32 KiB: the engine's manifest and shards byte for byte, no partition holds more
    than a quarter of the comments and no table handed over more than a few flushes' worth."""
    import logging
    import re

    from testkit.dumps import prepare_bench

    from convsts.datasets import pushshift

    bench = prepare_bench()
    dump = tmp_path / "RC_synthetic.zst"
    bench.write_dump(dump, 6000)
    inputs = [str(dump), *map(str, _edge_case_dumps(tmp_path))]
    cfg = load_config(None, ["data.rows_per_shard=300"])
    args = (inputs, cfg.filters, cfg.data.test_share, cfg.data.split_salt)
    engine = pushshift.prepare_local(*args, tmp_path / "engine", 300, parts=1)
    with caplog.at_level(logging.INFO, logger="convsts"):
        spread = pushshift.prepare_distributed(*args, tmp_path / "tasks", 300, parts=16, flush_bytes=32 << 10)
    assert spread == engine
    lines = " ".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("reddit: "))
    largest = re.search(r"partitions \(the largest (\d+) comments\)", lines).group(1)
    table_mib = re.search(r"tables of at most ([\d.]+) MiB", lines).group(1)
    assert 0 < int(largest) < engine["lines_read"] / 4, lines
    assert float(table_mib) < 0.5, lines  # 32 KiB a flush, 3 x 16 tables each: never the input (several MiB)
    # Fewer dumps than CPUs: each dump cut into pieces of 32 KiB, a task each; the same folder again.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="convsts"):
        cut = pushshift.prepare_distributed(*args, tmp_path / "pieces", 300, parts=16, piece_bytes=32 << 10, cpus=64)
    assert cut == engine
    pieces = re.search(r"(\d+) file\(s\) on 64 CPUs, read in (\d+) pieces", caplog.text)
    assert pieces and int(pieces.group(1)) == len(inputs) and int(pieces.group(2)) > 2 * len(inputs), caplog.text
    # Partitions whose rows outgrow 64 KiB (a dump that compresses well) are cut again before their join.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="convsts"):
        recut = pushshift.prepare_distributed(*args, tmp_path / "recut", 300, parts=4, part_bytes=64 << 10)
    assert recut == engine
    assert re.search(r"reddit: 4 partition\(s\) held over 0.0625 MiB of rows and were cut again", caplog.text), (
        caplog.text
    )


def test_a_line_over_the_limit_is_malformed_on_the_distributed_path_as_in_the_engine(ray_session, tmp_path, caplog):
    """Long lines just before every piece edge (2 MiB) and the engine's block edge (8 MiB): one task
    per file (one file on 2 CPUs is read whole) and pieces of 2 or 3 MiB (on 8 CPUs) give the
    engine's manifest and shards, each long line malformed."""
    import logging

    from test_pushshift import long_line_dump

    from convsts.datasets import pushshift

    dump = tmp_path / "RC_long"
    long_at = long_line_dump(dump)
    cfg = load_config(None, ["data.rows_per_shard=300"])
    args = ([str(dump)], cfg.filters, cfg.data.test_share, cfg.data.split_salt)
    engine = pushshift.prepare_local(*args, tmp_path / "engine", 300, parts=2)
    assert engine["malformed"] == len(long_at) and engine["pairs"] > 1000
    with caplog.at_level(logging.INFO, logger="convsts"):
        assert pushshift.prepare_distributed(*args, tmp_path / "file", 300, parts=2, cpus=2) == engine
    assert "read in" not in caplog.text and "1 file(s) read and partitioned" in caplog.text, caplog.text
    for piece_bytes in (2 << 20, 3 << 20):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="convsts"):
            cut = pushshift.prepare_distributed(
                *args, tmp_path / f"p{piece_bytes}", 300, parts=2, piece_bytes=piece_bytes, cpus=8
            )
        assert cut == engine, piece_bytes
        assert "1 file(s) on 8 CPUs, read in" in caplog.text, caplog.text


def test_prepare_reads_dumps_compressed_as_bz2_xz_or_gzip(tmp_path):
    """pushshift's months before 2017-12 ship as .bz2 and .xz: a thread across four months, each
    compressed its own way, pairs across files as plain dumps do."""
    import bz2
    import gzip
    import lzma

    months = {
        "RC_2015-01.bz2": (bz2.compress, [_comment("c1", "t3_s1", body="I think this is a great idea")]),
        "RC_2015-02.xz": (lzma.compress, [_comment("c2", "t1_c1", body="I completely agree with you")]),
        "RC_2015-03.gz": (gzip.compress, [_comment("c3", "t1_c2", body="and so do I, for what it is worth")]),
        "RC_2015-04": (bytes, [_comment("c4", "t1_c3", body="four months of agreement here")]),
    }
    for name, (compress, rows) in months.items():
        (tmp_path / name).write_bytes(compress(("\n".join(json.dumps(r) for r in rows) + "\n").encode()))
    m = prepare_reddit([str(tmp_path / "RC_2015-*")], tmp_path / "out", load_config(None, ["data.test_share=0.0"]))
    assert m["format"] == "pushshift" and m["lines_read"] == 4 and m["pairs"] == 3
    got = {(p["context"], p["response"]) for p in pq.read_table(tmp_path / "out" / "train").to_pylist()}
    assert got == {
        ("I think this is a great idea", "I completely agree with you"),
        ("I completely agree with you", "and so do I, for what it is worth"),
        ("and so do I, for what it is worth", "four months of agreement here"),
    }


def test_a_file_that_is_not_ndjson_fails_at_once_naming_it(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="notes.txt"):
        prepare_reddit([str(notes)], tmp_path / "out", load_config())


def test_the_vocabulary_counted_in_ray_data_counts_every_word_of_the_training_text(sample_prepared):
    """build_tokenizer counts words in Ray Data blocks (a folder over DRIVER_READ_BYTES); a block can hold several map batches' counts,
    so the same word arrives more than once in a batch. Every occurrence must add: the vocabulary
    (ranks by count) is the one counted directly from the prepared shards, and the same every time."""
    from collections import Counter

    import pandas as pd

    from convsts.datasets.text import DanTokenizer, words
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer

    cfg = load_config(None, ["model.encoder=dan"])
    total: Counter = Counter()
    for name in ("reddit", "snli"):
        task = get_task(name)
        frame = pd.read_parquet(sample_prepared / name / "train")
        for column in task.pair:
            for text in frame[column]:
                total.update(words(str(text), cfg.tokenizer.lowercase))
    direct = DanTokenizer.build(total, cfg.tokenizer).vocab
    counted = build_tokenizer(cfg, str(sample_prepared), driver_read_bytes=0).vocab  # in Ray Data
    assert len(counted) == len(direct) > 1000
    assert counted == direct
    # A folder this small is read in the driver by default (Ray Data's tasks take longer to start):
    # the same vocabulary.
    assert build_tokenizer(cfg, str(sample_prepared)).vocab == direct


def test_the_transformers_wordpiece_is_trained_on_the_training_text_read_through_ray_data(sample_prepared):
    """The Transformer's tokenizer is trained on the text of every task's training rows (read from
    Ray Data), not counted: its pieces cover the training words, and nothing is unknown in them."""
    import pandas as pd

    from convsts.datasets.text import SubwordTokenizer
    from convsts.ray_jobs.training.tokenizer_fit import build_tokenizer

    cfg = load_config(None, ["model.encoder=transformer", "tokenizer.subword_vocab_size=2000"])
    tokenizer = build_tokenizer(cfg, str(sample_prepared), driver_read_bytes=0)  # in Ray Data, as at scale
    assert isinstance(tokenizer, SubwordTokenizer) and tokenizer.num_words == 2000
    texts = [
        str(pd.read_parquet(sample_prepared / name / "train")[get_task(name).pair[0]].iloc[0])
        for name in ("reddit", "snli")
    ]
    ids = tokenizer.encode(texts)["ids"]  # (2, L)
    assert (ids[:, 0] > 1).all() and not (ids == 1).any()  # [PAD] 0, [UNK] 1: every character was seen


def _shards(folder):
    """Each parquet shard of a split folder as a table (compared without schema metadata), in file-name
    order (the order training lists them)."""
    return [pq.read_table(f) for f in sorted(folder.glob("*.parquet"))] if folder.is_dir() else []


def test_prepared_through_ray_data_or_in_the_driver_the_shards_are_the_same(sample_prepared, tmp_path):
    """A small input is prepared in the driver (data.driver_bytes), a large one through Ray Data,
    whose groupbys and joins hand rows over as their tasks finish: both write the rows in one order
    fixed by the rows themselves, cut into the same shards, so a run trains the same model on either
    folder (and on a folder prepared again). The order spreads a thread's pairs over the split."""
    from testkit.tiny import SAMPLE_PREPARE

    from convsts.ray_jobs.pipelines.inputs import prepare_all

    names = prepare_all(load_config(None, [*SAMPLE_PREPARE, "data.driver_bytes=0"]), str(tmp_path))
    assert set(names) == {"reddit", "snli"}
    for name in names:
        for split in get_task(name).splits:
            first, again = _shards(sample_prepared / name / split), _shards(tmp_path / name / split)
            assert len(first) == len(again) >= 1, (name, split)
            for a, b in zip(first, again):
                assert a.equals(b), (name, split)
        records = [
            json.loads((root / name / "manifest.json").read_text())["shards"] for root in (sample_prepared, tmp_path)
        ]
        assert records[0] == records[1], name  # byte for byte (each shard's sha256)
    assert len(_shards(sample_prepared / "reddit" / "train")) >= 8  # many shards, each in the same order
    train = pa.concat_tables(_shards(sample_prepared / "reddit" / "train")).to_pandas()
    assert len(train) > 5000
    neighbours = (train["thread_key"].to_numpy()[1:] == train["thread_key"].to_numpy()[:-1]).mean()
    assert neighbours < 0.05, f"{neighbours:.2f} of consecutive pairs share a thread"


def test_prepare_run_again_resumes_an_interrupted_folder_and_never_adds_to_a_prepared_one(
    sample_prepared, tmp_path, caplog
):
    """`convsts prepare all` run again into its --out keeps each task prepared to the end (and
    verified against the run), prepares an interrupted one again from scratch (its shards but no
    manifest: what a killed prepare leaves), and refuses other content. `prepare TASK` into a
    finished folder is refused: Ray Data would have added a second set of shards, and the folder
    would have held every pair twice under a manifest that lists them all."""
    import logging
    import shutil

    from testkit.tiny import SAMPLE_PREPARE

    from convsts.io.errors import BadInputError
    from convsts.ray_jobs.pipelines.inputs import prepare_all

    prepared = tmp_path / "prepared"
    shutil.copytree(sample_prepared, prepared)
    (prepared / "reddit" / "manifest.json").unlink()  # killed while writing the Reddit shards
    (prepared / "reddit" / PREPARE_MARKER).write_text('{"task": "reddit"}\n')  # written before its first shard
    for extra in list((prepared / "reddit" / "train").glob("*.parquet"))[1:]:
        extra.unlink()
    snli_before = (prepared / "snli" / "manifest.json").read_text()
    with caplog.at_level(logging.INFO, logger="convsts"):
        manifests = prepare_all(load_config(None, SAMPLE_PREPARE), str(prepared))
    assert "shards of an interrupted `convsts prepare`" in caplog.text and "removed, prepared again" in caplog.text
    assert f"{prepared / 'snli'}: already prepared from this run's inputs and settings; kept" in caplog.text
    assert (prepared / "snli" / "manifest.json").read_text() == snli_before  # kept as it was
    for split in ("train", "test"):
        again, first = _shards(prepared / "reddit" / split), _shards(sample_prepared / "reddit" / split)
        assert len(again) == len(first) and all(a.equals(b) for a, b in zip(again, first)), split
    assert manifests["reddit"]["train_pairs"] == sum(len(s) for s in _shards(prepared / "reddit" / "train"))

    # A finished folder is never added to.
    snli = get_task("snli")
    with pytest.raises(FileExistsError, match="already holds a prepared snli folder"):
        prepare_into(snli, snli.raw_inputs(load_config(None)), str(prepared / "snli"), load_config(None))
    assert len(_shards(prepared / "snli" / "train")) == len(_shards(sample_prepared / "snli" / "train"))
    # A kept folder is still checked against the run: other settings are refused, naming the key.
    with pytest.raises(BadInputError, match=r"data\.test_share=0\.1 \(this run: 0\.3\)"):
        prepare_all(load_config(None, ["data.test_share=0.3"]), str(prepared))
    # Anything but an interrupted prepare's shards is not removed.
    (prepared / "reddit" / "manifest.json").unlink()
    (prepared / "reddit" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="reddit is not empty and holds no interrupted `convsts prepare`"):
        prepare_all(load_config(None), str(prepared))
    assert (prepared / "reddit" / "notes.txt").read_text() == "mine"


def test_a_users_own_parquet_files_are_never_removed_and_two_prepares_never_share_a_folder(tmp_path):
    """A folder with train/ and test/ of parquet files that no prepare marked as its own (a user's
    files, in the layout a prepare writes) is refused and left byte for byte; a prepare into a folder
    that another process holds is refused naming the holder."""
    import subprocess
    import sys

    from convsts.ray_jobs.runtime.output_lock import OutputInUse

    reddit, cfg = get_task("reddit"), load_config(None)
    out = tmp_path / "D"
    for split, name in (("train", "my_pairs.parquet"), ("test", "my_eval.parquet")):
        (out / split).mkdir(parents=True)
        (out / split / name).write_bytes(b"PAR1 my own rows PAR1")
    with pytest.raises(
        FileExistsError, match=f"holds no interrupted `convsts prepare` of reddit \\(no {PREPARE_MARKER}\\)"
    ):
        prepare_into(reddit, reddit.raw_inputs(cfg), str(out), cfg)
    assert (out / "train" / "my_pairs.parquet").read_bytes() == b"PAR1 my own rows PAR1"
    assert (out / "test" / "my_eval.parquet").read_bytes() == b"PAR1 my own rows PAR1"

    held = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from convsts.ray_jobs.runtime.output_lock import output_lock\n"
         f"with output_lock({str(held)!r}, 'prepare'):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputInUse, match="is in use by another run \\(`convsts prepare`"):
            prepare_into(reddit, reddit.raw_inputs(cfg), str(held), cfg)
    finally:
        holder.communicate("", timeout=30)
    assert not held.exists()  # nothing written; the holder's lock file, and the folder it made, went with it
