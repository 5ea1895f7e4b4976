"""Task worker groups over one shared encoder (the paper's 95/5 Reddit/SNLI split).

`plan_tasks` maps ranks to tasks and decides how the task weights are realised. Synchronous
(trainer.task_split=sync), every step combines every rank's gradients:
  head_count          enough workers that the share of ranks per task matches the weights:
                      every rank's encoder gradient counts the same (a plain mean);
  gradient_weighting  too few workers for that (2 here): each rank's encoder gradient is scaled
                      by w_task / n_task_ranks before the sum, so the update is sum_t w_t * mean_t(g);
  task_sampling       one worker: each step's task is drawn by weight.
Head gradients are averaged within the task's group only. Asynchronous (trainer.task_split=async):
  async               each rank pushes its own updates to the parameter holder (training/parameter_holder.py),
                      which paces the tasks to their weights; no gradient crosses ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist

HEAD_COUNT_TOLERANCE = 0.01


class SplitMode(StrEnum):
    """How a plan realises the task weights (the module's docstring says each); its value is what
    MLflow's `task_split_mode` tag and a checkpoint's train state record."""

    HEAD_COUNT = "head_count"
    GRADIENT_WEIGHTING = "gradient_weighting"
    TASK_SAMPLING = "task_sampling"
    ASYNC = "async"


EVERY_TASK = "*"  # the task of the one rank of TASK_SAMPLING: it draws each step's task from all


@dataclass(frozen=True)
class TaskPlan:
    mode: SplitMode
    weights: dict[str, float]  # normalized configured weights
    rank_tasks: tuple[str, ...]  # the task of each rank (EVERY_TASK for the one rank of TASK_SAMPLING)

    @property
    def world_size(self) -> int:
        return len(self.rank_tasks)

    @property
    def tasks(self) -> list[str]:
        return list(self.weights)

    def ranks_by_task(self) -> dict[str, list[int]]:
        """{task: its ranks}: what a checkpoint's train state keeps of the plan (TrainState.task_ranks)."""
        return {t: self.ranks_of(t) for t in self.tasks}

    def ranks_of(self, task: str) -> list[int]:
        if self.mode is SplitMode.TASK_SAMPLING:
            return [0]
        return [r for r, t in enumerate(self.rank_tasks) if t == task]

    def tasks_of(self, rank: int) -> list[str]:
        return self.tasks if self.mode is SplitMode.TASK_SAMPLING else [self.rank_tasks[rank]]

    def leader(self, task: str) -> int:
        return self.ranks_of(task)[0]

    def effective_weight(self, task: str) -> float:
        """The share of the encoder update that comes from `task`."""
        if self.mode is SplitMode.HEAD_COUNT:
            return len(self.ranks_of(task)) / self.world_size
        return self.weights[task]

    def encoder_grad_scale(self, rank: int) -> float:
        """Multiply rank's local encoder gradient by this, then SUM across all ranks."""
        if self.mode in (SplitMode.TASK_SAMPLING, SplitMode.ASYNC):
            return 1.0
        task = self.rank_tasks[rank]
        return self.effective_weight(task) / len(self.ranks_of(task))

    def describe(self) -> str:
        groups = ", ".join(f"{t}: ranks {self.ranks_of(t)} weight {self.effective_weight(t):.3f}" for t in self.tasks)
        return f"task split mode={self.mode} ({groups})"


def plan_tasks(
    weights: dict[str, float], num_workers: int, task_workers: dict[str, int] | None = None, split: str = "sync"
) -> TaskPlan:
    """Ranks -> tasks: `task_workers` ({task: count}, summing to num_workers) when given, else by
    the weights (largest remainder, at least one rank per task)."""
    total = sum(weights.values())
    if not weights or total <= 0:
        raise ValueError(f"task weights must be positive, got {weights}")
    norm = {t: w / total for t, w in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))}
    if num_workers == 1 and len(norm) > 1 and split == "sync":
        return TaskPlan(SplitMode.TASK_SAMPLING, norm, (EVERY_TASK,))
    if num_workers < len(norm):
        raise ValueError(
            f"{num_workers} workers for {len(norm)} tasks: use one worker (sync), or at least one per task"
        )
    if task_workers:
        if sorted(task_workers) != sorted(norm) or sum(task_workers.values()) != num_workers:
            raise ValueError(
                f"task workers {dict(task_workers)} must give every task of {sorted(norm)} and sum to {num_workers}"
            )
        counts = dict(task_workers)
    else:  # largest-remainder allocation with at least one rank per task
        counts = {t: max(1, int(w * num_workers)) for t, w in norm.items()}
        while sum(counts.values()) < num_workers:
            t = max(norm, key=lambda t: norm[t] * num_workers - counts[t])
            counts[t] += 1
        while sum(counts.values()) > num_workers:
            t = max((t for t in norm if counts[t] > 1), key=lambda t: counts[t] - norm[t] * num_workers)
            counts[t] -= 1
    rank_tasks = tuple(t for t in norm for _ in range(counts[t]))
    if split == "async":
        return TaskPlan(SplitMode.ASYNC, norm, rank_tasks)
    matches = all(abs(counts[t] / num_workers - w) <= HEAD_COUNT_TOLERANCE for t, w in norm.items())
    return TaskPlan(SplitMode.HEAD_COUNT if matches else SplitMode.GRADIENT_WEIGHTING, norm, rank_tasks)


