"""Tables at a local path or a URI: parquet files and folders of shards read (pyarrow in this process,
Ray Data's read_parquet for a job), a JSON-lines file as a frame, a parquet file's row count from
its footer, and a column picked among its known spellings; a file that cannot be read is one line."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from convsts.io.errors import BadInputError
from convsts.io.storage import entry_info, is_uri, open_text, path_and_filesystem, path_errors, resolve


@contextlib.contextmanager
def reading_parquet(path: str | Path):
    """pyarrow's errors while reading a parquet file as one line: an unreachable store as
    StorageError (checked first for a URI), anything else as BadInputError (a corrupt or truncated file)."""
    if is_uri(path):
        entry_info(path)
    with path_errors(path, BadInputError, "not a readable parquet file: "):
        yield


def read_parquet_table(path: str | Path, columns: list[str] | None = None):
    """One parquet file or a folder of shards -> pyarrow.Table."""

    inner, fs = path_and_filesystem(path)
    with reading_parquet(path):
        return pq.read_table(inner, columns=columns, filesystem=fs)


def read_parquet_schema(path: str | Path):
    inner, fs = path_and_filesystem(path)
    with reading_parquet(path):
        return pq.read_schema(inner, filesystem=fs)


def read_shards(path: str, **kwargs):
    """ray.data.read_parquet for a local folder or a URI (endpoint options in its query honoured)."""
    import ray.data

    inner, fs = path_and_filesystem(path)
    with path_errors(path):
        return ray.data.read_parquet(inner, filesystem=fs, **kwargs)


def read_table_file(path: str):
    """A parquet or JSON-lines file as a pandas frame."""

    if path.endswith(".parquet"):
        return read_parquet_table(path).to_pandas()
    with open_text(path, encoding="utf-8-sig") as fh:  # a byte-order mark is accepted
        return pd.read_json(fh, lines=True)


def parquet_rows(path: str) -> int:
    """Row count of one parquet file from its footer (local or a URI)."""

    fs, inner = resolve(path)
    with reading_parquet(path), fs.open_input_file(inner) as fh:
        return pq.ParquetFile(fh).metadata.num_rows


def pick_column(columns: Sequence[str], candidates: Sequence[str], path: str, what: str) -> str:
    """The first of `candidates` (a column's known spellings) among a table's `columns`."""
    for name in candidates:
        if name in columns:
            return name
    raise BadInputError(f"{path}: no {what} column; expected one of {list(candidates)}, found {list(columns)}")
