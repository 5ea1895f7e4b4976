"""Every Python block of README.md and docs/ runs as written: in a working folder laid out as
`convsts demo --out runs/demo` leaves it (the demo's pretrained encoder as a checkpoint and a model
folder, an MLflow sqlite store whose run holds the model, results.json naming that run), each block
in a fresh process. The bash blocks that use only that folder (exports, serving the MLflow model and
a curl) run there too, `OUT` and `RUN_ID` filled in as the demo fills them. Every other command line
of a bash block parses with its own program's parser: `convsts ...` (the command reference's
synopses included: each `[optional]` part left out and put in, each `a|b` alternative taken, the
reader's placeholders in capitals filled in), `python bench/...`, `ray start`, `mlflow server`; a
line of any other program fails the check of what the docs hold."""

from __future__ import annotations

import importlib
import itertools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
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
    from convsts.models.checkpoint import TrainState, build_model, save_checkpoint, save_model_folder
    from convsts.models.config import ModelConfig
    from convsts.ray_jobs.tracking import runs as tracking
    from convsts.ray_jobs.tracking.mlflow_model import log_model

    cwd = tmp_path_factory.mktemp("docs")
    demo = cwd / "runs" / "demo"
    config = ModelConfig(encoder="pretrained")
    tokenizer = PretrainedTokenizer.from_model(config, TokenizerConfig(max_words=128))
    save_checkpoint(demo / "checkpoint", build_model(config, tokenizer).eval(), tokenizer, {}, TrainState(4))
    save_model_folder(demo / "checkpoint", demo / "model")
    uri = f"sqlite:///{demo / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "convsts", "demo")
    log_model(uri, run_id, demo / "model", step=4)
    tracking.end_run(uri, run_id)
    (demo / "results.json").write_text(json.dumps({"mlflow_run_id": run_id}))
    return cwd


