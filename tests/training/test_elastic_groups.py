"""Elastic task groups (trainer.num_workers=[MIN, MAX]), the Ray-free parts: the config's rules, the
check that MIN fits and how many fit now, the task split and data positions at a new size, the
generators seeded for it, and the one line a resize prints. tests/cluster/elastic/test_elastic.py runs
a real elastic group on a multi-node cluster."""

from pathlib import Path

import pytest
import torch

from convsts.io.errors import ConfigError
from convsts.models.checkpoint import TrainState
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.resources import check_training_fits, workers_that_fit
from convsts.ray_jobs.training.loop import WORKERS_METRIC, saved_plan
from convsts.ray_jobs.training.task_groups import SplitMode, plan_for
from convsts.ray_jobs.training.train_state import positions_of, repeated_rows, set_rng_state
from convsts.ray_jobs.training.worker import own_logged, previous_size, ray_restart, resize_line

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo_dan.yaml"


def test_num_workers_is_one_number_or_min_max_and_each_refusal_is_one_line():
    fixed = load_config(DEMO, ["trainer.num_workers=3"]).trainer
    assert (fixed.worker_range, fixed.elastic, fixed.ray_num_workers(), fixed.workers_text()) == ((3, 3), False, 3, "3")
    elastic = load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.resize_interval_s=5"]).trainer
    assert (elastic.worker_range, elastic.elastic, elastic.ray_num_workers()) == ((1, 3), True, (1, 3))
    assert elastic.workers_text() == "1-3" and elastic.resize_interval_s == 5
    same = load_config(DEMO, ["trainer.num_workers=[2,2]"]).trainer  # MIN == MAX: a fixed group
    assert (same.elastic, same.ray_num_workers()) == (False, 2)
    refused = {
        "trainer.num_workers=[3,1]": "[MIN, MAX] with 1 <= MIN <= MAX",
        "trainer.num_workers=[0,2]": "[MIN, MAX] with 1 <= MIN <= MAX",
        "trainer.num_workers=[1,2,3]": "[MIN, MAX]",
        "trainer.num_workers=0": "a whole number >= 1",
        "trainer.resize_interval_s=0": "trainer.resize_interval_s",
    }
    for override, words in refused.items():
        with pytest.raises(ConfigError) as err:
            load_config(DEMO, [override])
        assert words in str(err.value) and "\n" not in str(err.value), (override, str(err.value))
    # What an elastic group cannot be, each in one line naming the key.
    with pytest.raises(ConfigError, match="trainer.num_workers.*one number with trainer.task_split=async"):
        load_config(DEMO, ["trainer.num_workers=[2,4]", "trainer.task_split=async"])
    with pytest.raises(ConfigError, match="trainer.task_workers.*elastic"):
        load_config(DEMO, ["trainer.num_workers=[2,4]", "trainer.task_workers={reddit: 3, snli: 1}"])
    # Every size from MIN to MAX gives each task a rank, or is 1 (one rank draws each step's task).
    load_config(DEMO, ["trainer.num_workers=[1,2]"])
    three_tasks = ["task_modules=[testkit.toy_task]", "trainer.task_weights={reddit: 0.9, snli: 0.05, toy: 0.05}"]
    load_config(DEMO, [*three_tasks, "trainer.num_workers=[3,5]"])
    for sizes in ("[1,3]", "[2,4]"):
        with pytest.raises(ConfigError, match="at least one per task .3. at every size from MIN to MAX"):
            load_config(DEMO, [*three_tasks, f"trainer.num_workers={sizes}"])


