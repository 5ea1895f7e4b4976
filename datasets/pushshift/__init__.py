"""pushshift comment dumps -> annotated Reddit pairs, in columns: reading.py (lines -> rows),
rules.py (the filters), steps.py (what both engines do on columns), local.py and distributed.py (the
two engines).

A dump is NDJSON, one comment a line (plain or compressed, see compression.py). Each line is read as
one row: its fields, its line number and its place in the whole input (`order`: the rank of its file
among the inputs by path << LINE_BITS | its line). Then every line ends in one manifest bucket:

  malformed -> a filter rule (RULES, on the raw body and the author) -> duplicate_id (a comment id
  seen on an earlier line: only the first is used) -> unpaired (the parent is a submission, is not
  in the input, or was filtered) -> a pair (parent body, body), its split a hash of `link_id`.

Two engines run those steps on the same columns:
  * `prepare_local`, in this process: the dumps streamed in chunks of decompressed bytes, parsed by
    Arrow's JSON reader, the filters vectorized; comments are spilled to local disk in hash partitions
    (a comment by its id as a parent, by its parent's id as a reply), so that the duplicate ids and the
    parent join need one partition in memory at a time, not the input (a grace hash join);
  * `prepare_distributed`, as Ray tasks across a cluster: the same steps on the same columns, a read
    task per dump streaming its partitions into Ray's object store (which spills to disk past its
    memory), then a task per partition for the repeated ids and one for the parent join.
Both give the same counts and the same pairs (tests/data/test_prepare.py compares their shards byte for byte).
"""

from convsts.datasets.pushshift.distributed import cluster_partitions, prepare_distributed, row_bytes_estimate
from convsts.datasets.pushshift.local import prepare_local, remove_abandoned_spills
from convsts.datasets.pushshift.reading import parse_comment, read_dump_chunks, read_dump_file
from convsts.datasets.pushshift.steps import spill_partitions

__all__ = [
    "cluster_partitions",
    "parse_comment",
    "prepare_distributed",
    "prepare_local",
    "read_dump_chunks",
    "read_dump_file",
    "remove_abandoned_spills",
    "row_bytes_estimate",
    "spill_partitions",
]
