"""The comment filter rules on Arrow columns (vectorized): each well-formed line's first failed rule,
or "", in its `status`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from convsts.datasets.config import RedditFilterConfig
from convsts.datasets.reddit import RULES

ASCII_SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"  # what str.strip() removes from an ASCII string


def _ascii_alpha_counts(strings) -> np.ndarray:
    """How many bytes of each string (an Arrow string array) are ASCII letters."""
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset : strings.offset + len(strings) + 1]
    values = strings.buffers()[2]
    if values is None or offsets[-1] == offsets[0]:
        return np.zeros(len(strings), np.int64)
    data = np.frombuffer(values, np.uint8)[offsets[0] : offsets[-1]]  # (bytes,)
    letters = ((data | 0x20) - ord("a")) < 26  # (bytes,) A-Z and a-z: lower-cased, then a range
    starts = np.minimum(offsets[:-1] - offsets[0], len(data) - 1)
    counts = np.add.reduceat(letters.view(np.uint8), starts, dtype=np.int32)
    return np.where(offsets[1:] > offsets[:-1], counts, 0)  # reduceat gives an empty string the next byte


def rule_status(body, author, cfg: RedditFilterConfig) -> np.ndarray:
    """failing_rule of each (body, author) pair (Arrow string arrays without nulls), in columns: the
    same answer, string for string. ASCII texts are decided in columns; a non-ASCII body (its letter
    share and its stripped form) or author goes through the same Python string methods failing_rule uses."""
    banned = pa.array(list(cfg.banned_bodies), pa.string())
    deleted = pc.is_in(pc.ascii_trim(body, characters=ASCII_SPACE), value_set=banned).to_numpy(zero_copy_only=False)
    length = pc.utf8_length(body).to_numpy(zero_copy_only=False)
    alpha = _ascii_alpha_counts(body)
    wide = np.flatnonzero(~pc.string_is_ascii(body).to_numpy(zero_copy_only=False))
    texts = body.take(pa.array(wide)).to_pylist()
    deleted[wide] = [t.strip() in cfg.banned_bodies for t in texts]
    alpha[wide] = [sum(map(str.isalpha, t)) for t in texts]
    bot = np.zeros(len(body), bool)
    if cfg.author_substring:
        needle = cfg.author_substring.lower()
        ascii_author = pc.string_is_ascii(author).to_numpy(zero_copy_only=False)
        bot = pc.match_substring(pc.ascii_lower(author), needle).to_numpy(zero_copy_only=False) & ascii_author
        others = np.flatnonzero(~ascii_author)
        bot[others] = [bool(a) and needle in a.lower() for a in author.take(pa.array(others)).to_pylist()]
    prefix = np.zeros(len(body), bool)
    for start in cfg.banned_prefixes:
        prefix |= pc.starts_with(body, start).to_numpy(zero_copy_only=False)
    low = (length == 0) | (alpha / np.maximum(length, 1) <= cfg.min_alpha_share)
    return np.select([deleted, bot, prefix, length >= cfg.max_chars, low], list(RULES), "")


def with_rules(table, cfg: RedditFilterConfig):
    """A chunk of comments with each well-formed line's filter rule in `status`."""
    status = table["status"].to_numpy(zero_copy_only=False).astype(object)
    ok = pa.array(np.flatnonzero(status == ""))
    if len(ok):
        body, author = (table[name].combine_chunks() for name in ("body", "author"))
        if len(ok) < len(table):
            body, author = body.take(ok), author.take(ok)
        status[ok.to_numpy()] = rule_status(body, author, cfg)
    return table.set_column(table.schema.get_field_index("status"), "status", pa.array(status, pa.string()))