def plan_for(trainer, num_workers: int) -> TaskPlan:
    """The plan of a run config's `trainer` section over `num_workers` ranks."""
    return plan_tasks(trainer.task_weights, num_workers, trainer.task_workers, trainer.task_split)


class GradientCombiner:
    """Collectives that turn local gradients into the plan's combined update (gloo or NCCL)."""

    def __init__(self, plan: TaskPlan, rank: int):
        self.plan = plan
        self.rank = rank
        self.distributed = plan.world_size > 1 and dist.is_available() and dist.is_initialized()
        # Every rank must create every group, in the same order.
        self.task_groups = {}
        if self.distributed:
            for task in plan.tasks:
                self.task_groups[task] = dist.new_group(plan.ranks_of(task))

    def combine(self, model, task: str) -> None:
        """After backward on `task`'s loss: the encoder's gradients become the plan's weighted mix
        over all ranks, the task head's the mean over the task's ranks. In async mode gradients stay
        local: the worker pushes them to the parameter holder."""
        if self.plan.mode is SplitMode.ASYNC:
            return
        self.combine_encoder(list(model.encoder.parameters()), model.sparse_parameters())
        self.combine_head(task, list(model.heads[task].parameters()))

    def combine_encoder(
        self, params: Sequence[torch.nn.Parameter], sparse_params: Sequence[torch.nn.Parameter] = ()
    ) -> None:
        """`sparse_params`: those of `params` whose gradients are sparse. Every rank runs the same
        collectives for them even on a step where its gradient for them is missing."""
        scale = self.plan.encoder_grad_scale(self.rank)
        if not self.distributed:
            if scale != 1.0:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale)
            return
        sparse_ids = {id(p) for p in sparse_params}
        dense = [p for p in params if id(p) not in sparse_ids]
        sparse = [p for p in params if id(p) in sparse_ids]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in dense]
        flat = torch.cat([g.reshape(-1) for g in grads]) * scale  # (sum of numels,)
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(dense, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        for p in sparse:
            p.grad = _all_reduce_sparse(p, scale)

    def combine_head(self, task: str, params: Iterable[torch.nn.Parameter]) -> None:
        ranks = self.plan.ranks_of(task)
        if not self.distributed or len(ranks) == 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.task_groups[task])
        flat /= len(ranks)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sync_heads(self, heads: dict[str, torch.nn.Module]) -> None:
        """Give every rank each head's weights from that task's leader (before a checkpoint)."""
        if not self.distributed:
            return
        for task in self.plan.tasks:
            for p in heads[task].parameters():
                dist.broadcast(p.data, src=self.plan.leader(task))

    def any_rank(self, flag: torch.Tensor) -> bool:
        """Whether a 0-dim bool tensor is set on any rank (one small all-reduce, on the flag's device),
        so that every rank takes the same branch after it."""
        if not self.distributed:
            return bool(flag)
        value = flag.to(torch.int32).reshape(1)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def gather_objects(self, obj) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.plan.world_size
        dist.all_gather_object(out, obj)
        return out


def from_rank_0(obj, world: int):
    """`obj` as rank 0 has it, on every rank of the group (one broadcast; as given without a group)."""
    if world <= 1 or not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _all_reduce_sparse(p: torch.nn.Parameter, scale: float) -> torch.Tensor:
    """Sum of every rank's scaled sparse gradient: gather (indices, values), add, coalesce. Every
    buffer lives on the parameter's device (NCCL exchanges CUDA tensors only)."""
    device = p.device
    if p.grad is None:
        grad = torch.sparse_coo_tensor(
            torch.zeros((1, 0), dtype=torch.long, device=device),
            torch.zeros((0, *p.shape[1:]), device=device),
            p.shape,
            check_invariants=False,
        )
    else:
        grad = p.grad.coalesce()
    indices = grad.indices()[0]  # (nnz,)
    values = grad.values() * scale  # (nnz, D)
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([indices.numel()], dtype=torch.long, device=device))
    counts = [int(s) for s in torch.cat(sizes).tolist()]  # one host read for all ranks
    pad = max(counts) - indices.numel()
    idx_buf = torch.cat([indices, torch.zeros(pad, dtype=torch.long, device=device)])
    val_buf = torch.cat([values, torch.zeros((pad, *values.shape[1:]), dtype=values.dtype, device=device)])
    all_idx = [torch.empty_like(idx_buf) for _ in range(world)]
    all_val = [torch.empty_like(val_buf) for _ in range(world)]
    dist.all_gather(all_idx, idx_buf)
    dist.all_gather(all_val, val_buf)
    idx = torch.cat([i[:n] for i, n in zip(all_idx, counts)])
    val = torch.cat([v[:n] for v, n in zip(all_val, counts)])
    return torch.sparse_coo_tensor(idx.unsqueeze(0), val, p.shape, check_invariants=False).coalesce()


def draw_task(plan: TaskPlan, generator: torch.Generator) -> str:
    weights = torch.tensor([plan.weights[t] for t in plan.tasks])
    return plan.tasks[int(torch.multinomial(weights, 1, generator=generator).item())]
