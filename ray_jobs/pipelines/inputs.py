"""The prepared inputs of a run: every task it needs prepared into one folder (`convsts prepare all`,
the demo), or the missing ones prepared before training (`convsts train`, sweeps). Light to import:
`convsts prepare` starts without torch, MLflow or Ray (a task's prepare starts Ray only where it
needs Ray Data)."""

from __future__ import annotations

from typing import Any

from convsts.io import storage
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.tasks import prepared_tasks
from convsts.ray_jobs.tasks.prepared_folder import MANIFEST, prepare_into, verify_prepared


def is_prepared(task, prepared: str) -> bool:
    """The task's folder under `prepared` was prepared to the end (its manifest, written last, is there)."""
    return storage.is_file(storage.join(task.prepared_dir(prepared), MANIFEST))


def prepare_all(cfg: RunConfig, out_dir: str) -> dict[str, dict[str, Any]]:
    """Every task the run needs (prepared_tasks), each into out_dir/<task>; returns the manifests.
    Run again into the same folder, it resumes: a task prepared to the end from this run's inputs
    and settings is kept (one that differs is refused, naming the difference), one that was
    interrupted is prepared again."""
    tasks = prepared_tasks(cfg)
    manifests = _prepare_missing(cfg, str(out_dir), tasks)
    for name, task in tasks.items():
        if name not in manifests:
            manifests[name] = verify_prepared(task, str(out_dir), cfg)
            log.info("%s: already prepared from this run's inputs and settings; kept", task.prepared_dir(str(out_dir)))
    return {name: manifests[name] for name in tasks}


def ensure_prepared(cfg: RunConfig, prepared: str) -> dict[str, dict[str, Any]]:
    """Prepare the shards of this run's tasks (prepared_tasks) that are not in `prepared` yet (or
    whose prepare was interrupted); returns the manifests written. Folders already prepared are
    left to check_prepared."""
    return _prepare_missing(cfg, prepared, prepared_tasks(cfg))


def _prepare_missing(cfg: RunConfig, prepared: str, tasks: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each of `tasks` not prepared to the end under `prepared`, prepared there (a task's prepare
    starts Ray only where it needs Ray Data); every raw input of them is checked first, so a missing
    one is named before any task's prepare starts."""
    todo = {name: task for name, task in tasks.items() if not is_prepared(task, prepared)}
    for task in todo.values():
        storage.expand_inputs(task.raw_inputs(cfg))  # raises, naming a missing input
    return {
        name: prepare_into(task, task.raw_inputs(cfg), task.prepared_dir(prepared), cfg) for name, task in todo.items()
    }
