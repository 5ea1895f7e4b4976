"""NLI accuracy (SNLI dev/test) through a model's NLI head."""

from __future__ import annotations

import pandas as pd

from convsts.datasets.snli import read_snli
from convsts.io.storage import resolve_path
from convsts.ray_jobs.evaluation.metrics import accuracy
from convsts.ray_jobs.runtime.logs import log


def nli_metrics(scorer, frame: pd.DataFrame, prefix: str) -> dict[str, float]:
    logits = scorer.nli_logits(frame["premise"].tolist(), frame["hypothesis"].tolist())
    return {f"{prefix}/accuracy": accuracy(logits, frame["label"].to_numpy())}


def nli_accuracy(scorer, path: str, prefix: str) -> dict[str, float]:
    frame = read_snli(resolve_path(path))
    if frame.attrs["without_gold"]:
        log.info(
            "%s: %d pairs scored, %d without a gold label left out", prefix, len(frame), frame.attrs["without_gold"]
        )
    return nli_metrics(scorer, frame, prefix)
