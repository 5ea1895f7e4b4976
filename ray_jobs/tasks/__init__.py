"""The task registry: `get_task(name)` finds `TASK` in `ray_jobs/tasks/<name>.py` or in one of the
run config's `task_modules`. See ray_jobs/tasks/base.py for what a task declares."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from convsts.io.errors import ConfigError
from convsts.ray_jobs.tasks.base import Task

if TYPE_CHECKING:
    from convsts.ray_jobs.config.schema import RunConfig


NOT_TASKS = ("base", "prepared_folder")  # the modules of this package that define no task


def builtin_tasks() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in NOT_TASKS)


def _task_in(module_name: str) -> Task:
    task = getattr(importlib.import_module(module_name), "TASK", None)
    if not isinstance(task, Task):
        raise ValueError(f"module {module_name} has no Task bound to the name TASK")
    return task


def get_task(name: str, modules: Sequence[str] = ()) -> Task:
    """The task called `name`: from the extra `modules` first, else the built-in module of that name."""
    for module_name in modules:
        task = _task_in(module_name)
        if task.name == name:
            return task
    if name in builtin_tasks():
        return _task_in(f"convsts.ray_jobs.tasks.{name}")
    known = builtin_tasks() + [_task_in(m).name for m in modules]
    raise ValueError(
        f"unknown task {name!r}: known tasks are {', '.join(known)} "
        f"(add a module under ray_jobs/tasks/ or list one in task_modules)"
    )


def check_task_names(cfg: RunConfig) -> RunConfig:
    """`cfg` when every task it weights is a built-in task or one of its task_modules' (the built-in
    names are read from this package's listing: none of their modules is imported); else ConfigError
    naming the key."""
    builtin = builtin_tasks()
    for name in cfg.trainer.task_weights:
        if name in builtin:
            continue
        try:
            get_task(name, cfg.task_modules)
        except (ValueError, ImportError) as err:
            raise ConfigError(f"trainer.task_weights.{name}: {err}") from None
    return cfg


def trained_tasks(cfg: RunConfig) -> dict[str, Task]:
    """{name: task} of the tasks this run trains on (those with a weight), in config order."""
    return {name: get_task(name, cfg.task_modules) for name in cfg.trainer.task_weights}


def prepared_tasks(cfg: RunConfig) -> dict[str, Task]:
    """Tasks whose prepared shards a run needs: those trained, plus those in every vocabulary."""
    tasks = trained_tasks(cfg)
    for name in builtin_tasks():
        if name not in tasks and get_task(name).in_every_vocabulary:
            tasks[name] = get_task(name)
    return tasks


def model_heads(cfg: RunConfig) -> dict[str, str]:
    """{task: head kind} of a run's model: every built-in task (so that any checkpoint can be scored
    on every built-in benchmark and warm-start any run) plus the tasks trained."""
    heads = {name: get_task(name).head for name in builtin_tasks()}
    heads.update({name: task.head for name, task in trained_tasks(cfg).items()})
    return heads


__all__ = ["Task", "builtin_tasks", "check_task_names", "get_task", "model_heads", "prepared_tasks", "trained_tasks"]
