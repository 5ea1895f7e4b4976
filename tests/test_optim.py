import pytest
import torch

from ray_jobs.config import load_config
from ray_jobs.task_groups import mark_sparse
from ray_jobs.train import make_optimizer, set_lr


def _params():
    table = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True)
    dense = torch.nn.Linear(4, 3)
    mark_sparse([table.weight])
    return table, dense, [table.weight, *dense.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_dense_lr_scale_and_stage_changes(optimizer):
    cfg = load_config(None, [f"trainer.optimizer={optimizer}", "trainer.dense_lr_scale=0.1"])
    table, dense, params = _params()
    opts = make_optimizer(cfg, params, 0.01)
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
