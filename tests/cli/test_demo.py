"""The demo pipeline end to end at a tiny size: Ray Data, Ray Train (2 workers), MLflow, evaluation of
the trained encoder, the same encoder untrained and a baseline."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from testkit.tiny import TINY_DAN

from convsts.datasets.evalsets import read_stsb, stsb_split_path
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import load_model
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.cli.demo import build_parser
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.evaluation.sts import sts_metrics
from convsts.ray_jobs.pipelines.demo import DEFAULT_ENCODER, DEMO_CONFIGS, UNTRAINED, run_demo
from convsts.ray_jobs.tracking.runs import run_page as tracking_run_page

# The default demo (all-MiniLM-L6-v2, top layer training) at a tiny size.
TINY = [
    "trainer.steps=6",
    "trainer.log_every=3",
    "trainer.checkpoint_every=3",
    "trainer.eval_every=0",
    "model.pretrained.train_layers=1",
    "tokenizer.max_words=24",
    "model.response_hidden=64",
    "model.nli_hidden=32",
    "trainer.warmup_steps=2",
    "trainer.stages=[{start_step: 0, batch_size: 8, lr: 0.00002}]",
    "eval.reddit_pairs=200",
    "eval.tuned.enabled=false",
    "trainer.feed=local",  # not the feed's guarantee (testkit.tiny.TINY_DAN); the demo as users run it reads with ray_data
]

RANGES = {
    "stsb/dev/pearson": (-1, 1),
    "stsb/test/pearson": (-1, 1),
    "reddit/p_at_1": (0, 1),
    "reddit/p_at_3": (0, 1),
    "reddit/p_at_10": (0, 1),
    "snli/dev/accuracy": (0, 1),
}


def test_demo_configs_load_and_the_encoder_flag_picks_one():
    assert DEFAULT_ENCODER == "pretrained"
    for encoder, path in DEMO_CONFIGS.items():
        assert load_config(path).model.encoder == encoder
    args = build_parser().parse_args(["--out", "x", "--encoder", "dan"])
    assert DEMO_CONFIGS[args.encoder].name == "demo_dan.yaml" and args.config is None


def _small_eval_sets(folder: Path, rows: int = 300) -> list:
    """Overrides pointing STS-B dev/test, SNLI dev and CQA at samples of the embedded ones: the
    evaluation of two MiniLM encoders on the whole sets is a third of this test's time."""
    import pandas as pd

    folder.mkdir()
    sample = Path(resolve_path("{sample}"))
    for name in ("stsb_dev", "stsb_test", "snli_dev"):
        pd.read_parquet(sample / f"{name}.parquet").sample(rows, random_state=0).to_parquet(folder / f"{name}.parquet")
    cqa = pd.read_parquet(sample / "cqa2016_test.parquet")
    cqa[cqa["orgq_id"].isin(cqa["orgq_id"].unique()[: rows // 10])].to_parquet(folder / "cqa.parquet")  # 10 each
    return [
        f"data.stsb_dir={folder}",
        f"data.snli_dev={folder / 'snli_dev.parquet'}",
        f"data.cqa_test={folder / 'cqa.parquet'}",
    ]


@pytest.fixture(scope="module")
def tiny_demo(ray_session, mlflow_uri, tmp_path_factory) -> dict:
    """The default demo at a tiny size, run once for the tests below (the last one replaces it)."""
    tmp = tmp_path_factory.mktemp("tiny_demo")
    overrides = TINY + _small_eval_sets(tmp / "eval") + [f"mlflow.tracking_uri={mlflow_uri}"]
    cfg = load_config(DEMO_CONFIGS[DEFAULT_ENCODER], overrides)
    out = tmp / "demo"
    flat = run_demo(cfg, out, baselines=("bow",))
    return {"cfg": cfg, "out": out, "flat": flat, "overrides": overrides, "mlflow_uri": mlflow_uri, "tmp": tmp}


TEXTS = ["a man is playing a guitar", "the cat sleeps"]


@pytest.mark.slow
def test_the_tiny_demo_scores_the_model_its_untrained_encoder_and_a_baseline(tiny_demo):
    out, flat = tiny_demo["out"], tiny_demo["flat"]
    results = json.loads((out / "results.json").read_text())
    assert results == json.loads(json.dumps(flat))
    for name, (lo, hi) in RANGES.items():
        assert math.isfinite(results[name]) and lo <= results[name] <= hi, name
    assert results["reddit/p_at_1"] <= results["reddit/p_at_3"] <= results["reddit/p_at_10"]
    p1 = results["reddit/p_at_1"]  # over eval.reddit_pairs queries, with its binomial standard error
    assert results["reddit/queries"] == 200 and results["reddit/p_at_1_stderr"] == pytest.approx(
        math.sqrt(p1 * (1 - p1) / 200)
    )
    # The same encoder untrained and the baseline are scored on the same metrics, in the same table.
    for name, (lo, hi) in RANGES.items():
        assert lo <= results[f"{UNTRAINED}/{name}"] <= hi, name
    assert all(f"baseline/bow/{name}" in results for name in RANGES if not name.startswith("snli/"))
    # The gain over the untrained encoder, paired on the same 200 queries and candidates: its mean is
    # the difference of the two P@N; its paired standard error is at most the two binomial ones together.
    for n in (1, 3, 10):
        gain = results[f"reddit/p_at_{n}_minus_{UNTRAINED}"]
        assert gain == pytest.approx(results[f"reddit/p_at_{n}"] - results[f"{UNTRAINED}/reddit/p_at_{n}"], abs=1e-12)
    assert results["reddit/paired_queries"] == 200
    assert (
        0
        <= results[f"reddit/p_at_1_minus_{UNTRAINED}_stderr"]
        <= results["reddit/p_at_1_stderr"] + results[f"{UNTRAINED}/reddit/p_at_1_stderr"]
    )
    assert len(pd.read_parquet(out / "eval" / "items" / "reddit.parquet")) == 200
    table = (out / "results.md").read_text()
    assert f"| reddit/p_at_1_minus_{UNTRAINED} | " in table and "| reddit/paired_queries | 200 | — |" in table
    assert "| metric | pretrained, 6 steps | untrained | bow |" in table


@pytest.mark.slow
def test_the_demo_checkpoint_reloads_without_ray_and_gives_the_same_metric(tiny_demo):
    cfg, out = tiny_demo["cfg"], tiny_demo["out"]
    results = json.loads((out / "results.json").read_text())
    # The checkpoint reloads without Ray and gives the same embeddings, and the same metric.
    encoder = load(results["checkpoint"])
    texts = TEXTS
    assert np.array_equal(encoder.encode(texts), load(results["checkpoint"]).encode(texts))
    assert encoder.meta["run_config"]["trainer"]["steps"] == 6
    # Six steps of the top layer move the pretrained embeddings a little; the untrained checkpoint
    # holds the packaged weights themselves.
    start = load(out / "untrained").encode(texts)
    assert load(out / "untrained").meta["run_config"]["trainer"]["steps"] == 0
    assert not np.allclose(encoder.encode(texts), start, atol=1e-6) and np.allclose(
        encoder.encode(texts), start, atol=0.2
    )
    from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer

    dev = read_stsb(stsb_split_path(resolve_path(cfg.data.stsb_dir), "dev"))
    again = sts_metrics(EmbeddingScorer(encoder), dev, "stsb/dev")["stsb/dev/pearson"]
    assert again == pytest.approx(results["stsb/dev/pearson"], abs=1e-6)


@pytest.mark.slow
def test_the_demo_mlflow_run_holds_its_metrics_child_runs_and_model(tiny_demo):
    cfg, out, mlflow_uri, tmp_path = tiny_demo["cfg"], tiny_demo["out"], tiny_demo["mlflow_uri"], tiny_demo["tmp"]
    results = json.loads((out / "results.json").read_text())
    table = (out / "results.md").read_text()
    encoder, texts = load(results["checkpoint"]), TEXTS
    # The demo's MLflow run holds the params, both tasks' training metrics and the model's evaluation
    # metrics; the untrained encoder and each baseline are child runs of it, with their own metrics.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    run = client.get_run(results["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    # The run's page opens on the results table (its description), the UI on training runs (not on
    # MLflow 3's GenAI overview).
    assert run.data.tags["mlflow.note.content"] == table.rstrip("\n")
    tags = client.get_experiment(run.info.experiment_id).tags
    # MLflow 3.17's UI takes its GenAI / training view from a toggle or the URL before this tag: the
    # printed link asks for the training view.
    assert tracking_run_page(run.info.experiment_id, run.info.run_id).endswith(
        f"/runs/{run.info.run_id}?workflowType=machine_learning"
    )
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.params["trainer.steps"] == "6" and run.data.params["model.encoder"] == "pretrained"
    for name in (
        "reddit/loss",
        "snli/loss",
        "reddit/pairs_per_s",
        "snli/pairs_per_s",
        *RANGES,
    ):
        assert name in run.data.metrics, name
    assert [m for m in run.data.metrics if m.startswith((f"{UNTRAINED}/", "baseline/"))] == []
    children = {
        r.data.tags["convsts.reference"]: r
        for r in client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    }
    assert sorted(children) == ["bow", UNTRAINED] and all(r.info.status == "FINISHED" for r in children.values())
    for name in RANGES:
        assert children[UNTRAINED].data.metrics[name] == pytest.approx(results[f"{UNTRAINED}/{name}"]), name
    assert children["bow"].data.metrics["stsb/dev/pearson"] == pytest.approx(results["baseline/bow/stsb/dev/pearson"])
    assert "| metric | untrained |" in children[UNTRAINED].data.tags["mlflow.note.content"]
    assert run.data.tags["task_split_mode"] == "gradient_weighting"
    history = client.get_metric_history(run.info.run_id, "reddit/loss")
    assert [m.step for m in history] == [3, 6]
    # Evaluation metrics, the untrained encoder's and the baselines' stand at the last training step.
    for run_id in (run.info.run_id, children[UNTRAINED].info.run_id, children["bow"].info.run_id):
        assert [m.step for m in client.get_metric_history(run_id, "stsb/dev/pearson")] == [6], run_id
    assert f"reddit/p_at_1_minus_{UNTRAINED}" in run.data.metrics
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "results.json" in artifacts and "checkpoint" not in artifacts  # no optimizer state
    assert "items/reddit.parquet" in {a.path for a in client.list_artifacts(run.info.run_id, "items")}
    # The model is the run's one MLflow 3 logged model: logged after training, its card and metrics
    # brought up to date after evaluation.
    logged_models = [
        m for m in client.search_logged_models([run.info.experiment_id]) if m.source_run_id == run.info.run_id
    ]
    assert [m.name for m in logged_models] == ["model"]
    assert [o.step for o in client.get_run(run.info.run_id).outputs.model_outputs] == [6]
    assert {"reddit/loss", "stsb/test/pearson"} <= {m.key for m in logged_models[0].metrics}
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/loss_curves.png", "plots/stsb_test_scatter.png"} <= plots
    # The MLflow model and OUT/model: the encoder and a card with the evaluation (logged again after it).
    import mlflow

    mlflow.set_tracking_uri(mlflow_uri)  # a logged model's artifacts resolve through the process-wide URI
    try:
        listed = mlflow.artifacts.list_artifacts(artifact_uri=f"runs:/{run.info.run_id}/model/artifacts/model")
        logged = {a.path.rsplit("/", 1)[-1] for a in listed}
        (tmp_path / "logged").mkdir()
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=f"runs:/{run.info.run_id}/model/artifacts/model/README.md", dst_path=str(tmp_path / "logged")
        )
    finally:
        mlflow.set_tracking_uri(None)
    assert {"model.safetensors", "README.md", "card.json"} <= logged
    assert not (out / "model" / "train_state.pt").exists()
    assert load_config(out / "config.yaml").to_dict() == cfg.to_dict()  # the resolved config, written into --out
    card = (out / "model" / "README.md").read_text()
    assert f"| STS Benchmark test, Pearson r (raw cosine) | {results['stsb/test/pearson']:.4f} |" in card
    assert Path(local).read_text() == card  # the model logged after evaluation, with its results
    np.testing.assert_array_equal(load(out / "model").encode(texts), encoder.encode(texts))


@pytest.mark.slow
def test_a_used_demo_out_is_refused_then_replaced_with_fresh(tiny_demo):
    """Last: it replaces the module's demo."""
    from mlflow.tracking import MlflowClient

    cfg, out, overrides = tiny_demo["cfg"], tiny_demo["out"], tiny_demo["overrides"]
    results = json.loads((out / "results.json").read_text())
    client = MlflowClient(tiny_demo["mlflow_uri"])
    run = client.get_run(results["mlflow_run_id"])
    # The same --out again: refused before any work (no MLflow run), then replaced with --fresh.
    experiment = run.info.experiment_id
    before = {r.info.run_id for r in client.search_runs([experiment])}
    with pytest.raises(FileExistsError, match="already holds a demo run .*pass --fresh to replace it"):
        run_demo(cfg, out, baselines=("bow",))
    assert {r.info.run_id for r in client.search_runs([experiment])} == before
    # --fresh with another held-out share: the earlier sample no longer fits, so it is prepared again
    # (the DAN demo at a tiny size and no step, so that this second demo costs less than the first).
    small = [*TINY_DAN, "trainer.steps=0", "trainer.eval_every=0", "eval.reddit_pairs=200", "eval.tuned.enabled=false"]
    other = load_config(DEMO_CONFIGS["dan"], small + overrides[len(TINY) :] + ["data.test_share=0.2"])
    again = run_demo(other, out, baselines=("bow",), fresh=True)
    assert again["mlflow_run_id"] not in before and client.get_run(again["mlflow_run_id"]).info.status == "FINISHED"
    assert client.get_run(results["mlflow_run_id"]).info.status == "FINISHED"  # the earlier demo's run is kept
    assert json.loads((out / "results.json").read_text())["mlflow_run_id"] == again["mlflow_run_id"]
    assert json.loads((out / "prepared" / "reddit" / "manifest.json").read_text())["test_share"] == 0.2
    assert load(again["checkpoint"]).meta["run_config"]["data"]["test_share"] == 0.2
    # The untrained column's encoder (built in-process) has the weights this `trainer.steps=0` job saved.
    a, b = load_model(again["checkpoint"]).model.state_dict(), load_model(out / "untrained").model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
