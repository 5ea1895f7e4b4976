"""The training side of a checkpoint's train state (models.checkpoint.TrainState): torch's generators
of a process, and each rank's stream positions at any group size."""

from __future__ import annotations

from typing import Any

import torch

from convsts.models.checkpoint import TrainState
from convsts.ray_jobs.training.task_groups import TaskPlan


def rng_state() -> dict[str, Any]:
    """torch's generators of this process: the CPU one (dropout on CPU) and, on a GPU, CUDA's."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """A rank's saved generators, or {"seed": N}: every generator of the process seeded with N."""
    if "seed" in state:
        torch.manual_seed(state["seed"])
    if "cpu" in state:
        torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _in_rows(position: dict[str, int], ranks: int) -> dict[str, int]:
    """A stream position as rows read of its epoch (one saved as batches read: each global batch
    was `ranks` x its batch size)."""
    if "rows" in position or "batch_in_epoch" not in position:
        return position
    rows = position["batch_in_epoch"] * position.get("batch_size", 0) * ranks
    return {"epoch": position.get("epoch", 0), "rows": rows, "batch_size": position.get("batch_size", 0)}


def _same_ranks(state: TrainState, plan: TaskPlan, saved: TaskPlan, tasks) -> bool:
    """The group that wrote `state` had the same ranks for `tasks` as `plan`: each rank's own position holds."""
    then, now = state.task_ranks or saved.ranks_by_task(), plan.ranks_by_task()
    return len(state.positions) == plan.world_size and all(then.get(t) == now[t] for t in tasks)


def _saved_positions(state: TrainState, task: str, then: dict[str, list[int]]) -> list[dict[str, int]]:
    """The positions in `state` of the ranks that read `task`, in rows."""
    before = [r for r in then.get(task, []) if r < len(state.positions) and task in state.positions[r]]
    return [_in_rows(state.positions[r][task], len(then[task])) for r in before]


def _at(position: dict[str, int]) -> tuple[int, int]:
    return position.get("epoch", 0), position.get("rows", 0)


def positions_of(state: TrainState, rank: int, plan: TaskPlan, saved: TaskPlan) -> dict[str, dict[str, int]]:
    """The stream positions of `rank` of `plan` in `state`: its own where the group that wrote it had
    the same ranks for the same tasks (its task_ranks; `saved`, the plan rebuilt from the run's
    settings, for a state without them). Otherwise (an elastic group resized, a resume on another
    count or other task workers) each of the rank's tasks goes on from the task's position: a
    count of the epoch's rows read, the same on every rank of a task that draws together (the
    earliest of them where the ranks went at their own pace: the async split), which a stream
    at any number of ranks continues from (local_feed.LocalStream, dealt_stream.DealtStream). A position written before
    positions were counts of rows (batch_in_epoch) counts the batches of its task's ranks then.
    A task the state holds no position for starts at epoch 0 (the loop says so)."""
    then = state.task_ranks or saved.ranks_by_task()
    if _same_ranks(state, plan, saved, plan.tasks_of(rank)):
        return {t: _in_rows(p, len(then.get(t, [1]))) for t, p in state.positions[rank].items()}
    out = {}
    for task in plan.tasks_of(rank):
        if saved_positions := _saved_positions(state, task, then):
            out[task] = min(saved_positions, key=_at)
    return out


def repeated_rows(state: TrainState, plan: TaskPlan, saved: TaskPlan) -> dict[str, str]:
    """For each task whose ranks had gone at their own pace (the async split) and that goes on at
    other ranks: one line saying which rows come again. It goes on from its slowest rank's
    position (positions_of), so the rows of the epoch's order between that and its fastest rank's
    were read by some ranks and are read again."""
    then = state.task_ranks or saved.ranks_by_task()
    lines = {}
    for task in plan.tasks:
        found = _saved_positions(state, task, then)
        if not found or _same_ranks(state, plan, saved, [task]):
            continue
        slowest, fastest = min(found, key=_at), max(found, key=_at)
        if _at(slowest) == _at(fastest):
            continue
        until = f"row {fastest.get('rows', 0)}" + (
            f" of epoch {fastest.get('epoch', 0)}" if fastest.get("epoch", 0) != slowest.get("epoch", 0) else ""
        )
        lines[task] = (
            f"{task}: its {len(found)} ranks had gone at their own pace (the async split) and it goes on at "
            f"{len(plan.ranks_of(task))} from its slowest rank's row {slowest.get('rows', 0)} of epoch "
            f"{slowest.get('epoch', 0)}'s order: the rows from there to {until}, which its faster ranks had "
            f"read in part, are read again"
        )
    return lines
