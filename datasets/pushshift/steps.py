"""The steps on columns both pushshift engines share: partitioning comments as possible parents
(candidates) and replies, cutting an oversized partition again, the repeated ids, the parent join that makes
the pairs and their splits, and the manifest's counts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.pushshift.reading import read_dump_chunks, source_of
from convsts.datasets.pushshift.rules import with_rules
from convsts.datasets.reddit import (
    DUPLICATE,
    MAX_EXAMPLES,
    ORDER_KEY,
    WRITTEN_COLUMNS,
    keyed_table,
    manifest_counts,
    split_of,
)

log = logging.getLogger("convsts")


# The columns of a partition's rows: a comment as a possible parent (candidate), as a reply.
CANDIDATE_COLUMNS = ("id", "order", "status", "body")
REPLY_COLUMNS = ("parent_key", "order", "status", "body", "link_id", "subreddit")


PARTITION_INPUT_BYTES = 64 << 20  # input bytes (as stored) per spill partition of prepare_local, at first
# A partition's rows (Arrow bytes, as decompressed and parsed) joined at once, at most, by either
# engine: one larger is cut again by another hash before its join, however well its input
# compressed (cut_again).
PARTITION_ROW_BYTES = 128 << 20
# The engine's own budget (prepare_local, one process): a join holds about four times its rows'
# bytes at its peak, and the process keeps what Arrow freed for the next; 64 MiB keeps a 1.6M-comment
# dump where most replies make a pair under 600 MiB (docs/performance.md), 128 MiB took it to 860.
LOCAL_PARTITION_ROW_BYTES = 64 << 20
MAX_SPLITS = 3  # cuts of a partition at most: one whose rows share a few keys cannot shrink
KEY_BATCH_ROWS = 100_000  # pairs keyed at once (through pandas) in the pairs step
PARENT = "t1_"  # a parent_id that names a comment (t3_ names a submission)
# A reply's bucket when it makes no pair although it passed the filters (the manifest's unpaired_by_reason).
SUBMISSION, MISSING, FILTERED = "unpaired_parent_is_submission", "unpaired_parent_missing", "unpaired_parent_filtered"


def reply_statuses(joined):
    """Each reply's bucket after the parent join (own status first, then its parent's), "" for a pair."""
    parent_status = joined["parent_status"]
    pair_or_filtered = pc.if_else(pc.equal(parent_status, ""), "", FILTERED)
    with_parent = pc.if_else(pc.is_null(parent_status), MISSING, pair_or_filtered)
    parent = pc.if_else(pc.is_null(joined["parent_key"]), SUBMISSION, with_parent)
    return pc.if_else(pc.equal(joined["status"], ""), parent, joined["status"])


def partitioned_comments(comments, parts: int) -> list[tuple[str, Any, np.ndarray]]:
    """A chunk of well-formed comments (COMMENT_COLUMNS, filter rules in `status`) as [(kind, rows,
    each row's partition)]: "candidate", each comment as a possible parent by a hash of its id; "reply",
    each as a reply by a hash of its parent's id (a reply to a submission by its own id); a body is
    kept only where its comment passed the filters."""
    body = pc.if_else(pc.equal(comments["status"], ""), comments["body"], None)
    is_comment = pc.starts_with(comments["parent_id"], PARENT)
    parent_key = pc.if_else(is_comment, pc.utf8_slice_codeunits(comments["parent_id"], len(PARENT)), None)
    columns = {"id": comments["id"], "parent_key": parent_key, "body": body}
    columns |= {name: comments[name] for name in ("order", "status", "link_id", "subreddit")}
    candidate = pa.table({name: columns[name] for name in CANDIDATE_COLUMNS})
    reply = pa.table({name: columns[name] for name in REPLY_COLUMNS})
    return [
        ("candidate", candidate, hashed(comments["id"], parts)),
        ("reply", reply, hashed(pc.coalesce(parent_key, comments["id"]), parts)),
    ]


def hashed(keys, parts: int, seed: int = 0) -> np.ndarray:
    if parts == 1:
        return np.zeros(len(keys), np.int64)

    return (pl.Series(keys).hash(seed=seed).to_numpy() % parts).astype(np.int64)


def say_recut(count: int, part_bytes: int) -> None:
    if count:
        log.info("reddit: %d partition(s) held over %g MiB of rows and were cut again", count, part_bytes / 2**20)


def split_key(kind: str, rows):
    """What a partition's rows are cut again by (with another hash): a candidate by its id, a reply by its
    parent's id, so that each reply stays with its parent; a reply to a submission, which has no
    parent to join, by its line."""
    if kind == "candidate":
        return rows["id"]
    return pc.coalesce(rows["parent_key"], pc.cast(rows["order"], pa.string()))


def cut_ways(size: int, part_bytes: int) -> int:
    """Into how many parts a partition of `size` bytes of rows is cut again: each within `part_bytes`."""
    return -(-size // part_bytes)


def cut_again(kind: str, rows, ways: int, seed: int) -> Iterator[tuple[int, Any]]:
    """(part, its rows) of a partition's `rows` of `kind` cut into `ways` by another hash of their
    split_key (`seed`: another for each cut of the same rows)."""
    return partition_slices(rows, hashed(split_key(kind, rows), ways, seed), ways)


def key_ranges(pairs, parts: int) -> np.ndarray:
    """Each pair's range of ORDER_KEY among `parts` (monotone in the key: the ranges written one after
    the other, each sorted, are in_fixed_order's order)."""
    keys = pairs[ORDER_KEY].to_numpy()
    return np.minimum((keys / 2.0**64 * parts).astype(np.int64), parts - 1)


def partition_slices(table, part: np.ndarray, parts: int) -> Iterator[tuple[int, Any]]:
    """(partition, its rows) for each partition that has rows, rows in their order."""
    if parts > 1:
        ranked = np.argsort(part, kind="stable")
        part, table = part[ranked], table.take(pa.array(ranked))
    edges = np.searchsorted(part, np.arange(parts + 1))
    for p in np.flatnonzero(edges[1:] > edges[:-1]).tolist():
        yield p, table.slice(edges[p], edges[p + 1] - edges[p])


def repeated_lines_of(candidates):
    """The orders of one candidate partition's lines whose comment id was on an earlier line too."""
    candidates = candidates.select(["id", "order"])
    firsts = candidates.group_by("id").aggregate([("order", "min"), ("order", "count")])
    firsts = firsts.filter(pc.greater(firsts["order_count"], 1))
    if not firsts.num_rows:
        return candidates["order"].slice(0, 0).combine_chunks()
    repeated = candidates.join(firsts, "id", join_type="inner")
    return repeated.filter(pc.not_equal(repeated["order"], repeated["order_min"]))["order"].combine_chunks()


def parents_of(candidates, repeats):
    """A candidate partition's comments that can be a parent (not a later line of a repeated id)."""
    parents = candidates.filter(pc.invert(pc.is_in(candidates["order"], repeats)))
    return pa.table({"parent_key": parents["id"], "parent_status": parents["status"], "context": parents["body"]})


def joined_pairs(replies, parents, repeats, test_share: float, salt: str):
    """A partition's replies joined to their parents: ({(status, split): lines}, {split: pairs as
    WRITTEN_COLUMNS and ORDER_KEY})."""
    status = pc.if_else(pc.is_in(replies["order"], repeats), DUPLICATE, replies["status"])
    joined = replies.set_column(replies.schema.get_field_index("status"), "status", status)
    joined = joined.join(parents, "parent_key", join_type="left outer")
    statuses = reply_statuses(joined)
    counts = {
        (str(row["values"]), ""): int(row["counts"])
        for row in pc.value_counts(statuses).to_pylist()
        if row["values"] != ""
    }
    kept = joined.filter(pc.equal(statuses, "")).select(["context", "body", "link_id", "subreddit"])
    links = pc.unique(kept["link_id"])
    test = pa.array([split_of(link, test_share, salt) == "test" for link in links.to_pylist()], pa.bool_())
    is_test = pc.take(test, pc.index_in(kept["link_id"], value_set=links)).to_numpy(zero_copy_only=False)
    kept = kept.rename_columns(WRITTEN_COLUMNS)
    pieces: dict[str, list] = {"train": [], "test": []}
    # Keyed a batch at a time: the key is pandas' hash of each row, and a frame of Python strings
    # costs several times its Arrow bytes.
    for start in range(0, max(kept.num_rows, 1), KEY_BATCH_ROWS):
        frame, test = kept.slice(start, KEY_BATCH_ROWS).to_pandas(), is_test[start : start + KEY_BATCH_ROWS]
        pieces["train"].append(keyed_table(frame.loc[~test]))
        pieces["test"].append(keyed_table(frame.loc[test]))
    pairs = {split: pa.concat_tables(tables, promote_options="default") for split, tables in pieces.items()}
    counts |= {("", split): table.num_rows for split, table in pairs.items()}
    return counts, pairs


NO_PARENTS = pa.table({name: pa.array([], pa.string()) for name in ("parent_key", "parent_status", "context")})


def partition_pairs(replies: list, candidates: Callable[[], list], repeats, test_share: float, salt: str):
    """The pairs step of both engines: one partition's replies (its reply tables, None for none)
    joined to its possible parents (its candidate tables, fetched only where there are replies; a
    partition where no comment hashed has none: every reply's parent is missing): ({(status,
    split): lines}, {split: pairs as WRITTEN_COLUMNS and ORDER_KEY}); ({}, {}) without replies.
    `repeats`: the orders of every later line of a repeated comment id (repeated_lines_of)."""
    kept = [r for r in replies if r is not None]
    if not kept:
        return {}, {}
    found = [c for c in candidates() if c is not None]
    parents = parents_of(pa.concat_tables(found), repeats) if found else NO_PARENTS
    return joined_pairs(pa.concat_tables(kept), parents, repeats, test_share, salt)


def pairs_manifest(reads: Iterable[tuple], part_counts: Iterable[dict], ranked: Sequence[str]) -> dict[str, Any]:
    """The count merge of both engines: the manifest's counts from each read's (lines read,
    malformed lines, the orders of its first malformed lines, ...) in the inputs' order and each
    partition's {(status, split): lines}."""
    counts: dict[tuple[str, str], int] = {}
    lines_read, examples = 0, list[str]()
    for read_lines, malformed_lines, orders, *_ in reads:
        lines_read += read_lines
        counts[("malformed", "")] = counts.get(("malformed", ""), 0) + malformed_lines
        examples += [source_of(int(o), ranked) for o in orders][: MAX_EXAMPLES - len(examples)]
    for part in part_counts:
        for key, n in part.items():
            counts[key] = counts.get(key, 0) + n
    return manifest_counts([(s, split, n) for (s, split), n in counts.items()], lines_read, examples)


def spill_partitions(stored: int, per: int = PARTITION_INPUT_BYTES) -> int:
    """How many partitions inputs of `stored` bytes (as stored) are cut into: one per `per` bytes
    (prepare_local's spill: PARTITION_INPUT_BYTES)."""
    return max(1, -(-stored // per))


def without_malformed(chunk, room: int) -> tuple[Any, int, list[int]]:
    """(the chunk's well-formed lines, how many were malformed, the orders of the first `room` of
    those): the manifest's malformed count and examples."""
    malformed = pc.equal(chunk["status"], "malformed").to_numpy(zero_copy_only=False)
    if not malformed.any():
        return chunk, 0, []
    orders = np.sort(chunk["order"].to_numpy()[malformed])[:room].tolist()
    return chunk.filter(~malformed), int(malformed.sum()), orders


def ruled_chunks(path: str, rank: int, cfg: RedditFilterConfig) -> Generator[Any, None, None]:
    """read_dump_chunks with each well-formed line's filter rule in `status` (with_rules)."""
    for chunk in read_dump_chunks(path, rank):
        yield with_rules(chunk, cfg)
