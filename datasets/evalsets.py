"""Evaluation sets: STS Benchmark (official TSV or parquet), STS-style files, SemEval CQA subtask B."""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from convsts.io import storage, tables
from convsts.io.compression import plain_name, read_text
from convsts.io.errors import BadInputError

STSB_GENRES = {"main-captions": "captions", "main-forum": "forums", "main-forums": "forums", "main-news": "news"}


def read_stsb(path: str | Path) -> pd.DataFrame:
    """-> DataFrame(genre, sentence1, sentence2, score). Parquet, or the official tab-separated
    file (no quoting; some rows carry extra trailing license columns, which are ignored)."""
    path = str(path)
    if storage.name(path).endswith(".parquet"):
        df = tables.read_parquet_table(path).to_pandas()
        # A file that pandas wrote from a sample keeps its row labels: the rows are numbered anew.
        return (
            df[["genre", "sentence1", "sentence2", "score"]]
            .assign(score=lambda d: d["score"].astype(float))
            .reset_index(drop=True)
        )
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
    raise FileNotFoundError(
        f"no STS-B {split} file in {directory} (stsb_{split}.parquet, {split}.parquet or sts-{split}.csv)"
    )


# Column names of the common STS releases, ours first: MTEB / Hugging Face and GLUE (sentence1,
# sentence2, score), SICK (sentence_A, sentence_B, relatedness_score), and a few other spellings.
STS_COLUMN_NAMES = {
    "sentence1": ("sentence1", "sentence_A", "sentence_a", "sentence_1", "s1", "text1", "text_a"),
    "sentence2": ("sentence2", "sentence_B", "sentence_b", "sentence_2", "s2", "text2", "text_b"),
    "score": ("score", "relatedness_score", "similarity_score", "similarity", "gold_score", "label"),
}
# A column naming each pair's split, in files that ship every split together (sentence-transformers'
# stsbenchmark.tsv.gz: train/dev/test; SICK.txt: TRAIN/TRIAL/TEST): kept as `split`, lower-cased.
STS_SPLIT_COLUMN_NAMES = ("split", "SemEval_set")
MAX_LABEL_CLASSES = 3  # a `label` column with at most this many whole values is a class, not a 0-5 score
STS_INPUT_PREFIX, STS_GOLD_PREFIX = "STS.input.", "STS.gs."  # the STS 2012-2016 releases' file pairs


