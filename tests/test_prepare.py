"""`convsts prepare` on small files written in the real formats, through a real local Ray."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ray_jobs.config import load_config
from ray_jobs.prepare import prepare_reddit, prepare_snli


def _pairs_table(path):
    rows = {
        "source_file": ["books_2015-02-02.json"] * 4 + ["books_2015-02-03.json"] * 2,
        "subreddit": ["books"] * 6,
        "question": ["What are you reading this week", "I am reading Dune again", "What are you reading this week",
                     "short link", "What are you reading this week", "I am reading Dune again"],
        "answer": ["I am reading Dune again", "Dune is a great book", "https://example.com/book",
                   "x" * 360, "I am reading Dune again", "Dune is a great book"],
    }
    pq.write_table(pa.table(rows), path)


def test_prepare_paired_table_manifest_adds_up(ray_session, tmp_path):
    src = tmp_path / "pairs.parquet"
    _pairs_table(src)
    bad = tmp_path / "more.jsonl"
    bad.write_text(json.dumps({"question": "Is this a good thread", "answer": "Yes it is a good thread"}) + "\n"
                   + "{broken json\n")
    cfg = load_config(None, ["data.test_share=0.5"])
    manifest = prepare_reddit([str(src), str(bad)], tmp_path / "out", cfg, "pairs")
    assert manifest["lines_read"] == 8
    assert manifest["malformed"] == 1 and manifest["malformed_examples"] == [f"{bad}:2"]
    assert manifest["filtered_by_rule"]["banned_prefix"] == 1
    assert manifest["filtered_by_rule"]["too_long"] == 1
    assert manifest["pairs"] == 5 == manifest["train_pairs"] + manifest["test_pairs"]
    assert manifest["lines_read"] == (manifest["pairs"] + manifest["malformed"] + manifest["unpaired"]
                                      + sum(manifest["filtered_by_rule"].values()))
    written = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert written["pairs"] == 5
    train = pq.read_table(tmp_path / "out" / "train").to_pandas() if manifest["train_pairs"] else None
    test = pq.read_table(tmp_path / "out" / "test").to_pandas() if manifest["test_pairs"] else None
    keys = [set(t["thread_key"]) for t in (train, test) if t is not None]
    # The thread crawled on two days (same root) never straddles the split.
    if len(keys) == 2:
        assert not (keys[0] & keys[1])
    with pytest.raises(FileExistsError):
        prepare_reddit([str(src)], tmp_path / "out", cfg, "pairs")


def test_prepare_snli_writes_ranked_shards(ray_session, tmp_path):
    src = tmp_path / "snli.parquet"
    pq.write_table(pa.table({"sentence1": ["a", "b", "c"], "sentence2": ["d", "e", "f"],
                             "label": ["entailment", "-", "neutral"]}), src)
    manifest = prepare_snli(str(src), tmp_path / "snli", load_config())
    assert manifest["pairs"] == 2 and manifest["labels"] == {"entailment": 1, "neutral": 1, "contradiction": 0}
    table = pq.read_table(tmp_path / "snli" / "train").to_pandas()
    assert set(table.columns) >= {"premise", "hypothesis", "label", "fraction_rank"}
    assert table["fraction_rank"].between(0, 1).all()
