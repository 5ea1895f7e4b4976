import subprocess
import sys


def test_unknown_config_key_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.cli", "train", "--out", str(tmp_path), "trainer.stepz=1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "trainer.stepz" in proc.stderr


def test_help_lists_commands():
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.cli"], capture_output=True, text=True)
    assert proc.returncode == 0
    for name in ("prepare", "train", "evaluate", "tune", "submit", "jobs", "demo"):
        assert f"  {name} " in proc.stdout
        # Each command is also `python -m ray_jobs.<name>`, what a Ray job's entrypoint runs.
        sub = subprocess.run([sys.executable, "-m", f"ray_jobs.{name}", "--help"], capture_output=True, text=True)
        assert sub.returncode == 0 and f"convsts {name}" in sub.stdout, (name, sub.stderr)


def test_imports_have_no_side_effects(tmp_path):
    """Importing every package creates no files and sets no tracking URI or logging handlers."""
    code = ("import logging, os, mlflow; import datasets, models, ray_jobs.train, ray_jobs.evaluate, ray_jobs.demo, ray_jobs.tune, ray_jobs.submit, ray_jobs.jobs, tune_spaces.sts_matrix, tune_spaces.snli_fraction;"
            "print(len(logging.getLogger().handlers), os.environ.get('MLFLOW_TRACKING_URI'), sorted(os.listdir('.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 None []"


def test_unknown_tune_space_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.cli", "tune", "--space", "nope", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown tune space 'nope'" in proc.stderr


def test_version_and_print_config():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "ray_jobs.cli", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"convsts {version('convsts')}"
    proc = subprocess.run([sys.executable, "-m", "ray_jobs.cli", "train", "--print-config", "--config",
                           "configs/demo_dan.yaml", "trainer.steps=7",
                           "mlflow.tracking_uri=http://alice:s3cret@mlflow.example:5000"],
                          capture_output=True, text=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    assert proc.returncode == 0, proc.stderr
    import yaml

    printed = yaml.safe_load(proc.stdout)
    assert printed["trainer"]["steps"] == 7 and printed["model"]["encoder"] == "dan"
    assert "s3cret" not in proc.stdout and "mlflow.example" in printed["mlflow"]["tracking_uri"]


def test_submit_takes_its_own_options_after_the_job_name():
    from ray_jobs.submit import build_parser, own_options_first

    for argv in (["train", "--config", "C", "--address", "http://head:8265", "--out", "D"],
                 ["--address", "http://head:8265", "train", "--config", "C", "--out", "D"],
                 ["train", "--config", "C", "--out", "D", "--address=http://head:8265"]):
        args = build_parser().parse_args(own_options_first(argv))
        assert args.address == "http://head:8265" and args.job == "train", argv
        assert args.args == ["--config", "C", "--out", "D"], argv
    args = build_parser().parse_args(own_options_first(["evaluate", "--no-wait", "--checkpoint", "C", "--out", "E"]))
    assert args.no_wait and args.args == ["--checkpoint", "C", "--out", "E"]


def test_jobs_takes_address_before_or_after_the_action():
    from ray_jobs.jobs import build_parser

    assert build_parser().parse_args(["list", "--address", "http://h:8265"]).address == "http://h:8265"
    assert build_parser().parse_args(["--address", "http://h:8265", "list"]).address == "http://h:8265"
    assert build_parser().parse_args(["logs", "J", "--address", "http://h:8265"]).address == "http://h:8265"
    assert build_parser().parse_args(["list"]).address is None
