"""The training feed's order and its local reader (local_feed.LocalStream over feed_order and
sample_order): one order per epoch at any number of ranks, positions counted in rows, exactly-once
reads across sizes (bucketing included), a resume that seeks, a position that names its order. On
parquet shards written here; no Ray (tests/training/test_ray_data_feed.py: the Ray Data feed gives
the same batches)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from testkit.shard_folder import write_shards

from convsts.datasets.sample_order import EpochOrder, ShardSet
from convsts.datasets.text import DanTokenizer, count_words
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task
from convsts.ray_jobs.training.data_feed import batch_encoder, task_shards
from convsts.ray_jobs.training.feed_order import FeedOrder
from convsts.ray_jobs.training.feed_reader import BatchEncoder
from convsts.ray_jobs.training.local_feed import LocalStream

ROWS, PER_SHARD = 240, 20


def _folder(tmp_path, rows=ROWS, per_shard=PER_SHARD):
    return write_shards(tmp_path, rows, per_shard)


def _rows_of(table: pa.Table) -> dict[str, np.ndarray]:
    lengths = np.array([len(t.split()) for t in table.column("context").to_pylist()])
    ids = np.zeros((table.num_rows, 12), dtype=np.int64)  # (B, 12): the words' count as real tokens
    for i, n in enumerate(lengths):
        ids[i, :n] = 1
    return {"row": table.column("row").to_numpy(), "context__ids": ids}


def _order(shards, bucket_batches=0, block_rows=60, chunk=8, seed=7):
    window = bucket_batches * chunk if bucket_batches > 1 else 0
    return FeedOrder(shards, seed, block_rows, window, chunk)


def _stream(shards, share, position=None, batch_size=8, bucket_batches=0, block_rows=60):
    order = _order(shards, bucket_batches, block_rows)
    return LocalStream("reddit", order, _rows_of, batch_size, share, "cpu", position)


def _plain(position):
    """A position without its order's record."""
    return {k: v for k, v in position.items() if k != "order"}


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
        assert position["order"] == _order(shards).inputs  # and name their order
        for stream in streams:
            stream.close()
    assert read == whole[:232] and len(set(read)) == 232
    assert _plain(position) == {"epoch": 0, "rows": 232, "batch_size": 8, "ranks": 2}
    stream = _stream(shards, (0, 1), position)  # one rank: the last 8 rows are a global batch of its own
    assert [int(r) for r in next(stream)["row"]] == whole[232:]
    assert [int(r) for r in next(stream)["row"]] == EpochOrder(shards, 7, 1, 60).rows(0, 8).column("row").to_pylist()
    assert _plain(stream.position()) == {"epoch": 1, "rows": 8, "batch_size": 8, "ranks": 1}
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
    assert _plain(position) == {"epoch": 0, "rows": 112, "batch_size": 8, "ranks": 1}
    resumed = _stream(shards, (0, 1), position, bucket_batches=10)
    assert all(torch.equal(next(resumed)["row"], b["row"]) for b in bucketed[14:30])
    resumed.close()


def test_a_bucketed_group_resized_inside_a_window_neither_repeats_nor_skips_a_row(tmp_path):
    """A bucketing window is rows of the epoch's order, whatever the group's size: 2 ranks, then 1 and
    then 3 from positions inside windows of 80 rows, read the one bucketed order of a single rank,
    each row of the epoch once."""
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])
    alone = _stream(shards, (0, 1), bucket_batches=10)
    one_rank = [int(r) for _ in range(30) for r in next(alone)["row"]]
    alone.close()
    read, position = [], None
    for ranks, steps in ((2, 3), (1, 5), (3, 7)):  # 48 + 40 + 168 rows: 232 of 240, then the next epoch
        streams = [_stream(shards, (i, ranks), position, bucket_batches=10) for i in range(ranks)]
        read += _take(streams, steps)
        position = streams[0].position()
        for stream in streams:
            stream.close()
    assert read[:232] == one_rank[:232] and len(set(read[:232])) == 232
    assert position["epoch"] == 1 and position["rows"] == 24


def test_a_position_names_its_order_and_one_of_another_order_starts_the_epoch_over(tmp_path):
    """A position keeps what fixed its order; opened under another seed, trainer.shuffle_block_rows,
    shard list, kept rows (data.snli_fraction) or bucketing, a stream says in one line what changed
    and starts that epoch over rather than go on at a row count of another order."""
    folder, records = _folder(tmp_path)
    shards = ShardSet.of_folder(folder, records, ["row", "context"])
    stream = _stream(shards, (0, 1))
    for _ in range(5):
        next(stream)
    position = stream.position()
    stream.close()
    same = _stream(shards, (0, 2), position)
    assert same.order_changed is None and (same.epoch, same.rows) == (0, 40)
    same.close()
    fewer = ShardSet.of_folder(folder, records[:-1], ["row", "context"])
    kept = ShardSet.of_folder(folder, records, ["row", "context"], lambda c: c["row"] % 2 == 0, ["row"])
    changes = {
        "the seed (seed)": LocalStream("reddit", _order(shards, seed=8), _rows_of, 8, (0, 1), "cpu", position),
        "trainer.shuffle_block_rows": _stream(shards, (0, 1), position, block_rows=100),
        "the prepared shards": _stream(fewer, (0, 1), position),
        "the rows kept of them (data.snli_fraction": _stream(kept, (0, 1), position),
        "the length bucketing": _stream(shards, (0, 1), position, bucket_batches=4),
    }
    whole = EpochOrder(shards, 7, 0, 100).rows(0, 8).column("row").to_pylist()
    for named, changed in changes.items():
        assert changed.order_changed is not None and named in changed.order_changed, changed.order_changed
        assert changed.order_changed.startswith("reddit: the checkpoint's data position (40 rows of epoch 0)")
        assert changed.order_changed.endswith("the task starts epoch 0 over")
        assert (changed.epoch, changed.rows) == (0, 0)
        changed.close()
    again = _stream(shards, (0, 1), position, block_rows=100)
    assert [int(r) for r in next(again)["row"]] == whole  # epoch 0 of the order now, from its first row
    again.close()
    legacy = _stream(shards, (0, 1), _plain(position), block_rows=100)  # written before positions named it
    assert legacy.order_changed is None and legacy.rows == 40
    legacy.close()


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
    stream = LocalStream("snli", FeedOrder(shards, 3, 60), encode, 10, (0, 1), "cpu")
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
        order = _order(shards, bucket_batches)
        stream = LocalStream("reddit", order, encode, 8, (1, 2), "cpu", position, processes)
        out = [(next(stream), stream.position()) for _ in range(20)]  # past an epoch's end (15 batches a rank)
        stream.close()
        return out

    for position, bucket_batches in ((None, 0), ({"epoch": 0, "rows": 48, "batch_size": 8, "ranks": 2}, 4)):
        here, there = read(0, position, bucket_batches), read(2, position, bucket_batches)
        assert [p for _, p in here] == [p for _, p in there]
        for (a, _), (b, _) in zip(here, there):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _plain(here[0][1]) == {"epoch": 0, "rows": 64, "batch_size": 8, "ranks": 2}
