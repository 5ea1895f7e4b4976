import pytest
import torch

from ray_jobs.config import load_config
from ray_jobs.training.step import make_optimizer, set_lr


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
    from datasets.text import DanTokenizer, TokenizerConfig, count_words
    from models.checkpoint import build_model
    from models.config import DanConfig, ModelConfig
    from ray_jobs.training.step import Optimizers

    tok = DanTokenizer.build(count_words(["a b c"]), TokenizerConfig(bigram_buckets=11))
    model = build_model(ModelConfig(dan=DanConfig(embedding_dim=4, hidden_sizes=[4], output_dim=3)), tok)
    assert model.sparse_parameters() == [model.encoder.word_embedding.weight, model.encoder.bigram_embedding.weight]
    opts = Optimizers.build(load_config(None, ["trainer.optimizer=adam"]).trainer, model, ["reddit"], 0.01)
    assert [type(o).__name__ for o in opts.encoder] == ["SparseAdam", "Adam"]
    dense = build_model(ModelConfig(dan=DanConfig(embedding_dim=4, hidden_sizes=[4], output_dim=3,
                                                  sparse_embeddings=False)), tok)
    assert dense.sparse_parameters() == []
