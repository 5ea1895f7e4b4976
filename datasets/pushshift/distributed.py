"""The pushshift engine as Ray tasks across a cluster: a read task per dump (or per piece of one)
streaming its partitions into Ray's object store, tasks for the repeated ids, the parent join and
the shards' writes; the row estimate and partition count for the cluster."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.pushshift.reading import BOM, CHUNK_BYTES, line_pieces, numbered, numbered_table, whole_lines
from convsts.datasets.pushshift.rules import with_rules
from convsts.datasets.pushshift.steps import (
    PARTITION_ROW_BYTES,
    cut_again,
    cut_ways,
    key_ranges,
    pairs_manifest,
    partition_pairs,
    partition_slices,
    partitioned_comments,
    repeated_lines_of,
    ruled_chunks,
    say_recut,
    spill_partitions,
    without_malformed,
)
from convsts.datasets.reddit import MAX_EXAMPLES, ORDER_KEY
from convsts.datasets.shards import ShardPlan, write_pieces, write_range
from convsts.io import storage
from convsts.io.compression import decompressed_prefix
from convsts.io.read_ahead import read_ahead

log = logging.getLogger("convsts")


# A read task hands its rows to the object store, by partition, every this many bytes: with 3 kinds
# of table per partition, objects of FLUSH_BYTES / (3 x partitions) each (a restore from Ray's spill
# costs per object, so fewer, larger ones).
FLUSH_BYTES = 256 << 20
PIECE_BYTES = 64 << 20  # decompressed bytes of a dump per task, where whole dumps would leave CPUs idle
# A task reading a dump whole keeps about this many cores busy (its decompression thread beside
# Arrow's parser threads): dumps are cut into pieces only where the CPUs outnumber that.
WHOLE_READ_CPUS = 2
TASK_PARTITION_BYTES = 256 << 20  # input bytes (as stored) per partition of the distributed path, at first
PARTITION_TABLES = (
    "key",
    "candidate",
    "reply",
)  # what a read task hands over per partition: ids, possible parents, replies


def read_partitioned(
    path: str, rank: int, cfg: RedditFilterConfig, parts: int, flush_bytes: int, threads: int = 1
) -> Iterator[Any]:
    """A Ray streaming-generator task: one dump read, filtered and cut into `parts` hash partitions
    (partitioned_comments), handed over as partitioned_chunks hands them. Memory: `flush_bytes` and a chunk.
    `threads`: Arrow's parser threads while it runs (Ray sizes a worker's pool by its task's CPU,
    one; a dump read whole where CPUs would be idle parses on more, as the engine does)."""
    before = pa.cpu_count()
    pa.set_cpu_count(threads)
    try:
        yield from partitioned_chunks(ruled_chunks(path, rank, cfg), parts, flush_bytes)
    finally:
        pa.set_cpu_count(before)


def _cut_dump(path: str, piece_bytes: int) -> Iterator[tuple[int, bytes] | None]:
    """A Ray streaming-generator task: one dump's decompressed bytes in whole-line pieces of about
    `piece_bytes`, each with the number of its first line, for _read_piece tasks to parse side by side
    (a compressed stream cannot be split, but decompressing is a small part of the work); then None,
    the end (a read that fails ends the stream with its error instead)."""
    yield from numbered(read_ahead(whole_lines(path, piece_bytes)))
    yield None


def _read_piece(piece: tuple[int, bytes], rank: int, cfg: RedditFilterConfig, parts: int) -> list[Any]:
    """A Ray task: one piece of a dump (_cut_dump) read as read_partitioned reads a dump, its rows
    handed over at once: 3 x `parts` tables, then its counts."""
    first, data = piece
    chunks = (
        with_rules(numbered_table(chunk, line, rank), cfg)
        for line, chunk in numbered(line_pieces(data, CHUNK_BYTES), first)
    )
    return list(partitioned_chunks(chunks, parts, flush_bytes=sys.maxsize))


def partitioned_chunks(chunks: Iterable[Any], parts: int, flush_bytes: int) -> Iterator[Any]:
    """Ruled chunks of one input (ruled_chunks) cut into `parts` hash partitions
    (partitioned_comments): every `flush_bytes` of rows and at the end (at least once), 3 x `parts`
    tables in a fixed order (PARTITION_TABLES, each partition 0..parts-1; None for one without rows): "key", the
    candidate rows' (id, order) alone, for the repeated ids; "candidate"; "reply". Then the counts: (lines read,
    malformed lines, the first MAX_EXAMPLES of them, the largest table's bytes, each partition's
    candidate and reply bytes)."""
    buffered: dict[tuple[str, int], list] = {}
    size, largest, lines_read, malformed_lines, examples, flushed = 0, 0, 0, 0, list[int](), False
    part_bytes = [0] * parts
    for chunk in chunks:
        lines_read += chunk.num_rows
        chunk, malformed, orders = without_malformed(chunk, MAX_EXAMPLES - len(examples))
        malformed_lines, examples = malformed_lines + malformed, examples + orders
        for kind, table, part in partitioned_comments(chunk, parts):
            for p, rows in partition_slices(table, part, parts):
                buffered.setdefault((kind, p), []).append(rows)
                if kind == "candidate":
                    buffered.setdefault(("key", p), []).append(rows.select(["id", "order"]))
                size += rows.nbytes
                part_bytes[p] += rows.nbytes
        if size >= flush_bytes:
            largest = max(largest, max(sum(t.nbytes for t in tables) for tables in buffered.values()))
            yield from _flush(buffered, parts)
            buffered, size, flushed = {}, 0, True
    if buffered or not flushed:
        largest = max([largest, *(sum(t.nbytes for t in tables) for tables in buffered.values())])
        yield from _flush(buffered, parts)
    yield lines_read, malformed_lines, examples, largest, part_bytes


def _flush(buffered: dict[tuple[str, int], list], parts: int) -> Iterator[Any]:
    """3 x `parts` tables, PARTITION_TABLES in order, each partition 0..parts-1 (None for one with no rows),
    each one chunk: Ray serializes a table buffer by buffer, so the slices of every chunk read since
    the last hand-over would cost several times the copy that joins them."""
    for kind in PARTITION_TABLES:
        for p in range(parts):
            yield pa.concat_tables(buffered[kind, p]).combine_chunks() if (kind, p) in buffered else None


def _read_tasks(
    paths: Sequence[str], cfg: RedditFilterConfig, parts: int, flush_bytes: int, piece_bytes: int, cpus: int
) -> Iterator[list]:
    """Each read task's refs, the inputs in order and a dump's pieces in line order: its tables (3 x
    `parts` per hand-over, PARTITION_TABLES in order), then its counts. A read task per dump; where the
    cluster's `cpus` outnumber WHOLE_READ_CPUS a dump (whole dumps would leave CPUs idle), each dump
    is cut into pieces of `piece_bytes` (_cut_dump, a task that decompresses and holds a tenth of a
    CPU) parsed by a task each, at most 2 x `cpus` pieces at a time. Not on fewer CPUs: the pieces
    pass through the object store once more, which costs more than they gain there."""
    import ray

    ranked = sorted(paths)
    if len(paths) * WHOLE_READ_CPUS >= cpus:
        threads = min(WHOLE_READ_CPUS, max(1, cpus // max(len(paths), 1)))  # the CPUs the reads leave idle
        read = ray.remote(num_returns="streaming")(read_partitioned)
        streams = [read.remote(path, ranked.index(path), cfg, parts, flush_bytes, threads) for path in paths]
        for stream in streams:
            yield list(stream)  # a streaming generator's refs
        return
    # Ray's private option (the stubs do not list it): the cutter waits while `cpus` pieces are not taken.
    backpressure: dict[str, Any] = {"_generator_backpressure_num_objects": cpus}
    cut = ray.remote(num_returns="streaming", num_cpus=0.1, **backpressure)(_cut_dump)
    parse = ray.remote(num_returns=len(PARTITION_TABLES) * parts + 1)(_read_piece)
    cutters = [cut.remote(path, piece_bytes) for path in paths]
    running: list = []
    pieces = 0
    for path, cutter in zip(paths, cutters):
        previous: Any = None  # a piece is handed to a task once the next item comes: the last is the end or an error
        for item in cutter:  # type: ignore[attr-defined]  # a streaming generator's refs (the stubs: one ref)
            if previous is not None:
                if len(running) >= 2 * cpus:
                    running = ray.wait(running, num_returns=1)[1]
                refs: list = parse.remote(previous, ranked.index(path), cfg, parts)  # type: ignore[assignment]  # num_returns > 1: a list
                running.append(refs[-1])
                pieces += 1
                yield refs
            previous = item
        ray.get(previous)  # the end mark, or the read's error raised here, before a task is given it
    log.info("reddit: %d file(s) on %d CPUs, read in %d pieces", len(paths), cpus, pieces)


def _split_task(kind: str, ways: int, rows) -> list[Any]:
    """A Ray task: one table a read task handed over, cut into `ways` by another hash (split_key)."""
    if rows is None:
        return [None] * ways
    subs = dict(cut_again(kind, rows, ways, seed=1))
    return [subs.get(q) for q in range(ways)]


def _within_budget(handed: dict[str, list[list]], sizes: list[int], part_bytes: int) -> list[tuple[list, list]]:
    """Each partition's (candidate refs, reply refs) for a pairs task; a partition whose rows came to more
    than `part_bytes` (a dump that compresses well) cut into as many by another hash (split tasks,
    a table each), each part joined by a task of its own."""
    import ray

    out, recut = [], 0
    for p, size in enumerate(sizes):
        if size <= part_bytes:
            out.append((handed["candidate"][p], handed["reply"][p]))
            continue
        ways, recut = cut_ways(size, part_bytes), recut + 1
        split = ray.remote(num_returns=ways)(_split_task)
        # num_returns > 1: each call's refs are a list (the stubs: one ref)
        cut: dict[str, list[Any]] = {
            kind: [split.remote(kind, ways, ref) for ref in handed[kind][p]] for kind in ("candidate", "reply")
        }
        out += [([refs[q] for refs in cut["candidate"]], [refs[q] for refs in cut["reply"]]) for q in range(ways)]
    say_recut(recut, part_bytes)
    return out


def _repeated_lines_task(*keys):
    """One partition's (id, order) rows, from every read task: (the orders of its later lines of a
    repeated id, its comments)."""
    kept = [k for k in keys if k is not None]
    if not kept:
        return pa.array([], pa.int64()), 0
    table = pa.concat_tables(kept)
    return repeated_lines_of(table), table.num_rows


SPLITS = ("train", "test")


def _pairs_task(test_share: float, salt: str, ranges: int, repeats, candidates: list, *replies) -> list[Any]:
    """One partition's replies joined to its possible parents: [its counts, its pairs' rows in each
    key range ({split: [rows of range 0..ranges-1]}), then the train pairs by key range
    0..ranges-1, then the test pairs by range (None where a range has none)]. `candidates`: the
    partition's candidate tables (refs inside a list: fetched here, after the replies)."""
    import ray

    counts, pairs = partition_pairs(list(replies), lambda: ray.get(candidates), repeats, test_share, salt)
    sizes: dict[str, list[int]] = {}
    tables: list[Any] = []
    for split in SPLITS:
        by_range = dict(partition_slices(pairs[split], key_ranges(pairs[split], ranges), ranges)) if pairs else {}
        sizes[split] = [by_range[r].num_rows if r in by_range else 0 for r in range(ranges)]
        tables += [by_range.get(r) for r in range(ranges)]
    return [counts, sizes, *tables]


