"""SNLI: official 1.0 files (jsonl, txt; plain or compressed) or parquet -> (premise, hypothesis, label id).

Nested fractions for the data-quantity curve: every pair gets a rank in [0, 1) from a seeded
hash of its text; the subset for fraction f is the pairs with rank < f, so the 10% subset lies
inside the 20% one on every machine.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from convsts.io import errors, tables
from convsts.io.compression import SUFFIXES, open_lines, plain_name

LABELS = ("entailment", "neutral", "contradiction")
LABEL_IDS = {name: i for i, name in enumerate(LABELS)}


def fraction_rank(premise: str, hypothesis: str, seed: int = 0) -> float:
    digest = hashlib.sha1(f"{seed}\x00{premise}\x00{hypothesis}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# Column names of the common SNLI releases, ours first: SNLI's own files, Hugging Face / MultiNLI exports.
SNLI_COLUMN_NAMES = {
    "premise": ("sentence1", "premise"),
    "hypothesis": ("sentence2", "hypothesis"),
    "label": ("gold_label", "label"),
}
NO_GOLD = "-"  # SNLI's gold label where the annotators did not agree (Hugging Face exports: -1)


def read_snli(path: str | Path) -> pd.DataFrame:
    """-> DataFrame(premise, hypothesis, label) with label in {0, 1, 2}.

    Accepts parquet/jsonl/txt with either SNLI's own names (sentence1, sentence2, gold_label) or
    premise/hypothesis/label. Pairs without a gold label ('-', or -1) are left out and counted in
    `frame.attrs["without_gold"]`; any other label raises, naming the file and row.
    """
    path = str(path)
    name = plain_name(path)  # snli_1.0_dev.jsonl.gz holds JSON lines
    if name.endswith(".parquet"):
        df = tables.read_parquet_table(path).to_pandas()
    elif name.endswith((".jsonl", ".json")):
        with io.TextIOWrapper(open_lines(path), encoding="utf-8") as fh:
            df = pd.DataFrame([json.loads(line) for line in fh if line.strip()])
    elif name.endswith((".txt", ".tsv")):
        with io.TextIOWrapper(open_lines(path), encoding="utf-8") as fh:
            try:
                df = pd.read_csv(fh, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
            except pd.errors.ParserError as err:  # "Expected 14 fields in line 3, saw 15": a row with a tab too many
                detail = str(err).strip().removeprefix("Error tokenizing data. C error: ")
                raise errors.BadInputError(f"{path}: not a tab-separated SNLI table: {detail}") from None
    else:
        raise errors.BadInputError(
            f"{path}: SNLI must be .parquet, .jsonl or .txt (the text ones optionally compressed: "
            f"{', '.join(SUFFIXES)})"
        )
    picked = {ours: tables.pick_column(df.columns, names, path, ours) for ours, names in SNLI_COLUMN_NAMES.items()}
    labels = df[picked["label"]].map(_label_name)
    bad = ~labels.isin(LABELS + (NO_GOLD,))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise errors.BadInputError(
            f"{path}: row {row + 1}: unknown label {_shown(df[picked['label']].iloc[row])} "
            f"(expected one of {list(LABELS)}, 0-2, or {NO_GOLD!r} / -1 for no gold label)"
        )
    gold = (labels != NO_GOLD).to_numpy()
    frame = pd.DataFrame(
        {
            "premise": df[picked["premise"]][gold].astype(str),
            "hypothesis": df[picked["hypothesis"]][gold].astype(str),
            "label": labels[gold].map(LABEL_IDS).astype("int64"),
        }
    ).reset_index(drop=True)
    frame.attrs["without_gold"] = int((~gold).sum())
    return frame


def _shown(value) -> str:
    return repr(value.item() if isinstance(value, np.generic) else value)


def _label_name(value) -> str:
    """A label as SNLI names it: a name, an id 0-2 (also as text, from a tab-separated export), or NO_GOLD."""
    text = str(value).strip()
    if isinstance(value, (int, np.integer)) or text.lstrip("-").isdigit():
        if int(text) == -1:  # Hugging Face exports: no gold label
            return NO_GOLD
        return LABELS[int(text)] if 0 <= int(text) < len(LABELS) else text
    return text


def with_fraction_rank(df: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    df = df.copy()
    df["fraction_rank"] = [fraction_rank(p, h, seed) for p, h in zip(df["premise"], df["hypothesis"])]
    return df


def take_fraction(df: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The nested subset for `fraction` of a frame that has a fraction_rank column."""
    return df[df["fraction_rank"] < fraction].reset_index(drop=True)


def label_counts(df: pd.DataFrame) -> dict[str, int]:
    return {LABELS[i]: int((df["label"] == i).sum()) for i in range(3)}
