"""Evaluation sets: STS Benchmark (official TSV or parquet), STS-style files, SemEval CQA subtask B."""

from __future__ import annotations

import csv
from pathlib import Path
import pandas as pd
import pyarrow.parquet as pq

STSB_GENRES = {"main-captions": "captions", "main-forum": "forums", "main-forums": "forums", "main-news": "news"}


def read_stsb(path: str | Path) -> pd.DataFrame:
    """-> DataFrame(genre, sentence1, sentence2, score). Parquet, or the official tab-separated
    file (no quoting; some rows carry extra trailing license columns, which are ignored)."""
    path = str(path)
    if path.endswith(".parquet"):
        df = pq.read_table(path).to_pandas()
        return df[["genre", "sentence1", "sentence2", "score"]].assign(score=lambda d: d["score"].astype(float))
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 7:
                raise ValueError(f"{path}:{lineno}: expected at least 7 tab-separated fields, found {len(fields)}")
            genre, _file, _year, _id, score, s1, s2 = fields[:7]
            try:
                value = float(score)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: score {score!r} is not a number") from None
            rows.append({"genre": STSB_GENRES.get(genre, genre), "sentence1": s1, "sentence2": s2, "score": value})
    return pd.DataFrame(rows)


def stsb_split_path(directory: str | Path, split: str) -> Path:
    """STS-B split file in a folder: stsb_<split>.parquet, <split>.parquet or sts-<split>.csv."""
    directory = Path(directory)
    for name in (f"stsb_{split}.parquet", f"{split}.parquet", f"sts-{split}.csv"):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"no STS-B {split} file in {directory} (stsb_{split}.parquet, {split}.parquet or sts-{split}.csv)")


def read_sts_file(path: str | Path) -> pd.DataFrame:
    """Any STS-style file with sentence1, sentence2, score (parquet, or TSV with a header row)."""
    path = str(path)
    if path.endswith(".parquet"):
        df = pq.read_table(path).to_pandas()
    else:
        df = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    missing = {"sentence1", "sentence2", "score"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)} (found {list(df.columns)})")
    return pd.DataFrame({"sentence1": df["sentence1"].astype(str), "sentence2": df["sentence2"].astype(str),
                         "score": df["score"].astype(float)})


def read_cqa(path: str | Path) -> pd.DataFrame:
    """SemEval CQA subtask B as parquet: orgq_id, orgq text, relq_id, relq text, ir_rank, relevant."""
    df = pq.read_table(str(path)).to_pandas()
    needed = {"orgq_id", "orgq_subject", "orgq_body", "relq_id", "relq_subject", "relq_body", "ir_rank", "relevant"}
    missing = needed - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return df


def cqa_text(subject: str, body: str) -> str:
    return f"{subject or ''} {body or ''}".strip()

