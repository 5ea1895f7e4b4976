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
