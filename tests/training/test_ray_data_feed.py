"""The Ray Data feed (trainer.feed=ray_data: feed_pipeline and feed_dealer) on the session's Ray
instance: one order, two executors, the same batches. Each rank's batches from the task's dealer
hash as the local feed's do, over two epochs, at 1, 2 and 3 ranks, from the start and from a
position inside a block, bucketed or not; the pipeline reads each block once an epoch where the
local feed reads it once a rank; a restart seeks to the block that holds its next row."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import pytest
from testkit.shard_folder import write_shards

from convsts.datasets.sample_order import ShardSet
from convsts.datasets.text import DanTokenizer, count_words
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.training.dealt_stream import DealtStream
from convsts.ray_jobs.training.feed_order import FeedOrder
from convsts.ray_jobs.training.feed_reader import BatchEncoder
from convsts.ray_jobs.training.local_feed import LocalStream

pytestmark = pytest.mark.slow

ROWS, BATCH, BLOCK = 240, 8, 60


@pytest.fixture(scope="module")
def task_data(tmp_path_factory):
    """The shards (12 of 20 rows: blocks of 3-4 shards) and an encoder with the DAN's real tokenizer."""
    folder, records = write_shards(tmp_path_factory.mktemp("feed"), ROWS, 20)
    shards = ShardSet.of_folder(folder, records, ["row", "context", "label"])
    texts = [t for i in range(len(shards.shards)) for t in shards.read(i).column("context").to_pylist()]
    cfg = load_config(None, ["model.encoder=dan"])
    tokenizer = DanTokenizer.build(count_words(texts), cfg.tokenizer)
    return folder, records, BatchEncoder(tokenizer, {"context": "context"}, 12, "label")


def _digest(batch) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(batch[k].numpy()).tobytes() for k in sorted(batch))).hexdigest()


def _two_epochs(streams, position) -> tuple[list[list[str]], list[dict], int]:
    """Each rank's batch digests from `position` to the end of the next epoch, the positions after
    each global batch, and the rows the task read of its shards for them."""
    ranks = len(streams)
    start = (position or {}).get("rows", 0)
    steps = (ROWS - start) // (ranks * BATCH) + ROWS // (ranks * BATCH)
    digests: list[list[str]] = [[] for _ in streams]
    positions = []
    for _ in range(steps):
        for rank, stream in enumerate(streams):
            digests[rank].append(_digest(next(stream)))
        positions.append({k: v for k, v in streams[0].position().items()})
    return digests, positions, steps


@pytest.mark.parametrize("bucket", [0, 4])
def test_the_dealer_gives_each_rank_the_local_feeds_batches_and_reads_each_block_once_an_epoch(
    ray_session, task_data, bucket
):
    folder, records, encode = task_data
    for ranks in (1, 2, 3):
        for position in (None, {"epoch": 0, "rows": 72}):  # row 72: inside the epoch's second block

            def order():  # each rank its own shards, as each worker has
                shards = ShardSet.of_folder(folder, records, ["row", "context", "label"])
                return FeedOrder(shards, 7, BLOCK, bucket * BATCH, BATCH)

            local = [LocalStream("t", order(), encode, BATCH, (i, ranks), "cpu", position) for i in range(ranks)]
            name = uuid.uuid4().hex
            dealt = [
                DealtStream("t", name, order(), encode, BATCH, (i, ranks), "cpu", position, owner=i == 0)
                for i in range(ranks)
            ]
            here, here_positions, steps = _two_epochs(local, position)
            there, there_positions, _ = _two_epochs(dealt, position)
            assert here == there, (ranks, position, bucket)
            assert here_positions == there_positions and here_positions[-1]["epoch"] == 1
            local_read = sum(s.rows_read for s in local)
            if position is None:  # two whole epochs: every block once an epoch, against once a rank an epoch
                assert dealt[0].rows_read == 2 * ROWS and local_read == ranks * 2 * ROWS, (ranks, bucket)
            else:  # seeks: the first epoch's blocks from the one that holds row 72 (and its window), rows 60-239
                assert dealt[0].rows_read == 2 * ROWS - BLOCK and dealt[0].opening_rows_read == BLOCK
            assert all(s.rows_read == dealt[0].rows_read for s in dealt)  # the task's reads, said to each rank
            for stream in local + dealt:
                stream.close()
