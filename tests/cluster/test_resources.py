"""Node-by-node resource checks (ray_jobs/runtime/resources.py) and where each run keeps its checkpoints
(training/lineage.py: run_storage): the Ray-free rules behind the cluster tests."""

from pathlib import Path

import pytest

from convsts.io.errors import ConfigError
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.resources import Ask, check_training_fits, trials_at_once, unplaced
from convsts.ray_jobs.training.lineage import run_storage

REPO = Path(__file__).resolve().parents[2]


def test_requests_are_placed_whole_on_one_node():
    # 2.3 free CPUs over three nodes hold no 1-CPU worker: it would wait forever.
    left, _ = unplaced([{"CPU": 0.9}, {"CPU": 0.4}, {"CPU": 0.4}], [Ask("task worker", 1.0)])
    assert left == [Ask("task worker", 1.0)]
    # Largest first, each on the node with the least room that holds it: 3 + 1 + 1 on nodes of 4 and 1.
    left, room = unplaced([{"CPU": 4.0}, {"CPU": 1.0}], [Ask("a", 1.0), Ask("b", 3.0), Ask("c", 1.0)])
    assert left == [] and sorted(r["CPU"] for r in room) == [0.0, 0.0]
    # A GPU worker needs its GPU and its CPUs on the same node.
    left, _ = unplaced([{"CPU": 8.0}, {"CPU": 8.0, "GPU": 1.0}], [Ask("w", 4.0, 1.0), Ask("w", 4.0, 1.0)])
    assert len(left) == 1


def test_a_training_layout_that_fits_no_node_is_refused_in_one_line():
    gpu = load_config(REPO / "configs" / "transformer_gpu.yaml", ["trainer.use_gpu=false"])
    with pytest.raises(ConfigError) as refused:  # a worker of 2 CPUs on a 1-CPU machine
        check_training_fits(gpu, [{"CPU": 1.0}])
    message = str(refused.value)
    assert "\n" not in message and "1 node(s): 1 CPU" in message and "trainer.cpus_per_worker" in message
    assert check_training_fits(gpu, [{"CPU": 2.0}]) == 1  # the worker reads its own data: nothing else asks
    check_training_fits(gpu, [{"CPU": 16.0}])
    with pytest.raises(ConfigError, match="trainer.use_gpu=false"):
        check_training_fits(load_config(REPO / "configs" / "transformer_gpu.yaml"), [{"CPU": 16.0}])
    check_training_fits(load_config(REPO / "configs" / "transformer_gpu.yaml"), [{"CPU": 16.0, "GPU": 1.0}])
    # The default layout (2 x 0.5 CPU) fits one 1-CPU machine, but not three 0.4-CPU nodes.
    default = load_config(None)
    check_training_fits(default, [{"CPU": 1.0}])
    with pytest.raises(ConfigError, match="3 node"):
        check_training_fits(default, [{"CPU": 0.4}, {"CPU": 0.4}, {"CPU": 0.4}])
    # The paper-scale cluster (cluster/aws-gpu.yaml: 20 nodes of 8 CPUs and one GPU) holds its config.
    paper = load_config(REPO / "configs" / "paper_scale.yaml")
    check_training_fits(paper, [{"CPU": 0.0}] + [{"CPU": 8.0, "GPU": 1.0}] * 20)
    with pytest.raises(ConfigError):
        check_training_fits(paper, [{"CPU": 8.0, "GPU": 1.0}] * 19)


def test_worker_resources_keep_the_workers_on_the_nodes_that_have_them():
    # trainer.worker_resources: a custom resource each worker asks for, e.g. only the training nodes
    # (`ray start --resources='{"trainer_node": 1}'`) hold workers; the others' CPUs go to the feed.
    cfg = load_config(
        None, ["trainer.num_workers=2", "trainer.cpus_per_worker=1", "trainer.worker_resources={trainer_node: 1}"]
    )
    feed_node, training_node = {"CPU": 8.0}, {"CPU": 2.0, "trainer_node": 2.0}
    assert check_training_fits(cfg, [feed_node, training_node]) == 2
    with pytest.raises(ConfigError) as refused:  # 1 trainer_node: the second worker would wait forever
        check_training_fits(cfg, [feed_node, {"CPU": 2.0, "trainer_node": 1.0}])
    message = str(refused.value)
    assert "\n" not in message and "x 1 CPU + 1 trainer_node" in message, message
    assert "2 node(s): 8 CPU, 2 CPU + 1 trainer_node" in message and "trainer.worker_resources" in message
    with pytest.raises(ConfigError, match="trainer_node"):  # nor does a sweep's trial fit
        trials_at_once(cfg, [feed_node, {"CPU": 2.0, "trainer_node": 1.0}])
    assert trials_at_once(cfg, [feed_node, {"CPU": 4.0, "trainer_node": 4.0}]) == 2
    for bad, rule in (("{CPU: 1}", "a custom resource"), ("{trainer_node: 0}", "finite and > 0")):
        with pytest.raises(ConfigError, match=rule):
            load_config(None, [f"trainer.worker_resources={bad}"])


