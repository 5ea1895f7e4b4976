"""The InferSent baseline path: a BiLSTM-max encoder trained on SNLI alone (configs/infersent.yaml)
through the same Ray Train job, then evaluated."""

from pathlib import Path

import pytest

from convsts.datasets.snli import read_snli
from convsts.io.storage import resolve_path
from convsts.models.encoders import BiLstmMaxEncoder
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.evaluation.nli import nli_metrics
from convsts.ray_jobs.evaluation.scorers import EmbeddingScorer
from convsts.ray_jobs.tracking import runs as tracking

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"

TINY = [
    "data.snli_train='{sample}/snli_train.parquet'",
    "data.snli_dev='{sample}/snli_dev.parquet'",
    "data.snli_test=''",
    "data.stsb_dir='{sample}'",
    "model.bilstm.hidden_size=16",
    "model.bilstm.embedding_dim=16",
    "tokenizer.word_vocab_size=3000",
    "trainer.steps=6",
    "trainer.log_every=3",
    "trainer.checkpoint_every=6",
    "trainer.cpus_per_worker=0.5",
    "trainer.stages=[{start_step: 0, batch_size: 32, lr: 0.1}]",
    "trainer.feed=local",  # not the feed's guarantee (testkit.tiny.TINY_DAN)
]


@pytest.mark.slow
def test_infersent_trains_on_snli_alone(ray_session, mlflow_uri, tmp_path):
    from convsts.ray_jobs.pipelines.inputs import ensure_prepared
    from convsts.ray_jobs.training.driver import run_training

    cfg = load_config(REPO_CONFIGS / "infersent.yaml", TINY + [f"mlflow.tracking_uri={mlflow_uri}"])
    assert cfg.trainer.task_weights == {"snli": 1.0} and cfg.model.encoder == "bilstm"
    prepared = tmp_path / "prepared"
    ensure_prepared(cfg, prepared)
    assert (prepared / "snli" / "train").is_dir() and not (prepared / "reddit").exists()  # SNLI only
    result = run_training(cfg, tmp_path / "run", prepared_dir=prepared)

    encoder = load(result.checkpoint)
    assert isinstance(encoder.model.encoder, BiLstmMaxEncoder) and encoder.dim == 32  # 2 x 16, max-pooled
    dev = read_snli(resolve_path(cfg.data.snli_dev)).head(300)
    accuracy = nli_metrics(EmbeddingScorer(encoder), dev, "snli/dev")["snli/dev/accuracy"]
    assert 0 <= accuracy <= 1
    run = tracking.client(mlflow_uri).get_run(result.run_id)
    assert "snli/loss" in run.data.metrics and "reddit/loss" not in run.data.metrics
    assert run.info.status == "FINISHED"
