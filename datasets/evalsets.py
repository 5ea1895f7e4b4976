"""Evaluation sets: STS Benchmark (official TSV or parquet), STS-style files, SemEval CQA subtask B."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from datasets import storage
from datasets.storage import BadInputError

STSB_GENRES = {"main-captions": "captions", "main-forum": "forums", "main-forums": "forums", "main-news": "news"}


def read_stsb(path: str | Path) -> pd.DataFrame:
    """-> DataFrame(genre, sentence1, sentence2, score). Parquet, or the official tab-separated
    file (no quoting; some rows carry extra trailing license columns, which are ignored)."""
    path = str(path)
    if storage.name(path).endswith(".parquet"):
        df = storage.read_parquet_table(path).to_pandas()
        # A file that pandas wrote from a sample keeps its row labels: the rows are numbered anew.
        return (df[["genre", "sentence1", "sentence2", "score"]].assign(score=lambda d: d["score"].astype(float))
                .reset_index(drop=True))
    rows = []
    for lineno, line in enumerate(io.StringIO(storage.read_text(path), newline=None), start=1):
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 7:
            raise BadInputError(f"{path}:{lineno}: expected at least 7 tab-separated fields, found {len(fields)}")
        genre, _file, _year, _id, score, s1, s2 = fields[:7]
        try:
            value = float(score)
        except ValueError:
            raise BadInputError(f"{path}:{lineno}: score {score!r} is not a number") from None
        rows.append({"genre": STSB_GENRES.get(genre, genre), "sentence1": s1, "sentence2": s2, "score": value})
    return pd.DataFrame(rows)


def stsb_split_path(directory: str | Path, split: str) -> str:
    """STS-B split file in a folder (local or a URI): stsb_<split>.parquet, <split>.parquet or sts-<split>.csv."""
    for name in (f"stsb_{split}.parquet", f"{split}.parquet", f"sts-{split}.csv"):
        candidate = storage.join(directory, name)
        if storage.is_file(candidate):
            return candidate
    raise FileNotFoundError(f"no STS-B {split} file in {directory} (stsb_{split}.parquet, {split}.parquet or sts-{split}.csv)")


def read_sts_file(path: str | Path) -> pd.DataFrame:
    """Any STS-style file with sentence1, sentence2, score (parquet, or TSV with a header row)."""
    path = str(path)
    if storage.name(path).endswith(".parquet"):
        df = storage.read_parquet_table(path).to_pandas()
    else:
        try:
            df = pd.read_csv(io.StringIO(storage.read_text(path)), sep="\t", quoting=csv.QUOTE_NONE, dtype=str,
                             keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            raise BadInputError(f"{path}: not a tab-separated file with a header row ({str(err).strip()})") from None
    missing = {"sentence1", "sentence2", "score"} - set(df.columns)
    if missing:
        raise BadInputError(f"{path}: missing columns {sorted(missing)} (found {list(df.columns)})")
    return pd.DataFrame({"sentence1": df["sentence1"].astype(str), "sentence2": df["sentence2"].astype(str),
                         "score": df["score"].astype(float)}).reset_index(drop=True)


CQA_COLUMNS = ["orgq_id", "orgq_subject", "orgq_body", "relq_id", "relq_subject", "relq_body", "ir_rank", "relevant"]
RELEVANT_LABELS = {"PerfectMatch": True, "Relevant": True, "Irrelevant": False}


def read_cqa(path: str | Path, relevancy: str | Path | None = None) -> pd.DataFrame:
    """SemEval CQA subtask B -> orgq_id, orgq text, relq_id, relq text, ir_rank, relevant.

    Parquet with those columns, or the official XML (2016 and 2017 layouts: OrgQuestion elements
    holding Thread/RelQuestion). Gold relevance comes from the `.relevancy` file when given (or found
    beside the XML as <xml>.subtaskB.relevancy), else from RELQ_RELEVANCE2ORGQ in the XML.
    """
    path = str(path)
    if storage.name(path).endswith(".parquet"):
        df = storage.read_parquet_table(path).to_pandas()
        missing = set(CQA_COLUMNS) - set(df.columns)
        if missing:
            raise BadInputError(f"{path}: missing columns {sorted(missing)}")
        return df
    if not storage.name(path).endswith(".xml"):
        raise BadInputError(f"{path}: CQA files must be .parquet or the official .xml")
    df = _read_cqa_xml(path)
    if relevancy is None:
        guess = storage.add_suffix(path, ".subtaskB.relevancy")
        relevancy = guess if storage.is_file(guess) else None
    if relevancy is not None:
        gold = read_relevancy(relevancy)
        keys = list(zip(df["orgq_id"], df["relq_id"]))
        absent = [k for k in keys if k not in gold]
        if absent:
            raise BadInputError(f"{relevancy}: no gold label for {len(absent)} related question(s), e.g. "
                             f"{absent[0][0]} / {absent[0][1]}")
        df["relevant"] = [gold[k] for k in keys]
    elif df["label"].isna().any():
        first = df[df["label"].isna()].iloc[0]
        raise BadInputError(f"{path}: RelQuestion {first['relq_id']} has no RELQ_RELEVANCE2ORGQ; give the gold "
                         f".relevancy file (data.cqa_relevancy)")
    else:
        unknown = sorted(set(df["label"]) - set(RELEVANT_LABELS))
        if unknown:
            raise BadInputError(f"{path}: unknown RELQ_RELEVANCE2ORGQ value(s) {unknown}")
        df["relevant"] = df["label"].map(RELEVANT_LABELS).astype(bool)
    return df


def _read_cqa_xml(path: str) -> pd.DataFrame:
    import xml.etree.ElementTree as ET

    try:
        with storage.open_binary(path) as fh:
            root = ET.parse(fh).getroot()
    except ET.ParseError as err:
        line, column = err.position
        raise BadInputError(f"{path}:{line}:{column}: not well-formed XML ({err.msg if hasattr(err, 'msg') else err})") from None
    rows = []
    for org in root.iter("OrgQuestion"):
        orgq_id = org.get("ORGQ_ID")
        if not orgq_id:
            raise BadInputError(f"{path}: an OrgQuestion has no ORGQ_ID")
        subject, body = org.findtext("OrgQSubject", ""), org.findtext("OrgQBody", "")
        for rel in org.iter("RelQuestion"):
            relq_id = rel.get("RELQ_ID")
            try:
                rank = int(rel.get("RELQ_RANKING_ORDER", ""))
            except ValueError:
                raise BadInputError(f"{path}: RelQuestion {relq_id} of {orgq_id} has no integer RELQ_RANKING_ORDER") from None
            rows.append({"orgq_id": orgq_id, "orgq_subject": subject.strip(), "orgq_body": body.strip(),
                         "relq_id": relq_id, "relq_subject": rel.findtext("RelQSubject", "").strip(),
                         "relq_body": rel.findtext("RelQBody", "").strip(), "relq_category": rel.get("RELQ_CATEGORY"),
                         "ir_rank": rank, "label": rel.get("RELQ_RELEVANCE2ORGQ")})
    if not rows:
        raise BadInputError(f"{path}: no OrgQuestion/RelQuestion elements: not a SemEval CQA subtask B file")
    df = pd.DataFrame(rows)
    # The 2016 files repeat an OrgQuestion once per thread: keep each (orgq, relq) once.
    return df.drop_duplicates(["orgq_id", "relq_id"]).reset_index(drop=True)


def read_relevancy(path: str | Path) -> dict:
    """The scorer's gold file: ORGQ_ID RELQ_ID RANK SCORE true|false per line (tab or space separated)."""
    gold = {}
    with storage.open_text(path) as fh:
        for number, line in enumerate(fh, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 5 or parts[4] not in ("true", "false"):
                raise BadInputError(f"{path}:{number}: expected ORGQ_ID RELQ_ID RANK SCORE true|false, got {line.strip()!r}")
            gold[(parts[0], parts[1])] = parts[4] == "true"
    return gold


def cqa_text(subject: str, body: str) -> str:
    return f"{subject or ''} {body or ''}".strip()

