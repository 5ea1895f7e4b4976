import pytest
import torch

from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.training.train_step import make_optimizer, set_lr


def _params():
    table = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True)
    dense = torch.nn.Linear(4, 3)
    return table, dense, [table.weight, *dense.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_dense_lr_scale_and_stage_changes(optimizer):
    cfg = load_config(None, [f"trainer.optimizer={optimizer}", "trainer.dense_lr_scale=0.1"])
    table, dense, params = _params()
    opts = make_optimizer(cfg.trainer, params, [table.weight], 0.01)
    lrs = {id(p): g["lr"] for o in opts for g in o.param_groups for p in g["params"]}
    assert lrs[id(table.weight)] == pytest.approx(0.01) and lrs[id(dense.weight)] == pytest.approx(0.001)
    set_lr(opts, 0.5)  # the next stage keeps the ratio
    lrs = {id(p): g["lr"] for o in opts for g in o.param_groups for p in g["params"]}
    assert lrs[id(table.weight)] == pytest.approx(0.5) and lrs[id(dense.weight)] == pytest.approx(0.05)
    # A step with a sparse gradient on the table and dense ones on the layer works with each optimizer.
    loss = dense(table(torch.tensor([[1, 2], [3, 0]]))).sum()
    loss.backward()
    for opt in opts:
        opt.step()


def test_sparse_parameters_come_from_the_model():
    """The optimizer groups follow what the encoder declares, not an attribute patched onto tensors."""
    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import build_model
    from convsts.models.config import DanConfig, ModelConfig
    from convsts.ray_jobs.training.train_step import Optimizers

    tok = DanTokenizer.build(count_words(["a b c"]), TokenizerConfig(bigram_buckets=11))
    model = build_model(ModelConfig(dan=DanConfig(embedding_dim=4, hidden_sizes=[4], output_dim=3)), tok)
    assert model.sparse_parameters() == [model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight]
    opts = Optimizers.build(load_config(None, ["trainer.optimizer=adam"]).trainer, model, ["reddit"], 0.01)
    assert [type(o).__name__ for o in opts.encoder] == ["SparseAdam", "Adam"]
    dense = build_model(
        ModelConfig(dan=DanConfig(embedding_dim=4, hidden_sizes=[4], output_dim=3, sparse_embeddings=False)), tok
    )
    assert dense.sparse_parameters() == []


def test_head_lr_scale_applies_to_the_named_task_head_only_and_survives_stage_changes():
    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import build_model
    from convsts.models.config import DanConfig, ModelConfig
    from convsts.ray_jobs.training.train_step import Optimizers

    tok = DanTokenizer.build(count_words(["a b c"]), TokenizerConfig(bigram_buckets=11))
    model = build_model(ModelConfig(dan=DanConfig(embedding_dim=4, hidden_sizes=[4], output_dim=3)), tok)
    cfg = load_config(
        None, ["trainer.optimizer=adamw", "trainer.dense_lr_scale=0.5", "trainer.head_lr_scale={snli: 50}"]
    )
    opts = Optimizers.build(cfg.trainer, model, ["reddit", "snli"], 1e-4)

    def lrs(module, optimizers):
        by_param = {id(p): g["lr"] for o in optimizers for g in o.param_groups for p in g["params"]}
        return sorted({round(by_param[id(p)], 12) for p in module.parameters() if id(p) in by_param})

    assert lrs(model.encoder.word_embedding, opts.encoder) == [1e-4]
    assert lrs(model.encoder.dnn, opts.encoder) == [5e-5]  # dense encoder layers
    assert lrs(model.heads["snli"], opts.heads["snli"]) == [2.5e-3]  # 1e-4 x 0.5 x 50
    assert lrs(model.heads["reddit"], opts.heads["reddit"]) == [5e-5]  # not named: x 1
    opts.set_lr(2e-4)  # a later stage keeps every ratio
    assert lrs(model.heads["snli"], opts.heads["snli"]) == [5e-3]
    assert lrs(model.encoder.word_embedding, opts.encoder) == [2e-4]


def test_head_lr_scale_names_a_trained_task():
    from convsts.io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.head_lr_scale.snil"):
        load_config(None, ["trainer.head_lr_scale={snil: 50}"])
