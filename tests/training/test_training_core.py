"""The training core without Ray: the step, stage schedule, resume positions, gradient weighting,
the task and encoder registries (a toy task added as one module), checkpoint heads."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from testkit import toy_task
from testkit.frames import FrameStream

from convsts.datasets.text import DanTokenizer, count_words
from convsts.io.errors import ConfigError
from convsts.models.checkpoint import TrainState, build_model, save_checkpoint
from convsts.models.encoders import ENCODERS
from convsts.models.losses import in_batch_softmax_loss
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.tasks import builtin_tasks, get_task, model_heads, trained_tasks
from convsts.ray_jobs.tasks.base import fields
from convsts.ray_jobs.training.loop import LoopHooks, TrainLoop
from convsts.ray_jobs.training.schedule import StageSchedule
from convsts.ray_jobs.training.task_groups import GradientCombiner, plan_tasks
from convsts.ray_jobs.training.train_step import Optimizers, seed_everything, train_step

TINY = [
    "model.dan.embedding_dim=8",
    "model.dan.hidden_sizes=[8]",
    "model.dan.output_dim=6",
    "model.response_hidden=5",
    "model.nli_hidden=4",
    "tokenizer.bigram_buckets=97",
    "trainer.optimizer=adam",
    "trainer.log_every=1000",
    "trainer.checkpoint_every=1000",
    "trainer.feed=local",  # not the feed's guarantee (testkit.tiny.TINY_DAN)
]
REDDIT = pd.DataFrame(
    {
        "context": [f"question number {i} about topic {i % 7}" for i in range(40)],
        "response": [f"answer {i} on topic {i % 7} here" for i in range(40)],
    }
)
SNLI = pd.DataFrame(
    {
        "premise": [f"a man {i} plays" for i in range(24)],
        "hypothesis": [f"someone {i} sleeps" for i in range(24)],
        "label": [i % 3 for i in range(24)],
    }
)
FRAMES = {"reddit": REDDIT, "snli": SNLI, "toy": toy_task.rows()}


def _tokenizer(cfg):
    texts = [str(t) for f in FRAMES.values() for c in f.select_dtypes(exclude="number").columns for t in f[c]]
    return DanTokenizer.build(count_words(texts), cfg.tokenizer)


def snli_with_nan_loss_at(call: int):
    """The SNLI task, except that the loss of its `call`-th step is NaN (a fresh counter each time)."""
    from convsts.ray_jobs.tasks.snli import SnliTask

    class NanLoss(SnliTask):
        calls = 0

        def loss(self, model, batch):
            NanLoss.calls += 1
            loss, acc = super().loss(model, batch)
            return (loss * float("nan") if NanLoss.calls == call else loss), acc

    return NanLoss()


def _loop(cfg, state=None, hooks=None, model=None):
    tokenizer = _tokenizer(cfg)
    seed_everything(cfg.seed)
    model = model or build_model(cfg.model, tokenizer, model_heads(cfg))
    tasks = trained_tasks(cfg)
    opened = []

    def open_stream(task, batch_size, position):
        opened.append((task, batch_size, position))
        return FrameStream(tasks[task], FRAMES[task], tokenizer, batch_size, 16, seed=cfg.seed, position=position)

    plan = plan_tasks(cfg.trainer.task_weights, 1)
    loop = TrainLoop(cfg, model, plan, 0, open_stream, hooks or LoopHooks(progress=lambda line: None), state)
    return loop, model, opened


def test_stage_switch_reopens_streams_and_changes_lr():
    cfg = load_config(
        None,
        TINY
        + [
            "trainer.task_weights={reddit: 1.0}",
            "trainer.steps=5",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.01}, {start_step: 3, batch_size: 8, lr: 0.001}]",
        ],
    )
    lrs = []
    loop, _, opened = _loop(cfg)
    original = loop.optimizers.set_lr
    loop.optimizers.set_lr = lambda lr: (lrs.append(lr), original(lr))
    assert loop.run() == 5
    # the second stage's stream goes on from the rows the first read (3 batches of 4)
    assert opened == [("reddit", 4, {}), ("reddit", 8, {"epoch": 0, "rows": 12, "batch_size": 4})]
    assert lrs == [0.001] and loop.optimizers.encoder[0].param_groups[0]["lr"] == pytest.approx(0.001)
    assert (
        StageSchedule(cfg.trainer.stages).at(2).batch_size == 4 and StageSchedule(cfg.trainer.stages).at(3).lr == 0.001
    )


@pytest.mark.parametrize(
    "encoder",
    [
        ["model.encoder=dan"],
        # dropout draws from torch's own generator: a resume restores it with the task draws'
        ["model.encoder=transformer", "model.transformer.num_layers=1", "model.transformer.hidden_size=8",
         "model.transformer.num_heads=2", "model.transformer.filter_size=8", "model.transformer.output_dim=6"],
    ],
    ids=["dan", "transformer-dropout"],
)  # fmt: skip
def test_resume_from_a_checkpointed_state_logs_the_uninterrupted_runs_losses(encoder):
    """Two tasks drawn by task sampling, resumed at step 5 of 12 from the checkpoint's state: every
    later step logs the undisturbed run's losses and ends with its weights."""
    cfg = load_config(
        None,
        TINY
        + encoder
        + [
            "trainer.task_weights={reddit: 0.5, snli: 0.5}",
            "trainer.steps=12",
            "trainer.checkpoint_every=5",
            "trainer.log_every=1",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.01}]",
        ],
    )
    saved, logged = {}, {"undisturbed": {}, "resumed": {}}

    def hooks(name):
        def checkpoint(step, metrics, state):  # a snapshot, as the worker's torch.save makes
            saved[step] = (copy.deepcopy(state), {k: v.clone() for k, v in model.state_dict().items()})

        def log(metrics, step):
            logged[name][step] = {k: v for k, v in metrics.items() if k.endswith("/loss")}

        return LoopHooks(log=log, checkpoint=checkpoint, progress=lambda line: None)

    loop, model, _ = _loop(cfg, hooks=hooks("undisturbed"))
    loop.run()
    state, weights = saved[5]
    assert state.step == 5 and state.task_draws is not None and len(state.rng) == 1
    seed_everything(cfg.seed + 99)  # whatever a resumed worker did with the generators before
    fresh = build_model(cfg.model, _tokenizer(cfg), model_heads(cfg))
    fresh.load_state_dict(weights)
    resumed, resumed_model, opened = _loop(cfg, state=state, model=fresh, hooks=hooks("resumed"))
    assert sorted(opened, key=str) == sorted(((t, 4, state.positions[0][t]) for t in ("reddit", "snli")), key=str)
    resumed.run()
    after = {step: losses for step, losses in logged["undisturbed"].items() if step > 5}
    assert logged["resumed"] == after and {k for m in after.values() for k in m} == {"reddit/loss", "snli/loss"}
    for name, value in model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[name]), name


