"""The import graph of the `convsts` package: no cycles (function-level imports included), command
modules (recipes) never import each other and nothing in the library imports them, models/ is pure
torch, and an import inside a function defers what a command's start would otherwise pay for."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("convsts/io", "datasets", "models", "ray_jobs", "tune_spaces")
# The layers, lowest first: a module imports (at any level of its code, `if TYPE_CHECKING:` aside)
# only modules of its own layer or of the layers before it. docs/design.md draws the same list.
LAYERS = (
    "convsts.io",  # shared I/O: files and URIs, error types, redaction
    "convsts.datasets",  # raw formats, splits, tokenizers, shards
    "convsts.models",  # pure torch: encoders, heads, losses, checkpoints, SentenceEncoder
    "convsts.tune_spaces",  # the sweep spaces, declarations only
    "convsts.ray_jobs.runtime",  # entry-point set-up, Ray resources, the job API, the --out lock
    "convsts.ray_jobs.tracking",  # MLflow runs, the model card, the pyfunc model
    "convsts.ray_jobs.evaluation",  # evaluators and metrics, one benchmark per module
    "convsts.ray_jobs.tasks",  # the task registry, each task, a task's prepared folder
    "convsts.ray_jobs.config",  # the run config: schema, loader, reference
    "convsts.ray_jobs.training",  # the Ray-free step and loops, the Ray Train worker and driver
    "convsts.ray_jobs.pipelines",  # a command's work end to end: inputs, negatives, evaluation, demo
    "convsts.ray_jobs.sweeps",  # Ray Tune sweeps
    "convsts.ray_jobs.cli",  # the commands
)
# An import inside a function must defer something that a command's start would otherwise pay for
# (`convsts --help`, `convsts prepare --help`, ...: docs/performance.md "Start-up"), or a package
# of an optional extra that an installation may lack. These import units each take 0.09 s or more
# here beyond what `convsts --help` loads (0.06 s in all): a subpackage of Ray as much again as Ray.
SLOW_UNITS = {
    "ray", "ray.data", "ray.train", "ray.tune", "mlflow", "torch", "transformers", "sentence_transformers",
    "matplotlib", "sklearn", "onnx", "onnxruntime", "onnxscript", "sqlalchemy",
    "scipy",  # scipy.stats and scipy.sparse: over a second of every Ray Train worker's start (its STS-B probe's)
}  # fmt: skip
RAY_UNITS = ("ray.data", "ray.train", "ray.tune")


# Submodules of a light package that load a slow one: safetensors' torch API imports torch.
LOADS_TORCH = ("safetensors.torch",)


def _unit(name: str) -> str:
    """What importing `name` loads, as far as deferring goes: the top-level package, one of Ray's
    own heavy subpackages, or torch for a light package's torch API."""
    if any(name == m or name.startswith(m + ".") for m in LOADS_TORCH):
        return "torch"
    return next((u for u in RAY_UNITS if name == u or name.startswith(u + ".")), name.split(".")[0])


def _optional_packages() -> set[str]:
    """The import names of pyproject's optional extras that the package itself uses (pretrained, onnx)."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {req.split("==")[0].split("[")[0] for extra in ("pretrained", "onnx") for req in extras[extra]}
    return {name.replace("-", "_") for name in names} | {"sentence_transformers"}


def _module_files():
    """{module name: path} of every module of the package."""
    files = {"convsts": REPO / "convsts" / "__init__.py", "convsts.__main__": REPO / "convsts" / "__main__.py"}
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            parts = parts[1:] if parts[0] == "convsts" else parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(("convsts", *parts))] = path
    for folder in FOLDERS:  # namespace folders (no __init__.py) are packages too
        files.setdefault("convsts." + folder.removeprefix("convsts/"), None)
    return files


MODULES = _module_files()


def _commands():
    """commands.COMMANDS, read from the source (a broken import graph must not break this test)."""
    for node in ast.parse(MODULES["convsts.ray_jobs.cli.commands"].read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and "COMMANDS" in ast.unparse(node).split("=")[0]:
            return ast.literal_eval(node.value)
    raise AssertionError("commands.py has no COMMANDS")


COMMANDS = _commands()


def _imports(path: Path, module: str):
    """(imported convsts module or third-party name, the import statement, at module level?) for each import."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    top_level = {id(node) for node in tree.body}
    type_only = set()  # `if TYPE_CHECKING:` imports never run: no edge of the import graph
    for node in tree.body:  # imports under a module-level if or try count as top level
        if isinstance(node, ast.If | ast.Try):
            inside = {id(n) for n in ast.walk(node)}
            top_level |= inside
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                type_only |= inside
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
            # `from ray import tune` loads ray.tune: a name of ours or a heavy subpackage is a module of its own
            names = [
                f"{base}.{a.name}"
                if f"{base}.{a.name}" in MODULES or _unit(f"{base}.{a.name}") != _unit(base)
                else base
                for a in node.names
            ]
        else:
            continue
        if id(node) in type_only:
            continue
        for name in names:
            yield name, node, id(node) in top_level


