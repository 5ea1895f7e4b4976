import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_unknown_config_key_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "convsts", "train", "--out", str(tmp_path), "trainer.stepz=1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "trainer.stepz" in proc.stderr


@pytest.mark.slow  # a subprocess per command
def test_help_lists_commands():
    names = ("prepare", "train", "evaluate", "tune", "submit", "jobs", "demo")
    # Each command is also `python -m convsts <name>`, what a Ray job's entrypoint runs
    # (the subprocesses run side by side: each spends its time importing).
    subs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "convsts", name, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    }
    proc = subprocess.run([sys.executable, "-m", "convsts"], capture_output=True, text=True)
    assert proc.returncode == 0
    for name, sub in subs.items():
        assert f"  {name} " in proc.stdout
        out, err = sub.communicate(timeout=300)
        assert sub.returncode == 0 and f"convsts {name}" in out, (name, err)


def test_imports_have_no_side_effects(tmp_path):
    """Importing the commands and the library they load creates no files and sets no tracking URI or
    logging handlers."""
    code = (
        "import logging, os, mlflow; import convsts.datasets.reddit, convsts.models.sentence_encoder, "
        "convsts.ray_jobs.cli.train, convsts.ray_jobs.cli.evaluate, convsts.ray_jobs.cli.demo, convsts.ray_jobs.cli.tune, "
        "convsts.ray_jobs.cli.submit, convsts.ray_jobs.cli.jobs, convsts.ray_jobs.training.driver, "
        "convsts.ray_jobs.sweeps.tuner, convsts.ray_jobs.pipelines.evaluate, convsts.ray_jobs.pipelines.hard_negatives, "
        "convsts.models.export, convsts.tune_spaces.sts_matrix, convsts.tune_spaces.snli_fraction;"
        "print(len(logging.getLogger().handlers), os.environ.get('MLFLOW_TRACKING_URI'), sorted(os.listdir('.')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 None []"


def test_unknown_tune_space_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "convsts", "tune", "--space", "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown tune space 'nope'" in proc.stderr


def test_version_and_print_config():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "convsts", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"convsts {version('convsts')}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "convsts",
            "train",
            "--print-config",
            "--config",
            "configs/demo_dan.yaml",
            "trainer.steps=7",
            "mlflow.tracking_uri=http://alice:s3cret@mlflow.example:5000",
        ],
        capture_output=True,
        text=True,
        cwd=str(__import__("pathlib").Path(__file__).parents[2]),
    )
    assert proc.returncode == 0, proc.stderr
    import yaml

    printed = yaml.safe_load(proc.stdout)
    assert printed["trainer"]["steps"] == 7 and printed["model"]["encoder"] == "dan"
    assert "s3cret" not in proc.stdout and "mlflow.example" in printed["mlflow"]["tracking_uri"]


def test_submit_takes_its_own_options_after_the_job_name():
    from convsts.ray_jobs.cli.submit import build_parser, own_options_first

    for argv in (
        ["train", "--config", "C", "--address", "http://head:8265", "--out", "D"],
        ["--address", "http://head:8265", "train", "--config", "C", "--out", "D"],
        ["train", "--config", "C", "--out", "D", "--address=http://head:8265"],
    ):
        args = build_parser().parse_args(own_options_first(argv))
        assert args.address == "http://head:8265" and args.job == "train", argv
        assert args.args == ["--config", "C", "--out", "D"], argv
    args = build_parser().parse_args(own_options_first(["evaluate", "--no-wait", "--checkpoint", "C", "--out", "E"]))
    assert args.no_wait and args.args == ["--checkpoint", "C", "--out", "E"]


def test_overrides_after_a_list_option_stay_overrides():
    """`--sts A B key=value` (and prepare's `--input A B key=value`): argparse's nargs takes every
    later word; the dotted overrides among them go back to the overrides (a URI's query stays a path)."""
    from convsts.ray_jobs.cli.evaluate import build_parser as evaluate_parser
    from convsts.ray_jobs.cli.prepare import build_parser as prepare_parser
    from convsts.ray_jobs.config.loader import parse_with_overrides

    args = parse_with_overrides(
        evaluate_parser(),
        [
            "--checkpoint",
            "C",
            "--out",
            "E",
            "--sts",
            "a/STS.input.x.txt",
            "s3://b/y.tsv?endpoint_override=h:9000",
            "data.snli_dev=''",
            "trainer.stages=[{start_step: 0}]",
        ],
        ("sts", "fraction_curve"),
    )
    assert args.sts == ["a/STS.input.x.txt", "s3://b/y.tsv?endpoint_override=h:9000"]
    assert args.overrides == ["data.snli_dev=''", "trainer.stages=[{start_step: 0}]"]
    # --sts NAME=FILE names a file: a KEY=VALUE stays an override only where KEY starts at a run config key.
    args = parse_with_overrides(
        evaluate_parser(),
        [
            "--checkpoint",
            "C",
            "--out",
            "E",
            "--sts",
            "sts12=a/test.parquet",
            "STS13.headlines=b.tsv",
            "seed=3",
            "model.encoder=dan",
        ],
        ("sts",),
    )
    assert args.sts == ["sts12=a/test.parquet", "STS13.headlines=b.tsv"] and args.overrides == [
        "seed=3",
        "model.encoder=dan",
    ]
    args = parse_with_overrides(
        evaluate_parser(), ["--fraction-curve", "C1", "C2", "--out", "E", "eval.seed=3"], ("sts", "fraction_curve")
    )
    assert args.fraction_curve == ["C1", "C2"] and args.overrides == ["eval.seed=3"]
    args = parse_with_overrides(
        prepare_parser(), ["reddit", "--input", "RC_1.zst", "RC_2.zst", "data.test_share=0.2", "--out", "P"], ("input",)
    )
    assert args.input == ["RC_1.zst", "RC_2.zst"] and args.overrides == ["data.test_share=0.2"] and args.out == "P"