def test_a_task_the_checkpoint_holds_no_position_of_starts_at_epoch_0_saying_so():
    """A resume that trains a task its checkpoint did not (its weight was 0 then): that task's data
    starts at epoch 0, in one line; the other task goes on from its position, without a line."""
    cfg = load_config(
        None,
        TINY
        + [
            "trainer.task_weights={reddit: 0.5, snli: 0.5}",
            "trainer.steps=4",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.01}]",
        ],
    )
    position = {"epoch": 1, "rows": 12, "batch_size": 4}
    state = TrainState(4, positions=[{"reddit": position}], world_size=1, task_ranks={"reddit": [0]})
    lines: list[str] = []
    _, _, opened = _loop(cfg, state=state, hooks=LoopHooks(progress=lines.append))
    assert sorted(opened, key=str) == [("reddit", 4, position), ("snli", 4, {})]
    assert lines == [
        "[convsts rank 0] snli: the checkpoint (step 4) holds no position of this task's data (it was not "
        "trained then): its data starts at epoch 0"
    ]


def test_gradient_weighting_in_one_process_scales_the_encoder_update():
    """Rank 0 of a 2-worker plan (reddit, weight 0.95): its encoder gradient is scaled by 0.95
    before the (here absent) all-reduce; the head's is not."""
    cfg = load_config(None, TINY + ["trainer.optimizer=sgd", "trainer.steps=1"])
    tokenizer = _tokenizer(cfg)
    task = get_task("reddit")
    batch = FrameStream(task, REDDIT, tokenizer, 8, 16).__next__()
    results = {}
    for name, combiner in (
        ("plain", GradientCombiner(plan_tasks({"reddit": 1.0}, 1), 0)),
        ("weighted", GradientCombiner(plan_tasks(cfg.trainer.task_weights, 2), 0)),
    ):
        seed_everything(0)
        model = build_model(cfg.model, tokenizer)
        opts = Optimizers.build(cfg.trainer, model, ["reddit"], lr=0.1)
        loss, _ = train_step(model, task, batch, opts, combiner)
        assert loss.requires_grad is False and loss.dim() == 0
        results[name] = {
            n: (p.grad.to_dense() if p.grad.is_sparse else p.grad)
            for n, p in model.named_parameters()
            if p.grad is not None
        }
    for name, delta in results["plain"].items():
        scale = 0.95 if name.startswith("encoder.") else 1.0
        torch.testing.assert_close(results["weighted"][name], scale * delta, rtol=1e-5, atol=1e-7)
    assert results["plain"].keys() == results["weighted"].keys()


