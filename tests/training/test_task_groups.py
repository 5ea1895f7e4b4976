import pytest
import torch

from convsts.ray_jobs.training.task_groups import GradientCombiner, draw_task, plan_tasks

W = {"reddit": 0.95, "snli": 0.05}


def test_two_workers_use_gradient_weighting():
    plan = plan_tasks(W, 2)
    assert plan.mode == "gradient_weighting"
    assert plan.rank_tasks == ("reddit", "snli")
    assert plan.encoder_grad_scale(0) == pytest.approx(0.95)
    assert plan.encoder_grad_scale(1) == pytest.approx(0.05)


def test_twenty_workers_realise_95_5_by_head_count():
    plan = plan_tasks(W, 20)
    assert plan.mode == "head_count"
    assert len(plan.ranks_of("reddit")) == 19 and plan.ranks_of("snli") == [19]
    assert all(plan.encoder_grad_scale(r) == pytest.approx(1 / 20) for r in range(20))


def test_intermediate_sizes_weight_gradients():
    plan = plan_tasks(W, 4)
    assert plan.mode == "gradient_weighting" and plan.ranks_of("snli") == [3]
    # sum over ranks of scale = the task weights
    assert sum(plan.encoder_grad_scale(r) for r in plan.ranks_of("reddit")) == pytest.approx(0.95)


def test_one_worker_samples_tasks_by_weight():
    plan = plan_tasks(W, 1)
    assert plan.mode == "task_sampling" and plan.tasks_of(0) == ["reddit", "snli"]
    gen = torch.Generator().manual_seed(0)
    draws = [draw_task(plan, gen) for _ in range(4000)]
    assert 0.03 < draws.count("snli") / 4000 < 0.07


def test_single_process_combiner_scales_nothing_in_task_sampling():
    plan = plan_tasks(W, 1)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    GradientCombiner(plan, 0).combine_encoder([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))


def test_too_few_workers_for_tasks():
    with pytest.raises(ValueError, match="workers"):
        plan_tasks({"reddit": 0.5, "snli": 0.3, "other": 0.2}, 2)
