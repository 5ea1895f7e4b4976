"""The training feed read by the workers themselves (data_feed.TaskStream over sample_order): one order
per epoch at any number of ranks, positions counted in rows, exactly-once reads across sizes, a
resume that seeks, length bucketing. On parquet shards written here; no Ray."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from convsts.datasets.sample_order import EpochOrder, ShardSet
from convsts.datasets.text import DanTokenizer, count_words
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task
from convsts.ray_jobs.training.data_feed import TaskStream, batch_encoder, task_shards
from convsts.ray_jobs.training.feed_reader import BatchEncoder

ROWS, PER_SHARD = 240, 20


def _folder(tmp_path, rows=ROWS, per_shard=PER_SHARD):
    """Shards of rows with an id, a text of 1-12 words and a label; their (file, rows) records."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "train"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for index, start in enumerate(range(0, rows, per_shard)):
        ids = list(range(start, min(rows, start + per_shard)))
        texts = [" ".join(f"w{int(w)}" for w in rng.integers(0, 50, size=int(rng.integers(1, 13)))) for _ in ids]
        name = f"part-{index:06d}.parquet"
        pq.write_table(pa.table({"row": ids, "context": texts, "label": [i % 3 for i in ids]}), folder / name)
        records.append((name, len(ids)))
    return str(folder), records


def _rows_of(table: pa.Table) -> dict[str, np.ndarray]:
    lengths = np.array([len(t.split()) for t in table.column("context").to_pylist()])
    ids = np.zeros((table.num_rows, 12), dtype=np.int64)  # (B, 12): the words' count as real tokens
    for i, n in enumerate(lengths):
        ids[i, :n] = 1
    return {"row": table.column("row").to_numpy(), "context__ids": ids}


def _stream(shards, share, position=None, batch_size=8, bucket_batches=0, block_rows=60):
    return TaskStream("reddit", shards, _rows_of, batch_size, share, "cpu", 7, block_rows, position, bucket_batches, 0)


def _take(streams, steps):
    """`steps` global batches: a batch from each rank's stream in turn; the rows each read."""
    read = []
    for _ in range(steps):
        for stream in streams:
            read.extend(int(r) for r in next(stream)["row"])
    return read


def test_an_epochs_order_is_the_same_at_any_number_of_ranks_and_each_row_comes_once(tmp_path):
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])
    orders = {}
    for ranks in (1, 2, 3):
        streams = [_stream(shards, (i, ranks)) for i in range(ranks)]
        orders[ranks] = _take(streams, 24 // ranks)  # 192 rows of the epoch
        for stream in streams:
            stream.close()
    assert orders[1] == orders[2] == orders[3]
    whole = EpochOrder(shards, 7, 0, 60).rows(0, ROWS).column("row").to_pylist()
    assert sorted(whole) == list(range(ROWS)) and orders[1] == whole[:192]
    assert whole != list(range(ROWS))  # shuffled
    assert EpochOrder(shards, 7, 1, 60).rows(0, ROWS).column("row").to_pylist() != whole  # another each epoch


def test_a_group_resized_2_1_2_reads_each_row_of_an_epoch_exactly_once(tmp_path):
    """Two ranks, then one from the first rank's position, then two again: the rows of every full
    global batch are read once each, in the epoch's one order, and the next epoch starts anew."""
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])
    whole = EpochOrder(shards, 7, 0, 60).rows(0, ROWS).column("row").to_pylist()
    read, position = [], None
    for ranks, steps in ((2, 4), (1, 5), (2, 8)):  # 64 + 40 + 128 rows: 232 of 240, no batch of 16 left
        streams = [_stream(shards, (i, ranks), position) for i in range(ranks)]
        read += _take(streams, steps)
        position = streams[0].position()
        assert all(s.position() == position for s in streams)  # the ranks of a task share it
        for stream in streams:
            stream.close()
    assert read == whole[:232] and len(set(read)) == 232
    assert position == {"epoch": 0, "rows": 232, "batch_size": 8, "ranks": 2}
    stream = _stream(shards, (0, 1), position)  # one rank: the last 8 rows are a global batch of its own
    assert [int(r) for r in next(stream)["row"]] == whole[232:]
    assert [int(r) for r in next(stream)["row"]] == EpochOrder(shards, 7, 1, 60).rows(0, 8).column("row").to_pylist()
    assert stream.position() == {"epoch": 1, "rows": 8, "batch_size": 8, "ranks": 1}
    stream.close()


def test_a_resume_seeks_and_reads_no_row_it_skips(tmp_path):
    """Opened late in the epoch at another size, a stream reads only the block that holds its next
    rows, not the ones before it; at the same size and batch size it gives the undisturbed batches."""
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])
    undisturbed = _stream(shards, (0, 1))
    batches = [next(undisturbed) for _ in range(30)]
    undisturbed.close()
    late = ShardSet.of_folder(folder, records, ["row", "context"])
    resumed = _stream(late, (0, 2), {"epoch": 0, "rows": 200, "batch_size": 4, "ranks": 1})
    assert [int(r) for r in next(resumed)["row"]] == [int(r) for r in batches[25]["row"]]  # rows 200-207
    assert late.rows_read <= 60 + PER_SHARD  # the last block (three shards, or four), nothing before it
    assert 0 < resumed.opening_rows_read <= 60 + PER_SHARD  # what the stream says it read to reach row 200
    resumed.close()
    position = {"epoch": 0, "rows": 80, "batch_size": 8, "ranks": 1}
    again = _stream(ShardSet.of_folder(folder, records, ["row", "context"]), (0, 1), position)
    assert all(torch.equal(next(again)["row"], b["row"]) for b in batches[10:30])  # rows 80-239, as undisturbed
    again.close()