def pair_keys(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """Each pair's (sentence, sentence), lowercased with punctuation and spacing collapsed and in
    sorted order: how a pair is recognised across releases (the STS Benchmark re-punctuated the
    STS 2012-2017 pairs it took)."""

    def norm(text: str) -> str:
        return " ".join(re.sub(r"[^\w]+", " ", str(text).lower()).split())

    pairs = ((norm(a), norm(b)) for a, b in zip(frame["sentence1"], frame["sentence2"]))
    return [(x, y) if x <= y else (y, x) for x, y in pairs]


SPLIT_NAMES = ("train", "dev", "validation", "test")  # a file named only so says nothing of its set
# A Hugging Face hub parquet shard (data/test-00000-of-00001.parquet, a hash may follow): named by its split.
HUB_SHARD = re.compile(r"(?P<split>[A-Za-z]+)-\d{5}-of-\d{5}(-[0-9a-f]+)?")
GENERIC_FOLDERS = ("data",)  # hub datasets keep their files in data/: the folder above names the set
SET_NAME = re.compile(r"[\w.+-]+")  # --sts NAME=FILE


def _set_folder(path: str) -> str:
    """The nearest folder above `path` that names a set: not a split's folder, nor data/."""
    return next((folder for folder in storage.parent_names(path) if folder not in SPLIT_NAMES + GENERIC_FOLDERS), "")


def _named(entry: str) -> tuple[str, str]:
    """(name or "", path) of an --sts entry: NAME=FILE names its metrics; a file that exists under the
    whole text, or a text whose part before "=" is not a plain name (a URI's query), is a path."""
    name, sep, path = str(entry).partition("=")
    if sep and path and SET_NAME.fullmatch(name) and not storage.is_file(entry):
        return name, path
    return "", str(entry)


def check_sts_entries(entries: Sequence[str]) -> dict[str, str]:
    """sts_set_names of --sts entries whose files are all there; else one line naming the entry."""
    for entry in entries:
        name, path = _named(entry)
        if name and not storage.is_file(path):  # a mistyped config override lands here too (trainr.steps=5)
            raise BadInputError(
                f"--sts {entry}: no file {path} to name {name!r} (as a config override, "
                f"{name!r} is not a run config key)"
            )
        if not storage.is_file(path):
            raise BadInputError(f"--sts {path}: no such file")
    return sts_set_names(entries)


def sts_set_names(entries: Sequence[str]) -> dict[str, str]:
    """{path: the name its metrics go under} for --sts entries. NAME=FILE is named NAME. An STS
    2012-2016 file is named by its folder (the release) and its set, so that one release's sets sort
    together and a set that several releases hold (headlines: 2013-2016) keeps them apart:
    STS13/STS.input.headlines.txt -> STS13.headlines. Any other file by its own name (my_sts.tsv ->
    my_sts), and by its folder's too where two share it or where the name is only a split's (MTEB's
    sickr-sts/test.jsonl.gz -> sickr-sts.test; a hub shard sts12-sts/data/test-00000-of-00001.parquet
    -> sts12-sts.test). Raises if two files still share a name."""

    def own(path: str) -> str:
        name = plain_name(path)
        if name.startswith(STS_INPUT_PREFIX):
            return ".".join(filter(None, [storage.folder_name(path), name[len(STS_INPUT_PREFIX) :].rsplit(".", 1)[0]]))
        stem = name.rsplit(".", 1)[0] if "." in name else name
        shard = HUB_SHARD.fullmatch(stem)
        return shard["split"] if shard else stem

    named = [_named(entry) for entry in entries]
    names = {path: given or own(path) for given, path in named}
    given = {path for name, path in named if name}
    counts = Counter(names.values())
    names = {
        p: f"{_set_folder(p)}.{n}"
        if p not in given
        and (counts[n] > 1 or n in SPLIT_NAMES)
        and _set_folder(p)
        and not storage.name(p).startswith(STS_INPUT_PREFIX)
        else n
        for p, n in names.items()
    }
    counts = Counter(names.values())
    clash = [p for p, n in names.items() if counts[n] > 1]
    twice = [p for p, c in Counter(p for _, p in named).items() if c > 1]
    if twice:
        raise BadInputError(f"{twice[0]}: given to --sts twice; give each file once")
    if clash:
        raise BadInputError(
            f"{clash[0]}: its metrics would share the name {names[clash[0]]!r} with another --sts entry; "
            f"name each file (--sts NAME=FILE) or give it a folder of its own"
        )
    return names


def read_sts_file(path: str | Path) -> pd.DataFrame:
    """An STS-style file -> DataFrame(sentence1, sentence2, score), read as its release ships it:
    parquet or JSON lines (MTEB, Hugging Face; MTEB's test.jsonl.gz), a tab-separated (or comma-separated) table with a
    header row (SICK, GLUE), the STS Benchmark's headerless 7-column file, or an STS 2012-2016
    `STS.input.<name>.txt` with its `STS.gs.<name>.txt` beside it; the text ones plain or compressed
    (convsts.io.compression: .gz, .bz2, .xz, .zst). Pairs whose gold line is empty
    are left out and counted in `frame.attrs["without_gold"]`. A table that ships several splits
    together (a `split` or `SemEval_set` column: sentence-transformers' stsbenchmark.tsv.gz, SICK.txt)
    keeps each pair's split, lower-cased, as a fourth column `split`."""
    path = str(path)
    name = plain_name(path)  # MTEB's test.jsonl.gz holds JSON lines
    if name.startswith(STS_INPUT_PREFIX):
        return _read_sts_input_and_gold(path)
    if name.endswith(".parquet"):
        return _sts_columns(tables.read_parquet_table(path).to_pandas(), path)
    text = read_text(path)
    if name.endswith((".jsonl", ".json")):
        try:
            return _sts_columns(pd.read_json(io.StringIO(text), lines=True, dtype=False), path)
        except ValueError as err:
            raise BadInputError(f"{path}: not JSON lines ({str(err).strip()})") from None
    first = text.split("\n", 1)[0].rstrip("\r")
    known = {alias for aliases in STS_COLUMN_NAMES.values() for alias in aliases}
    for sep in ("\t", ","):
        if known & set(first.split(sep)):
            try:
                table = pd.read_csv(
                    io.StringIO(text),
                    sep=sep,
                    quoting=csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL,
                    dtype=str,
                    keep_default_na=False,
                )
            except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
                raise BadInputError(
                    f"{path}: not a {'tab' if sep == chr(9) else 'comma'}-separated table ({str(err).strip()})"
                ) from None
            return _sts_columns(table, path)
    fields = first.split("\t")
    if len(fields) >= 7 and _is_number(fields[4]):  # the STS Benchmark's own file: genre, file, year, id, score, s1, s2
        return read_stsb(path)[["sentence1", "sentence2", "score"]]
    raise BadInputError(
        f"{path}: no header row naming the sentence and score columns (e.g. sentence1, sentence2, "
        f"score), and not the STS Benchmark's 7-column layout; for STS 2012-2016 give the "
        f"{STS_INPUT_PREFIX}<name>.txt file"
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _sts_columns(df: pd.DataFrame, path: str) -> pd.DataFrame:
    """sentence1, sentence2, score from a table whose columns use one of STS_COLUMN_NAMES' spellings."""
    picked = {ours: tables.pick_column(df.columns, aliases, path, ours) for ours, aliases in STS_COLUMN_NAMES.items()}
    scores = pd.to_numeric(df[picked["score"]], errors="coerce")
    given = df[picked["score"]]  # empty, null or NaN: no gold (left out and counted); anything else must be a number
    bad = scores.isna() & given.notna() & (given.astype(str).str.strip() != "")
    if bad.any():
        row = int(bad.to_numpy().argmax())
        raise BadInputError(
            f"{path}: row {row + 1}: {picked['score']} {df[picked['score']].iloc[row]!r} is not a number"
        )
    classes = sorted(scores.dropna().unique())
    if picked["score"] == "label" and len(classes) <= MAX_LABEL_CLASSES and all(float(c).is_integer() for c in classes):
        # Hugging Face's glue/stsb calls its 0-5 scores `label`; classification tables (MRPC, NLI) do too.
        raise BadInputError(
            f"{path}: its label column holds only the classes {[int(c) for c in classes]}, not "
            f"similarity scores; name the score column one of {list(STS_COLUMN_NAMES['score'][:-1])}"
        )
    # A row without one of its sentences (a short row, a null cell) is no pair to score: it is left
    # out as a pair without gold is, and counted apart (`without_text`), never scored as "" or "nan".
    texts = [df[picked[side]] for side in ("sentence1", "sentence2")]
    no_text = np.zeros(len(df), dtype=bool)
    for column in texts:
        no_text |= (column.isna() | (column.astype(str).str.strip() == "")).to_numpy()
    frame = pd.DataFrame(
        {
            "sentence1": texts[0].astype(str),
            "sentence2": texts[1].astype(str),
            "score": scores.astype(float),
        }
    )
    split = next((c for c in STS_SPLIT_COLUMN_NAMES if c in df.columns), None)
    if split is not None:
        names = (
            df[split].astype(str).str.strip().str.lower().str.replace(r"[^\w.-]+", "_", regex=True)
        )  # a metric name part
        frame["split"] = names.where(names != "", "unnamed").to_numpy()
    kept = _without_missing_gold(frame[~no_text].reset_index(drop=True))
    kept.attrs["without_text"] = int(no_text.sum())
    return kept


def _read_sts_input_and_gold(path: str) -> pd.DataFrame:
    """STS.input.<name>.txt (sentence pairs, tab-separated, no quoting) + STS.gs.<name>.txt (one
    gold score a line, empty where a pair has none)."""
    gold_path = storage.sibling(path, STS_GOLD_PREFIX + storage.name(path)[len(STS_INPUT_PREFIX) :])
    if not storage.is_file(gold_path):
        raise BadInputError(f"{path}: its gold scores {gold_path} are not beside it")
    pairs = read_text(path).splitlines()
    gold = read_text(gold_path).splitlines()
    while gold and not gold[-1].strip() and len(gold) > len(pairs):
        gold.pop()
    if len(gold) != len(pairs):
        raise BadInputError(f"{gold_path}: {len(gold)} lines for the {len(pairs)} pairs of {path}")
    rows = []
    for lineno, (line, score) in enumerate(zip(pairs, gold), start=1):
        fields = line.split("\t")
        if len(fields) < 2:
            raise BadInputError(f"{path}:{lineno}: expected two tab-separated sentences, found {len(fields)} field(s)")
        if score.strip() and not _is_number(score.strip()):
            raise BadInputError(f"{gold_path}:{lineno}: score {score.strip()!r} is not a number")
        rows.append((fields[0], fields[1], float(score) if score.strip() else float("nan")))
    return _without_missing_gold(pd.DataFrame(rows, columns=["sentence1", "sentence2", "score"]))


def _without_missing_gold(frame: pd.DataFrame) -> pd.DataFrame:
    missing = frame["score"].isna()
    kept = frame[~missing].reset_index(drop=True)
    kept.attrs["without_gold"] = int(missing.sum())
    return kept


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
        df = tables.read_parquet_table(path).to_pandas()
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
            raise BadInputError(
                f"{relevancy}: no gold label for {len(absent)} related question(s), e.g. "
                f"{absent[0][0]} / {absent[0][1]}"
            )
        df["relevant"] = [gold[k] for k in keys]
    elif df["label"].isna().any():
        first = df[df["label"].isna()].iloc[0]
        raise BadInputError(
            f"{path}: RelQuestion {first['relq_id']} has no RELQ_RELEVANCE2ORGQ; give the gold "
            f".relevancy file (data.cqa_relevancy)"
        )
    else:
        unknown = sorted(set(df["label"]) - set(RELEVANT_LABELS))
        if unknown:
            raise BadInputError(f"{path}: unknown RELQ_RELEVANCE2ORGQ value(s) {unknown}")
        df["relevant"] = df["label"].map(RELEVANT_LABELS).astype(bool)
    return df


def _read_cqa_xml(path: str) -> pd.DataFrame:
    try:
        with storage.open_binary(path) as fh:
            root = ET.parse(fh).getroot()
    except ET.ParseError as err:
        line, column = err.position
        raise BadInputError(
            f"{path}:{line}:{column}: not well-formed XML ({err.msg if hasattr(err, 'msg') else err})"
        ) from None
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
                raise BadInputError(
                    f"{path}: RelQuestion {relq_id} of {orgq_id} has no integer RELQ_RANKING_ORDER"
                ) from None
            rows.append(
                {
                    "orgq_id": orgq_id,
                    "orgq_subject": subject.strip(),
                    "orgq_body": body.strip(),
                    "relq_id": relq_id,
                    "relq_subject": rel.findtext("RelQSubject", "").strip(),
                    "relq_body": rel.findtext("RelQBody", "").strip(),
                    "relq_category": rel.get("RELQ_CATEGORY"),
                    "ir_rank": rank,
                    "label": rel.get("RELQ_RELEVANCE2ORGQ"),
                }
            )
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
                raise BadInputError(
                    f"{path}:{number}: expected ORGQ_ID RELQ_ID RANK SCORE true|false, got {line.strip()!r}"
                )
            gold[(parts[0], parts[1])] = parts[4] == "true"
    return gold


def cqa_text(subject: str, body: str) -> str:
    return f"{subject or ''} {body or ''}".strip()
