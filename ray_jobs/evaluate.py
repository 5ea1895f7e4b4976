"""`convsts evaluate`: metrics of a checkpoint (or a lexical baseline) -> DIR/results.json + table + MLflow.

  convsts evaluate --checkpoint C --out DIR [--sts FILE ...] [--run-id ID] [--config ...]
  convsts evaluate --baseline bow|tfidf --out DIR

Metric names: stsb/<split>/pearson|spearman, stsb/<split>/<genre>/pearson, sts/<stem>/pearson,
snli/<split>/accuracy, reddit/p_at_1|3|10, cqa2016/map. Primary metric: stsb/dev/pearson.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from datasets import storage
from datasets.evalsets import cqa_text, read_cqa, read_sts_file, read_stsb, stsb_split_path
from datasets.snli import read_snli
from datasets.text import words
from ray_jobs import metrics as M
from ray_jobs import tracking
from ray_jobs.config import RunConfig, load_config, resolve_path
from ray_jobs.runtime import log, setup_logging, tracking_uri
from models.sts_transform import StsTransform, fit_sts_transform

PRIMARY_METRIC = "stsb/dev/pearson"


class EmbeddingScorer:
    """Scores through a checkpoint: cosine-based STS and CQA, the trained dot product for Reddit."""

    def __init__(self, encoder, batch_size: int = 512):
        self.encoder = encoder
        self.batch_size = batch_size
        self.name = "model"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode(list(texts), batch_size=self.batch_size)

    def embed_responses(self, texts: Sequence[str]) -> np.ndarray:
        return self.encoder.encode_responses(list(texts), batch_size=self.batch_size)

    def nli_logits(self, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        return self.encoder.classify_nli(list(premises), list(hypotheses), batch_size=self.batch_size)


class LexicalScorer:
    """The STS 2017 baseline (binary bag of words) or TF-IDF, as sparse vectors; cosine everywhere."""

    def __init__(self, kind: str, fit_texts: Sequence[str]):
        from collections import Counter

        if kind not in ("bow", "tfidf"):
            raise ValueError(f"unknown baseline {kind!r}: expected bow or tfidf")
        self.kind = kind
        self.name = kind
        df: Counter = Counter()
        for text in fit_texts:
            df.update(set(words(text)))
        self.vocab = {w: i for i, w in enumerate(sorted(df))}
        n = max(len(fit_texts), 1)
        self.idf = np.array([np.log((1 + n) / (1 + df[w])) + 1.0 for w in sorted(df)], dtype=np.float32)

    def _vectors(self, texts: Sequence[str]):
        from scipy import sparse

        rows, cols, vals = [], [], []
        for r, text in enumerate(texts):
            counts: Dict[int, int] = {}
            for w in words(text):
                if w in self.vocab:
                    counts[self.vocab[w]] = counts.get(self.vocab[w], 0) + 1
            for c, k in counts.items():
                rows.append(r)
                cols.append(c)
                vals.append(1.0 if self.kind == "bow" else k * float(self.idf[c]))
        m = sparse.csr_matrix((vals, (rows, cols)), shape=(len(texts), len(self.vocab)), dtype=np.float32)
        norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
        return sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ m

    def embed(self, texts: Sequence[str]):
        return self._vectors(texts)

    embed_responses = embed


def _pair_cosine(a, b) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return M.cosine(a, b)
    return np.asarray(a.multiply(b).sum(axis=1)).ravel()  # rows are already unit length


def _scores_matrix(q, c) -> np.ndarray:
    if isinstance(q, np.ndarray):
        return q @ c.T
    return (q @ c.T).toarray()


def stsb_embeddings(scorer, frame: pd.DataFrame) -> Dict[str, np.ndarray]:
    return {"u": scorer.embed(frame["sentence1"]), "v": scorer.embed(frame["sentence2"]),
            "score": frame["score"].to_numpy(dtype=np.float64)}


def sts_metrics_from_sim(sim: np.ndarray, frame: pd.DataFrame, prefix: str, by_genre: bool = True) -> Dict[str, float]:
    gold = frame["score"].to_numpy()
    out = {f"{prefix}/pearson": M.pearson(sim, gold), f"{prefix}/spearman": M.spearman(sim, gold)}
    if by_genre and "genre" in frame.columns:
        for genre, part in frame.groupby("genre"):
            idx = part.index.to_numpy()
            out[f"{prefix}/{genre}/pearson"] = M.pearson(sim[idx], gold[idx])
    return out


def sts_metrics(scorer, frame: pd.DataFrame, prefix: str, by_genre: bool = True,
                embedded: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, float]:
    """sim(u, v) = -arccos(cos(u, v)) against the gold scores."""
    emb = embedded or stsb_embeddings(scorer, frame)
    cos = _pair_cosine(emb["u"], emb["v"])
    sim = -np.arccos(np.clip(cos, -1.0, 1.0))
    return sts_metrics_from_sim(sim, frame, prefix, by_genre)


def tuned_sts_metrics(scorer, cfg: RunConfig, frames: Dict[str, pd.DataFrame],
                      embedded: Dict[str, Dict[str, np.ndarray]]) -> tuple[Dict[str, float], StsTransform]:
    """Fit one matrix on STS-B train (selected on dev), then score dev and test with it."""
    if "train" not in embedded:
        embedded["train"] = stsb_embeddings(scorer, frames["train"])
    transform = fit_sts_transform(embedded["train"], embedded["dev"], cfg.eval.tuned)
    return transformed_sts_metrics(transform, frames, embedded), transform


def transformed_sts_metrics(transform: StsTransform, frames: Dict[str, pd.DataFrame],
                            embedded: Dict[str, Dict[str, np.ndarray]]) -> Dict[str, float]:
    """stsb_tuned/<dev|test>/... of a fitted matrix on embeddings already computed."""
    results: Dict[str, float] = {"stsb_tuned/best_epoch": float(transform.best_epoch)}
    for split in ("dev", "test"):
        emb = embedded[split]
        results.update(sts_metrics_from_sim(transform.score(emb["u"], emb["v"]), frames[split], f"stsb_tuned/{split}"))
    return results


def reddit_metrics(scorer, pairs: pd.DataFrame, n_queries: int, negatives: int, seed: int) -> Dict[str, float]:
    """One true response against `negatives` random responses from the held-out split."""
    rng = np.random.default_rng(seed)
    if len(pairs) < negatives + 1:
        raise ValueError(f"reddit P@N needs at least {negatives + 1} held-out pairs, found {len(pairs)}")
    queries = rng.choice(len(pairs), size=min(n_queries, len(pairs)), replace=False)
    candidates = np.empty((len(queries), negatives + 1), dtype=np.int64)
    for row, q in enumerate(queries):
        others = rng.choice(len(pairs) - 1, size=negatives, replace=False)
        others[others >= q] += 1  # skip the true pair itself
        candidates[row] = np.concatenate([[q], others])
    needed = np.unique(candidates)
    ctx = scorer.embed(pairs["context"].iloc[queries].tolist())
    rsp = scorer.embed_responses(pairs["response"].iloc[needed].tolist())
    position = {int(i): k for k, i in enumerate(needed)}
    full = _scores_matrix(ctx, rsp)  # (q, |needed|)
    cols = np.vectorize(position.get)(candidates)
    scores = np.take_along_axis(full, cols, axis=1)  # (q, 1 + negatives); true response in column 0
    p = M.precision_at_n(scores, (1, 3, 10))
    return {f"reddit/p_at_{n}": v for n, v in p.items()}


def cqa_metrics(scorer, frame: pd.DataFrame, prefix: str) -> Dict[str, float]:
    org = frame.drop_duplicates("orgq_id")
    org_vec = scorer.embed([cqa_text(s, b) for s, b in zip(org["orgq_subject"], org["orgq_body"])])
    rel_vec = scorer.embed([cqa_text(s, b) for s, b in zip(frame["relq_subject"], frame["relq_body"])])
    org_row = {q: i for i, q in enumerate(org["orgq_id"])}
    left = org_vec[[org_row[q] for q in frame["orgq_id"]]]
    cos = _pair_cosine(left, rel_vec)
    queries = []
    for _, idx in frame.groupby("orgq_id", sort=False).indices.items():
        order = idx[np.argsort(frame["ir_rank"].to_numpy()[idx], kind="stable")]  # ties keep IR order
        queries.append((cos[order], frame["relevant"].to_numpy()[order]))
    return {f"{prefix}/map": M.mean_average_precision(queries)}


def snli_metrics(scorer, frame: pd.DataFrame, split: str) -> Dict[str, float]:
    logits = scorer.nli_logits(frame["premise"].tolist(), frame["hypothesis"].tolist())
    return {f"snli/{split}/accuracy": M.accuracy(logits, frame["label"].to_numpy())}


def reddit_heldout(prepared_dir: Optional[str | Path]) -> Optional[pd.DataFrame]:
    """The held-out Reddit split of a prepared folder (local or a URI), or None when it has none."""
    if prepared_dir is None:
        return None
    test_dir = storage.join(prepared_dir, "reddit", "test")
    if not storage.is_dir(test_dir):
        return None
    frame = storage.read_parquet_table(test_dir).to_pandas()
    # Shard order from Ray Data is not fixed: sort so that the seeded P@N sample is reproducible.
    return frame.sort_values(["thread_key", "context", "response"], kind="stable").reset_index(drop=True)


def evaluate(scorer, cfg: RunConfig, prepared_dir: Optional[str | Path], sts_files: Sequence[str] = (),
             transform_dirs: Sequence[Path] = ()) -> Dict[str, float]:
    """All metrics of one scorer. The tuned STS matrix (embedding scorers only) is saved in each of
    `transform_dirs`."""
    results: Dict[str, float] = {}
    stsb_dir = resolve_path(cfg.data.stsb_dir)
    frames = {split: read_stsb(stsb_split_path(stsb_dir, split)) for split in ("dev", "test")}
    embedded = {split: stsb_embeddings(scorer, frame) for split, frame in frames.items()}
    for split, frame in frames.items():
        results.update(sts_metrics(scorer, frame, f"stsb/{split}", embedded=embedded[split]))
    if cfg.eval.tuned.enabled and isinstance(scorer, EmbeddingScorer):
        try:
            frames["train"] = read_stsb(stsb_split_path(stsb_dir, "train"))
        except FileNotFoundError as err:
            log.warning("no tuned STS metrics: %s", err)
        else:
            tuned, transform = tuned_sts_metrics(scorer, cfg, frames, embedded)
            results.update(tuned)
            for folder in transform_dirs:
                transform.save(folder)
    for path in sts_files:
        results.update(sts_metrics(scorer, read_sts_file(path), f"sts/{Path(path).stem}", by_genre=False))
    heldout = reddit_heldout(prepared_dir)
    if heldout is not None:
        results.update(reddit_metrics(scorer, heldout, cfg.eval.reddit_pairs, cfg.eval.reddit_negatives, cfg.eval.seed))
    if cfg.data.cqa_test:
        frame = read_cqa(resolve_path(cfg.data.cqa_test), resolve_path(cfg.data.cqa_relevancy) or None)
        results.update(cqa_metrics(scorer, frame, cfg.data.cqa_name))
    if hasattr(scorer, "nli_logits"):
        for split, path in (("dev", cfg.data.snli_dev), ("test", cfg.data.snli_test)):
            if path:
                results.update(snli_metrics(scorer, read_snli(resolve_path(path)), split))
    return results


def results_table(columns: Dict[str, Dict[str, float]]) -> str:
    """Markdown: one row per metric, one column per system (model, baselines)."""
    names = sorted({k for r in columns.values() for k in r if isinstance(r[k], (int, float))})
    header = "| metric | " + " | ".join(columns) + " |"
    lines = [header, "|---" * (len(columns) + 1) + "|"]
    for name in names:
        cells = []
        for r in columns.values():
            v = r.get(name)
            cells.append(f"{v:.4f}" if isinstance(v, (int, float)) and np.isfinite(v) else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scatter_plot(scorer, cfg: RunConfig, path: Path) -> None:
    """Predicted vs gold on STS-B test (the paper's Figure 7)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), "test"))
    cos = _pair_cosine(scorer.embed(frame["sentence1"]), scorer.embed(frame["sentence2"]))
    pred = 5.0 * (1.0 - np.arccos(np.clip(cos, -1, 1)) / np.pi)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(frame["score"], pred, s=4, alpha=0.4)
    ax.set_xlabel("gold similarity")
    ax.set_ylabel("5 (1 - arccos(cos) / pi)")
    ax.set_title(f"STS-B test, r = {M.pearson(pred, frame['score']):.3f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fraction_curve_plot(rows: Sequence[Dict[str, Any]], metrics: Sequence[str], path: Path) -> None:
    """A metric against the SNLI fraction (the paper's Figure 8): mean over seeds, one line per metric,
    each seed as a faint dot. `rows`: dicts with "fraction" and the metric names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in metrics:
        points = [(float(r["fraction"]), float(r[name])) for r in rows if np.isfinite(float(r.get(name, np.nan)))]
        if not points:
            continue
        fractions = sorted({f for f, _ in points})
        means = [np.mean([v for f, v in points if f == x]) for x in fractions]
        line, = ax.plot(fractions, means, marker="o", label=name)
        ax.scatter([f for f, _ in points], [v for _, v in points], s=8, alpha=0.3, color=line.get_color())
    ax.set_xlabel("fraction of SNLI train")
    ax.set_ylabel("Pearson r")
    ax.set_title("STS Benchmark vs. SNLI data in multitask training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


CURVE_METRICS = ["stsb/dev/pearson", "stsb/dev/captions/pearson", "stsb/test/pearson", "stsb/test/captions/pearson"]


def fraction_curve(checkpoints: Sequence[str], cfg: RunConfig, out_dir: Path) -> List[Dict[str, Any]]:
    """Figure 8 from checkpoints: each one's STS-B against the data.snli_fraction (and seed) stored
    in its config.json. Writes out_dir/curve.csv and out_dir/curve.png; returns the rows."""
    from models import load

    out_dir.mkdir(parents=True, exist_ok=True)
    stsb_dir = resolve_path(cfg.data.stsb_dir)
    frames = {split: read_stsb(stsb_split_path(stsb_dir, split)) for split in ("dev", "test")}
    rows = []
    for checkpoint in checkpoints:
        encoder = load(checkpoint)
        data = encoder.meta.get("run_config", {}).get("data", {})
        if "snli_fraction" not in data:
            raise ValueError(f"{checkpoint}: its config.json has no data.snli_fraction (not a convsts training checkpoint)")
        scorer = EmbeddingScorer(encoder, cfg.eval.batch_size)
        row: Dict[str, Any] = {"fraction": data["snli_fraction"], "seed": data.get("snli_fraction_seed", 0),
                               "checkpoint": str(checkpoint)}
        for split, frame in frames.items():
            row.update(sts_metrics(scorer, frame, f"stsb/{split}"))
        rows.append({k: row[k] for k in ["fraction", "seed", *CURVE_METRICS, "checkpoint"]})
    rows.sort(key=lambda r: (r["fraction"], r["seed"]))
    pd.DataFrame(rows).to_csv(out_dir / "curve.csv", index=False)
    fraction_curve_plot(rows, CURVE_METRICS, out_dir / "curve.png")
    return rows


def run_evaluation(cfg: RunConfig, out_dir: str | Path, checkpoint: Optional[str] = None, baseline: Optional[str] = None,
                   prepared_dir: Optional[str | Path] = None, sts_files: Sequence[str] = (),
                   run_id: Optional[str] = None, log_to_mlflow: bool = True,
                   mlflow_uri: Optional[str] = None) -> Dict[str, float]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prepared = str(prepared_dir) if prepared_dir else None
    if checkpoint:
        from models import load

        scorer = EmbeddingScorer(load(checkpoint), cfg.eval.batch_size)
    elif baseline:
        fit = []
        stsb_dir = resolve_path(cfg.data.stsb_dir)
        for split in ("train", "dev", "test"):
            try:
                f = read_stsb(stsb_split_path(stsb_dir, split))
                fit += list(f["sentence1"]) + list(f["sentence2"])
            except FileNotFoundError:
                pass
        heldout = reddit_heldout(prepared)
        if heldout is not None:
            fit += list(heldout["context"]) + list(heldout["response"])
        scorer = LexicalScorer(baseline, fit)
    else:
        raise ValueError("give --checkpoint or --baseline")
    transform_dirs = [out_dir] + ([Path(checkpoint)] if checkpoint else [])
    results = evaluate(scorer, cfg, prepared, sts_files, transform_dirs)
    scatter_plot(scorer, cfg, out_dir / "stsb_test_scatter.png")
    flat: Dict[str, object] = dict(results)
    if checkpoint:
        flat["checkpoint"] = str(checkpoint)
    if log_to_mlflow:
        uri = mlflow_uri or tracking_uri(cfg.mlflow.tracking_uri, out_dir)
        if run_id is None:
            run_id = tracking.start_run(uri, cfg.mlflow.experiment, f"evaluate-{scorer.name}",
                                        {"checkpoint": checkpoint or "", "baseline": baseline or ""},
                                        tags={"convsts.job": "evaluate"})
            own_run = True
        else:
            own_run = False
        tracking.log_metrics(uri, run_id, results)
        tracking.log_artifact(uri, run_id, str(out_dir / "stsb_test_scatter.png"), "plots")
        flat["mlflow_run_id"] = run_id
        if own_run:
            tracking.end_run(uri, run_id)
    (out_dir / "results.json").write_text(json.dumps(flat, indent=2), encoding="utf-8")
    (out_dir / "results.md").write_text(results_table({scorer.name: results}) + "\n", encoding="utf-8")
    return flat


def training_run(checkpoint: str) -> tuple[Optional[str], Optional[str]]:
    """(run id, tracking URI) of the training job that wrote `checkpoint`, from its train.json."""
    info = Path(checkpoint).resolve().parent / "train.json"
    if not info.is_file():
        return None, None
    data = json.loads(info.read_text(encoding="utf-8"))
    return data.get("mlflow_run_id"), data.get("tracking_uri")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="convsts evaluate", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--checkpoint")
    group.add_argument("--baseline", choices=["bow", "tfidf"])
    group.add_argument("--fraction-curve", nargs="+", metavar="CHECKPOINT",
                       help="STS-B of several checkpoints against the SNLI fraction each was trained with "
                            "(Figure 8): OUT/curve.csv and OUT/curve.png")
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=None)
    parser.add_argument("--prepared", default=None, help="prepared shards (Reddit held-out split)")
    parser.add_argument("--sts", nargs="*", default=[], help="extra STS-style files (parquet or tsv)")
    parser.add_argument("--run-id", default=None, help="MLflow run to log into (default: a new run)")
    parser.add_argument("overrides", nargs="*")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    cfg = load_config(args.config, args.overrides)
    if args.fraction_curve:
        rows = fraction_curve(args.fraction_curve, cfg, Path(args.out))
        print(pd.DataFrame(rows).to_string(index=False))
        return 0
    prepared = args.prepared
    if prepared is None and args.checkpoint:
        guess = Path(args.checkpoint).resolve().parent / "prepared"
        prepared = str(guess) if guess.is_dir() else (resolve_path(cfg.data.prepared_dir) or None)
    run_id, uri = args.run_id, None
    if args.checkpoint and run_id is None:
        run_id, uri = training_run(args.checkpoint)
    results = run_evaluation(cfg, args.out, args.checkpoint, args.baseline, prepared, args.sts, run_id,
                             mlflow_uri=uri)
    print(results_table({args.baseline or "model": {k: v for k, v in results.items() if isinstance(v, float)}}))
    print(json.dumps({"results": str(Path(args.out) / "results.json"), "mlflow_run_id": results.get("mlflow_run_id")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