def test_one_worker_draws_both_tasks_and_logs_each():
    cfg = load_config(
        None,
        TINY
        + [
            "trainer.steps=40",
            "trainer.log_every=40",
            "trainer.task_weights={reddit: 0.5, snli: 0.5}",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.001}]",
        ],
    )
    logged = {}
    loop, _, _ = _loop(cfg, hooks=LoopHooks(log=lambda m, s: logged.update(m), progress=lambda line: None))
    loop.run()
    assert {"reddit/loss", "snli/loss", "reddit/batch_accuracy", "snli/batch_accuracy", "lr"} <= set(logged)
    assert all(np.isfinite(v) for v in logged.values())


def test_registries_list_the_built_in_tasks_and_encoders():
    assert builtin_tasks() == ["reddit", "snli"]
    assert set(ENCODERS) == {"dan", "transformer", "bilstm", "pretrained"}
    for name in builtin_tasks():
        task = get_task(name)
        assert task.name == name and task.head and len(task.pair) == 2
    with pytest.raises(ConfigError, match="trainer.task_weights.mnli: unknown task 'mnli'"):
        load_config(None, ["trainer.task_weights={mnli: 1.0}"])
    # Named first, before the settings keyed by task (the demo's head_lr_scale.snli) are checked.
    with pytest.raises(ConfigError, match="trainer.task_weights.mnli: unknown task 'mnli'"):
        load_config(Path(__file__).parents[2] / "configs" / "demo.yaml", ["trainer.task_weights={mnli: 1.0}"])
    with pytest.raises(ConfigError, match="model.encoder: expected dan\\|transformer\\|bilstm\\|pretrained"):
        load_config(None, ["model.encoder=gpt"])


def test_a_toy_task_is_one_module_plus_config_entries(tmp_path):
    cfg = load_config(
        None,
        TINY
        + [
            "task_modules=[testkit.toy_task]",
            "trainer.task_weights={reddit: 0.5, toy: 0.5}",
            "trainer.steps=30",
            "trainer.log_every=30",
            "trainer.stages=[{start_step: 0, batch_size: 8, lr: 0.01}]",
        ],
    )
    assert list(trained_tasks(cfg)) == ["reddit", "toy"]
    assert model_heads(cfg) == {"reddit": "response", "snli": "nli", "toy": "testkit.toy_task:SameFirstWordHead"}
    logged = {}
    loop, model, _ = _loop(cfg, hooks=LoopHooks(log=lambda m, s: logged.update(m), progress=lambda line: None))
    loop.run()
    assert "toy/loss" in logged and np.isfinite(logged["toy/loss"])
    # The checkpoint records the head kinds; convsts.models.sentence_encoder.load rebuilds the toy head without the task registry.
    save_checkpoint(tmp_path / "c", model, _tokenizer(cfg), cfg.to_dict())
    loaded = load(tmp_path / "c")
    assert set(loaded.model.heads) == {"reddit", "snli", "toy"}
    assert torch.equal(loaded.model.heads["toy"].score.weight, model.heads["toy"].score.weight)


def test_a_checkpoint_records_its_heads_and_one_without_them_is_refused(tmp_path):
    """config.json names the task heads (every checkpoint of this format writes them); one without
    is damaged, refused in one line rather than given a guessed pair of heads."""
    from convsts.io.errors import BadInputError
    from convsts.models.checkpoint import write_manifest

    cfg = load_config(None, TINY)
    model = build_model(cfg.model, _tokenizer(cfg))
    save_checkpoint(tmp_path / "c", model, _tokenizer(cfg), {})
    loaded = load(tmp_path / "c")
    assert set(loaded.model.heads) == {"reddit", "snli"} and loaded.encode(["a man plays"]).shape == (1, 6)
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    del meta["heads"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    write_manifest(tmp_path / "c")  # written whole so, as by another program: the manifest matches
    with pytest.raises(BadInputError, match="config.json: no task heads recorded; the checkpoint is damaged"):
        load(tmp_path / "c")


def test_the_run_seed_sets_initial_weights_and_batch_order():
    cfg = load_config(None, TINY)
    tok = _tokenizer(cfg)

    def weights(seed):
        seed_everything(seed)
        return build_model(cfg.model, tok).encoder.dnn[0].weight.detach().clone()

    assert torch.equal(weights(1), weights(1)) and not torch.equal(weights(1), weights(2))
    task = get_task("reddit")
    first = [next(FrameStream(task, REDDIT, tok, 8, 16, seed=s))["context__words"] for s in (1, 1, 2)]
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])


