"""A prepared-like folder of small parquet shards for the feed's tests and benchmarks: rows with an id,
a text of 1-12 words and a label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_shards(root: Path, rows: int = 240, per_shard: int = 20) -> tuple[str, list[tuple[str, int]]]:
    """Shards of `rows` rows, `per_shard` each, in root/train; the folder and their (file, rows) records."""
    rng = np.random.default_rng(0)
    folder = root / "train"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for index, start in enumerate(range(0, rows, per_shard)):
        ids = list(range(start, min(rows, start + per_shard)))
        texts = [" ".join(f"w{int(w)}" for w in rng.integers(0, 50, size=int(rng.integers(1, 13)))) for _ in ids]
        name = f"part-{index:06d}.parquet"
        pq.write_table(pa.table({"row": ids, "context": texts, "label": [i % 3 for i in ids]}), folder / name)
        records.append((name, len(ids)))
    return str(folder), records
