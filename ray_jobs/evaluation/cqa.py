"""SemEval CQA subtask B (question-question similarity): MAP of the cosine ranking, as the official scorer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from convsts.datasets.evalsets import cqa_text, read_cqa
from convsts.io.storage import resolve_path
from convsts.ray_jobs.evaluation.metrics import mean_average_precision
from convsts.ray_jobs.evaluation.scorers import pair_cosine

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig


def cqa_metrics(scorer, frame: pd.DataFrame, prefix: str) -> dict[str, float]:
    org = frame.drop_duplicates("orgq_id")
    org_vec = scorer.embed([cqa_text(s, b) for s, b in zip(org["orgq_subject"], org["orgq_body"])])
    rel_vec = scorer.embed([cqa_text(s, b) for s, b in zip(frame["relq_subject"], frame["relq_body"])])
    org_row = {q: i for i, q in enumerate(org["orgq_id"])}
    left = org_vec[[org_row[q] for q in frame["orgq_id"]]]
    cos = pair_cosine(left, rel_vec)
    queries = []
    for _, idx in frame.groupby("orgq_id", sort=False).indices.items():
        order = idx[np.argsort(frame["ir_rank"].to_numpy()[idx], kind="stable")]  # ties keep IR order
        queries.append((cos[order], frame["relevant"].to_numpy()[order]))
    return {f"{prefix}/map": mean_average_precision(queries)}


def configured_cqa_metrics(scorer, cfg: RunConfig) -> dict[str, float]:
    if not cfg.data.cqa_test:
        return {}
    frame = read_cqa(resolve_path(cfg.data.cqa_test), resolve_path(cfg.data.cqa_relevancy) or None)
    return cqa_metrics(scorer, frame, cfg.data.cqa_name)