def test_the_check_places_min_workers_and_says_how_many_fit_now_with_every_cpu_a_workers():
    """A worker reads its own data, so a group may take every CPU: the issue's layouts that starved
    Ray Data's reads (a head of 2 CPUs and two 1-CPU nodes at [1,3] x 1 CPU; a head of 1 CPU and
    three 2-CPU nodes) are accepted, and so is any cluster their node losses leave."""
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.cpus_per_worker=1"])
    nodes = [{"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert check_training_fits(cfg, nodes) == 3
    assert check_training_fits(cfg, nodes[:2]) == 3  # a node lost: 3 workers fill the 3 CPUs left
    assert check_training_fits(cfg, nodes[:1]) == 2  # down to the head
    assert check_training_fits(cfg, [{"CPU": 1.0}, *[{"CPU": 2.0}] * 3]) == 3
    two = load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.cpus_per_worker=2"])
    assert check_training_fits(two, [{"CPU": 2.0}, {"CPU": 2.0}]) == 2
    assert check_training_fits(two, [{"CPU": 1.0}, {"CPU": 2.0}]) == 1
    assert workers_that_fit(two, [{"CPU": 16.0}]) == 3
    with pytest.raises(ConfigError) as err:  # MIN does not fit: refused, naming MIN
        check_training_fits(
            load_config(DEMO, ["trainer.num_workers=[2,4]", "trainer.cpus_per_worker=2"]), [{"CPU": 3.0}]
        )
    assert "the elastic group's MIN, 2," in str(err.value) and "\n" not in str(err.value)
    fixed = load_config(DEMO, ["trainer.num_workers=2", "trainer.cpus_per_worker=1"])
    assert check_training_fits(fixed, [{"CPU": 2.0}]) == 2
    gpu = load_config(DEMO, ["trainer.num_workers=[1,4]", "trainer.use_gpu=true", "trainer.cpus_per_worker=4"])
    assert check_training_fits(gpu, [{"CPU": 8.0, "GPU": 1.0}] * 3) == 3  # one worker per GPU


def test_each_size_is_planned_with_the_same_rules():
    trainer = load_config(DEMO, ["trainer.num_workers=[1,20]"]).trainer
    modes = {n: plan_for(trainer, n).mode for n in (1, 2, 3, 20)}
    assert modes == {
        1: SplitMode.TASK_SAMPLING,
        2: SplitMode.GRADIENT_WEIGHTING,
        3: SplitMode.GRADIENT_WEIGHTING,
        20: SplitMode.HEAD_COUNT,
    }
    for n in (2, 3, 20):  # the encoder update's mix is the weights at every size
        plan = plan_for(trainer, n)
        mix = {t: sum(plan.encoder_grad_scale(r) for r in plan.ranks_of(t)) for t in plan.tasks}
        assert mix == pytest.approx({"reddit": 0.95, "snli": 0.05}, abs=0.01), (n, mix)


def _state(world: int, positions: list[dict], step: int = 480) -> TrainState:
    rng = [{"cpu": torch.get_rng_state()} for _ in range(world)]
    return TrainState(step, positions=positions, world_size=world, rng=rng)


def test_positions_follow_the_ranks_the_checkpoint_records_not_a_plan_rebuilt_from_todays_settings():
    """A state keeps each task's ranks in the group that wrote it: a resume whose plan maps other
    ranks to the tasks (other task workers, another size) takes each task's position (the rows of
    its epoch read) from the ranks that read it, never another task's rank; a state without them
    (older) rebuilds the plan."""
    cfg = load_config(DEMO, ["trainer.num_workers=3"])
    reddit = {"epoch": 2, "rows": 960, "batch_size": 32, "ranks": 1}
    snli = {"epoch": 5, "rows": 512, "batch_size": 32, "ranks": 2}
    # Written with trainer.task_workers={reddit: 1, snli: 2}: reddit on rank 0, snli on ranks 1-2.
    state = _state(3, [{"reddit": reddit}, {"snli": snli}, {"snli": snli}])
    state.task_ranks = {"reddit": [0], "snli": [1, 2]}
    three = plan_for(cfg.trainer, 3)  # today's plan at 3: reddit on ranks 0-1, snli on rank 2
    assert three.ranks_of("reddit") == [0, 1] and three.ranks_of("snli") == [2]
    assert positions_of(state, 0, three, three) == {"reddit": reddit}  # the task's rows, at any ranks
    assert positions_of(state, 1, three, three) == {"reddit": reddit}
    assert positions_of(state, 2, three, three) == {"snli": snli}
    # The same ranks for the same tasks: each rank's own position, as it was.
    same = TrainState.from_dict({**state.to_dict(), "task_ranks": {"reddit": [0, 1], "snli": [2]}})
    same.positions = [{"reddit": reddit}, {"reddit": {**reddit, "rows": 992}}, {"snli": snli}]
    assert positions_of(same, 1, three, three) == {"reddit": {**reddit, "rows": 992}}
    # A state written before task_ranks was kept reads as the plan rebuilt from the settings.
    older = TrainState.from_dict({k: v for k, v in same.to_dict().items() if k != "task_ranks"})
    assert older.task_ranks == {} and positions_of(older, 1, three, saved_plan(cfg, older, three)) == {
        "reddit": {**reddit, "rows": 992}
    }
    # A position written as batches read (before positions were rows): its task's ranks' batches.
    batches = _state(3, [{"reddit": {"epoch": 2, "batch_in_epoch": 15, "batch_size": 32}}, {"snli": snli}, {}])
    batches.task_ranks = {"reddit": [0], "snli": [1]}
    assert positions_of(batches, 0, three, three) == {"reddit": {"epoch": 2, "rows": 480, "batch_size": 32}}


def test_a_checkpoint_of_another_size_gives_each_rank_its_tasks_position_and_seeded_generators():
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]"])
    # Written by 3 ranks (reddit 0-1, snli 2), every rank of a task at the same position.
    reddit = {"epoch": 2, "rows": 1920, "batch_size": 32, "ranks": 2}
    snli = {"epoch": 5, "rows": 224, "batch_size": 32, "ranks": 1}
    state = _state(3, [{"reddit": reddit}, {"reddit": reddit}, {"snli": snli}])
    three = plan_for(cfg.trainer, 3)
    assert saved_plan(cfg, state, three) is three
    assert positions_of(state, 1, three, three) == {"reddit": reddit}  # the same size: its own
    # At 2 ranks (reddit 0, snli 1) and at 1 (each step's task drawn: both on rank 0), each task
    # goes on from the rows its ranks had read together.
    two = plan_for(cfg.trainer, 2)
    before = saved_plan(cfg, state, two)
    assert before.ranks_of("reddit") == [0, 1]
    assert positions_of(state, 0, two, before) == {"reddit": reddit}
    assert positions_of(state, 1, two, before) == {"snli": snli}
    one = plan_for(cfg.trainer, 1)
    assert positions_of(state, 0, one, saved_plan(cfg, state, one)) == {"reddit": reddit, "snli": snli}
    # Ranks of a task that went at their own pace (the async split): the earliest, so none is skipped.
    ahead = _state(3, [{"reddit": reddit}, {"reddit": {**reddit, "rows": 2048}}, {"snli": snli}])
    assert positions_of(ahead, 0, one, saved_plan(cfg, ahead, one))["reddit"] == reddit
    # ... and the rows its faster rank had read come again, said in one line (the task's leader says it).
    assert repeated_rows(ahead, one, saved_plan(cfg, ahead, one)) == {
        "reddit": "reddit: its 2 ranks had gone at their own pace (the async split) and it goes on at 1 from its "
        "slowest rank's row 1920 of epoch 2's order: the rows from there to row 2048, which its faster ranks had "
        "read in part, are read again"
    }
    assert repeated_rows(ahead, three, three) == {}  # the same ranks: each goes on from its own
    assert repeated_rows(state, one, saved_plan(cfg, state, one)) == {}  # ranks that drew together
    # Generators: each rank's own at the same size, seeded from (seed, step, rank) at another, the
    # same on every restart at that size and different between ranks.
    assert state.rng_of(2, 3, cfg.seed) is state.rng[2]
    draws = []
    for rank in (0, 0, 1):
        set_rng_state(state.rng_of(rank, 2, cfg.seed))
        draws.append(torch.rand(3))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_a_resize_is_one_line_saying_from_to_why_and_the_split():
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]"])
    lost = resize_line(3, plan_for(cfg.trainer, 2), 480, by_ray=True)
    assert lost.startswith("[convsts rank 0] worker group resized from 3 to 2 at step 480 (fewer workers fit")
    assert "task split mode=gradient_weighting" in lost and "\n" not in lost
    grew = resize_line(1, plan_for(cfg.trainer, 2), 520, by_ray=True)
    assert "from 1 to 2 at step 520 (more workers fit: Ray's resize check found room)" in grew
    resumed = resize_line(2, plan_for(cfg.trainer, 3), 40, by_ray=False)
    assert "(this run's trainer.num_workers)" in resumed