@pytest.fixture(scope="module", autouse=True)
def python_blocks(demo_folder):
    """Every Python block started at once, each in a fresh process in the demo's folder, when this
    module starts: they spend their time importing, beside the module's other tests, and are checked
    by its last test. {page:line: process}"""
    started = {
        where: subprocess.Popen(
            [sys.executable, "-c", code], cwd=demo_folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for where, code in blocks("python")
    }
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()


def command_lines() -> list[tuple[str, str]]:
    """(page:line, command) of each command of a bash block: continued lines joined, comments, the
    `.venv/bin/` prefix and a `for ...; do` head taken off; a shell variable is the reader's value."""
    found = []
    for where, code in blocks("bash"):
        for line in code.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$|^#.*$", "", line).strip()
            line = re.sub(r"^for \w+ in [^;]*; do\s*|;\s*done$", "", line).removeprefix(".venv/bin/")
            line = re.sub(r"\$\(basename \"?\$\w+\"?\)|\$\w+", "x", line)
            if line and line not in ("done",):
                found.append((where, line))
    return found


NUMERIC = {"N", "M", "G", "K"}  # placeholders of counts (--pairs N, --margin M, --gpus-per-worker G)
PLACEHOLDER = re.compile(r"(?<![\w.$/-])[A-Z][A-Z0-9_]*(?![\w(])")


def _tokens(line: str) -> list[str]:
    """shlex's words, with synopsis marks as words of their own: `[`, `]`, `(`, `)`, `|` (a value
    such as `seed=[0]` or `'[7]'` stays whole; `[NAME=]FILE` is the choice `(NAME=FILE | FILE)`)."""
    out = []
    for word in shlex.split(line):
        if "=[" in word or "={" in word or word.startswith(("'", '"')):
            out.append(word)
            continue
        head = re.match(r"^[\[(]*", word).group()
        tail = re.search(r"[\])]*$", word[len(head) :]).group()
        core = word[len(head) : len(word) - len(tail)]
        named = re.fullmatch(r"(\w+=)\](.+)", core)  # the `[` of [NAME=] went to head
        if named and head.endswith("["):
            out += [*head[:-1], "(", named.group(1) + named.group(2), "|", named.group(2), ")", *tail]
        else:
            out += [*head, *([core] if core else []), *tail]
    return [w for w in out if w != "..."]


def _parse_group(tokens: list[str], i: int, closing: str | None):
    """(alternatives: a list of sequences of items, next index) from tokens[i], up to `closing`."""
    alternatives, sequence = [], []
    while i < len(tokens) and tokens[i] != closing:
        word = tokens[i]
        if word == "|":
            alternatives.append(sequence)
            sequence = []
        elif word in "[(":
            inner, i = _parse_group(tokens, i + 1, "]" if word == "[" else ")")
            sequence.append(("optional" if word == "[" else "group", inner))
        else:
            sequence.append(("word", word.removesuffix("...")))
        i += 1
    return [*alternatives, sequence], i


def _choices(word: str) -> list[str]:
    """`bow|tfidf` -> its alternatives (a URL or a value with `=` is one word)."""
    return word.split("|") if "|" in word and "=" not in word and "://" not in word else [word]


def _points(alternatives) -> list[int]:
    """The number of ways of each choice of a synopsis, in the order _render meets them."""
    sizes = [len(alternatives)] if len(alternatives) > 1 else []
    for sequence in alternatives:
        for kind, value in sequence:
            if kind == "word":
                sizes += [len(_choices(value))] if len(_choices(value)) > 1 else []
            else:
                sizes += ([2] if kind == "optional" else []) + _points(value)
    return sizes


def _render(alternatives, pick: Iterator[int], emit: bool = True) -> list[str]:
    """The words of one variant: each choice takes the next of `pick` (every choice is met, chosen
    or not, so that a variant is one tuple of picks)."""
    chosen = next(pick) if len(alternatives) > 1 else 0
    out = []
    for index, sequence in enumerate(alternatives):
        for kind, value in sequence:
            on = emit and index == chosen
            if kind == "word":
                choices = _choices(value)
                word = choices[next(pick) if len(choices) > 1 else 0]
                out += [word] if on else []
            else:
                included = next(pick) == 1 if kind == "optional" else True
                out += _render(value, pick, on and included)
    return out


def synopsis_variants(line: str) -> list[list[str]]:
    """The command lines a synopsis stands for, each as argv, placeholders filled in: `convsts jobs
    list | logs JOB_ID [--follow]` -> [convsts, jobs, list], [convsts, jobs, logs, x, --follow]. An
    alternative after ` | ` that does not start with the program continues its first words."""
    line = PLACEHOLDER.sub(lambda m: "1" if m.group() in NUMERIC else "x", line)
    tokens = _tokens(line)
    top = [[]]
    for word in tokens:  # a top-level | separates whole commands: each gets the program and command
        if word == "|" and top[-1].count("[") == top[-1].count("]") and top[-1].count("(") == top[-1].count(")"):
            top.append([])
        else:
            top[-1].append(word)
    head = top[0][:2]
    variants = []
    for part in top:
        part = part if part[:1] == head[:1] else head + part
        tree, _ = _parse_group(part, 0, None)
        for picks in itertools.product(*(range(n) for n in _points(tree))):
            argv = _render(tree, iter(picks))
            if argv not in variants:
                variants.append(argv)
    return variants


def _lines_of(program: str) -> list[tuple[str, list[str]]]:
    """(page:line, argv) of each variant of each command line that runs `program`."""
    return [
        (where, argv)
        for where, line in command_lines()
        if line == program or line.startswith(program + " ")
        for argv in synopsis_variants(line)
    ]


CONVSTS = _lines_of("convsts")


def test_the_synopsis_expansion_takes_every_part():
    assert synopsis_variants("convsts jobs list | logs JOB_ID [--follow] | stop JOB_ID") == [
        ["convsts", "jobs", "list"], ["convsts", "jobs", "logs", "x"], ["convsts", "jobs", "logs", "x", "--follow"],
        ["convsts", "jobs", "stop", "x"],
    ]  # fmt: skip
    assert synopsis_variants("convsts evaluate --out DIR (--checkpoint C [--sts [NAME=]FILE ...] | --baseline bow|tfidf)") == [
        ["convsts", "evaluate", "--out", "x", "--checkpoint", "x"],
        ["convsts", "evaluate", "--out", "x", "--checkpoint", "x", "--sts", "x=x"],
        ["convsts", "evaluate", "--out", "x", "--checkpoint", "x", "--sts", "x"],
        ["convsts", "evaluate", "--out", "x", "--baseline", "bow"],
        ["convsts", "evaluate", "--out", "x", "--baseline", "tfidf"],
    ]  # fmt: skip
    assert synopsis_variants("convsts mine-negatives --pairs N seed=[0] 'a b'") == [
        ["convsts", "mine-negatives", "--pairs", "1", "seed=[0]", "a b"]
    ]


@pytest.mark.parametrize("where,argv", CONVSTS, ids=[f"{w} {' '.join(a[1:3])}" for w, a in CONVSTS])
def test_every_convsts_line_in_the_docs_parses(where, argv):
    """The command's own parser takes the line (its options exist and have their values); nothing runs."""
    from convsts.ray_jobs.cli import main
    from convsts.ray_jobs.cli.commands import COMMANDS

    def command_parser(name: str):
        return importlib.import_module(COMMANDS[name][0]).build_parser()

    argv = argv[1:]
    if argv[0].startswith("-"):  # convsts --version, --help: the entry point's own
        assert main(argv) == 0
        return
    assert argv[0] in COMMANDS, (where, argv)
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


# A bench script's parser is built inside its main(): each line runs the script with parse_args
# stopping the script right after it has parsed (one interpreter for all, so torch and Ray load once).
BENCH_PARSE = """
import argparse, json, runpy, sys
class Parsed(Exception): pass
parse = argparse.ArgumentParser.parse_args
def parse_then_stop(self, args=None, namespace=None):
    parse(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_then_stop
failed = []
for where, argv in json.loads(sys.argv[1]):
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
        failed.append([where, argv, "ran without parsing its arguments"])
    except Parsed:
        pass
    except SystemExit as exc:
        failed.append([where, argv, f"exit {exc.code}"])
print(json.dumps(failed))
"""


def test_every_bench_line_in_the_docs_parses():
    lines = [(where, argv[1:]) for where, argv in _lines_of("python") if argv[1:2] and argv[1].startswith("bench/")]
    assert len({tuple(argv[:1]) for _, argv in lines}) >= 6, lines  # the benches docs/performance.md cites
    probe = ["the check itself", ["bench/startup.py", "--no-such-option"]]  # must be reported
    done = subprocess.run(
        [sys.executable, "-c", BENCH_PARSE, json.dumps([*lines, probe])],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == [[*probe, "exit 2"]], "bench lines that do not parse:\n" + "\n".join(map(str, failed[:-1]))


def test_every_ray_start_and_mlflow_server_line_in_the_docs_parses():
    """Ray's and MLflow's own command-line parsers (click) take each line; nothing starts."""
    from mlflow.cli import server
    from ray.scripts.scripts import start

    lines = [(w, a[2:], start) for w, a in _lines_of("ray start")] + [
        (w, a[2:], server) for w, a in _lines_of("mlflow server")
    ]
    assert {cmd for _, _, cmd in lines} == {start, server}, lines
    for where, args, command in lines:
        try:
            command.make_context(command.name, list(args))
        except Exception as err:  # click's UsageError / BadParameter
            pytest.fail(f"{where}: `{command.name} {' '.join(args)}` does not parse: {err}")


# What else a bash block of the docs may hold: the README's two set-up commands and CI's, the lines
# the demo folder runs (below), and the shell around them.
OTHER_PROGRAMS = ("bash scripts/", "bash .ci/run", "export ", "curl ", "MLFLOW_TRACKING_URI=", "python -c ")


def test_every_command_line_of_the_docs_is_checked():
    unchecked = [
        f"{where}: {line}"
        for where, line in command_lines()
        if not line.startswith(("convsts", "python bench/", "ray start", "mlflow server", *OTHER_PROGRAMS))
    ]
    assert not unchecked, "command lines no test parses or runs:\n" + "\n".join(unchecked)


# Bash lines that run as written in the demo's working folder, the reader's placeholders (in capitals)
# filled in as the demo fills them: exports, a Python one-liner, serving the MLflow model and a curl.
# The other lines start Ray clusters, train on full data or run benchmarks: they are parsed above.
RUN_IN_DEMO_FOLDER = ("convsts export ", "python -c ", "MLFLOW_TRACKING_URI=", "curl ")


PLACEHOLDERS = ("OUT", "RUN_ID")  # filled in by the test; a block with any other is the reader's to fill


DEMO_OUT = "runs/demo"  # what OUT is in the demo's folder


def _runnable_blocks() -> list[tuple[str, list[str]]]:
    """(page:line, its lines) of each bash block whose every line runs in the demo's folder; blocks
    that are the same lines once OUT is filled in run once, under all their places ("a+b")."""
    found: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
    for where, code in blocks("bash"):
        lines = [line.strip() for line in code.replace("\\\n", " ").splitlines() if line.strip()]
        words = {w for line in lines for w in re.findall(r"(?<![\w$/-])[A-Z][A-Z0-9_]*(?![\w=])", line.split(" #")[0])}
        if all(line.startswith(RUN_IN_DEMO_FOLDER) for line in lines) and words <= set(PLACEHOLDERS):
            same = tuple(_filled(line, {"OUT": DEMO_OUT}) for line in lines)
            found.setdefault(same, ([], lines))[0].append(where)
    return [("+".join(places), lines) for places, lines in found.values()]


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


def _run_block(where: str, lines: list[str], folder: Path, env: dict[str, str], ran: set[str]) -> None:
    """The block's lines in `folder`, its placeholders filled in; a `mlflow models serve` line runs in
    the background until the block's curl has its answer. A line another block ran already (the
    README's ONNX export is the guide's once OUT is filled in) is not run again: it is in `ran`."""
    import os
    import signal

    server = None
    try:
        for line in lines:
            if " models serve " in line:
                server = subprocess.Popen(
                    line, shell=True, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True, start_new_session=True,
                )  # fmt: skip
                _wait_for_port(int(re.search(r"--port (\d+)", line).group(1)), server)
                continue
            if line in ran and not line.startswith("curl "):
                continue
            done = subprocess.run(line, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{where}: {line}\n{done.stderr[-3000:]}"
            ran.add(line)
            if line.startswith("curl "):
                answer = json.loads(done.stdout)
                assert len(answer["predictions"]) == 1 and len(answer["predictions"][0]) == 384, answer
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


@pytest.mark.slow  # a server and exports, in subprocesses
def test_every_export_and_serve_command_runs_in_the_demo_folder(demo_folder):
    """Each block whose every line runs in the demo's folder, in the order the docs give them, with
    `.venv/bin` on PATH (as the docs say): each distinct command once (an export costs seconds)."""
    import os

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run_id = json.loads((demo_folder / "runs" / "demo" / "results.json").read_text())["mlflow_run_id"]
    places = dict(zip(PLACEHOLDERS, [DEMO_OUT, run_id]))
    blocks_run, ran = _runnable_blocks(), set()
    assert len(blocks_run) >= 3, blocks_run  # serving, the README's exports, the guide's ONNX export
    for where, lines in blocks_run:
        _run_block(where, [_filled(line, places) for line in lines], demo_folder, env, ran)


def test_every_test_the_docs_name_exists():
    """`tests/PATH.py` and `tests/PATH.py::test_name` (and `::test_name` after one) in README.md and
    docs/ name a test file and a test function of it that exist."""
    import ast

    missing = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        current = None
        for m in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?(?:\[[^\]`]*\])?`", text):
            path, name = m.group(1), m.group(2)
            if path:
                current = REPO / path
                if not current.is_file():
                    missing.append(f"{page.relative_to(REPO)}: {path}")
                    continue
            if name and current is not None and current.is_file():
                tree = ast.parse(current.read_text(encoding="utf-8"))
                if name not in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}:
                    missing.append(f"{page.relative_to(REPO)}: {current.relative_to(REPO)}::{name}")
    assert not missing, "tests the docs name that do not exist:\n" + "\n".join(missing)


# Last in this module: the blocks' processes ran beside the tests above.
@pytest.mark.parametrize("where,code", blocks("python"), ids=[w for w, _ in blocks("python")])
def test_every_python_block_runs_as_written(where, code, python_blocks):
    _, stderr = python_blocks[where].communicate(timeout=300)
    assert python_blocks[where].returncode == 0, f"{where}:\n{code}\n{stderr[-3000:]}"


# A dotted name in backticks that starts at one of our packages (or a module of one) names code:
# `training.driver._copy_whole`, `convsts.models.checkpoint.verified_folder`, `lineage.apply_start`.
CODE_ROOTS = ("convsts", "convsts.ray_jobs", "convsts.io", "convsts.models", "convsts.ray_jobs.training")
FILE_SUFFIXES = (".json", ".py", ".md", ".yaml", ".safetensors", ".pt", ".png", ".csv", ".db", ".parquet", ".txt")
PACKAGE_DIRS = {"convsts": REPO / "convsts", "io": REPO / "convsts" / "io", "datasets": REPO / "datasets",
                "models": REPO / "models", "ray_jobs": REPO / "ray_jobs", "tune_spaces": REPO / "tune_spaces"}  # fmt: skip


def _module_file(dotted: list[str]) -> Path | None:
    """The source file of convsts module `dotted` (["convsts", "ray_jobs", "training", "driver"]), or None."""
    if dotted[0] != "convsts" or len(dotted) < 2 or dotted[1] not in PACKAGE_DIRS:
        return REPO / "convsts" / "__init__.py" if dotted == ["convsts"] else None
    base = PACKAGE_DIRS[dotted[1]].joinpath(*dotted[2:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(path: Path, attrs: list[str]) -> bool:
    """`path` defines attrs[0] at its top level (a def, class, assignment or import), and each next
    attribute inside the class before it where it is one."""
    import ast

    scope = ast.parse(path.read_text(encoding="utf-8")).body
    for attr in attrs:
        found = None
        for node in scope:
            names = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = [a.asname or a.name for a in node.names]
            if attr in names:
                found = node
        if found is None:
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def code_name_exists(name: str) -> bool | None:
    """Whether a backticked dotted name of the docs names our code that exists; None where it is not
    a name of our code (a file, an MLflow tag, a config key, another library's name)."""
    if name.endswith(FILE_SUFFIXES) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", name):
        return None
    parts = name.split(".")
    module_found = False  # a module of ours is named, without what the name says it defines
    for root in CODE_ROOTS:
        full = [*root.split("."), *parts] if not name.startswith("convsts.") else parts
        for i in range(len(full), 1, -1):
            module = _module_file(full[:i])
            if module is not None:
                if i == len(full) or _defines(module, full[i:]):
                    return True
                module_found = module_found or i > len(full) - len(parts)
                break
    first = parts[1] if parts[0] == "convsts" else parts[0]
    known = {p.stem for d in PACKAGE_DIRS.values() for p in d.rglob("*.py")} | set(PACKAGE_DIRS)
    if module_found or (first in known and not (parts[0] == "convsts" and len(parts) == 2)):
        return False
    return None


def test_every_code_name_in_the_docs_exists():
    names = {
        (page.relative_to(REPO), m.group(1))
        for page in PAGES
        for m in re.finditer(r"`([\w.]+)`", page.read_text(encoding="utf-8"))
    }
    missing = sorted((str(page), name) for page, name in names if code_name_exists(name) is False)
    assert missing == [], missing
    # The check itself: what exists, what does not, what is not a name of our code.
    assert code_name_exists("training.driver._copy_whole") and code_name_exists("convsts.models.checkpoint.Checkpoint")
    assert code_name_exists("lineage.RunStart.chain_run_ids")
    assert (
        code_name_exists("training.driver._place") is False and code_name_exists("checkpoint.check_complete") is False
    )
    assert code_name_exists("convsts.continues") is None and code_name_exists("train_state.pt") is None
