"""Real tiny checkpoints for tests: an untrained DAN on the embedded STS-B sample's vocabulary, and
one that names the run and step that wrote it (a link of a run chain)."""

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.evalsets import read_stsb, stsb_split_path
from convsts.datasets.text import DanTokenizer, count_words
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import TrainState, build_model, save_checkpoint
from convsts.models.config import DanConfig, ModelConfig
from convsts.ray_jobs.config.loader import load_config


def sample_dan_checkpoint(path):
    """An untrained small DAN whose vocabulary is the sample STS-B train split's words."""
    stsb = read_stsb(stsb_split_path(resolve_path("{sample}"), "train"))
    texts = list(stsb["sentence1"]) + list(stsb["sentence2"])
    tokenizer = DanTokenizer.build(count_words(texts), TokenizerConfig(word_vocab_size=5000, bigram_buckets=500))
    config = ModelConfig(
        dan=DanConfig(embedding_dim=24, hidden_sizes=[24], output_dim=16), response_hidden=16, nli_hidden=8
    )
    return save_checkpoint(path, build_model(config, tokenizer).eval(), tokenizer, {})


def chain_checkpoint(path, bigram_buckets: int = 64, step: int = 3, run_id: str | None = None):
    """A tiny DAN checkpoint (weights, tokenizer, run config, train state at `step`, the MLflow run
    that wrote it, manifest)."""
    cfg = load_config(None, ["model.dan.output_dim=6", "model.dan.embedding_dim=16", "model.dan.hidden_sizes=[4]"])
    cfg.tokenizer.bigram_buckets = bigram_buckets
    tok = DanTokenizer.build(count_words(["a man plays a guitar", "a woman sings"]), cfg.tokenizer)
    provenance = {"run_id": run_id} if run_id else None
    return save_checkpoint(
        path,
        build_model(cfg.model, tok).eval(),
        tok,
        cfg.to_dict(),
        train_state=TrainState(step),
        provenance=provenance,
    )