def test_a_group_started_again_before_its_first_checkpoint_is_a_restart_that_knows_its_last_size(mlflow_uri):
    """Ray Train starts a group again without a checkpoint when it loses a worker before the first
    one: the run's own steps are already logged (the group's size with each), so this start is a
    restart from step 0 that follows a group of that size; a first start's run holds only what the
    driver logged before the fit."""
    from convsts.ray_jobs.tracking import runs as tracking

    client = tracking.client(mlflow_uri)
    experiment = client.create_experiment("restart-before-checkpoint")
    run_id = client.create_run(experiment).info.run_id
    loop_config = {"tracking_uri": mlflow_uri, "run_id": run_id}
    tracking.log_metrics(mlflow_uri, run_id, {"data/reddit_train_pairs": 100})  # the driver's, before the fit
    assert not ray_restart(own_logged(loop_config), checkpoint=None)
    assert previous_size(loop_config, None, restarted=False) is None
    tracking.log_metrics(mlflow_uri, run_id, {WORKERS_METRIC: 3, "reddit/loss": 4.8}, 10)  # the first group's step
    assert ray_restart(own_logged(loop_config), checkpoint=None)
    assert previous_size(loop_config, None, restarted=True) == 3
    assert ray_restart({}, checkpoint=object())  # from a checkpoint Ray registered


