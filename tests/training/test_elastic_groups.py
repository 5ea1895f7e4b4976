"""Elastic task groups (trainer.num_workers=[MIN, MAX]), the Ray-free parts: the config's rules, the
check that MIN fits and how many fit now, the task split and data positions at a new size, the
generators seeded for it, and the one line a resize prints. tests/cluster/elastic/test_elastic.py runs
a real elastic group on a multi-node cluster."""

from pathlib import Path

import pytest
import torch

from convsts.io.errors import ConfigError
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.resources import check_training_fits, clusters_left, elastic_size, workers_that_fit
from convsts.ray_jobs.training.loop import WORKERS_METRIC, saved_plan
from convsts.ray_jobs.training.task_groups import SplitMode, plan_for
from convsts.ray_jobs.training.train_state import TrainState, set_rng_state
from convsts.ray_jobs.training.worker import previous_size, ray_restart, resize_line

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


def test_the_check_places_min_workers_says_how_many_fit_now_and_keeps_ray_datas_cpu():
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.cpus_per_worker=2"])
    head, node = {"CPU": 1.0}, {"CPU": 2.0}  # the head keeps a CPU no 2-CPU worker fits in: Ray Data's
    assert check_training_fits(cfg, [head, node, node, node]) == 3
    assert check_training_fits(cfg, [head, node]) == 1
    assert workers_that_fit(cfg, [{"CPU": 16.0}]) == 3
    # Ray sizes an elastic group by the workers' requests alone: on nodes that the workers fill
    # exactly, the group would take the CPU Ray Data's reads need, which would wait forever.
    assert elastic_size(cfg, [node, node]) == 2
    with pytest.raises(ConfigError) as err:
        check_training_fits(cfg, [node, node])
    message = str(err.value)
    assert "would start 2 worker(s) x 2 CPU on the cluster's 2 node(s): 2 CPU, 2 CPU" in message
    assert "leaving no whole CPU for Ray Data's reads" in message and "\n" not in message
    # Once the other node is lost even one worker fills the head: no MAX helps, cpus_per_worker does.
    assert "lower MAX" not in message and "trainer.cpus_per_worker" in message


def test_an_elastic_group_is_refused_when_a_cluster_its_node_losses_leave_would_starve_ray_datas_reads():
    """Ray restarts an elastic group at the size that fits whatever nodes are left: every cluster
    that losses can leave (the head stays) is checked, not only the cluster at the start."""
    head = {"node:__internal_head__": 1.0}
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.cpus_per_worker=1"])
    # A head of 2 CPUs and two 1-CPU nodes: 3 workers leave Ray Data a CPU now, but a lost node
    # leaves 3 CPUs that the 3 workers fill; with MAX=1, every cluster left keeps a CPU.
    nodes = [{"CPU": 2.0, **head}, {"CPU": 1.0}, {"CPU": 1.0}]
    assert workers_that_fit(cfg, nodes) == 3
    with pytest.raises(ConfigError) as err:
        check_training_fits(cfg, nodes)
    message = str(err.value)
    assert (
        "would start 3 worker(s) x 1 CPU when 1 of the cluster's 3 nodes are lost (on the 2 node(s): 2 CPU, 1 CPU left)"
        in message
    )
    assert message.endswith("or lower MAX to 1") and "\n" not in message
    assert (
        check_training_fits(load_config(DEMO, ["trainer.num_workers=[1,1]", "trainer.cpus_per_worker=1"]), nodes) == 1
    )
    # The layout docs/cluster.md names (a head of 1 CPU, three 2-CPU nodes) with 1-CPU workers: two
    # nodes lost leave 3 CPUs that 3 workers fill; with 2-CPU workers the head's CPU is never a worker's.
    nodes = [{"CPU": 1.0, **head}, *[{"CPU": 2.0}] * 3]
    with pytest.raises(
        ConfigError, match=r"when 2 of the cluster's 4 nodes are lost \(on the 2 node\(s\): 1 CPU, 2 CPU left\)"
    ):
        check_training_fits(cfg, nodes)
    assert (
        check_training_fits(load_config(DEMO, ["trainer.num_workers=[1,3]", "trainer.cpus_per_worker=2"]), nodes) == 3
    )
    # The head is the node Ray marks as the head, wherever it is listed: the others may all go.
    assert [len(c) for c in clusters_left([{"CPU": 2.0}, {"CPU": 1.0, **head}, {"CPU": 2.0}])] == [3, 2, 1]
    assert clusters_left([{"CPU": 2.0}, {"CPU": 1.0, **head}]).__next__()[0]["CPU"] == 1.0
    with pytest.raises(ConfigError) as err:  # MIN does not fit: refused, naming MIN
        check_training_fits(
            load_config(DEMO, ["trainer.num_workers=[2,4]", "trainer.cpus_per_worker=2"]), [{"CPU": 3.0}]
        )
    assert "the elastic group's MIN, 2," in str(err.value) and "\n" not in str(err.value)
    fixed = load_config(DEMO, ["trainer.num_workers=2", "trainer.cpus_per_worker=1"])
    assert check_training_fits(fixed, [{"CPU": 8.0}]) == 2
    gpu = load_config(DEMO, ["trainer.num_workers=[1,4]", "trainer.use_gpu=true", "trainer.cpus_per_worker=4"])
    assert elastic_size(gpu, [{"CPU": 8.0, "GPU": 1.0}] * 3) == 3  # one worker per GPU, CPUs left over
    assert check_training_fits(gpu, [{"CPU": 8.0, "GPU": 1.0}] * 3) == 3


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
    ranks to the tasks (other task workers, another size) takes each task's position from the ranks
    that read it, never another task's rank; a state without them (older) rebuilds the plan."""
    cfg = load_config(DEMO, ["trainer.num_workers=3"])
    reddit, snli = (
        {"epoch": 2, "batch_in_epoch": 30, "batch_size": 32},
        {"epoch": 5, "batch_in_epoch": 8, "batch_size": 32},
    )
    # Written with trainer.task_workers={reddit: 1, snli: 2}: reddit on rank 0, snli on ranks 1-2.
    state = _state(3, [{"reddit": reddit}, {"snli": snli}, {"snli": snli}])
    state.task_ranks = {"reddit": [0], "snli": [1, 2]}
    three = plan_for(cfg.trainer, 3)  # today's plan at 3: reddit on ranks 0-1, snli on rank 2
    assert three.ranks_of("reddit") == [0, 1] and three.ranks_of("snli") == [2]
    assert state.positions_of(0, three, three) == {"reddit": {**reddit, "batch_in_epoch": 15}}
    assert state.positions_of(1, three, three) == {"reddit": {**reddit, "batch_in_epoch": 15}}
    assert state.positions_of(2, three, three) == {"snli": {**snli, "batch_in_epoch": 16}}
    # The same ranks for the same tasks: each rank's own position, as it was.
    same = TrainState.from_dict({**state.to_dict(), "task_ranks": {"reddit": [0, 1], "snli": [2]}})
    same.positions = [{"reddit": reddit}, {"reddit": {**reddit, "batch_in_epoch": 31}}, {"snli": snli}]
    assert same.positions_of(1, three, three) == {"reddit": {**reddit, "batch_in_epoch": 31}}
    # A state written before task_ranks was kept reads as the plan rebuilt from the settings.
    older = TrainState.from_dict({k: v for k, v in same.to_dict().items() if k != "task_ranks"})
    assert older.task_ranks == {} and older.positions_of(1, three, saved_plan(cfg, older, three)) == {
        "reddit": {**reddit, "batch_in_epoch": 31}
    }