def _write_range_task(folder: str, plan: ShardPlan, start: int, *tables) -> tuple[dict, dict]:
    """A Ray task: one key range of a split, from every partition's pairs task, sorted by its key and
    written as the shards wholly within it (write_range): (their records, the rows of the shards
    that cross its ends)."""
    table = pa.concat_tables([t for t in tables if t is not None])
    return write_range(folder, plan, start, table.sort_by([(ORDER_KEY, "ascending")]).drop_columns([ORDER_KEY]))


def _write_pieces_task(folder: str, index: int, *pieces: dict) -> dict:
    """A Ray task: shard `index` from the rows its key ranges' write tasks left of it, in order."""
    return write_pieces(folder, index, [p[index] for p in pieces if index in p])


def _write_split(
    joined: list, range_rows: list[dict], split: str, rows: int, out_dir: str | Path, rows_per_shard: int
) -> list:
    """One split's shards written by tasks side by side, as ShardWriter writes them in one process:
    a task per key range (its offset from the ranges' sizes), a task per shard that crosses a
    range's end; the driver gathers the records alone."""
    import ray
    import ray.util.scheduling_strategies

    folder = storage.join(out_dir, split)
    fs, inner = storage.resolve(folder)
    fs.create_dir(inner, recursive=True)  # there even when there are no rows
    plan, index = ShardPlan(rows, rows_per_shard), SPLITS.index(split)
    ranges = len(range_rows[0][split]) if range_rows else 0  # `range_rows`: each join's rows by key range
    sizes = [sum(s[split][r] for s in range_rows) for r in range(ranges)]
    if sum(sizes) != rows:
        raise RuntimeError(f"{folder}: the key ranges hold {sum(sizes)} rows, not {rows}")
    # A local folder is the command's machine's: the tasks write it there (on that node's CPUs); a
    # bucket takes them from every node.
    here = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), False)
    place: Any = "DEFAULT" if storage.is_uri(folder) else here  # the stubs list no node affinity
    write = ray.remote(num_returns=2, scheduling_strategy=place)(_write_range_task)
    starts = [sum(sizes[:r]) for r in range(ranges)]
    written = {
        r: write.remote(folder, plan, starts[r], *[j[2 + index * ranges + r] for j in joined])
        for r in range(ranges)
        if sizes[r]
    }
    records: dict[int, dict] = {}
    for recs in ray.get([refs[0] for refs in written.values()]):
        records.update(recs)
    join = ray.remote(scheduling_strategy=place)(_write_pieces_task)
    crossing = [i for i in range(len(plan.edges) - 1) if plan.size(i) and i not in records]
    joins = {
        i: join.remote(
            folder,
            i,
            *[refs[1] for r, refs in written.items() if i in plan.overlapping(starts[r], starts[r] + sizes[r])],
        )
        for i in crossing
    }
    records.update(zip(joins, ray.get(list(joins.values()))))
    return [records[i] for i in sorted(records)]


