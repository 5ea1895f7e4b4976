"""The import graph: command modules (recipes) never import each other; models/ is pure torch."""

import ast
from pathlib import Path

from ray_jobs.cli import COMMANDS

REPO = Path(__file__).resolve().parent.parent


def _imports(path: Path):
    """Every module a file imports, at module level or inside functions."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_command_modules_do_not_import_each_other():
    commands = {module for module, _ in COMMANDS.values()}
    for module in commands:
        path = REPO / (module.replace(".", "/") + ".py")
        others = sorted(set(_imports(path)) & (commands - {module}))
        assert not others, f"{module} imports command modules {others}"


def test_library_modules_do_not_import_command_modules():
    commands = {module for module, _ in COMMANDS.values()} | {"ray_jobs.cli"}
    for path in [*REPO.glob("ray_jobs/*/*.py"), *REPO.glob("ray_jobs/*.py"), *REPO.glob("models/*.py"),
                 *REPO.glob("datasets/*.py"), *REPO.glob("tune_spaces/*.py"), *REPO.glob("bench/*.py")]:
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module in commands:
            continue
        bad = sorted(set(_imports(path)) & commands)
        if path.parent.name == "bench":  # benchmarks are scripts: they may run a command's main, not borrow its parts
            bad = [b for b in bad if b != "ray_jobs.cli"]
        assert not bad, f"{module} imports command modules {bad}"


def test_models_is_pure_torch():
    for path in REPO.glob("models/*.py"):
        bad = sorted(m for m in _imports(path) if m.split(".")[0] in ("ray", "mlflow", "ray_jobs"))
        assert not bad, f"{path.name} imports {bad}"
