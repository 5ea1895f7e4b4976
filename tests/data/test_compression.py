"""Compressed inputs (convsts.io.compression): pushshift's .zst, .bz2 and .xz dumps, MTEB's .jsonl.gz,
read whole, across concatenated streams, and refused in one line when cut or corrupt."""

import bz2
import gzip
import io
import json
import lzma

import pandas as pd
import pytest
import zstandard

from convsts.datasets import evalsets, pushshift, reddit, snli
from convsts.io import compression
from convsts.io.errors import BadInputError

COMPRESS = {
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
}
KIND = {".zst": "zstd", ".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}


def _lines(n: int, start: int = 0) -> bytes:
    rows = [
        {
            "id": f"c{i}",
            "parent_id": "t3_x",
            "link_id": "t3_x",
            "author": "someone",
            "body": f"comment number {i} with a few words",
            "subreddit": "test",
        }
        for i in range(start, start + n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_every_compression_is_one_set_of_suffixes():
    assert set(COMPRESS) == set(compression.SUFFIXES)
    assert compression.plain_name("s3://b/mteb/test.jsonl.gz?region=eu") == "test.jsonl"
    assert compression.plain_name("RC_2015-01.bz2") == "RC_2015-01" and compression.plain_name("a.jsonl") == "a.jsonl"


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_a_compressed_file_reads_whole_and_across_concatenated_streams(tmp_path, suffix):
    path = tmp_path / f"RC_2015-01{suffix}"
    path.write_bytes(COMPRESS[suffix](_lines(3000)) + COMPRESS[suffix](_lines(5, start=3000)))
    with compression.open_lines(path) as fh:
        lines = list(fh)
    assert b"".join(lines) == _lines(3005)
    bodies = [body for frame in pushshift.read_dump_file(str(path), chunk_bytes=1000) for body in frame["body"]]
    assert len(bodies) == 3005 and bodies[-1] == "comment number 3004 with a few words"
    assert reddit.detect_format(str(path)) == "pushshift"


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_a_cut_or_corrupt_compressed_file_is_refused_naming_it(tmp_path, suffix):
    data = COMPRESS[suffix](_lines(20000))
    cut = tmp_path / f"RC_cut{suffix}"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    with pytest.raises(BadInputError, match=rf"RC_cut{suffix}: truncated {KIND[suffix]} file"):
        sum(1 for _ in compression.open_lines(cut))
    corrupt = bytearray(data)
    corrupt[len(data) // 2 : len(data) // 2 + 64] = b"\x00" * 64
    bad = tmp_path / f"RC_bad{suffix}"
    bad.write_bytes(bytes(corrupt))
    with pytest.raises(BadInputError, match=rf"RC_bad{suffix}: corrupt {KIND[suffix]} data"):
        sum(1 for _ in compression.open_lines(bad))


class _FailingStore(io.RawIOBase):
    """A stream that gives some bytes and then fails as a store's connection does (an OSError)."""

    def __init__(self, data: bytes):
        self._data = io.BytesIO(data[:4096])

    def readable(self):
        return True

    def readinto(self, buffer):
        n = self._data.readinto(buffer)
        if n == 0:
            raise ConnectionResetError("connection reset by the store")
        return n


def test_a_store_failing_mid_read_is_its_own_error_not_corrupt_data():
    """gzip and bzip2 report corrupt data as OSError, as pyarrow reports a store's failure: the
    store's error goes through unchanged, not as 'corrupt gzip data'."""
    for suffix in (".gz", ".bz2"):
        kind, opener = compression.STDLIB[suffix]
        stream = compression._StdlibLines(
            _FailingStore(COMPRESS[suffix](_lines(20000))), f"s3://b/RC{suffix}", kind, opener
        )
        with pytest.raises(ConnectionResetError, match="connection reset by the store"):
            sum(1 for _ in io.BufferedReader(stream))


def test_a_paired_table_reads_compressed(tmp_path):
    rows = [{"question": "What are you reading this week", "answer": "I am reading Dune again"}, {"question": 3}]
    path = tmp_path / "pairs.jsonl.xz"
    path.write_bytes(lzma.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    assert reddit.detect_format(str(path)) == "pairs"
    pairs = reddit.read_pairs_file(str(path))
    assert list(pairs["status"]) == ["", "malformed"] and pairs["response"].iloc[0] == "I am reading Dune again"


def test_snli_and_sts_files_read_compressed_as_their_releases_ship_them(tmp_path):
    rows = [
        {"sentence1": "A man.", "sentence2": "A person.", "gold_label": "entailment"},
        {"sentence1": "A dog.", "sentence2": "A cat.", "gold_label": "-"},
    ]
    (tmp_path / "snli_1.0_dev.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    )
    nli = snli.read_snli(tmp_path / "snli_1.0_dev.jsonl.gz")
    assert list(nli["premise"]) == ["A man."] and nli.attrs["without_gold"] == 1
    table = "sentence1\tsentence2\tgold_label\nKids play.\tAdults sleep.\tcontradiction\n"
    (tmp_path / "snli_1.0_test.txt.bz2").write_bytes(bz2.compress(table.encode()))
    assert list(snli.read_snli(tmp_path / "snli_1.0_test.txt.bz2")["label"]) == [snli.LABEL_IDS["contradiction"]]

    # MTEB's STS files: test.jsonl.gz, one folder per set; named by the folder, as "test" names no set.
    sts = pd.DataFrame(
        {
            "sentence1": ["a cat sits", "a man sings"],
            "sentence2": ["a cat is sitting", "stocks fell"],
            "score": [4.6, 0.2],
        }
    )
    for folder in ("sts12-sts", "sickr-sts"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test.jsonl.gz").write_bytes(
            gzip.compress(sts.to_json(orient="records", lines=True).encode())
        )
    pd.testing.assert_frame_equal(evalsets.read_sts_file(tmp_path / "sts12-sts" / "test.jsonl.gz"), sts)
    paths = [str(tmp_path / f / "test.jsonl.gz") for f in ("sts12-sts", "sickr-sts")]
    assert sorted(evalsets.sts_set_names(paths).values()) == ["sickr-sts.test", "sts12-sts.test"]
    assert evalsets.sts_set_names(paths[:1]) == {paths[0]: "sts12-sts.test"}
    assert evalsets.sts_set_names(["test.jsonl"]) == {"test.jsonl": "test"}  # no folder to name it by
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(sts.to_json(orient="records", lines=True).encode())[:-12])
    with pytest.raises(BadInputError, match="cut.jsonl.gz: truncated gzip file"):
        evalsets.read_sts_file(tmp_path / "cut.jsonl.gz")