SAMPLE_BYTES = 4 << 20  # stored bytes of a dump decompressed and parsed to estimate its rows
SAMPLED_FILES = 4  # the largest dumps are sampled


def row_bytes_estimate(paths: Sequence[str], cfg: RedditFilterConfig) -> int:
    """The rows (candidate and reply bytes, as the read tasks count them) the dumps will hold, from the
    rows of the first SAMPLE_BYTES (as stored) of the SAMPLED_FILES largest, scaled to all their
    bytes: the monthly dumps compress 8-10x, others 3x, and their comments pass the filters at
    their own rate."""
    sizes = {path: stat[0] for path in paths if (stat := storage.file_stat(path)) is not None}
    rows = read = 0
    for path in sorted(sizes, key=sizes.__getitem__, reverse=True)[:SAMPLED_FILES]:
        data, stored = decompressed_prefix(path, SAMPLE_BYTES)
        data = data[: data.rfind(b"\n") + 1]  # whole lines
        if data.startswith(BOM):
            data = data[len(BOM) :]
        if data:
            *_, counts = partitioned_chunks([with_rules(numbered_table(data, 1, 0), cfg)], 1, sys.maxsize)
            rows, read = rows + sum(counts[4]), read + stored
    return rows * sum(sizes.values()) // read if read else 0