def test_a_checkpoint_of_another_size_gives_each_rank_its_tasks_position_and_seeded_generators():
    cfg = load_config(DEMO, ["trainer.num_workers=[1,3]"])
    # Written by 3 ranks (reddit 0-1, snli 2), every rank of a task at the same position.
    reddit, snli = (
        {"epoch": 2, "batch_in_epoch": 30, "batch_size": 32},
        {"epoch": 5, "batch_in_epoch": 7, "batch_size": 32},
    )
    state = _state(3, [{"reddit": reddit}, {"reddit": reddit}, {"snli": snli}])
    three = plan_for(cfg.trainer, 3)
    assert saved_plan(cfg, state, three) is three
    assert state.positions_of(1, three, three) == {"reddit": reddit}  # the same size: its own
    # At 2 ranks (reddit 0, snli 1): reddit's one rank reads a split twice as long, as far in as
    # its two ranks had read together.
    two = plan_for(cfg.trainer, 2)
    before = saved_plan(cfg, state, two)
    assert before.ranks_of("reddit") == [0, 1]
    assert state.positions_of(0, two, before) == {"reddit": {**reddit, "batch_in_epoch": 60}}
    assert state.positions_of(1, two, before) == {"snli": snli}
    # At 1 rank (each step's task drawn): both tasks on rank 0.
    one = plan_for(cfg.trainer, 1)
    assert state.positions_of(0, one, saved_plan(cfg, state, one)) == {
        "reddit": {**reddit, "batch_in_epoch": 60},
        "snli": snli,
    }
    # Back up from 1 rank to 3: reddit's 2 ranks each read half of it in their halves.
    alone = _state(1, [{"reddit": {**reddit, "batch_in_epoch": 61}, "snli": snli}])
    assert alone.positions_of(1, three, saved_plan(cfg, alone, three)) == {"reddit": {**reddit, "batch_in_epoch": 30}}
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
    assert not ray_restart(loop_config, checkpoint=None)
    assert previous_size(loop_config, None, restarted=False) is None
    tracking.log_metrics(mlflow_uri, run_id, {WORKERS_METRIC: 3, "reddit/loss": 4.8}, 10)  # the first group's step
    assert ray_restart(loop_config, checkpoint=None)
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