def test_overrides_are_taken_anywhere_on_the_command_line():
    """Overrides before, between and after options, in every command that takes them: `train ...
    --resume latest model.dan.output_dim=64` was refused by argparse ("unrecognized arguments")."""
    import importlib

    line = ["a.b=1", "--out", "O", "c.d=2", "--config", "C", "e.f=3"]
    for command in ("train", "demo", "tune", "prepare", "evaluate"):
        module = importlib.import_module(f"convsts.ray_jobs.cli.{command}")
        own = {"tune": ["--space", "snli_fraction"], "prepare": ["reddit"], "evaluate": ["--checkpoint", "K"]}
        argv = [*own.get(command, []), *line]
        args = module.build_parser().parse_intermixed_args(argv)
        assert args.overrides == ["a.b=1", "c.d=2", "e.f=3"], (command, args)
    done = subprocess.run(
        [sys.executable, "-m", "convsts", "train", "--config", "configs/demo_dan.yaml", "--resume", "latest",
         "model.dan.output_dim=64", "--print-config"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "output_dim: 64" in done.stdout and "resume_from: latest" in done.stdout


def test_jobs_takes_address_before_or_after_the_action():
    from convsts.ray_jobs.cli.jobs import build_parser

    assert build_parser().parse_args(["list", "--address", "http://h:8265"]).address == "http://h:8265"
    assert build_parser().parse_args(["--address", "http://h:8265", "list"]).address == "http://h:8265"
    assert build_parser().parse_args(["logs", "J", "--address", "http://h:8265"]).address == "http://h:8265"
    assert build_parser().parse_args(["list"]).address is None


@pytest.mark.parametrize("verbose", [False, True])
def test_ray_data_logs_to_the_console_at_warning_unless_verbose(verbose, tmp_path):
    """quiet_ray_logs points Ray Data at ray_jobs/runtime/ray_data_logging.yaml before Ray Data is imported
    (as the worker setup hook does in every Ray worker): its console shows warnings only, without
    the progress-bar hint; with --verbose, Ray's own config is left alone."""
    code = (
        "import logging, os; from convsts.ray_jobs.runtime.logs import quiet_ray_logs; quiet_ray_logs(); import ray.data; "
        "lg = logging.getLogger('ray.data'); "
        "print(sorted((h.name, logging.getLevelName(h.level)) for h in lg.handlers)); "
        "lg.info('an info line'); lg.warning('Progress bars disabled. To enable, set ...'); lg.warning('a warning line')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_DATA_LOGGING_CONFIG", "CONVSTS_VERBOSE")}
    if verbose:
        env["CONVSTS_VERBOSE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "a warning line" in done.stderr
    if verbose:
        assert "an info line" in done.stderr and "Progress bars disabled" in done.stderr
    else:
        assert "[('console', 'WARNING'), ('file', 'NOTSET')]" in done.stdout
        assert "an info line" not in done.stderr and "Progress bars disabled" not in done.stderr


def test_a_misspelt_command_is_one_line_with_did_you_mean():
    from convsts.ray_jobs.cli import main

    for typed, expected in (
        ("trian", "did you mean `convsts train`?"),
        ("evalute", "did you mean `convsts evaluate`?"),
    ):
        proc = subprocess.run([sys.executable, "-m", "convsts", typed], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [
            f"convsts: unknown command {typed!r}; {expected} (convsts --help lists them)"
        ]
    assert main(["zzz"]) == 2  # nothing close: the list of commands instead


def test_ray_data_lists_parquet_with_one_footer_reader_unless_the_user_says(monkeypatch):
    """ray_data_defaults (the driver's ensure_ray and every worker's setup hook) sets the variable Ray
    Data's parquet listing reads for its pool of footer-reading actors (32 by default, a process
    each); a user's own value stays. Checked on Ray Data's own indexer, as it reads the variable."""
    from ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer import FooterFileIndexer

    from convsts.ray_jobs.runtime.ray_start import FOOTER_ACTORS_ENV, ray_data_defaults

    monkeypatch.delenv(FOOTER_ACTORS_ENV, raising=False)
    assert FooterFileIndexer(ignore_missing_paths=False)._num_actors == 32  # Ray's default, what this avoids
    ray_data_defaults()
    assert FooterFileIndexer(ignore_missing_paths=False)._num_actors == 1
    monkeypatch.setenv(FOOTER_ACTORS_ENV, "8")
    ray_data_defaults()
    assert FooterFileIndexer(ignore_missing_paths=False)._num_actors == 8
