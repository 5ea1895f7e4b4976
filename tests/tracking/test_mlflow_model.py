"""The trained encoder as a model folder with a model card and as an MLflow pyfunc model: loaded
with mlflow.pyfunc, registered on the sqlite store, and served by `mlflow models serve` on
127.0.0.1 (real HTTP; the vectors equal convsts.models.sentence_encoder.load(...).encode); the card takes evaluation results."""

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from testkit.local_cluster import BIN, free_port, stop_pids
from testkit.tiny import EXPORT_PROBES

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import DanTokenizer, count_words
from convsts.models.checkpoint import TrainState, build_model, save_checkpoint, save_model_folder
from convsts.models.config import DanConfig, ModelConfig
from convsts.models.sentence_encoder import load
from convsts.models.sts_transform import StsTransform, StsTransformConfig
from convsts.ray_jobs.pipelines.evaluate import trained_step
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.tracking.mlflow_model import log_model
from convsts.ray_jobs.tracking.model_card import CARD_FILE, add_results, run_facts, write_card

TEXTS = ["A man is playing a guitar.", "Two dogs run through a snowy field.", "", "what is the best pizza in town?"]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def model_folder(tmp_path):
    torch.manual_seed(0)
    tokenizer = DanTokenizer.build(count_words(TEXTS * 3), TokenizerConfig(bigram_buckets=128))
    config = ModelConfig(
        encoder="dan",
        dan=DanConfig(embedding_dim=16, hidden_sizes=[16], output_dim=12),
        response_hidden=8,
        nli_hidden=8,
    )
    ckpt = save_checkpoint(
        tmp_path / "ckpt",
        build_model(config, tokenizer, {"reddit": "response", "snli": "nli"}),
        tokenizer,
        {"name": "tiny"},
        train_state=TrainState(3),
    )
    rotation = np.linalg.qr(np.random.default_rng(0).normal(size=(12, 12)))[0]  # a tuned STS matrix, as evaluate saves
    StsTransform(rotation, StsTransformConfig(), 0.5, 1).save(ckpt)
    folder = save_model_folder(ckpt, tmp_path / "model")
    manifests = {
        "reddit": {"inputs": ["s3://key:secret@bucket/pairs.parquet"], "train_pairs": 90, "test_pairs": 10},
        "snli": {"input": "snli/train.parquet", "pairs": 40},
    }  # the two manifest layouts
    write_card(
        folder,
        run_facts(
            {"name": "tiny", "trainer": {"steps": 3}}, manifests, {"reddit": "ab" * 20}, "RUNID", "sqlite:///x.db", 12.0
        ),
    )
    return folder


def test_model_folder_has_no_optimizer_state_and_a_card(model_folder):
    assert sorted(p.name for p in model_folder.iterdir()) == [
        "README.md",
        "card.json",
        "config.json",
        "manifest.json",  # of the model's files: every reader checks them
        "model.safetensors",
        "sts_transform.safetensors",
        "tokenizer.json",
    ]
    assert load(model_folder).encode(TEXTS).shape == (4, 12)
    # The weights' training step travels in config.json, so evaluation logs at it without the train state.
    assert json.loads((model_folder / "config.json").read_text())["step"] == 3 and trained_step(model_folder) == 3
    np.testing.assert_allclose(
        load(model_folder).encode(TEXTS, tuned=True), load(model_folder.parent / "ckpt").encode(TEXTS, tuned=True)
    )
    card = (model_folder / CARD_FILE).read_text()
    header = yaml.safe_load(card.split("---")[1])
    assert header["library_name"] == "convsts" and header["datasets"] == ["reddit", "snli"]
    assert "encoder-dan" in header["tags"] and "model-index" not in header  # not evaluated yet
    assert (
        "90 training pairs" in card
        and "snli: 40 training pairs" in card
        and "`snli/train.parquet`" in card
        and "from convsts.models.sentence_encoder import load" in card
        and "encoder = load(" in card
        and "runs:/RUNID/model" in card
    )
    assert "secret" not in card and "secret" not in (model_folder / "card.json").read_text()
    add_results(model_folder, {"stsb/test/pearson": 0.7123, "reddit/p_at_1": 0.25, "checkpoint": "x"})
    card = (model_folder / CARD_FILE).read_text()
    header = yaml.safe_load(card.split("---")[1])
    metrics = {m["type"]: m["value"] for r in header["model-index"][0]["results"] for m in r["metrics"]}
    assert metrics == {"stsb/test/pearson": 0.7123, "reddit/p_at_1": 0.25}
    assert "| STS Benchmark test, Pearson r (raw cosine) | 0.7123 |" in card


