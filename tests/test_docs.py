"""Every Python block of README.md and docs/*.md runs as written: in a working folder laid out as
`convsts demo --out runs/demo` leaves it (a checkpoint, its model folder, an MLflow sqlite store
whose run holds the model, results.json naming that run), each block in a fresh process. And every
`convsts COMMAND ...` line of their bash blocks parses: the command and its options exist."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.M | re.S)


def blocks(language: str) -> list[tuple[str, str]]:
    """(page:line, code) of every fenced block in `language`, its indentation (a list item's) removed."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(2) == language:
                indent = len(m.group(1))
                code = "\n".join(line[indent:] for line in m.group(3).splitlines())
                found.append((f"{page.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}", code))
    return found


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory) -> Path:
    """A working folder holding runs/demo as the demo writes it, from a tiny DAN (no training)."""
    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models import save_checkpoint
    from convsts.models.checkpoint import build_model, save_model_folder
    from convsts.models.config import DanConfig, ModelConfig
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.tracking.mlflow_model import log_model

    cwd = tmp_path_factory.mktemp("docs")
    demo = cwd / "runs" / "demo"
    texts = ["a man is playing a guitar", "a man plays guitar", "a woman slices an onion", "two dogs run"]
    tokenizer = DanTokenizer.build(count_words(texts), TokenizerConfig(bigram_buckets=64))
    config = ModelConfig(encoder="dan", dan=DanConfig(embedding_dim=16, hidden_sizes=[16], output_dim=12))
    save_checkpoint(demo / "checkpoint", build_model(config, tokenizer).eval(), tokenizer, {}, {"step": 4})
    save_model_folder(demo / "checkpoint", demo / "model")
    uri = f"sqlite:///{demo / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "convsts", "demo")
    log_model(uri, run_id, demo / "model", step=4)
    tracking.end_run(uri, run_id)
    (demo / "results.json").write_text(json.dumps({"mlflow_run_id": run_id}))
    return cwd


@pytest.mark.parametrize("where,code", blocks("python"), ids=[w for w, _ in blocks("python")])
def test_every_python_block_runs_as_written(where, code, demo_folder):
    done = subprocess.run([sys.executable, "-c", code], cwd=demo_folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where}:\n{code}\n{done.stderr[-3000:]}"


def _convsts_lines() -> list[tuple[str, list[str]]]:
    """(page:line, argv after `convsts`) of each `convsts ...` command in a bash block (continued lines
    joined; comments, placeholders in capitals and `|`-separated alternatives are the reader's)."""
    found = []
    for where, code in blocks("bash"):
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith(".venv/bin/"):
                line = line[len(".venv/bin/") :]
            if not line.startswith("convsts ") or any(mark in line for mark in ("|", "...", "[")):
                continue  # a synopsis (alternatives, optional parts), not a command to run
            if line.split()[1].startswith("-"):  # convsts --version, --help: the entry point's own
                continue
            argv = shlex.split(line)[1:]
            found.append((where, argv))
    return found


@pytest.mark.parametrize("where,argv", _convsts_lines(), ids=[" ".join(a[:2]) for _, a in _convsts_lines()])
def test_every_convsts_command_in_the_docs_parses(where, argv):
    """The command's own parser takes the line (its options exist and have their values); nothing runs."""
    from convsts.ray_jobs.cli.commands import COMMANDS

    def command_parser(name: str):
        return importlib.import_module(COMMANDS[name][0]).build_parser()

    assert argv and argv[0] in COMMANDS, (where, argv)
    parser = command_parser(argv[0])
    if argv[0] == "submit":  # submit's own options, then the job's: the job's parser checks the rest
        from convsts.ray_jobs.cli.submit import own_options_first

        args = parser.parse_args(own_options_first(argv[1:]))
        argv = [args.job, *args.args]
        parser = command_parser(argv[0])
    parse = parser.parse_args if argv[0] == "jobs" else parser.parse_intermixed_args  # jobs: sub-commands
    try:
        parse(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: `convsts {' '.join(argv)}` does not parse (exit {exc.code})")
