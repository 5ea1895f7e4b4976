"""Two GPU paths where CUDA is present (skipped without it): the sparse-gradient
exchange runs under NCCL with every buffer on the GPU, and the in-training STS-B probe encodes on
the model's device. One process: an NCCL group of one rank still refuses CPU tensors, which is what
stopped a multi-GPU DAN run at its first step."""

import pytest
import torch
from testkit.local_cluster import free_port
from testkit.tiny import TINY_DAN

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import DanTokenizer, count_words
from convsts.models.checkpoint import build_model
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.evaluation.sts import StsDevProbe, read_stsb_split
from convsts.ray_jobs.training.task_groups import _all_reduce_sparse


@pytest.mark.gpu
def test_sparse_gradients_are_exchanged_under_nccl_on_the_gpu(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        table = torch.nn.EmbeddingBag(50, 4, mode="sum", sparse=True).cuda()
        table(torch.tensor([[1, 2], [3, 3]], device="cuda")).sum().backward()
        summed = _all_reduce_sparse(table.weight, 0.5)
        assert summed.device.type == "cuda"
        torch.testing.assert_close(summed.to_dense(), table.weight.grad.to_dense() * 0.5)
        table.weight.grad = None  # a rank without a gradient for the table still takes part
        assert _all_reduce_sparse(table.weight, 1.0)._nnz() == 0
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_the_in_training_sts_probe_encodes_on_the_model_device():
    cfg = load_config(None, TINY_DAN)
    frame = read_stsb_split(cfg, "dev")
    tokenizer = DanTokenizer.build(
        count_words(list(frame["sentence1"]) + list(frame["sentence2"])),
        TokenizerConfig(word_vocab_size=3000, bigram_buckets=2000),
    )
    model = build_model(cfg.model, tokenizer)
    on_cpu = StsDevProbe(cfg, tokenizer).evaluate(model)[StsDevProbe.METRIC]
    model = model.cuda()
    on_gpu = StsDevProbe(cfg, tokenizer).evaluate(model)[StsDevProbe.METRIC]
    # The same weights give the same Pearson on either device; the model stays on the GPU, training.
    assert on_gpu == pytest.approx(on_cpu, abs=1e-4) and -1 <= on_gpu <= 1
    assert model.training and all(p.is_cuda for p in model.parameters())