def test_a_sweep_with_an_elastic_group_is_refused_in_one_line_before_any_work(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "convsts", "tune", "--space", "snli_fraction", "--config", str(DEMO),
         "--out", str(tmp_path / "sweep"), "trainer.num_workers=[1,2]"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("convsts ")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "trainer.num_workers=[1, 2]: a sweep's trials are fixed-size groups" in lines[0]
    assert not (tmp_path / "sweep" / "sweep.json").exists()


def test_a_restart_sets_the_modes_tag_for_its_size_and_says_which_steps_it_replays(mlflow_uri, capfd):
    """The task_split_mode tag follows the group's size at every start; a restart from a checkpoint
    behind the run's last logged step says which steps it replays without logging them again."""
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.training.worker import _announce

    cfg = load_config(DEMO, ["trainer.num_workers=[1,2]"])
    client = tracking.client(mlflow_uri)
    run_id = client.create_run(client.create_experiment("replayed-steps")).info.run_id
    loop_config = {"tracking_uri": mlflow_uri, "run_id": run_id}
    _announce(loop_config, plan_for(cfg.trainer, 2), 2, "cpu", 0, restarted=False, own={})
    assert client.get_run(run_id).data.tags["task_split_mode"] == "gradient_weighting"
    tracking.log_metrics(mlflow_uri, run_id, {WORKERS_METRIC: 2, "reddit/loss": 4.8}, 60)
    _announce(loop_config, plan_for(cfg.trainer, 1), 1, "cpu", 40, restarted=True, own=own_logged(loop_config))
    assert client.get_run(run_id).data.tags["task_split_mode"] == "task_sampling"
    lines = capfd.readouterr().out.splitlines()
    assert lines[-1] == (
        "[convsts rank 0] steps 41-60 are replayed from step 40; the run logged them before, so they are not "
        "logged again (train/workers there stays the earlier group's size)"
    )