def _graph():
    """{module: {convsts modules it imports, parents of those included}}."""
    graph = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        if path is None:
            continue
        for name, _, _ in _imports(path, module):
            if not name.startswith("convsts"):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                target = ".".join(parts[:i])
                if target in MODULES and not module.startswith(target + ".") and target != module:
                    graph[module].add(target)
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_there_are_no_import_cycles():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _layer(module: str) -> int | None:
    return next((i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")), None)


def test_every_module_lies_in_a_layer():
    loose = sorted(
        m for m in MODULES if _layer(m) is None and m not in ("convsts", "convsts.__main__", "convsts.ray_jobs")
    )
    assert not loose, f"modules in no layer of LAYERS: {loose}"


def test_each_layer_imports_only_itself_and_the_layers_below():
    """By folder: e.g. nothing in tasks/ imports config/, training/ or pipelines/; cli/ may import all."""
    upward = []
    for module, targets in _graph().items():
        if (own := _layer(module)) is None:
            continue
        for target in sorted(targets):
            if (layer := _layer(target)) is not None and layer > own:
                upward.append(f"{module} imports {target} ({LAYERS[layer]} is above {LAYERS[own]})")
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _top_level() -> dict[str, set[str]]:
    """{module: what its top-level imports name (our modules and third-party names)}."""
    return {m: {name for name, _, at_top in _imports(p, m) if at_top} for m, p in MODULES.items() if p is not None}


def _closure(roots, top) -> set[str]:
    """Our modules that importing `roots` runs (their packages included), through top-level imports."""
    seen, todo = set(), list(roots)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for target in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if target in MODULES and target not in seen:
                seen.add(target)
                todo.extend(n for n in top.get(target, ()) if n.startswith("convsts"))
    return seen


def _loads(modules, top) -> set[str]:
    """The import units (_unit) of third-party packages that importing `modules` loads at their top level."""
    units = {_unit(n) for m in modules for n in top.get(m, ()) if not n.startswith("convsts")}
    return units | {"ray" for u in units if u in RAY_UNITS}


def _start_modules(top) -> set[str]:
    """Our modules a command's start loads: `convsts`'s entry point, each command module, and the
    built-in task modules (the task registry loads them by name as a command starts)."""
    tasks = [m for m in MODULES if m.startswith("convsts.ray_jobs.tasks.") and MODULES[m] is not None]
    return _closure(["convsts.__main__", "convsts.ray_jobs.cli", *(m for m, _ in COMMANDS.values()), *tasks], top)


def deferred_imports_that_defer_nothing() -> list[str]:
    """Each import inside a function that does not defer what a command's start would pay for: its
    module is loaded by the importing module's own top-level imports already; or it is not slow
    (SLOW_UNITS, or ours loading one) and no optional extra; or the importing module is one that no
    command's start loads, so that nothing starts faster for it."""
    top, optional = _top_level(), _optional_packages()
    started = _start_modules(top)
    bad = []
    for module, path in MODULES.items():
        if path is None:
            continue
        own = _closure([module], top)
        for name, node, at_top in _imports(path, module):
            if at_top:
                continue
            where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{node.lineno} imports {name}"
            ours = name.startswith("convsts")
            target = _closure([name], top) if ours else set()
            if (ours and name in own) or (not ours and _unit(name) in _loads(own, top)):
                bad.append(f"{where}: the module's own top-level imports load it already")
            elif not ours and name.split(".")[0] in optional:
                continue  # an optional extra: the import fails only where it is used
            elif not (_loads(target, top) & SLOW_UNITS if ours else _unit(name) in SLOW_UNITS):
                bad.append(f"{where}: nothing slow to defer (SLOW_UNITS)")
            elif module not in started:
                bad.append(f"{where}: no command's start loads {module}, so nothing starts faster")
    return bad


def test_every_function_level_import_defers_what_a_command_start_would_pay_for():
    bad = deferred_imports_that_defer_nothing()
    assert not bad, "imports inside functions that defer nothing (import them at the top):\n" + "\n".join(bad)


def test_the_deferred_import_check_finds_an_import_that_defers_nothing(tmp_path, monkeypatch):
    """A module that imports pyarrow at its top and again in a function, and one that defers a slow
    import that no command's start needs, are both named."""
    module = tmp_path / "probe.py"
    module.write_text("import pyarrow\n\ndef f():\n    import pyarrow\n    import ray\n")
    monkeypatch.setitem(MODULES, "convsts.datasets.probe", module)
    bad = [line for line in deferred_imports_that_defer_nothing() if "probe.py" in line]
    assert any("imports pyarrow: the module's own top-level imports load it already" in b for b in bad), bad
    assert any("imports ray: no command's start loads convsts.datasets.probe" in b for b in bad), bad


def test_command_modules_do_not_import_each_other():
    commands = {module for module, _ in COMMANDS.values()}
    graph = _graph()
    for module in commands:
        others = sorted(graph[module] & (commands - {module}))
        assert not others, f"{module} imports command modules {others}"


def test_library_modules_do_not_import_command_modules():
    commands = {module for module, _ in COMMANDS.values()} | {"convsts.ray_jobs.cli", "convsts.__main__"}
    for module, targets in _graph().items():
        if module not in commands:
            assert not targets & commands, f"{module} imports command modules {sorted(targets & commands)}"


def test_commands_are_thin():
    """A command module is argument parsing and one library call: build_parser, main and at most a
    few short helpers, no classes."""
    for module, _ in COMMANDS.values():
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        functions = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert not classes, f"{module} defines classes {classes}: library code belongs in the library"
        assert "main" in functions, module
        long = {name: n for name, n in functions.items() if n > 40 and name != "build_parser"}
        assert not long, f"{module}: functions over 40 lines {long}"
        assert len(tree.body) < 40, f"{module} holds {len(tree.body)} top-level statements"


def test_no_library_function_is_over_60_lines():
    long = []
    for path in filter(None, MODULES.values()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "build_parser":
                if (n := node.end_lineno - node.lineno + 1) > 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_models_is_pure_torch():
    for module, path in MODULES.items():
        if module.startswith("convsts.models"):
            bad = sorted(
                n
                for n, _, _ in _imports(path, module)
                if n.split(".")[0] in ("ray", "mlflow") or n.startswith("convsts.ray_jobs")
            )
            assert not bad, f"{path.name} imports {bad}"


def _loaded_after(code: str, modules: list[str]) -> list[str]:
    """Which of `modules` a fresh interpreter has loaded after running `code`."""
    import subprocess
    import sys

    probe = f"{code}; import sys; print(sorted(m for m in {modules!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    return ast.literal_eval(result.stdout.strip())


def test_the_prepare_command_and_the_run_config_load_no_slow_library():
    """`convsts prepare` (and anything that only reads a run config) starts without torch, MLflow,
    SciPy or Ray: imported in a fresh interpreter, none of them is loaded."""
    code = (
        "import convsts.ray_jobs.cli.prepare, convsts.ray_jobs.pipelines.inputs; "
        "from convsts.ray_jobs.config.loader import load_config; from convsts.ray_jobs.tasks import get_task; "
        "load_config(None); get_task('reddit'); get_task('snli')"
    )
    assert _loaded_after(code, sorted(SLOW_UNITS)) == []


def test_refusals_that_need_no_model_answer_before_the_library_loads(tmp_path, monkeypatch):
    """A damaged checkpoint (evaluate, export), an unwritable --out, an unreachable tracking server
    and a folder as the tracking store (train) are refused in one line each before the command
    loads torch, MLflow or Ray: a fresh interpreter runs the commands and has loaded none of them."""
    from testkit.faults import tiny_checkpoint
    from testkit.local_cluster import free_ports

    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut after its manifest was written
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    commands = [
        ["evaluate", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "e")],
        ["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--out", str(tmp_path / "x")],
        ["train", "--out", "/proc/no-such-folder/out"],
        ["train", "--out", str(tmp_path / "t"), f"mlflow.tracking_uri=http://127.0.0.1:{free_ports(1)[0]}"],
        ["train", "--out", str(tmp_path / "f"), f"mlflow.tracking_uri=file://{tmp_path}/mlruns"],
    ]
    code = (
        "from convsts.ray_jobs.cli import main; "
        f"codes = [main(c) for c in {commands!r}]; assert codes == [2] * 5, codes"
    )
    assert _loaded_after(code, sorted(SLOW_UNITS)) == []
    assert not (tmp_path / "e").exists() and not (tmp_path / "x").exists()


def test_reading_a_run_config_imports_no_data_pipeline():
    """The run config is a pure schema plus a loader: reading one (task names checked against the
    registry by name) loads no data pipeline, tokenizer or task module."""
    pipelines = ["convsts.datasets.reddit", "convsts.datasets.pushshift", "convsts.datasets.snli", "convsts.datasets.text",
                 "convsts.ray_jobs.tasks.reddit", "convsts.ray_jobs.tasks.snli", "tokenizers", *sorted(SLOW_UNITS)]  # fmt: skip
    code = (
        "from convsts.ray_jobs.config.loader import load_config; "
        "load_config('configs/demo.yaml', ['trainer.task_weights={reddit: 0.9, snli: 0.1}'])"
    )
    assert _loaded_after(code, pipelines) == []


def test_every_package_of_the_tree_is_listed_for_the_wheel():
    """pyproject.toml lists the packages (the links of convsts/ are not discovered): a subpackage
    added to the tree and not to that list would be missing from an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {m.rpartition(".")[0] for m, path in MODULES.items() if path is not None and path.name != "__init__.py"}
    packages |= {m for m, path in MODULES.items() if path is None or path.name == "__init__.py"}
    assert listed == packages, (
        f"not listed: {sorted(packages - listed)}; listed, not in the tree: {sorted(listed - packages)}"
    )


# A checkpoint's files are named by convsts.models.checkpoint alone (its layout's one owner: a
# package, its modules included). The other modules that name a file of the same name name another
# layout's, each said here.
CHECKPOINT_FILES = ("train_state", "model.safetensors", "manifest.json", "config.json", "tokenizer.json")
OTHER_LAYOUTS = {
    "convsts.models.checkpoint": CHECKPOINT_FILES,  # the owner
    "convsts.datasets.pretrained": ("model.safetensors", "config.json", "tokenizer.json"),  # a Hugging Face folder
    "convsts.datasets.text": ("tokenizer.json",),  # a Hugging Face model's own tokenizer
    "convsts.ray_jobs.tasks.prepared_folder": ("manifest.json",),  # a prepared data folder's manifest
    "convsts.models.export": ("tokenizer.json",),  # an ONNX export folder's tokenizer
}
# What a checkpoint's files are called, as its owner exports it: another module that imports one
# builds a path into a checkpoint itself (and reads the file its own way); it asks the owner instead.
FILE_NAME_CONSTANTS = (
    "WEIGHTS_FILE",
    "TOKENIZER_FILE",
    "TRAIN_STATE_FILE",
    "MANIFEST_FILE",
    "EMBEDDING_FILES",
    "MODEL_FILES",
)


def names_of_checkpoint_files(modules=None) -> list[str]:
    """Each string (docstrings aside) of a module that names a checkpoint's file, where the module
    is not the checkpoint module and names no other layout's file of that name (OTHER_LAYOUTS)."""
    found = []
    for module, path in (modules or MODULES).items():
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        owned = OTHER_LAYOUTS.get(module, ()) or (CHECKPOINT_FILES if _within(module, CHECKPOINT_OWNER) else ())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for name in CHECKPOINT_FILES:
                    if name in node.value and name not in owned:
                        found.append(f"{path.name}:{node.lineno} names {name}")
    return found


CHECKPOINT_OWNER, RUN_FOLDER_OWNER = "convsts.models.checkpoint", "convsts.ray_jobs.runtime.run_folder"


def _within(module: str, owner: str) -> bool:
    """`module` is `owner` or one of its modules (an owner may be a package)."""
    return module == owner or module.startswith(owner + ".")


def _nodes_outside(owner: str, modules=None):
    """(the file, each node of its syntax tree) of every module but `owner` (and its modules)."""
    for module, path in (modules or MODULES).items():
        if path is not None and not _within(module, owner):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                yield path, node


def imports_of_checkpoint_file_names(modules=None) -> list[str]:
    """Each import, outside the checkpoint module, of a name its layout's files go by."""
    return [
        f"{path.name}:{node.lineno} imports {a.name}"
        for path, node in _nodes_outside(CHECKPOINT_OWNER, modules)
        if isinstance(node, ast.ImportFrom) and node.module and _within(node.module, CHECKPOINT_OWNER)
        for a in node.names
        if a.name in FILE_NAME_CONSTANTS
    ]


# An --out folder's names, said by convsts.ray_jobs.runtime.run_folder alone (the ones that are not
# also everyday words: "checkpoint", "model" and "prepared" are its too). train.json's own field
# "best_checkpoint" is a key of that file, not a folder's name.
RUN_FOLDER_NAMES = ("run.json", "train.json", "config.yaml", "ray_results", "loss_curves.png", "mlflow.db")


def names_of_run_folder_files(modules=None) -> list[str]:
    """Each string that is exactly a run folder's name, in a module other than its owner."""
    return [
        f"{path.name}:{node.lineno} names {node.value}"
        for path, node in _nodes_outside(RUN_FOLDER_OWNER, modules)
        if isinstance(node, ast.Constant) and node.value in RUN_FOLDER_NAMES
    ]


def imports_from_the_run_folder_module(modules=None) -> list[str]:
    """Each import, outside the run folder module, of anything but RunFolder: OUT's paths are asked
    of a RunFolder, so no other module builds one from a name."""
    return [
        f"{path.name}:{node.lineno} imports {a.name}"
        for path, node in _nodes_outside(RUN_FOLDER_OWNER, modules)
        if isinstance(node, ast.ImportFrom) and node.module == RUN_FOLDER_OWNER
        for a in node.names
        if a.name != "RunFolder"
    ]


def test_only_the_run_folder_module_names_an_outs_files(tmp_path):
    assert names_of_run_folder_files() == []
    assert imports_from_the_run_folder_module() == []
    probe = tmp_path / "probe.py"
    probe.write_text('"""Reads run.json."""\nRECORD = "run.json"\n')
    assert names_of_run_folder_files({"convsts.probe": probe}) == ["probe.py:2 names run.json"]
    probe.write_text("from convsts.ray_jobs.runtime.run_folder import RunFolder, TRACKING_DB\n")
    assert imports_from_the_run_folder_module({"convsts.probe": probe}) == ["probe.py:1 imports TRACKING_DB"]


def test_only_the_checkpoint_module_names_a_checkpoints_files(tmp_path):
    assert names_of_checkpoint_files() == []
    assert imports_of_checkpoint_file_names() == []
    # The check itself: a module that names one is found; a docstring that mentions one is not.
    probe = tmp_path / "probe.py"
    probe.write_text('"""Reads train_state.pt."""\nSTATE = "train_state.pt"\nWEIGHTS = f"{1}/model.safetensors"\n')
    assert names_of_checkpoint_files({"convsts.probe": probe}) == [
        "probe.py:2 names train_state",
        "probe.py:3 names model.safetensors",
    ]
    probe.write_text("from convsts.models.checkpoint import WEIGHTS_FILE, read_meta\n")
    assert imports_of_checkpoint_file_names({"convsts.probe": probe}) == ["probe.py:1 imports WEIGHTS_FILE"]