def test_toy_task_prepare_uses_the_default_reader(ray_session, tmp_path):
    toy_task.rows().to_json(tmp_path / "toy.jsonl", orient="records", lines=True)
    cfg = load_config(
        None,
        [
            "task_modules=[testkit.toy_task]",
            "trainer.task_weights={toy: 1.0}",
            f"data.task_inputs={{toy: [{tmp_path / 'toy.jsonl'}]}}",
        ],
    )
    task = get_task("toy", cfg.task_modules)
    from convsts.ray_jobs.cli.prepare import build_parser

    # Overrides may follow the options on the command line, as for every other command.
    args = build_parser().parse_intermixed_args(["toy", "--out", "X", "task_modules=[testkit.toy_task]"])
    assert args.what == "toy" and args.overrides == ["task_modules=[testkit.toy_task]"]
    manifest = task.prepare(task.raw_inputs(cfg), task.prepared_dir(str(tmp_path / "prepared")), cfg)
    assert manifest["pairs"] == 64
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "prepared" / "toy" / "train").to_pandas()
    assert set(table.columns) >= {"left", "right", "same"} and len(table) == 64


def test_every_checkpoint_carries_the_latest_in_training_score():
    """With in-training evaluation on, each checkpoint report names the STS-B dev score it is
    ranked by (Ray keeps the best ones): the latest evaluation's, or the floor before the first."""
    from convsts.ray_jobs.training.loop import NOT_EVALUATED, SCORE_METRIC

    cfg = load_config(
        None,
        TINY
        + [
            "trainer.task_weights={reddit: 1.0}",
            "trainer.steps=6",
            "trainer.checkpoint_every=1",
            "trainer.eval_every=2",
            "trainer.stages=[{start_step: 0, batch_size: 4, lr: 0.01}]",
        ],
    )
    scores = iter([0.5, 0.7, 0.6])
    reported = {}
    hooks = LoopHooks(
        checkpoint=lambda step, metrics, state: reported.update({step: metrics[SCORE_METRIC]}),
        evaluate=lambda model: {SCORE_METRIC: next(scores)},
        progress=lambda line: None,
    )
    loop, _, _ = _loop(cfg, hooks=hooks)
    loop.run()
    assert reported == {1: NOT_EVALUATED, 2: 0.5, 3: 0.5, 4: 0.7, 5: 0.7, 6: 0.6}


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_lr_warms_up_then_decays_toward_zero_at_the_last_step(decay):
    from convsts.ray_jobs.config.schema import StageConfig

    schedule = StageSchedule(
        [StageConfig(0, 8, 1.0), StageConfig(60, 16, 0.5)], warmup_steps=10, decay=decay, total=110
    )
    assert schedule.lr_at(0) == pytest.approx(0.1) and schedule.lr_at(9) == pytest.approx(1.0)  # warm-up
    assert schedule.lr_at(10) == pytest.approx(1.0)  # decay starts after warm-up
    middle = 0.5 if decay == "linear" else 0.5 * (1 + math.cos(math.pi * 0.5))
    assert schedule.lr_at(60) == pytest.approx(0.5 * middle)  # a factor on the second stage's lr
    assert schedule.lr_at(109) < 0.01 and schedule.lr_at(110) == pytest.approx(0.0)
    lrs = [schedule.lr_at(s) for s in range(10, 60)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # never rises within a stage
    assert StageSchedule([StageConfig(0, 8, 1.0)], 0, "none", 100).lr_at(99) == 1.0


def test_symmetric_loss_is_a_model_setting_that_reaches_the_reddit_loss_and_the_checkpoint(tmp_path):
    cfg = load_config(None, TINY + ["model.symmetric_loss=true"])
    tokenizer = _tokenizer(cfg)
    seed_everything(0)
    model = build_model(cfg.model, tokenizer, model_heads(cfg))
    model.heads["reddit"].net[-1].weight.data.normal_()  # a response side that is not the identity
    task = get_task("reddit")
    batch = next(iter(FrameStream(task, REDDIT, tokenizer, 8, 16)))
    loss, _ = task.loss(model, batch)
    context, response = model.encode_both(fields(batch, "context"), fields(batch, "response"))  # (8, D) each
    response = model.heads["reddit"](response)  # (8, D)
    scale = cfg.model.score_scale
    assert loss.item() == pytest.approx(in_batch_softmax_loss(context, response, scale, symmetric=True).item())
    assert loss.item() != pytest.approx(in_batch_softmax_loss(context, response, scale).item())
    save_checkpoint(tmp_path / "c", model, tokenizer, cfg.to_dict())
    assert load(tmp_path / "c").model.config.symmetric_loss is True
    assert load_config(None, TINY).model.symmetric_loss is False  # the paper's one-way loss by default
