"""The GPU configs run on CPU at a tiny size: configs/transformer_gpu.yaml (one GPU: bf16, AdamW,
warm-up and linear decay, clipping, length bucketing, two batch stages, in-training STS-B) through
the same Ray Train job with use_gpu off; configs/paper_scale.yaml (the GPU cluster) parses and
validates with its bucket paths in place."""

from pathlib import Path

import pytest

from convsts.models.encoders import TransformerSentenceEncoder
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tracking import runs as tracking

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SAMPLE_DATA = [
    "data.reddit_inputs=['{sample}/reddit_pairs.parquet']",
    "data.snli_train='{sample}/snli_train.parquet'",
    "data.snli_dev='{sample}/snli_dev.parquet'",
    "data.snli_test=''",
    "data.stsb_dir='{sample}'",
    "data.cqa_test=''",
]
TINY = [
    "trainer.use_gpu=false",
    "trainer.cpus_per_worker=0.5",
    "trainer.steps=8",
    "trainer.warmup_steps=2",
    "trainer.log_every=4",
    "trainer.checkpoint_every=4",
    "trainer.eval_every=4",
    "trainer.bucket_batches=4",
    "trainer.stages=[{start_step: 0, batch_size: 8, lr: 0.0003}, {start_step: 4, batch_size: 16, lr: 0.0003}]",
    "tokenizer.subword_vocab_size=2000",
    "tokenizer.max_words=24",
    "model.transformer={num_layers: 1, num_heads: 2, hidden_size: 32, filter_size: 64, dropout: 0.1, output_dim: 24}",
    "model.response_hidden=16",
    "model.nli_hidden=16",
]


def test_gpu_configs_ask_for_what_a_gpu_run_needs():
    one = load_config(REPO_CONFIGS / "transformer_gpu.yaml")
    t = one.trainer
    assert one.model.encoder == "transformer" and t.use_gpu and t.num_workers == 1
    assert (t.precision, t.optimizer, t.lr_decay) == ("bf16", "adamw", "linear")
    assert t.warmup_steps > 0 and t.grad_clip > 0 and t.bucket_batches > 0 and t.eval_every > 0
    assert [s.batch_size for s in t.stages] == [128, 512]
    cluster = load_config(REPO_CONFIGS / "paper_scale.yaml")
    assert cluster.trainer.use_gpu and cluster.trainer.num_workers == 20
    assert cluster.trainer.storage_path.startswith("s3://") and cluster.data.prepared_dir.startswith("s3://")


@pytest.mark.slow
def test_transformer_gpu_config_trains_on_cpu_at_a_tiny_size(ray_session, sample_prepared, mlflow_uri, tmp_path):
    from convsts.ray_jobs.training.driver import run_training

    cfg = load_config(REPO_CONFIGS / "transformer_gpu.yaml", SAMPLE_DATA + TINY + [f"mlflow.tracking_uri={mlflow_uri}"])
    result = run_training(cfg, tmp_path / "run", prepared_dir=sample_prepared)

    encoder = load(result.checkpoint)
    assert isinstance(encoder.model.encoder, TransformerSentenceEncoder) and encoder.dim == 24
    assert (tmp_path / "run" / "best_checkpoint").is_dir()  # in-training STS-B dev chose one
    client = tracking.client(mlflow_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["trainer.precision"] == "bf16"
    lrs = [m.value for m in client.get_metric_history(result.run_id, "lr")]
    assert lrs and all(0 <= lr <= 0.0003 for lr in lrs) and lrs[-1] < 0.0003  # warmed up, then decaying
    assert "reddit/loss" in run.data.metrics  # one worker draws each step's task 95/5: SNLI may not come up in 8