def test_length_bucketing_keeps_every_row_groups_similar_lengths_and_resumes_inside_a_window(tmp_path):
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])

    def epoch(bucket_batches):
        stream = _stream(shards, (0, 1), bucket_batches=bucket_batches)
        batches = [next(stream) for _ in range(30)]  # one epoch: 240 rows / 8
        stream.close()
        return batches

    def spread(batches):
        return float(np.mean([b["context__ids"].sum(1).float().std().item() for b in batches]))

    plain, bucketed = epoch(0), epoch(10)
    for batches in (plain, bucketed):
        assert sorted(int(r) for b in batches for r in b["row"]) == list(range(ROWS))
    assert spread(bucketed) < 0.5 * spread(plain)
    assert all(torch.equal(a["row"], b["row"]) for a, b in zip(bucketed, epoch(10)))
    stream = _stream(shards, (0, 1), bucket_batches=10)
    for _ in range(14):  # 4 batches into the second window
        next(stream)
    position = stream.position()
    stream.close()
    assert position == {"epoch": 0, "rows": 80, "batch_size": 8, "ranks": 1, "in_window": 4}
    resumed = _stream(shards, (0, 1), position, bucket_batches=10)
    assert all(torch.equal(next(resumed)["row"], b["row"]) for b in bucketed[14:30])
    resumed.close()


def test_a_filtered_task_reads_its_kept_rows_tokenized_by_the_runs_tokenizer(tmp_path):
    """SNLI at data.snli_fraction=0.5: the stream reads the nested subset only, each row once an
    epoch, its premise and hypothesis tokenized by the run's tokenizer and its label kept."""
    rows = [(f"a man plays {i}", f"someone plays {i % 7}", i % 3) for i in range(200)]
    folder = tmp_path / "snli" / "train"
    folder.mkdir(parents=True)
    table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(("premise", "hypothesis", "label"))})
    pq.write_table(table, folder / "part-000000.parquet")
    cfg = load_config(None, ["data.snli_fraction=0.5", "model.encoder=dan"])
    task = get_task("snli")
    shards = task_shards(task, cfg, {"folder": str(folder), "shards": [("part-000000.parquet", 200)]})
    assert 70 < shards.rows < 130
    tokenizer = DanTokenizer.build(count_words([t for r in rows for t in r[:2]]), cfg.tokenizer)
    encode = batch_encoder(task, tokenizer, 8, cfg)
    stream = TaskStream("snli", shards, encode, 10, (0, 1), "cpu", 3, 60)
    batches = [next(stream) for _ in range(shards.rows // 10)]
    stream.close()
    assert {"premise__words", "hypothesis__words", "label"} <= set(batches[0])
    words = torch.cat([b["premise__words"] for b in batches])  # (kept, 8)
    assert len({tuple(w.tolist()) for w in words}) == len(words)  # every kept row once
    assert batches[0]["label"].dtype == torch.int64


def test_a_rank_share_smaller_than_a_batch_is_one_line(tmp_path):
    folder, records = _folder(tmp_path, rows=20)
    with pytest.raises(RuntimeError, match=r"reddit: 20 training rows, fewer than one batch of its 3 rank\(s\)"):
        _stream(ShardSet.of_folder(folder, records, ["row", "context"]), (0, 3))


def test_a_stream_read_in_processes_gives_the_batches_and_positions_of_one_read_in_a_thread(tmp_path):
    """trainer.feed_processes: the same batches, in the same order, with the same positions, whether
    the rows are read and tokenized in the worker's thread or in two processes; bucketed and resumed
    inside a window too."""
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context", "label"])
    cfg = load_config(None, ["model.encoder=dan"])
    texts = [t for i in range(len(shards.shards)) for t in shards.read(i).column("context").to_pylist()]
    encode = BatchEncoder(DanTokenizer.build(count_words(texts), cfg.tokenizer), {"context": "context"}, 12, "label")

    def read(processes, position=None, bucket_batches=0):
        stream = TaskStream("reddit", shards, encode, 8, (1, 2), "cpu", 7, 60, position, bucket_batches, 0, processes)
        out = [(next(stream), stream.position()) for _ in range(20)]  # past an epoch's end (15 batches a rank)
        stream.close()
        return out

    for position, bucket_batches in ((None, 0), ({"epoch": 0, "rows": 32, "batch_size": 8, "ranks": 2,
                                                    "in_window": 2}, 4)):  # fmt: skip
        here, there = read(0, position, bucket_batches), read(2, position, bucket_batches)
        assert [p for _, p in here] == [p for _, p in there]
        for (a, _), (b, _) in zip(here, there):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert here[0][1] == {"epoch": 0, "rows": 32, "batch_size": 8, "ranks": 2, "in_window": 3}
