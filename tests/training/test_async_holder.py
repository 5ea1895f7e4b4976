"""Asynchronous task groups without Ray: the async plan and its config keys, the worker's update as
(indices, values) for the DAN's tables, and the parameter holder (applying pushes, sparse pulls,
pacing to the task weights, the end of the run, generations). The holder's methods are called as
Ray calls them, on one asyncio loop; tests/training/test_async_groups.py runs it as an actor under Ray Train."""

import asyncio

import pytest
import test_training_core as core
import torch
from testkit.frames import FrameStream

from convsts.io.errors import ConfigError
from convsts.models.checkpoint import build_model
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import model_heads, trained_tasks
from convsts.ray_jobs.training.parameter_holder import HolderReset, HolderUpdate, ParameterHolder
from convsts.ray_jobs.training.task_groups import GradientCombiner, plan_for, plan_tasks
from convsts.ray_jobs.training.train_step import Optimizers, seed_everything, train_step

W = {"reddit": 0.95, "snli": 0.05}


def test_async_plan_gives_each_rank_one_task_and_scales_nothing():
    plan = plan_tasks(W, 2, split="async")
    assert plan.mode == "async" and plan.rank_tasks == ("reddit", "snli")
    assert plan.encoder_grad_scale(1) == 1.0
    assert plan_tasks(W, 20, split="async").ranks_of("snli") == [19]
    assert plan_tasks(W, 4, {"reddit": 2, "snli": 2}, "async").rank_tasks == ("reddit", "reddit", "snli", "snli")
    assert plan_tasks(W, 4, {"reddit": 2, "snli": 2}).mode == "gradient_weighting"  # sync honours the counts too
    with pytest.raises(ValueError, match="at least one per task"):
        plan_tasks(W, 1, split="async")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["trainer.task_split=lockstep"], "trainer.task_split"),
        (["trainer.task_workers={reddit: 2, snli: 1}"], "trainer.task_workers"),  # sums to 3, not 2
        (["trainer.task_workers={reddit: 2}"], "trainer.task_workers"),  # no count for snli
        (["trainer.task_split=async", "trainer.num_workers=1"], "trainer.num_workers"),
        (["trainer.async_refresh_every=0"], "trainer.async_refresh_every"),
        (["trainer.async_slack=-1"], "trainer.async_slack"),
    ],
)
def test_async_config_keys_are_checked(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def _setup(extra=()):
    cfg = load_config(
        None,
        core.TINY
        + [
            "trainer.task_split=async",
            "trainer.steps=60",
            "trainer.checkpoint_every=25",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.01}]",
            *extra,
        ],
    )
    tokenizer = core._tokenizer(cfg)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, tokenizer, model_heads(cfg))
    holder = ParameterHolder()
    info = holder.reset(cfg.to_dict(), tokenizer.to_dict(), model.state_dict())
    return cfg, tokenizer, model, holder, info


def _worker_update(cfg, tokenizer, model, task_name, generation=1):
    """A worker's HolderUpdate after one real train_step on `task_name` (its gradients pending)."""
    tasks = trained_tasks(cfg)
    update = HolderUpdate(None, model, task_name, 1)
    update.generation = generation
    stream = FrameStream(tasks[task_name], core.FRAMES[task_name], tokenizer, 4, 16)
    plan = plan_for(cfg.trainer, 2)
    train_step(
        model,
        tasks[task_name],
        next(stream),
        Optimizers(encoder=[update], heads={task_name: []}),
        GradientCombiner(plan, plan.ranks_of(task_name)[0]),
    )
    return update


