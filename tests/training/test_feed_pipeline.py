"""The Ray Data feed's map (feed_pipeline.BlockReader) without Ray: a block read once and handed on
in chunks, whose rows are the block's rows in its seeded order, encoded, with the rows read from
storage counted once, on the block's first row."""

from __future__ import annotations

import numpy as np
from testkit.shard_folder import write_shards

from convsts.datasets.sample_order import EpochOrder, ShardSet
from convsts.datasets.text import DanTokenizer, count_words
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.training.feed_dealer import CpuShare, feed_cpus
from convsts.ray_jobs.training.feed_order import FeedOrder
from convsts.ray_jobs.training.feed_pipeline import READ_COLUMN, BlockReader, stretches
from convsts.ray_jobs.training.feed_reader import BatchEncoder

ROWS, BLOCK, CHUNK = 240, 60, 7


def test_a_block_is_read_once_and_handed_on_in_chunks_of_its_encoded_rows_in_order(tmp_path):
    folder, records = write_shards(tmp_path, ROWS, 20)
    columns = ["row", "context", "label"]
    texts = ShardSet.of_folder(folder, records, columns).read(0).column("context").to_pylist()
    encode = BatchEncoder(
        DanTokenizer.build(count_words(texts), load_config(None, []).tokenizer), {"context": "context"}, 12, "label"
    )
    order = FeedOrder(ShardSet.of_folder(folder, records, columns), 7, BLOCK, 0, 8)
    _, items = stretches(order, 0, 72, 16, 100)  # from row 72: the rest of block 1, then blocks 2 and 3
    assert [(i["block"], i["first"], i["last"]) for i in items[:2]] == [(1, 12, 60), (2, 0, 60)]
    batch = {k: np.array([i[k] for i in items[:2]]) for k in items[0]}
    chunks = list(BlockReader(order, encode, chunk_rows=CHUNK)(batch))
    assert [len(c["label"]) for c in chunks] == [7] * 6 + [6] + [7] * 8 + [4]  # 48 rows, then 60, in sevens
    whole = EpochOrder(ShardSet.of_folder(folder, records, columns), 7, 0, BLOCK)
    expected = [encode(whole.block(1).slice(12, 48)), encode(whole.block(2))]
    for key in expected[0]:
        got = np.concatenate([c[key] for c in chunks])
        assert np.array_equal(got, np.concatenate([e[key] for e in expected])), key
    read = np.concatenate([c[READ_COLUMN] for c in chunks])
    assert (
        read[0] == BLOCK and read[48] == BLOCK and read.sum() == 2 * BLOCK
    )  # each block's reads once, on its first row


def test_an_elastic_group_below_its_max_leaves_the_cpus_it_may_grow_into_to_its_next_workers():
    # Two of [1,3] workers of 1 CPU on a cluster with 1 CPU free: the pipelines take none of it (a
    # task of 1 CPU there would keep the third worker from ever being placed); at 3 of 3 they take
    # what is free, split between the group's two tasks.
    worker = (("CPU", 1.0),)
    assert CpuShare(2, grow_by=1, per_worker=worker).cpus_left({"CPU": 1.0}) == 0.0
    assert CpuShare(2, grow_by=0, per_worker=worker).cpus_left({"CPU": 3.0}) == 1.5
    assert CpuShare(1, grow_by=2, per_worker=worker).cpus_left({"CPU": 5.0}) == 3.0
    # Only the workers the free resources hold: with a custom resource (trainer.worker_resources) or
    # a GPU that no free node has, no worker can come, and the feed takes the free CPUs.
    pinned = (("CPU", 1.0), ("trainer_node", 1.0))
    assert CpuShare(1, grow_by=2, per_worker=pinned).cpus_left({"CPU": 4.0}) == 4.0
    assert CpuShare(1, grow_by=2, per_worker=pinned).cpus_left({"CPU": 4.0, "trainer_node": 1.0}) == 3.0
    gpu = (("CPU", 2.0), ("GPU", 1.0))
    assert CpuShare(1, grow_by=1, per_worker=gpu).cpus_left({"CPU": 8.0}) == 8.0
    assert feed_cpus(CpuShare(2, grow_by=1, per_worker=worker).cpus_left({"CPU": 1.0})) == 0.0  # shares the workers'
