"""Every Python block of README.md and docs/*.md runs as written: in a working folder laid out as
`convsts demo --out runs/demo` leaves it (the demo's pretrained encoder as a checkpoint and a model
folder, an MLflow sqlite store whose run holds the model, results.json naming that run), each block
in a fresh process. The bash blocks that use only that folder (exports, serving the MLflow model and
a curl) run there too, `OUT` and `RUN_ID` filled in as the demo fills them; every `convsts COMMAND
...` line of the others (clusters, full-data training, sweeps) parses: the command and its options
exist."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
    """A working folder holding runs/demo as the demo writes it: the demo's encoder (the pretrained
    MiniLM), untrained here."""
    from convsts.datasets.config import TokenizerConfig
    from convsts.datasets.text import PretrainedTokenizer
    from convsts.models.checkpoint import build_model, save_checkpoint, save_model_folder
    from convsts.models.config import ModelConfig
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.tracking.mlflow_model import log_model

    cwd = tmp_path_factory.mktemp("docs")
    demo = cwd / "runs" / "demo"
    config = ModelConfig(encoder="pretrained")
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=128))
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
            if not line.startswith("convsts ") or any(mark in line for mark in ("|", "...")):
                continue  # a synopsis (alternatives, repeated parts), not a command to run
            if line.split()[1].startswith("-"):  # convsts --version, --help: the entry point's own
                continue
            argv = shlex.split(line)[1:]
            if any(token.startswith("[") for token in argv):  # optional parts; `seed=[0]` is a value
                continue
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


# Bash lines that run as written in the demo's working folder, the reader's placeholders (in capitals)
# filled in as the demo fills them: exports, a Python one-liner, serving the MLflow model and a curl.
# The other lines start Ray clusters, train on full data or run benchmarks: they are parsed above.
RUN_IN_DEMO_FOLDER = ("convsts export ", "python -c ", "MLFLOW_TRACKING_URI=", "curl ")


PLACEHOLDERS = ("OUT", "RUN_ID")  # filled in by the test; a block with any other is the reader's to fill


def _runnable_blocks() -> list[tuple[str, list[str]]]:
    """(page:line, its lines) of each bash block whose every line runs in the demo's folder."""
    found = []
    for where, code in blocks("bash"):
        lines = [line.strip() for line in code.replace("\\\n", " ").splitlines() if line.strip()]
        words = {w for line in lines for w in re.findall(r"(?<![\w$/-])[A-Z][A-Z0-9_]*(?![\w=])", line.split(" #")[0])}
        if all(line.startswith(RUN_IN_DEMO_FOLDER) for line in lines) and words <= set(PLACEHOLDERS):
            found.append((where, lines))
    return found


def _filled(line: str, places: dict[str, str]) -> str:
    for name, value in places.items():
        line = re.sub(rf"\b{name}\b", value, line)
    return line


def _wait_for_port(port: int, server: subprocess.Popen, timeout_s: float = 120.0) -> None:
    import socket
    import time

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert server.poll() is None, server.stdout.read() if server.stdout else "the server ended"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


@pytest.mark.slow  # a server and exports, in subprocesses
@pytest.mark.parametrize("where,lines", _runnable_blocks(), ids=[w for w, _ in _runnable_blocks()])
def test_every_export_and_serve_command_runs_in_the_demo_folder(where, lines, demo_folder):
    """Each line of the block, in the demo's folder, with `.venv/bin` on PATH (as the docs say); a
    `mlflow models serve` line runs in the background until the block's curl has its answer."""
    import os

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run_id = json.loads((demo_folder / "runs" / "demo" / "results.json").read_text())["mlflow_run_id"]
    places = dict(zip(PLACEHOLDERS, ["runs/demo", run_id]))
    server = None
    try:
        for line in (_filled(line, places) for line in lines):
            if " models serve " in line:
                server = subprocess.Popen(
                    line, shell=True, cwd=demo_folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, start_new_session=True,
                )  # fmt: skip
                _wait_for_port(int(re.search(r"--port (\d+)", line).group(1)), server)
                continue
            done = subprocess.run(
                line, shell=True, cwd=demo_folder, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"{where}: {line}\n{done.stderr[-3000:]}"
            if line.startswith("curl "):
                answer = json.loads(done.stdout)
                assert len(answer["predictions"]) == 1 and len(answer["predictions"][0]) == 384, answer
    finally:
        if server is not None:
            import signal

            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