def test_mlflow_model_loads_registers_and_serves_over_http(model_folder, tmp_path, monkeypatch):
    import mlflow

    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # artifacts must not land in the working directory

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    run_id = tracking.start_run(uri, "serve-test", "tiny")
    tracking.log_metrics(uri, run_id, {"stsb/dev/pearson": 0.25}, step=3)
    model_uri = log_model(uri, run_id, model_folder, register_as="convsts-tiny", step=3)
    tracking.end_run(uri, run_id)
    assert model_uri == f"runs:/{run_id}/model"
    # An MLflow 3 LoggedModel: output of the run at its step, with the run's metrics at that step,
    # and the registered version points at it.
    client = tracking.client(uri)
    (logged,) = client.search_logged_models([client.get_run(run_id).info.experiment_id])
    assert logged.name == "model" and logged.source_run_id == run_id
    assert {(m.key, m.value, m.step) for m in logged.metrics} == {("stsb/dev/pearson", 0.25, 3)}
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [logged.model_id]
    assert client.get_model_version("convsts-tiny", "1").source == f"models:/{logged.model_id}"
    # Logged again after an evaluation: still the run's one model (same id, same registered version),
    # now with the evaluated card and the new metrics.
    add_results(model_folder, {"stsb/test/pearson": 0.5})
    tracking.log_metrics(uri, run_id, {"stsb/test/pearson": 0.5}, step=3)
    assert log_model(uri, run_id, model_folder, register_as="convsts-tiny", step=3) == model_uri
    (again,) = client.search_logged_models([client.get_run(run_id).info.experiment_id])
    assert again.model_id == logged.model_id and again.status == logged.status
    assert {(m.key, m.value) for m in again.metrics} == {("stsb/dev/pearson", 0.25), ("stsb/test/pearson", 0.5)}
    assert [str(v.version) for v in client.search_model_versions("name='convsts-tiny'")] == ["1"]
    # Artifacts live beside the store, not in the working directory.
    assert (tmp_path / "store" / "mlartifacts").is_dir() and not any((tmp_path / "cwd").iterdir())
    expected = load(model_folder).encode(TEXTS)  # (4, 12)

    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pyfunc.load_model(model_uri)
        np.testing.assert_allclose(loaded.predict(pd.DataFrame({"text": TEXTS})), expected, atol=1e-5)
        probes = loaded.predict(pd.DataFrame({"text": EXPORT_PROBES}))  # URLs, entities, emoji, empty strings
        np.testing.assert_allclose(probes, load(model_folder).encode(EXPORT_PROBES), atol=1e-5)
        raw = loaded.predict(pd.DataFrame({"text": TEXTS}), params={"normalize_embeddings": False})
        assert not np.allclose(np.linalg.norm(raw[:2], axis=1), 1.0)
        tuned = loaded.predict(pd.DataFrame({"text": TEXTS}), params={"tuned": True})
        np.testing.assert_allclose(tuned, load(model_folder).encode(TEXTS, tuned=True), atol=1e-5)
        card = mlflow.artifacts.download_artifacts(f"{model_uri}/artifacts/model/README.md", dst_path=str(tmp_path))
        assert "| STS Benchmark test, Pearson r (raw cosine) | 0.5000 |" in Path(card).read_text()
        registered = mlflow.pyfunc.load_model("models:/convsts-tiny/1")
        np.testing.assert_allclose(registered.predict(pd.DataFrame({"text": TEXTS})), expected, atol=1e-5)
    finally:
        mlflow.set_tracking_uri(None)

    port = free_port()
    # The scoring server execs `uvicorn` by name: the environment's bin folder must be on PATH.
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "models",
            "serve",
            "-m",
            model_uri,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        cwd=tmp_path,
        stdout=open(tmp_path / "serve.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 180
        while not _answers(f"http://127.0.0.1:{port}/ping"):
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.time() < deadline, "mlflow models serve did not answer within 180 s"
            time.sleep(0.5)
        body = json.dumps({"dataframe_records": [{"text": t} for t in TEXTS]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            served = np.array(json.loads(response.read())["predictions"], dtype=np.float32)
    finally:
        stop_pids([proc.pid], grace_s=15)
        proc.wait(timeout=30)
    np.testing.assert_allclose(served, expected, atol=1e-5)