def test_strict_spread_that_only_the_strategy_refuses_names_the_strategy():
    strict = load_config(None, ["trainer.placement_strategy=STRICT_SPREAD", "trainer.num_workers=3"])
    with pytest.raises(ConfigError) as refused:  # 3 workers, 2 nodes: lowering the CPUs cannot help
        check_training_fits(strict, [{"CPU": 4.0}, {"CPU": 4.0}])
    message = str(refused.value)
    assert "\n" not in message and "trainer.placement_strategy=SPREAD" in message
    assert "trainer.cpus_per_worker" not in message
    check_training_fits(strict, [{"CPU": 4.0}] * 3)  # a node each
    loose = load_config(None, ["trainer.num_workers=3"])  # SPREAD shares a node once all are used
    check_training_fits(loose, [{"CPU": 4.0}, {"CPU": 4.0}])
    # Too few CPUs anywhere: the resource advice, as for any strategy.
    with pytest.raises(ConfigError, match="trainer.cpus_per_worker"):
        check_training_fits(strict, [{"CPU": 0.2}] * 4)


def test_trials_at_once_counts_whole_trials_per_node():
    cfg = load_config(None, ["trainer.cpus_per_worker=0.4"])  # a trial: 0.1 + 2 x 0.4 = 0.9 CPUs
    assert trials_at_once(cfg, [{"CPU": 1.0}]) == 1
    assert trials_at_once(cfg, [{"CPU": 2.0}]) == 2
    assert trials_at_once(cfg, [{"CPU": 8.0}]) == 8
    assert trials_at_once(cfg, [{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 1.0}]) == 5
    # Each request is placed whole on one node: two nodes of 0.45 CPU hold the trial function and
    # one worker, and the second worker waits forever, so the sweep is refused, in one line.
    with pytest.raises(ConfigError, match="does not fit") as refused:
        trials_at_once(cfg, [{"CPU": 0.45}, {"CPU": 0.45}])
    assert "\n" not in str(refused.value)
    # The cluster of tests/cluster/multinode/ (1 CPU on each of 4 nodes) holds two default trials at a
    # time (0.1 + 2 x 0.5 CPU each).
    assert trials_at_once(load_config(None), [{"CPU": 1.0}] * 4) == 2
    assert trials_at_once(load_config(None), [{"CPU": 2.0}]) == 1


def test_every_run_owns_its_checkpoint_location(tmp_path):
    cfg = load_config(None)
    assert run_storage(cfg, tmp_path) == (str(tmp_path / "ray_results"), cfg.name)  # OUT holds one run
    # A run that resumes another into the same OUT has a folder of its own (else Ray restores that one's).
    assert run_storage(cfg, tmp_path, "k1") == (str(tmp_path / "ray_results"), f"{cfg.name}-k1")
    shared = load_config(None, ["trainer.storage_path=s3://bucket/convsts", "name=paper"])
    first, second = run_storage(shared, tmp_path), run_storage(shared, tmp_path)
    assert first[0] == second[0] == "s3://bucket/convsts/paper"
    assert first[1] != second[1]  # a second run with the same name never restores the first's checkpoints
    # A trial's key is its own id: its retries and a resumed sweep find its checkpoints, and only those.
    assert run_storage(shared, tmp_path, "a1b2c_00001") == ("s3://bucket/convsts/paper", "a1b2c_00001")
    assert run_storage(shared, tmp_path, "a1b2c_00001") != run_storage(shared, tmp_path, "a1b2c_00002")


def test_placement_strategy_is_checked():
    assert load_config(None).trainer.placement_strategy == "SPREAD"
    assert load_config(None, ["trainer.placement_strategy=PACK"]).trainer.placement_strategy == "PACK"
    with pytest.raises(ConfigError, match="trainer.placement_strategy"):
        load_config(None, ["trainer.placement_strategy=ANYWHERE"])


@pytest.mark.parametrize("name", ["../elsewhere", "/some/folder", "a/b", "..", ".hidden", "-x"])
def test_a_run_name_is_a_plain_name_not_a_path(name):
    # The name is joined under OUT/ray_results and the storage path, which --fresh empties: before,
    # `--fresh name=/some/folder` removed /some/folder.
    with pytest.raises(ConfigError, match="name: a plain name"):
        load_config(None, [f"name={name}"])
    assert load_config(None, ["name=paper-scale_v2.1"]).name == "paper-scale_v2.1"
