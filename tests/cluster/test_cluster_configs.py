"""cluster/ and the job-submission helpers: every YAML parses, has what Ray / KubeRay require, and
pins the same versions as the project."""

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from convsts.ray_jobs.cli.submit import job_address
from convsts.ray_jobs.config.loader import load_config
from convsts.ray_jobs.runtime.job_api import build_runtime_env, entrypoint
from convsts.ray_jobs.training.task_groups import plan_tasks

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster"


def project_pins():
    """The pins a cluster job installs: the project's dependencies and its `pretrained` extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["pretrained"]
    pins = {}
    for dep in deps:
        name, version = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^;\s]+)", dep).groups()
        pins[name.lower()] = version
    return pins


def pins_in(text):
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"\b([A-Za-z0-9_.-]+)==([0-9][^\"'\s,\]]*)", text)}


def test_every_yaml_parses():
    files = sorted(CLUSTER.glob("*.yaml")) + sorted((REPO / "configs").glob("*.yaml"))
    assert {f.name for f in files} >= {"aws-gpu.yaml", "rayjob.yaml", "runtime_env.yaml", "runtime_env.pip.yaml"}
    for f in files:
        assert isinstance(yaml.safe_load(f.read_text()), dict), f


def test_launcher_yaml_has_the_keys_ray_requires_and_project_pins():
    cfg = yaml.safe_load((CLUSTER / "aws-gpu.yaml").read_text())
    for key in (
        "cluster_name",
        "max_workers",
        "provider",
        "auth",
        "available_node_types",
        "head_node_type",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    ):
        assert key in cfg, key
    assert cfg["provider"]["type"] == "aws" and cfg["provider"]["region"]
    assert cfg["head_node_type"] in cfg["available_node_types"]
    for name, node in cfg["available_node_types"].items():
        assert "node_config" in node and "resources" in node, name
        if name != cfg["head_node_type"]:
            assert node["max_workers"] <= cfg["max_workers"]
    pins = project_pins()
    assert cfg["docker"]["image"].startswith(f"rayproject/ray:{pins['ray']}-")
    installed = pins_in(" ".join(cfg["setup_commands"]))
    assert installed == {k: v for k, v in pins.items() if k != "ray"}  # Ray comes from the pinned image
    assert (
        "nightly" not in (CLUSTER / "aws-gpu.yaml").read_text() and "git+" not in (CLUSTER / "aws-gpu.yaml").read_text()
    )


def test_rayjob_manifest():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob" and job["metadata"]["name"]
    spec = job["spec"]
    assert spec["entrypoint"].startswith("python -m convsts train ")
    pins = project_pins()
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == pins["ray"]
    head = cluster["headGroupSpec"]
    assert "rayStartParams" in head and head["template"]["spec"]["containers"]
    groups = cluster["workerGroupSpecs"]
    assert groups and all(
        g["groupName"] and "rayStartParams" in g and g["template"]["spec"]["containers"] for g in groups
    )
    images = [c["image"] for c in head["template"]["spec"]["containers"]]
    images += [c["image"] for g in groups for c in g["template"]["spec"]["containers"]]
    assert all(image.startswith(f"rayproject/ray:{pins['ray']}-") for image in images)
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert "working_dir" in runtime_env
    assert pins_in(" ".join(runtime_env["pip"]["packages"])) == {k: v for k, v in pins.items() if k != "ray"}
    # The config the entrypoint names exists, and 20 workers realise 95/5 by head count.
    config_path = re.search(r"--config (\S+)", spec["entrypoint"]).group(1)
    cfg = load_config(REPO / config_path)
    assert sum(g["replicas"] for g in groups) == cfg.trainer.num_workers
    assert plan_tasks(cfg.trainer.task_weights, cfg.trainer.num_workers).mode == "head_count"


def test_runtime_envs():
    pins = project_pins()
    plain = build_runtime_env(CLUSTER / "runtime_env.yaml")
    assert plain["working_dir"] == str(REPO) and "pip" not in plain
    assert {".venv", ".git", "runs"} <= set(plain["excludes"])
    with_pip = build_runtime_env(CLUSTER / "runtime_env.pip.yaml")
    assert pins_in(" ".join(with_pip["pip"]["packages"])) == {k: v for k, v in pins.items() if k != "ray"}
    assert with_pip["excludes"] == plain["excludes"]


def test_runtime_env_forwards_the_tracking_uri(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")
    assert build_runtime_env(None)["env_vars"]["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5001"


def test_entrypoint_and_address(monkeypatch):
    from convsts.ray_jobs.cli.commands import COMMANDS
    from convsts.ray_jobs.runtime.job_api import JOBS

    assert set(JOBS) <= set(COMMANDS)
    assert (
        entrypoint("train", ["--out", "/tmp/x y", "trainer.steps=5"])
        == "python -m convsts train --out '/tmp/x y' trainer.steps=5"
    )
    with pytest.raises(ValueError, match="unknown job 'nope'"):
        entrypoint("nope", [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert job_address(None) == "http://127.0.0.1:8265"
    assert job_address("10.0.0.5:8265") == "http://10.0.0.5:8265"
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    assert job_address(None) == "http://head:8265"
