"""Reddit input-response pairs: raw inputs -> filtered pairs -> thread-hash train/test split.

Two input formats:
  * pushshift comment dumps (NDJSON, plain or compressed: .zst, .bz2, .xz, .gz): comments are paired with their parent
    comment (datasets/pushshift/);
  * paired tables (parquet or jsonl) with a context and a response column, such as the
    question/answer tables in ../shared/data/reddit.

Every row or line read ends in exactly one bucket of the manifest: a pair (train or test),
filtered by a named rule, unpaired or a duplicate comment id (dumps only), or malformed;
`lines_read` is counted as read, and a manifest whose buckets do not add up to it is not written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.shards import write_shards, write_table
from convsts.io import storage, tables
from convsts.io.compression import open_lines, plain_name
from convsts.io.errors import BadInputError

CONTEXT_COLUMNS = ("context", "question", "input", "parent_body")
RESPONSE_COLUMNS = ("response", "answer", "reply", "body")
PAIR_COLUMNS = ["context", "response", "thread_key", "subreddit", "source", "status", "split"]
WRITTEN_COLUMNS = ["context", "response", "thread_key", "subreddit"]  # a prepared pair's columns
ORDER_KEY = "order_key"  # the shards' row order while they are written (not written)
MAX_EXAMPLES = 20


RULES = ("deleted", "bot_author", "banned_prefix", "too_long", "low_alpha")
DUPLICATE = "duplicate_id"  # a comment id seen before (dumps repeat comments): only its first line is used


def failing_rule(text: str, author: str | None, cfg: RedditFilterConfig) -> str:
    """The first rule (in RULES order) that removes this comment, or "" when it is kept.

    Computed on the raw body: `len` counts Unicode code points; the alphabetic share is
    sum(ch.isalpha()) / len(text), and an empty body has share 0.
    """
    if text.strip() in cfg.banned_bodies:
        return "deleted"
    if author and cfg.author_substring and cfg.author_substring.lower() in author.lower():
        return "bot_author"
    if any(text.startswith(p) for p in cfg.banned_prefixes):
        return "banned_prefix"
    if len(text) >= cfg.max_chars:
        return "too_long"
    alpha = sum(map(str.isalpha, text))
    if not text or alpha / len(text) <= cfg.min_alpha_share:
        return "low_alpha"
    return ""


def split_of(thread_key: str, test_share: float, salt: str = "convsts") -> str:
    """Deterministic split by a hash of the thread: the same on every machine and every run."""
    digest = hashlib.sha1(f"{salt}\x00{thread_key}".encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    return "test" if bucket < test_share else "train"


def _norm_key(text: str) -> str:
    return " ".join(str(text).lower().split())


# ---------------------------------------------------------------------------------------------
# Paired tables


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what a JSON escape of half a surrogate pair decodes to


def json_record(raw: bytes, first_line: bool = False) -> dict[str, Any] | None:
    """One NDJSON line -> its object, or None when it is not UTF-8 or not a JSON object. A UTF-8
    byte-order mark at the start of a file (as some editors and exporters write) is accepted. A string
    escape of half a surrogate pair ("\\ud83d": an emoji that the dump cut in two) becomes U+FFFD,
    the replacement character, as a UTF-8 decoder does with a broken sequence: the rest of the text is kept."""
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text[1:] if first_line and text.startswith("\ufeff") else text)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    if b"\\u" in raw:  # only an escape can hold a lone surrogate
        obj = {k: LONE_SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v for k, v in obj.items()}
    return obj


def read_pairs_file(path: str) -> pd.DataFrame:
    """One paired table (parquet or jsonl) -> rows with context, response, group, subreddit, source, status.

    Rows whose context or response is missing or not a string are kept with status "malformed"
    so that the manifest can count and show them.
    """
    if storage.name(path).endswith(".parquet"):
        df = tables.read_parquet_table(path).to_pandas()
    elif plain_name(path).endswith((".jsonl", ".json")):
        rows, bad = [], []
        with open_lines(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                obj = json_record(raw, lineno == 1)
                if obj is None:
                    bad.append(lineno)
                else:
                    rows.append({**obj, "__line": lineno})
        df = pd.DataFrame(rows)
        if bad:
            df = pd.concat([df, pd.DataFrame({"__line": bad, "__bad": True})], ignore_index=True)
    else:
        raise BadInputError(f"{path}: paired tables must be .parquet or .jsonl (optionally compressed: .jsonl.gz)")
    if df.empty:
        return pd.DataFrame(columns=["context", "response", "group", "subreddit", "source", "status"])
    ctx = tables.pick_column(df.columns, CONTEXT_COLUMNS, path, "context")
    rsp = tables.pick_column(df.columns, RESPONSE_COLUMNS, path, "response")
    line = df["__line"] if "__line" in df.columns else pd.Series(np.arange(1, len(df) + 1), index=df.index)
    ok = df[ctx].map(lambda v: isinstance(v, str)) & df[rsp].map(lambda v: isinstance(v, str))
    if "__bad" in df.columns:
        ok &= df["__bad"].isna()
    group = df["source_file"] if "source_file" in df.columns else pd.Series(path, index=df.index)
    subreddit = df["subreddit"] if "subreddit" in df.columns else pd.Series("", index=df.index)
    return pd.DataFrame(
        {
            "context": df[ctx].where(ok, "").astype(str),
            "response": df[rsp].where(ok, "").astype(str),
            "group": group.fillna("").astype(str),
            "subreddit": subreddit.fillna("").astype(str),
            "source": [f"{path}:{int(n)}" for n in line],
            "status": np.where(ok, "", "malformed"),
        }
    )


def thread_keys(group: pd.DataFrame) -> pd.Series:
    """Root statement of each pair's thread within one crawled file.

    A reply's text reappears as the `question` of its own replies, so following question ->
    the question it answered reaches the thread's root (a submission title). Keying the split on
    (subreddit, root text) keeps a thread crawled on several days on one side of the split.
    """
    parent_of: dict[str, str] = {}
    for q, a in zip(group["context"], group["response"]):
        parent_of.setdefault(a, q)
    roots = []
    for q in group["context"]:
        seen = {q}
        node = q
        while node in parent_of and parent_of[node] not in seen:
            node = parent_of[node]
            seen.add(node)
        roots.append(node)
    return pd.Series([f"{s}|{_norm_key(r)}" for s, r in zip(group["subreddit"], roots)], index=group.index)


def annotate_pairs(group: pd.DataFrame, cfg: RedditFilterConfig, test_share: float, salt: str) -> pd.DataFrame:
    """Filter rule, thread key and split for the rows of one crawled file (a Ray Data map_groups fn)."""
    group = group.copy()
    well_formed = group["status"] == ""
    keys = pd.Series("", index=group.index)
    if well_formed.any():
        keys[well_formed] = thread_keys(group[well_formed])
    group["thread_key"] = keys
    statuses = []
    for status, ctx, rsp in zip(group["status"], group["context"], group["response"]):
        statuses.append(status or failing_rule(ctx, None, cfg) or failing_rule(rsp, None, cfg))
    group["status"] = statuses
    group["split"] = [split_of(k, test_share, salt) if not s else "" for k, s in zip(keys, statuses)]
    return group[PAIR_COLUMNS]


# ---------------------------------------------------------------------------------------------
# Format detection


def detect_format(path: str) -> str | None:
    """ "pushshift" for NDJSON comment dumps, "pairs" for paired tables, None for a file without
    records (empty, or blank lines only); anything else raises BadInputError naming the file."""
    if storage.name(path).endswith(".parquet"):
        names = tables.read_parquet_schema(path).names
        if any(c in names for c in CONTEXT_COLUMNS) and any(c in names for c in RESPONSE_COLUMNS):
            return "pairs"
        raise BadInputError(f"{path}: parquet without a context/response column pair; columns are {names}")
    first = _first_json_line(path)
    if first is None:
        return None
    if "parent_id" in first and "body" in first:
        return "pushshift"
    if any(c in first for c in CONTEXT_COLUMNS) and any(c in first for c in RESPONSE_COLUMNS):
        return "pairs"
    raise BadInputError(f"{path}: cannot tell the format from its first record (keys {sorted(first)})")


def _first_json_line(path: str) -> dict[str, Any] | None:
    """The first record of an NDJSON file, None when it has none; a first line that is not a JSON
    object means the file is not NDJSON at all (a README beside the dumps, a CSV)."""
    with open_lines(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip(b"\xef\xbb\xbf \t\r\n"):
                continue
            obj = json_record(raw, lineno == 1)
            if obj is None:
                raise BadInputError(
                    f"{path}:{lineno}: not NDJSON (the first record is not a JSON object); "
                    f"give only data files as inputs (a glob such as DIR/RC_* leaves others out)"
                )
            return obj
    return None


# ---------------------------------------------------------------------------------------------
# Ray Data pipeline


def _read_pairs_batch(batch: dict[str, np.ndarray]) -> pd.DataFrame:
    return pd.concat([read_pairs_file(str(p)) for p in batch["path"]], ignore_index=True)


def pairs_dataset(paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str):
    """(Ray Dataset of annotated pairs (PAIR_COLUMNS), rows read) from paired tables, one read task per file."""
    import ray.data

    files = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=max(1, len(paths)))
    rows = files.map_batches(_read_pairs_batch, batch_size=1, batch_format="numpy").materialize()
    # One crawled file per group: thread roots are found within the file that holds the thread.
    return rows.groupby("group").map_groups(
        annotate_pairs, fn_args=(cfg, test_share, salt), batch_format="pandas"
    ), rows.count()


def order_key(frame: pd.DataFrame) -> np.ndarray:
    """in_fixed_order's sort key of each row: pandas' fixed-key hash of its WRITTEN_COLUMNS values."""
    return pd.util.hash_pandas_object(frame[WRITTEN_COLUMNS], index=False).to_numpy()


def _with_order_key(batch: pd.DataFrame) -> pd.DataFrame:
    return batch.assign(**{ORDER_KEY: order_key(batch)})


def in_fixed_order(part, rows: int, rows_per_shard: int):
    """`part` (a Ray Dataset of WRITTEN_COLUMNS) as blocks of one fixed order and size, whatever
    order Ray Data's joins and groupbys handed its rows over in, so that two prepares of the same
    inputs write the same shards and a run repeated on either trains the same model.

    The order is a hash of each row's own values (pandas' fixed-key hash): a thread's pairs end up
    spread over the split, not side by side in one in-batch softmax batch, as a sort by thread
    would put them. Rows that tie are equal in every written column. The sorted rows are cut into
    rows // rows_per_shard equal blocks, written in that order (one shard each)."""
    shards = max(1, rows // rows_per_shard)
    # The groupbys leave many small blocks; combined first, the sort exchanges shards x shards pieces.
    ordered = (
        part.repartition(shards)
        .map_batches(_with_order_key, batch_format="pandas")
        .sort(ORDER_KEY)
        .repartition(shards)
        .drop_columns([ORDER_KEY])
    )
    # This dataset's own copy of the DataContext (shared only with its lineage in this prepare):
    # the write hands blocks to its tasks, and so to the shard names, in the sorted order.
    ordered.context.execution_options.preserve_order = True
    return ordered


BUCKETS = ("malformed", "duplicate_ids", "filtered_by_rule", "unpaired", "pairs")  # what a line read became


def manifest_bucket_problem(manifest: dict[str, Any]) -> str | None:
    """Where a prepared manifest's line counts do not add up as manifest_counts made them, as
    'KEY=N but ...' (a hand-edited count), or None."""
    if "lines_read" not in manifest:
        return None
    for key in ("filtered_by_rule", "unpaired_by_reason"):
        values = manifest.get(key)
        if not isinstance(values, dict) or any(type(n) is not int for n in values.values()):
            return f"{key}: not a mapping of counts ({values!r})"
    for key in ("lines_read", *BUCKETS):
        if key != "filtered_by_rule" and type(manifest.get(key)) is not int:
            return f"{key}: not a count ({manifest.get(key)!r})"
    by_reason = sum(manifest["unpaired_by_reason"].values())
    if manifest["unpaired"] != by_reason:
        return f"unpaired={manifest['unpaired']} but unpaired_by_reason adds up to {by_reason}"
    became = sum(sum(v.values()) if isinstance(v, dict) else v for v in (manifest[key] for key in BUCKETS))
    if manifest["lines_read"] != became:
        return (
            f"lines_read={manifest['lines_read']} but what its lines became ({', '.join(BUCKETS)}) adds up to {became}"
        )
    return None


def manifest_counts(counts, lines_read: int, examples: list[str]) -> dict[str, Any]:
    """The manifest's buckets from (status, split, rows) triples; they must add up to `lines_read`."""
    by_status: dict[str, int] = {}
    by_split = {"train": 0, "test": 0}
    for status, split, n in counts:
        if status:
            by_status[status] = by_status.get(status, 0) + int(n)
        else:
            by_split[split] += int(n)
    malformed = by_status.pop("malformed", 0)
    duplicates = by_status.pop(DUPLICATE, 0)
    filtered = {rule: by_status.pop(rule, 0) for rule in RULES}
    unpaired = {k: by_status.pop(k) for k in sorted(by_status) if k.startswith("unpaired")}
    if by_status:
        raise RuntimeError(f"rows with statuses no manifest bucket holds: {by_status}")
    buckets = malformed + duplicates + sum(filtered.values()) + sum(unpaired.values()) + sum(by_split.values())
    if buckets != lines_read:
        raise RuntimeError(
            f"{lines_read} lines were read but the manifest's buckets hold {buckets} "
            f"(an input line made more or fewer than one row); nothing was written"
        )
    return {
        "lines_read": lines_read,
        "malformed": malformed,
        "malformed_examples": examples if malformed else [],
        "duplicate_ids": duplicates,
        "filtered_by_rule": filtered,
        "unpaired": sum(unpaired.values()),
        "unpaired_by_reason": unpaired,
        "pairs": by_split["train"] + by_split["test"],
        "train_pairs": by_split["train"],
        "test_pairs": by_split["test"],
    }


def write_pairs(annotated, lines_read: int, out_dir: str | Path, rows_per_shard: int) -> dict[str, Any]:
    """Write kept pairs (a Ray Dataset) as train/test parquet shards (out_dir local or a URI); return
    the manifest's counts and each split's shard records (`shards`).

    `lines_read` is counted where the input was read (one row per line or table row); the buckets
    must add up to it exactly, or nothing is written."""
    from ray.data.expressions import col

    annotated = annotated.materialize()
    counts = [
        (r["status"], r["split"], r["count()"]) for r in annotated.groupby(["status", "split"]).count().take_all()
    ]
    malformed = annotated.filter(expr=col("status") == "malformed")
    examples = [r["source"] for r in malformed.take(MAX_EXAMPLES)] if any(c[0] == "malformed" for c in counts) else []
    manifest = manifest_counts(counts, lines_read, examples)
    shards = {}
    for split in ("train", "test"):
        part = annotated.filter(expr=(col("status") == "") & (col("split") == split)).select_columns(WRITTEN_COLUMNS)
        ordered = in_fixed_order(part, manifest[f"{split}_pairs"], rows_per_shard)
        shards[split] = write_shards(ordered, storage.join(out_dir, split), rows_per_shard)
    return {"shards": shards, **manifest}


def keyed_table(kept: pd.DataFrame):
    """Kept pairs (WRITTEN_COLUMNS) as an Arrow table with their ORDER_KEY, as write_ordered takes them."""
    return pa.Table.from_pandas(_with_order_key(kept[WRITTEN_COLUMNS].reset_index(drop=True)), preserve_index=False)


def write_ordered(keyed: dict[str, list], out_dir: str | Path, rows_per_shard: int) -> dict[str, Any]:
    """Each split's kept pairs (keyed_table pieces, in any order) in the order of in_fixed_order, cut as it
    cuts them, written from this process: {split: shard records}."""
    shards = {}
    for split in ("train", "test"):
        pieces = keyed.get(split) or [keyed_table(pd.DataFrame({c: pd.Series([], dtype=str) for c in WRITTEN_COLUMNS}))]
        table = pa.concat_tables(pieces).sort_by([(ORDER_KEY, "ascending")])  # a stable sort
        shards[split] = write_table(table.drop_columns([ORDER_KEY]), storage.join(out_dir, split), rows_per_shard)
    return shards


def write_pairs_frame(annotated: pd.DataFrame, lines_read: int, out_dir: str | Path, rows_per_shard: int):
    """write_pairs for annotated pairs held in the driver (a pandas frame): the same counts, and the
    same shards (rows in the order of in_fixed_order, cut as it cuts them), without Ray."""
    counts = [(status, split, n) for (status, split), n in annotated.groupby(["status", "split"]).size().items()]
    examples = list(annotated.loc[annotated["status"] == "malformed", "source"][:MAX_EXAMPLES])
    manifest = manifest_counts(counts, lines_read, examples)
    kept = annotated.loc[annotated["status"] == ""]
    keyed = {split: [keyed_table(kept.loc[kept["split"] == split])] for split in ("train", "test")}
    return {"shards": write_ordered(keyed, out_dir, rows_per_shard), **manifest}


# ---------------------------------------------------------------------------------------------
# In the driver: the same steps on pandas frames, for inputs small enough for one process


def pairs_frame(paths: Sequence[str], cfg: RedditFilterConfig, test_share: float, salt: str):
    """(annotated pairs as a pandas frame, rows read): pairs_dataset's steps in this process."""
    rows = pd.concat([read_pairs_file(p) for p in paths], ignore_index=True)
    groups = [annotate_pairs(g, cfg, test_share, salt) for _, g in rows.groupby("group", sort=True)]
    annotated = pd.concat(groups, ignore_index=True) if groups else pd.DataFrame(columns=PAIR_COLUMNS)
    return annotated, len(rows)