def test_worker_sends_table_gradients_as_rows_and_the_holder_returns_changed_rows_only():
    cfg, tokenizer, model, holder, info = _setup()
    update = _worker_update(cfg, tokenizer, model, "reddit")
    tables = {n for n, p in model.named_parameters() if any(p is s for s in model.sparse_parameters())}
    assert tables and tables <= set(update.pending)
    for name in tables:
        rows, values = update.pending[name]  # (nnz,), (nnz, D): the rows this batch used, not the table
        table = dict(model.named_parameters())[name]
        assert rows.dim() == 1 and values.shape == (rows.numel(), table.shape[1]) and rows.numel() < table.shape[0] / 2
    assert not any(n.startswith("heads.snli.") for n in update.pending)  # the other task's head stays out

    before = {n: p.detach().clone() for n, p in holder.params.items()}
    reply = asyncio.run(holder.push(info["generation"], "reddit", update.pending, 0, True))
    assert reply["applied"] and reply["step"] == 1 and holder.updates == {"reddit": 1, "snli": 0}
    for name in tables:
        rows, values = reply["weights"][name]
        pushed_rows = update.pending[name][0]
        assert set(rows.tolist()) == set(pushed_rows.tolist())  # only the rows the update changed travel back
        changed = (holder.params[name] != before[name]).any(1).nonzero().squeeze(1)
        assert set(changed.tolist()) <= set(pushed_rows.tolist())
        assert torch.equal(values, holder.params[name][rows])
    assert not any(n.startswith("heads.snli.") for n in reply["weights"])
    for name in holder.params:  # a reddit update leaves the SNLI head alone
        if name.startswith("heads.snli."):
            assert torch.equal(holder.params[name], before[name]), name
    update.load(reply["weights"], reply["step"])  # the worker's copy now equals the holder's
    for name, p in update.named.items():
        assert torch.equal(p, holder.params[name]), name
    # Nothing changed since: the next pull carries no table rows.
    again = asyncio.run(holder.turn(info["generation"], "reddit", reply["step"]))
    assert all(again["weights"][n][0].numel() == 0 for n in tables)


def test_holder_paces_tasks_to_their_weights_counts_every_update_and_stops_at_the_end():
    cfg, tokenizer, model, holder, info = _setup(["trainer.async_slack=1"])
    grads = {task: _worker_update(cfg, tokenizer, model, task).pending for task in ("reddit", "snli")}
    gen = info["generation"]
    pushed = {"reddit": 0, "snli": 0}
    due_at = []

    async def worker(task):
        reply = await holder.turn(gen, task, 0, pull=False)
        while not reply["done"]:
            reply = await holder.push(gen, task, grads[task], reply["step"], False)
            pushed[task] += reply["applied"]
            assert reply["room"] > 0 or reply["due"]  # a reply is the task's turn: it may start an update
            if reply["due"] and not reply["done"]:
                due_at.append(reply["step"])
                if task == "reddit":  # rank 0's checkpoint (the other rank waits for it under Ray Train)
                    holder.checkpoint_state(gen)
            await asyncio.sleep(0)  # the other worker's turn to run

    async def both():
        await asyncio.gather(worker("reddit"), worker("snli"))

    asyncio.run(both())
    assert holder.step == 60 and sum(holder.updates.values()) == 60  # exactly trainer.steps
    assert holder.updates == pushed  # every applied update was a pushed one, none twice
    # Each task within slack + workers of its share: SNLI 3 of 60 at 5%.
    assert abs(holder.updates["snli"] - 0.05 * 60) <= 2, holder.updates
    assert due_at and min(due_at) >= 25
    late = asyncio.run(holder.push(gen, "reddit", grads["reddit"], 60, False))
    assert not late["applied"] and late["done"] and holder.step == 60


def test_a_push_from_an_earlier_generation_is_refused():
    cfg, tokenizer, model, holder, info = _setup()
    update = _worker_update(cfg, tokenizer, model, "reddit")
    holder.reset(cfg.to_dict(), tokenizer.to_dict(), model.state_dict())  # rank 0 of a restarted worker group
    with pytest.raises(HolderReset, match="reset"):
        asyncio.run(holder.push(info["generation"], "reddit", update.pending, 0, False))
    fresh = ParameterHolder()  # the actor after its process died
    with pytest.raises(HolderReset, match="restarted"):
        asyncio.run(fresh.push(info["generation"], "reddit", update.pending, 0, False))