def cluster_partitions(stored: int, cpus: int, row_bytes: int = 0) -> int:
    """The partitions of a distributed prepare of `stored` bytes (as stored) that will hold about
    `row_bytes` of rows (row_bytes_estimate), on `cpus` CPUs: one per TASK_PARTITION_BYTES stored
    and at least one per three quarters of PARTITION_ROW_BYTES of rows (a partition cut again
    by _within_budget costs a pass of its rows through the object store), at least one per CPU."""
    by_rows = -(-row_bytes * 4 // (3 * PARTITION_ROW_BYTES))
    return max(spill_partitions(stored, TASK_PARTITION_BYTES), by_rows, cpus)


def prepare_distributed(
    paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str, out_dir: str | Path,
    rows_per_shard: int, parts: int, flush_bytes: int = FLUSH_BYTES, piece_bytes: int = PIECE_BYTES, cpus: int = 0,
    part_bytes: int = PARTITION_ROW_BYTES,
) -> dict[str, Any]:  # fmt: skip
    """prepare_local's steps as Ray tasks on the cluster this process joined: the dumps read (_read_tasks:
    their rows partitioned by hash as they stream, handed to Ray's object store, which spills to disk
    past its memory), a task per partition for the repeated ids, a task per partition for the parent
    join; then the shards written by tasks side by side, a task per key range (_write_split), as
    prepare_local writes them range after range; the driver writes only the manifest, from the
    tasks' records. The same counts, the same shards. Memory: the object store's (configured), a
    partition per task, at most `part_bytes` of its rows (_within_budget)."""
    import ray

    ranked, started = sorted(paths), time.monotonic()
    handed: dict[str, list[list]] = {kind: [[] for _ in range(parts)] for kind in PARTITION_TABLES}
    stats = []
    for refs in _read_tasks(paths, cfg, parts, flush_bytes, piece_bytes, cpus):
        for i, ref in enumerate(refs[:-1]):
            handed[PARTITION_TABLES[(i // parts) % len(PARTITION_TABLES)]][i % parts].append(ref)
        stats.append(refs[-1])
    read = ray.get(stats)  # a read that failed (a truncated file) raises here, before a word of what follows
    log.info("reddit: %d file(s) read and partitioned in %.1f s", len(paths), time.monotonic() - started)
    found = [ray.remote(num_returns=2)(_repeated_lines_task).remote(*handed["key"][p]) for p in range(parts)]
    repeats = ray.put(pa.concat_arrays([pa.array([], pa.int64()), *ray.get([f[0] for f in found])]))
    log.info("reddit: repeated ids found in %.1f s", time.monotonic() - started)
    jobs = _within_budget(handed, [sum(r[4][p] for r in read) for p in range(parts)], part_bytes)
    ranges = len(jobs)  # key ranges, a write task each: as many as the joins, each about a join's rows
    pairs_task = ray.remote(num_returns=2 + 2 * ranges)(_pairs_task)
    joined = [
        pairs_task.remote(test_share, salt, ranges, repeats, candidates, *replies) for candidates, replies in jobs
    ]

    manifest = _distributed_manifest(read, ray.get([j[0] for j in joined]), ranked)
    log.info(
        "reddit: %d lines of %d file(s) in %d partitions (the largest %d comments), joined in %.1f s",
        manifest["lines_read"],
        len(paths),
        parts,
        max(ray.get([f[1] for f in found]), default=0),
        time.monotonic() - started,
    )
    range_rows = ray.get([j[1] for j in joined])  # fetched once: small dicts
    shards = {
        split: _write_split(joined, range_rows, split, manifest[f"{split}_pairs"], out_dir, rows_per_shard)
        for split in SPLITS
    }
    log.info("reddit: shards written by tasks in %.1f s", time.monotonic() - started)
    return {"shards": shards, **manifest}


def _distributed_manifest(stats: list, part_counts: list[dict], ranked: list[str]) -> dict[str, Any]:
    """The manifest's counts from the read tasks' stats (in the inputs' order) and each partition's
    counts; logs the largest table a read task handed over."""
    largest = max((stat[3] for stat in stats), default=0)
    log.info("reddit: read tasks handed over tables of at most %.1f MiB", largest / 2**20)
    return pairs_manifest(stats, part_counts, ranked)
