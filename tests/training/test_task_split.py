"""The 95/5 task split on a real Ray Train job (2 workers, gloo): the shared encoder stays identical
on both workers and its update is the configured weighted mix of the two tasks' gradients."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from convsts.datasets.config import TokenizerConfig
from convsts.datasets.text import DanTokenizer, count_words
from convsts.models.checkpoint import build_model
from convsts.models.config import DanConfig, ModelConfig
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import get_task
from convsts.ray_jobs.training.task_groups import GradientCombiner, plan_tasks
from convsts.ray_jobs.training.train_step import Optimizers, train_step

WEIGHTS = {"reddit": 0.95, "snli": 0.05}
REDDIT = (
    ["what is your favourite book", "anyone watching the game", "best laptop for coding"],
    ["dune without a doubt", "yes what a match", "anything with a good keyboard"],
)
SNLI = (
    ["a man plays a guitar", "two dogs run in a field", "a woman reads"],
    ["a person makes music", "cats sleep indoors", "someone is reading"],
    [0, 2, 0],
)


def _setup():
    tok = DanTokenizer.build(count_words(REDDIT[0] + REDDIT[1] + SNLI[0] + SNLI[1]), TokenizerConfig(bigram_buckets=97))
    cfg = ModelConfig(dan=DanConfig(embedding_dim=8, hidden_sizes=[8], output_dim=6), response_hidden=5, nli_hidden=4)
    torch.manual_seed(0)
    model = build_model(cfg, tok)
    return tok, model


def _batch(tok, task):
    def enc(texts, prefix):
        return {f"{prefix}__{k}": torch.from_numpy(v) for k, v in tok.encode(texts, width=8).items()}

    if task == "reddit":
        return {**enc(REDDIT[0], "context"), **enc(REDDIT[1], "response")}
    return {**enc(SNLI[0], "premise"), **enc(SNLI[1], "hypothesis"), "label": torch.tensor(SNLI[2])}


def _dense(grad):
    return (grad.to_dense() if grad.is_sparse else grad).numpy().copy()


def _worker(config):
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    plan = plan_tasks(WEIGHTS, ray.train.get_context().get_world_size())
    tok, model = _setup()
    combiner = GradientCombiner(plan, rank)
    encoder = list(model.encoder.parameters())
    task = get_task(plan.tasks_of(rank)[0])
    opts = Optimizers.build(load_config(None, ["trainer.optimizer=sgd"]).trainer, model, [task.name], lr=0.1)
    out = {}
    for step in range(2):
        train_step(model, task, _batch(tok, task.name), opts, combiner)  # the trainer's own step
        if step == 0:  # the combined gradients the update used
            out.update({f"grad{i}": _dense(p.grad) for i, p in enumerate(encoder)})
        out.update({f"step{step}_param{i}": p.detach().numpy().copy() for i, p in enumerate(encoder)})
    np.savez(Path(config["out"]) / f"rank{rank}.npz", **out)


@pytest.mark.slow
def test_two_workers_share_one_encoder_with_weighted_gradients(ray_session, tmp_path):
    import ray.train
    from ray.train.torch import TorchTrainer

    TorchTrainer(
        _worker,
        train_loop_config={"out": str(tmp_path)},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path / "ray"), name="split"),
    ).fit()
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    n_params = len([k for k in r0.files if k.startswith("grad")])
    for step in range(2):
        for i in range(n_params):
            assert np.array_equal(r0[f"step{step}_param{i}"], r1[f"step{step}_param{i}"]), (step, i)

    # The same mix computed in one process on the same batches.
    expected = None
    for task, weight in WEIGHTS.items():
        tok, model = _setup()
        loss, _ = get_task(task).loss(model, _batch(tok, task))
        loss.backward()
        grads = [weight * _dense(p.grad) for p in model.encoder.parameters()]
        expected = grads if expected is None else [a + b for a, b in zip(expected, grads)]
    for i in range(n_params):
        np.testing.assert_allclose(r0[f"grad{i}"], expected[i], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(r1[f"grad{i}"], expected[i], rtol=1e-5, atol=1e-7)


def _nan_worker(config):
    """Both ranks run the real TrainLoop; the SNLI rank's loss turns NaN at step 3."""
    import ray.train
    import test_training_core as core

    from convsts.ray_jobs.training.loop import LoopHooks

    rank = ray.train.get_context().get_world_rank()
    cfg = load_config(
        None,
        core.TINY
        + [
            "trainer.steps=8",
            "trainer.log_every=4",
            "trainer.checkpoint_every=4",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.001}]",
        ],
    )
    tokenizer = core._tokenizer(cfg)
    from testkit.frames import FrameStream

    from convsts.models.checkpoint import build_model
    from convsts.ray_jobs.tasks import model_heads, trained_tasks
    from convsts.ray_jobs.training.loop import TrainLoop
    from convsts.ray_jobs.training.train_step import seed_everything

    seed_everything(cfg.seed)
    model = build_model(cfg.model, tokenizer, model_heads(cfg))
    tasks = trained_tasks(cfg)

    def open_stream(task, batch_size, position):
        return FrameStream(tasks[task], core.FRAMES[task], tokenizer, batch_size, 16, position=position)

    plan = plan_tasks(cfg.trainer.task_weights, 2)
    saved = []
    loop = TrainLoop(
        cfg,
        model,
        plan,
        rank,
        open_stream,
        LoopHooks(checkpoint=lambda step, m, s: saved.append(step), progress=lambda line: None),
    )
    loop.tasks["snli"] = core.snli_with_nan_loss_at(3)
    try:
        loop.run()
    except Exception as err:  # every rank stops at the same check; none waits in a checkpoint
        (Path(config["out"]) / f"rank{rank}.txt").write_text(f"{type(err).__name__}: {err}\nsaved {saved}")
        raise


@pytest.mark.slow
def test_a_nan_loss_on_one_rank_stops_every_rank(ray_session, tmp_path):
    import ray.train
    from ray.train.torch import TorchTrainer

    with pytest.raises(Exception, match="non-finite"):
        TorchTrainer(
            _nan_worker,
            train_loop_config={"out": str(tmp_path)},
            scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
            run_config=ray.train.RunConfig(storage_path=str(tmp_path / "ray"), name="nan"),
        ).fit()
    reports = {r: (tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)}
    assert "non-finite snli loss (nan) at step 3" in reports[1]
    # Rank 0 stops at the same check (step 4): the NaN reached its encoder through the all-reduce, so
    # either its own loss is NaN by then or it reports the SNLI rank's.
    assert re.search(r"non-finite (reddit loss \(nan\) at step 4|loss on another rank \(snli\) by step 4)", reports[0])
    assert all(r.endswith("saved []") for r in reports.values())
