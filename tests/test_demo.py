"""The demo pipeline end to end at a tiny size: Ray Data, Ray Train (2 workers), MLflow, evaluation."""

import json
import math

import numpy as np
import pytest

from models import load
from ray_jobs.config import load_config
from ray_jobs.demo import DEFAULT_CONFIG, run_demo
from ray_jobs.evaluation.sts import sts_metrics
from ray_jobs.config import resolve_path
from datasets.evalsets import read_stsb, stsb_split_path
from tiny import TINY_DAN

TINY = ["trainer.steps=6", "trainer.log_every=3", "trainer.checkpoint_every=3", "trainer.eval_every=0", *TINY_DAN,
        "eval.reddit_pairs=200"]

RANGES = {
    "stsb/dev/pearson": (-1, 1), "stsb/test/pearson": (-1, 1),
    "reddit/p_at_1": (0, 1), "reddit/p_at_3": (0, 1), "reddit/p_at_10": (0, 1),
    "snli/dev/accuracy": (0, 1),
}


@pytest.mark.slow
def test_tiny_demo_end_to_end(ray_session, mlflow_uri, tmp_path):
    cfg = load_config(DEFAULT_CONFIG, TINY + [f"mlflow.tracking_uri={mlflow_uri}"])
    out = tmp_path / "demo"
    flat = run_demo(cfg, out, baselines=("bow",))

    results = json.loads((out / "results.json").read_text())
    assert results == json.loads(json.dumps(flat))
    for name, (lo, hi) in RANGES.items():
        assert math.isfinite(results[name]) and lo <= results[name] <= hi, name
    assert results["reddit/p_at_1"] <= results["reddit/p_at_3"] <= results["reddit/p_at_10"]

    # The checkpoint reloads without Ray and gives the same embeddings, and the same metric.
    encoder = load(results["checkpoint"])
    texts = ["a man is playing a guitar", "the cat sleeps"]
    assert np.array_equal(encoder.encode(texts), load(results["checkpoint"]).encode(texts))
    assert encoder.meta["run_config"]["trainer"]["steps"] == 6
    from ray_jobs.evaluation.scorers import EmbeddingScorer

    dev = read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), "dev"))
    again = sts_metrics(EmbeddingScorer(encoder), dev, "stsb/dev")["stsb/dev/pearson"]
    assert again == pytest.approx(results["stsb/dev/pearson"], abs=1e-6)

    # One MLflow run holds the params, both tasks' training metrics and the evaluation metrics.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(results["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.steps"] == "6" and run.data.params["model.encoder"] == "dan"
    for name in ("reddit/loss", "snli/loss", "reddit/pairs_per_s", "snli/pairs_per_s", *RANGES):
        assert name in run.data.metrics, name
    assert run.data.tags["task_split_mode"] == "gradient_weighting"
    history = client.get_metric_history(run.info.run_id, "reddit/loss")
    assert [m.step for m in history] == [3, 6]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"checkpoint", "results.json"} <= artifacts
