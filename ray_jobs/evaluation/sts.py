"""STS benchmarks: STS-B (overall and by genre, raw and with the tuned matrix), any STS-style file,
and the STS-B dev probe run inside training. Score: convsts.models.similarity's angular score."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from convsts.datasets.evalsets import pair_keys, read_sts_file, read_stsb, stsb_split_path
from convsts.io.storage import resolve_path
from convsts.models.sentence_encoder import SentenceEncoder
from convsts.models.similarity import angular_score_from_cosine, pearson
from convsts.models.sts_transform import StsTransform, fit_sts_transform
from convsts.ray_jobs.evaluation.metrics import spearman
from convsts.ray_jobs.evaluation.scorers import pair_cosine
from convsts.ray_jobs.runtime.logs import log

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig


def read_stsb_split(cfg: RunConfig, split: str) -> pd.DataFrame:
    return read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), split))


def stsb_embeddings(scorer, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return {
        "u": scorer.embed(frame["sentence1"]),
        "v": scorer.embed(frame["sentence2"]),
        "score": frame["score"].to_numpy(dtype=np.float64),
    }


def sts_metrics_from_scores(
    scores: np.ndarray, frame: pd.DataFrame, prefix: str, by_genre: bool = True
) -> dict[str, float]:
    gold = frame["score"].to_numpy()
    out = {f"{prefix}/pearson": pearson(scores, gold), f"{prefix}/spearman": spearman(scores, gold)}
    if by_genre and "genre" in frame.columns:
        # Positions, not index labels: a frame read from a parquet file that pandas wrote keeps its labels.
        for genre, idx in sorted(frame.groupby("genre").indices.items()):
            out[f"{prefix}/{genre}/pearson"] = pearson(scores[idx], gold[idx])
    return out


def predicted_scores(embedded: dict[str, np.ndarray]) -> np.ndarray:
    """The angular score (0-5) of each pair."""
    return angular_score_from_cosine(pair_cosine(embedded["u"], embedded["v"]))


def sts_metrics(
    scorer, frame: pd.DataFrame, prefix: str, by_genre: bool = True, embedded: dict[str, np.ndarray] | None = None
) -> dict[str, float]:
    """Pearson and Spearman of the angular score against the gold scores."""
    emb = embedded or stsb_embeddings(scorer, frame)
    return sts_metrics_from_scores(predicted_scores(emb), frame, prefix, by_genre)


def sts_file_metrics(
    scorer,
    path: str,
    name: str,
    transform: StsTransform | None = None,
    fitted_pairs: AbstractSet[tuple[str, str]] = frozenset(),
) -> dict[str, float]:
    """sts/<name>/{pearson,spearman} of an STS-style file (convsts.datasets.evalsets.read_sts_file), and
    sts_tuned/<name>/... with `transform` (the matrix fitted on STS-B: does it carry over?). The STS
    Benchmark holds many STS 2012-2016 pairs: the tuned scores leave out `fitted_pairs` (the pair_keys
    of the STS-B splits that fitted and selected the matrix) and say how many they scored
    (sts_tuned/<name>/pairs). A file that ships several splits together is also scored split by
    split (sts/<name>/<split>/..., as `split` in read_sts_file's frame)."""
    frame = read_sts_file(path)
    left_out, no_text = frame.attrs.get("without_gold", 0), frame.attrs.get("without_text", 0)
    # A file of several splits (a `split` column) is scored whole and split by split: sts/<name>/<split>/...
    parts = {"": np.ones(len(frame), dtype=bool)}  # (n,) each
    if "split" in frame.columns and frame["split"].nunique() > 1:
        parts.update({f"/{split}": (frame["split"] == split).to_numpy() for split in sorted(frame["split"].unique())})
    counts = ", ".join(f"{key[1:]} {int(rows.sum())}" for key, rows in parts.items() if key)
    (log.warning if left_out or no_text else log.info)(
        "sts %s: %d pairs scored%s%s%s",
        name,
        len(frame),
        f" ({counts})" if counts else "",
        f", {left_out} without a gold score left out" if left_out else "",
        f", {no_text} rows missing a sentence left out" if no_text else "",
    )
    embedded = stsb_embeddings(scorer, frame)
    scores = predicted_scores(embedded)  # (n,)
    results: dict[str, float] = {}
    for key, rows in parts.items():
        results.update(
            sts_metrics_from_scores(
                scores[rows], frame[rows].reset_index(drop=True), f"sts/{name}{key}", by_genre=False
            )
        )
    if transform is None:
        return results
    fresh = np.array([key not in fitted_pairs for key in pair_keys(frame)], dtype=bool)  # (n,)
    if not fresh.all():
        log.info(
            "sts_tuned %s: %d of %d pairs are in the STS-B splits that fitted the matrix; scored on the other %d",
            name,
            int((~fresh).sum()),
            len(frame),
            int(fresh.sum()),
        )
    tuned = transform.score(embedded["u"], embedded["v"])  # (n,)
    for key, rows in parts.items():
        kept = rows & fresh  # (n,)
        if kept.sum() < 2:
            continue
        results.update(
            sts_metrics_from_scores(
                tuned[kept], frame[kept].reset_index(drop=True), f"sts_tuned/{name}{key}", by_genre=False
            )
        )
        results[f"sts_tuned/{name}{key}/pairs"] = float(kept.sum())
    return results


def tuned_sts_metrics(
    scorer, cfg: RunConfig, frames: dict[str, pd.DataFrame], embedded: dict[str, dict[str, np.ndarray]]
) -> tuple[dict[str, float], StsTransform]:
    """Fit one matrix on STS-B train (selected on dev), then score dev and test with it."""
    if "train" not in embedded:
        embedded["train"] = stsb_embeddings(scorer, frames["train"])
    transform = fit_sts_transform(embedded["train"], embedded["dev"], cfg.eval.tuned)
    return transformed_sts_metrics(transform, frames, embedded), transform


def transformed_sts_metrics(
    transform: StsTransform, frames: dict[str, pd.DataFrame], embedded: dict[str, dict[str, np.ndarray]]
) -> dict[str, float]:
    """stsb_tuned/<dev|test>/... of a fitted matrix on embeddings already computed."""
    results: dict[str, float] = {"stsb_tuned/best_epoch": float(transform.best_epoch)}
    for split in ("dev", "test"):
        emb = embedded[split]
        results.update(
            sts_metrics_from_scores(transform.score(emb["u"], emb["v"]), frames[split], f"stsb_tuned/{split}")
        )
    return results


class StsDevProbe:
    """STS-B dev Pearson of the model being trained (trainer.eval_every), on the model's device."""

    METRIC = "stsb/dev/pearson_during_training"

    def __init__(self, cfg: RunConfig, tokenizer):
        self.frame = read_stsb_split(cfg, "dev")
        self.tokenizer = tokenizer

    def evaluate(self, model) -> dict[str, float]:
        model.eval()
        try:
            encoder = SentenceEncoder(model, self.tokenizer, {})
            embedded = {
                "u": encoder.encode(list(self.frame["sentence1"]), 512),
                "v": encoder.encode(list(self.frame["sentence2"]), 512),
            }
        finally:
            model.train()
        return {self.METRIC: pearson(predicted_scores(embedded), self.frame["score"].to_numpy())}
