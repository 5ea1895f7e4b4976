"""SNLI: official 1.0 files (jsonl, txt) or parquet -> (premise, hypothesis, label id).

Nested fractions for the data-quantity curve: every pair gets a rank in [0, 1) from a seeded
hash of its text; the subset for fraction f is the pairs with rank < f, so the 10% subset lies
inside the 20% one on every machine.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Dict

import numpy as np
import pandas as pd

from datasets import storage

LABELS = ("entailment", "neutral", "contradiction")
LABEL_IDS = {name: i for i, name in enumerate(LABELS)}


def fraction_rank(premise: str, hypothesis: str, seed: int = 0) -> float:
    digest = hashlib.sha1(f"{seed}\x00{premise}\x00{hypothesis}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def read_snli(path: str | Path) -> pd.DataFrame:
    """-> DataFrame(premise, hypothesis, label) with label in {0, 1, 2}; gold '-' pairs dropped.

    Accepts parquet/jsonl/txt with either SNLI's own names (sentence1, sentence2, gold_label) or
    premise/hypothesis/label. Unknown labels raise, naming the file and row.
    """
    path = str(path)
    suffix = storage.name(path)
    if suffix.endswith(".parquet"):
        df = storage.read_parquet_table(path).to_pandas()
    elif suffix.endswith((".jsonl", ".json")):
        with storage.open_text(path) as fh:
            df = pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    elif suffix.endswith((".txt", ".tsv")):
        with storage.open_text(path) as fh:
            df = pd.read_csv(fh, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    else:
        raise ValueError(f"{path}: SNLI must be .parquet, .jsonl or .txt")
    premise = next((c for c in ("sentence1", "premise") if c in df.columns), None)
    hypothesis = next((c for c in ("sentence2", "hypothesis") if c in df.columns), None)
    label = next((c for c in ("gold_label", "label") if c in df.columns), None)
    if not (premise and hypothesis and label):
        raise ValueError(f"{path}: expected sentence1/sentence2/gold_label columns, found {list(df.columns)}")
    labels = df[label].map(_label_name)
    df = df[labels != "-"].reset_index(drop=True)
    labels = labels[labels != "-"].reset_index(drop=True)
    bad = ~labels.isin(LABELS)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: row {row}: unknown label {df[label][row]!r}")
    return pd.DataFrame(
        {
            "premise": df[premise].astype(str),
            "hypothesis": df[hypothesis].astype(str),
            "label": labels.map(LABEL_IDS).astype("int64"),
        }
    )


def _label_name(value) -> str:
    if isinstance(value, (int, np.integer)):
        return LABELS[int(value)] if 0 <= int(value) < 3 else "-"  # HF exports use -1 for no gold
    return str(value).strip()


def with_fraction_rank(df: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    df = df.copy()
    df["fraction_rank"] = [fraction_rank(p, h, seed) for p, h in zip(df["premise"], df["hypothesis"])]
    return df


def take_fraction(df: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The nested subset for `fraction` of a frame that has a fraction_rank column."""
    return df[df["fraction_rank"] < fraction].reset_index(drop=True)


def label_counts(df: pd.DataFrame) -> Dict[str, int]:
    return {LABELS[i]: int((df["label"] == i).sum()) for i in range(3)}
