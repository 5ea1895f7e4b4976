"""The columnar pushshift reader and filters against their line-by-line definitions (parse_comment,
failing_rule), and the local engine's spill partitions (no Ray)."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit.dumps import prepare_bench

from convsts.datasets import pushshift
from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.reddit import failing_rule

CFG = RedditFilterConfig()


def _line(cid="a1", **fields):
    return json.dumps({"id": cid, "parent_id": "t3_x", "link_id": "t3_x", "author": "alice", "body": "hello"} | fields)


TRICKY_LINES = [
    _line(),
    "",  # blank
    "   " + _line("a2"),  # valid JSON with spaces before it: not well shaped, still a comment
    _line("a3") + "\r",  # a CRLF line end
    _line("a4") + " " + _line("a5"),  # two objects on one line: malformed
    '{"id": "broken',  # cut off
    json.dumps({"id": "a6", "parent_id": "t3_x", "link_id": "t3_x", "author": "bob", "body": 5}),  # wrong type
    json.dumps({"id": "a7", "parent_id": "t3_x", "link_id": "t3_x", "body": "no author"}),  # field missing
    '{"id": "a8", "parent_id": "t3_x", "link_id": "t3_x", "author": "c", "body": "\xff\xfe"}',  # not UTF-8 (below)
    "[1, 2, 3]",  # JSON, not an object
    _line("a9", body="caf\u00e9 \u00fcber na\u00efve", subreddit=None),  # non-ASCII; a null subreddit
    _line("b1"),  # the last line has no newline
]


def _dump_bytes(lines):
    data = "\n".join(lines).encode("utf-8")
    return data.replace("\xff\xfe".encode(), b"\xff\xfe")  # the raw bytes, invalid UTF-8


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 64, 7])
def test_the_chunked_reader_reads_each_line_as_parse_comment_does(tmp_path, chunk_bytes):
    """Every line is one row, in any chunk size (a chunk smaller than a line included): Arrow's rows for
    well-shaped lines, the others line by line, each with its line number; malformed exactly where
    parse_comment says so; a byte-order mark at the start of the file is accepted."""
    path = tmp_path / "RC_tricky"
    path.write_bytes(pushshift.reading.BOM + _dump_bytes(TRICKY_LINES))
    rows = sorted(
        (
            r
            for table in pushshift.read_dump_chunks(str(path), rank=2, chunk_bytes=chunk_bytes)
            for r in table.to_pylist()
        ),
        key=lambda r: r["line"],
    )
    raw_lines = _dump_bytes(TRICKY_LINES).split(b"\n")
    assert [r["line"] for r in rows] == list(range(1, len(raw_lines) + 1))
    assert all(r["order"] == (2 << pushshift.reading.LINE_BITS) + r["line"] for r in rows)
    for row, raw in zip(rows, raw_lines):
        expected = pushshift.parse_comment(raw)
        if expected is None:
            assert row["status"] == "malformed" and row["id"] == "", raw
        else:
            assert row["status"] == "" and {k: row[k] for k in expected} == expected, raw
    assert [r["line"] for r in rows if r["status"] == "malformed"] == [2, 5, 6, 7, 8, 9, 10]


RULE_CASES = [
    ("a" * 349, "alice"),
    ("a" * 350, "alice"),
    ("\u00e9" * 349, "alice"),  # 349 code points in 698 bytes: not too long
    ("\u00e9" * 350, "alice"),
    ("abcdefg 12", "alice"),  # 7/10 letters: low
    ("abcdefgh12", "alice"),
    ("\u00e9\u00e8\u00ea\u00eb\u00e0\u00e2\u00ee 12", "alice"),  # 7/10 non-ASCII letters: low, as str.isalpha counts
    ("\u4e2d\u6587\u5b57\u7b26\u4e32\u6d4b\u8bd5\u7528\u4f8b\u554a", "alice"),  # CJK letters are alphabetic
    ("", "alice"),
    ("[deleted]", "alice"),
    ("  [removed]\n", "alice"),
    ("\x1c[deleted]\x1f", "alice"),  # str.strip() removes the ASCII separators too
    ("\u3000[deleted]\u00a0", "alice"),  # and Unicode spaces
    ("[deleted] for real, a sentence", "alice"),
    ("a fine comment about things", "helper_bot"),
    ("a fine comment about things", "RoBoTnik"),
    ("a fine comment about things", "\u00dfbot\u00e9"),  # a non-ASCII author
    ("a fine comment about things", ""),
    ("https://example.com look", "alice"),
    ("/r/pics is good", "alice"),
    ("@you hello there friend", "alice"),
    (" https://not-a-prefix.example with a space first", "alice"),
]


def test_the_vectorized_filters_give_failing_rule_s_answer_string_for_string():
    bodies = pa.array([b for b, _ in RULE_CASES], pa.string())
    authors = pa.array([a for _, a in RULE_CASES], pa.string())
    got = pushshift.rules.rule_status(bodies, authors, CFG)
    assert list(got) == [failing_rule(b, a, CFG) for b, a in RULE_CASES]
    assert set(got) >= {"", "deleted", "bot_author", "banned_prefix", "too_long", "low_alpha"}


def test_the_local_engine_finds_the_reference_rows_with_any_number_of_spill_partitions(tmp_path):
    """bench/prepare_pushshift.py's synthetic dump (threads, repeated ids, malformed lines) in one spill
    partition and in five: the same manifest and the same shards byte for byte, and the pairs are the
    rows the plain single-process reference finds."""
    bench = prepare_bench()
    dump = tmp_path / "RC_synthetic.zst"
    bench.write_dump(dump, 6000)
    pairs, _, rows = bench.reference(dump, tmp_path / "reference.parquet")
    manifests = [
        pushshift.prepare_local([str(dump)], CFG, 0.1, "convsts", tmp_path / f"out{parts}", 300, parts=parts)
        for parts in (1, 5)
    ]
    assert manifests[0] == manifests[1]
    m = manifests[0]
    assert m["lines_read"] == 6000 and m["duplicate_ids"] > 0 and m["malformed"] > 0 and m["pairs"] == pairs
    assert len(m["shards"]["train"]) == m["train_pairs"] // 300
    got = set()
    for split in ("train", "test"):
        got |= {(r["context"], r["response"], split) for r in pq.read_table(tmp_path / "out5" / split).to_pylist()}
    assert got == rows


def test_the_distributed_prepare_cuts_more_partitions_as_the_input_grows():
    """One partition per 256 MiB of input as stored and per three quarters of a task's rows (its
    budget, PARTITION_ROW_BYTES), at least one per CPU."""
    step, rows = pushshift.distributed.TASK_PARTITION_BYTES, pushshift.steps.PARTITION_ROW_BYTES * 3 // 4
    assert [pushshift.cluster_partitions(n * step, cpus=2) for n in (0, 1, 2, 3, 40, 400)] == [2, 2, 2, 3, 40, 400]
    assert pushshift.cluster_partitions(step, cpus=16) == 16
    assert [pushshift.cluster_partitions(step, 2, n * rows) for n in (1, 2, 3, 10)] == [2, 2, 3, 10]
    assert pushshift.cluster_partitions(step, 2, 10 * rows + 1) == 11


def _rows_read(path: Path) -> int:
    """The rows (candidate and reply bytes) a read task counts in one dump, read as a whole."""
    *_, counts = pushshift.distributed.partitioned_chunks(pushshift.steps.ruled_chunks(str(path), 0, CFG), 1, 1 << 62)
    return sum(counts[4])


def test_the_rows_of_dumps_are_estimated_from_their_first_bytes_whatever_the_compression(tmp_path):
    """row_bytes_estimate: a dump smaller than its sample gives the rows its read counts, whatever its
    compression; a larger one, the rows of its first SAMPLE_BYTES scaled to its size, within a few
    percent, at 3x and at a monthly dump's 8x (bench/prepare_pushshift.py's two kinds)."""
    import bz2
    import gzip
    import lzma

    import zstandard

    bench = prepare_bench()
    plain = tmp_path / "RC_small"
    bench.write_dump(tmp_path / "RC_small.zst", 3000)
    plain.write_bytes(zstandard.ZstdDecompressor().decompressobj().decompress((tmp_path / "RC_small.zst").read_bytes()))
    exact = _rows_read(plain)
    for suffix, compress in ((".zst", None), (".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        path = tmp_path / f"RC_small{suffix}"
        if compress:
            path.write_bytes(compress(plain.read_bytes()))
        assert pushshift.row_bytes_estimate([str(path)], CFG) == exact, suffix
    assert pushshift.row_bytes_estimate([str(plain)], CFG) == exact
    for kind, lines in (("synthetic", 80_000), ("monthly", 80_000), ("real", 130_000)):  # about 3x, 8x and 14x in zstd
        big = tmp_path / f"RC_{kind}.zst"
        bench.write_dump(big, lines, kind=kind)
        assert big.stat().st_size > 2 * pushshift.distributed.SAMPLE_BYTES
        estimate, rows = pushshift.row_bytes_estimate([str(big)], CFG), _rows_read(big)
        assert abs(estimate - rows) < 0.05 * rows, (kind, estimate, rows)


def test_a_read_task_parses_on_its_threads_and_gives_its_worker_back_as_it_was(tmp_path):
    """_read_partitioned sets Arrow's pool to `threads` while it reads (a Ray worker's is one CPU's)
    and restores it, for the tasks that worker runs next; the same tables on any number."""
    import pyarrow as pa

    dump = tmp_path / "RC_t.zst"
    prepare_bench().write_dump(dump, 2000)
    before = pa.cpu_count()
    one, two = (list(pushshift.distributed.read_partitioned(str(dump), 0, CFG, 2, 1 << 62, threads=n)) for n in (1, 3))
    assert pa.cpu_count() == before
    assert [t.equals(u) if t is not None else u is None for t, u in zip(one[:-1], two[:-1])] == [True] * 6
    assert one[-1] == two[-1]


LONG_LINE_EDGES = [2 << 20, 4 << 20, 6 << 20, 8 << 20]  # piece edges at 2 MiB, the engine's block at 8 MiB


def long_line_dump(path: Path) -> set[int]:
    """Short comments with, 0.3 MB before each of LONG_LINE_EDGES, a comment of 1.5 MiB (valid JSON,
    a reply to it after it), and a line of exactly MAX_LINE_BYTES and one of a byte more; returns
    the numbers of the lines over MAX_LINE_BYTES, which are malformed wherever they fall."""
    limit = pushshift.reading.MAX_LINE_BYTES

    def sized(cid: str, size: int) -> bytes:
        empty = _line(cid, body="").encode()
        return _line(cid, body="x" * (size - len(empty))).encode()

    lines: list[bytes] = []
    size, long_at, short = 0, set(), 0

    def add(line: bytes) -> None:
        nonlocal size
        lines.append(line)
        size += len(line) + 1

    add(sized("exact", limit))
    add(sized("over", limit + 1))
    long_at.add(2)
    for k, edge in enumerate(LONG_LINE_EDGES):
        while size < edge - 300_000:
            short += 1
            add(_line(f"s{short}", body=f"short comment {short} with words", parent_id=f"t1_s{short - 1}").encode())
        add(sized(f"long{k}", 3 * limit // 2))
        long_at.add(len(lines))
        add(_line(f"reply{k}", body="a reply to the long one", parent_id=f"t1_long{k}").encode())
    path.write_bytes(b"\n".join(lines) + b"\n")
    return long_at


@pytest.mark.parametrize("chunk_bytes", [pushshift.reading.CHUNK_BYTES, 2 << 20, 3 << 20, 1 << 20])
def test_a_line_over_the_limit_is_malformed_wherever_it_falls(tmp_path, chunk_bytes):
    """The one rule: a line of more than MAX_LINE_BYTES is malformed, inside a block or across its
    end, at every block size; a line of exactly MAX_LINE_BYTES is read."""
    dump = tmp_path / "RC_long"
    long_at = long_line_dump(dump)
    tables = list(pushshift.read_dump_chunks(str(dump), chunk_bytes=chunk_bytes))
    rows = pa.concat_tables(tables).to_pandas()
    malformed = set(rows.loc[rows["status"] == "malformed", "line"])
    assert malformed == long_at and len(rows) == rows["line"].max()
    assert rows.loc[rows["line"] == 1, "id"].item() == "exact"


def test_the_engine_joins_a_partition_with_replies_and_no_comments(tmp_path):
    """Replies whose parents are in no file, in partitions where no comment hashed: the one pairs
    step (both engines') counts each parent missing."""
    dump = tmp_path / "RC_orphans"
    dump.write_text("\n".join(_line(f"r{i}", parent_id=f"t1_gone{i}", body=f"a reply number {i}") for i in range(3)))
    m = pushshift.prepare_local([str(dump)], CFG, 0.1, "convsts", tmp_path / "out", 300, parts=64)
    assert m["unpaired_by_reason"] == {"unpaired_parent_missing": 3} and m["pairs"] == 0


@pytest.mark.parametrize("cuts", [[], [5], [0, 0, 7, 8, 9], [3, 250, 251, 600], list(range(0, 1000, 97))])
def test_shards_written_range_by_range_with_their_pieces_joined_are_the_writers_bytes(tmp_path, cuts):
    """The one shard writer: key ranges of any size (empty, smaller than a shard, crossing several)
    written each on its own (write_range, as the distributed prepare's tasks do) with the pieces of
    the shards that cross their ends joined (write_pieces) give ShardWriter's shards, byte for byte."""
    from convsts.datasets.shards import ShardPlan, ShardWriter, write_pieces, write_range

    table = pa.table({"context": [f"c{i}" for i in range(1000)], "response": [f"r{i}" * (i % 7) for i in range(1000)]})
    whole = ShardWriter(tmp_path / "whole", table.num_rows, 300)
    whole.add(table)
    expected = whole.close()
    plan, bounds = ShardPlan(table.num_rows, 300), [0, *cuts, table.num_rows]
    (tmp_path / "ranges").mkdir()
    records, pieces = {}, {}
    for start, stop in zip(bounds, bounds[1:]):
        written, left = write_range(tmp_path / "ranges", plan, start, table.slice(start, stop - start))
        records.update(written)
        for index, rows in left.items():
            pieces.setdefault(index, []).append(rows)
    records |= {index: write_pieces(tmp_path / "ranges", index, rows) for index, rows in pieces.items()}
    assert [records[i] for i in sorted(records)] == expected and len(expected) == 3
    for record in expected:
        assert (tmp_path / "ranges" / record["file"]).read_bytes() == (tmp_path / "whole" / record["file"]).read_bytes()


def test_the_engine_cuts_a_partition_whose_rows_outgrow_the_budget_and_writes_the_same_shards(tmp_path, caplog):
    """Partitions are sized by their rows as read (decompressed and parsed), not by the input as
    stored: with a budget of 32 KiB of rows every partition of the synthetic dump is cut again, some
    more than once, and the manifest and shards are those of one uncut partition."""
    import logging

    bench = prepare_bench()
    dump = tmp_path / "RC_synthetic.zst"
    bench.write_dump(dump, 6000)
    whole = pushshift.prepare_local([str(dump)], CFG, 0.1, "convsts", tmp_path / "whole", 300, parts=1)
    with caplog.at_level(logging.INFO, logger="convsts"):
        cut = pushshift.prepare_local(
            [str(dump)], CFG, 0.1, "convsts", tmp_path / "cut", 300, parts=2, part_bytes=32 << 10
        )
    assert cut == whole
    recut = [r.getMessage() for r in caplog.records if "were cut again" in r.getMessage()]
    assert len(recut) == 1 and int(recut[0].split()[1]) > 2, recut
    for record in whole["shards"]["train"]:
        assert (tmp_path / "cut" / "train" / record["file"]).read_bytes() == (
            tmp_path / "whole" / "train" / record["file"]
        ).read_bytes()


def test_the_engines_pairs_are_written_in_ranges_within_the_budget_however_many_comments_pair(tmp_path):
    """The pairs spilled for writing are cut into key ranges by the rows spilled, not by the input as
    stored: a dump of one stored partition whose comments come to many budgets of rows has as many
    ranges, each within about a budget (a dump where most replies pair holds about as many bytes of
    pairs as of comments); written one after another, they give the shards of one range."""
    from convsts.datasets.pushshift.local import Spill
    from convsts.datasets.pushshift.steps import cut_ways, partition_pairs, ruled_chunks

    bench = prepare_bench()
    dump = tmp_path / "RC_synthetic.zst"
    bench.write_dump(dump, 6000)
    budget = 32 << 10
    spill = Spill(tmp_path, parts=1)
    for chunk in ruled_chunks(str(dump), 0, CFG):
        spill.add_comments(pushshift.steps.without_malformed(chunk, 0)[0])
    spill.close("candidate")
    spill.close("reply")
    spilled = spill.size(0)
    spill.set_ranges(budget)
    assert spill.ranges == cut_ways(spilled, budget) > 10
    _, pairs = partition_pairs(
        [spill.read("reply", 0)], lambda: [spill.read("candidate", 0)], pa.array([], pa.int64()), 0.1, "s"
    )
    for split, table in pairs.items():
        spill.add_pairs(split, table)
    spill.close("pairs-train")
    sizes = [f.stat().st_size for f in tmp_path.glob("pairs-train-*.arrow")]
    assert len(sizes) > 10 and max(sizes) <= 1.5 * budget, (len(sizes), max(sizes))
    one = pushshift.prepare_local([str(dump)], CFG, 0.1, "s", tmp_path / "one", 300, parts=1, part_bytes=1 << 30)
    cut = pushshift.prepare_local([str(dump)], CFG, 0.1, "s", tmp_path / "cut", 300, parts=1, part_bytes=budget)
    assert cut == one
    for record in one["shards"]["train"]:
        assert (tmp_path / "cut" / "train" / record["file"]).read_bytes() == (
            tmp_path / "one" / "train" / record["file"]
        ).read_bytes()
