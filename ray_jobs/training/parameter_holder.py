"""The parameter holder of asynchronous task groups (trainer.task_split=async), after the paper's
parameter servers. One Ray actor keeps the shared encoder, each task's head and their optimizers.
Every worker pushes its own gradients (the DAN's sparse tables as (indices, values), never dense
tables) and gets fresh weights back every trainer.async_refresh_every pushes (the sparse rows
changed since its copy, the dense tensors whole), without waiting for the other tasks' workers.
A head is pushed and pulled only by its own task's workers.

The holder applies each update as it arrives, at the lr of the stage schedule at its update count,
and paces the tasks to their weights: a worker whose task is trainer.async_slack updates ahead of
its share of all updates waits before computing its next one (so each task's count stays within
about slack + its workers updates of its share). It counts updates, staleness (updates applied between a worker's copy
and its push) and waiting per task, calls a checkpoint every trainer.checkpoint_every updates and
ends the run at trainer.steps updates.

It keeps nothing across a restart of its own: rank 0 resets it from the run's starting point
(fresh weights, --resume, or Ray Train's latest checkpoint) whenever the worker group starts, and a
restarted (empty) holder fails the workers' next push, so that Ray Train restarts them from the last
checkpoint (trainer.max_failures). `ParameterHolder` is plain Python with async methods; `start_holder`
makes it a Ray actor."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch

from convsts.datasets.text import tokenizer_from_dict
from convsts.models.checkpoint import TrainState
from convsts.ray_jobs.config.loader import from_dict
from convsts.ray_jobs.tasks import trained_tasks
from convsts.ray_jobs.training.schedule import StageSchedule
from convsts.ray_jobs.training.start_weights import initial_model
from convsts.ray_jobs.training.task_groups import plan_for
from convsts.ray_jobs.training.train_step import Optimizers

# A pushed or pulled tensor: dense, or a sparse table's (row indices (nnz,), rows (nnz, D)).
Wire = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


class HolderReset(RuntimeError):
    """The worker's generation of the holder is gone (the holder restarted, or was reset)."""


def shared_or_head(name: str, task: str) -> bool:
    """Whether parameter `name` is the shared encoder's or `task`'s head's."""
    return name.startswith("encoder.") or name.startswith(f"heads.{task}.")


class ParameterHolder:
    """Built empty; rank 0's `reset` gives it the run (config, tokenizer, weights, train state), so
    that a restarted holder needs nothing from its constructor (Ray keeps large constructor
    arguments in the object store, from where a restart may not find them: ray-project/ray#53727)."""

    def __init__(self):
        self.generation = self.step = 0  # generation 0 until rank 0 resets it
        self.model = None
        self._cond: asyncio.Condition | None = None

    def _build(self, run: dict[str, Any], tokenizer: dict[str, Any]) -> None:
        self.cfg = from_dict(run)
        trainer = self.cfg.trainer
        self.model = initial_model(self.cfg, tokenizer_from_dict(tokenizer), warm_start=False)  # reset() loads it
        self.tasks = list(trained_tasks(self.cfg))
        self.weights = plan_for(trainer, trainer.max_workers).weights  # async: a fixed-size group
        self.schedule = StageSchedule(trainer.stages, trainer.warmup_steps, trainer.lr_decay, trainer.steps)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        sparse = {id(p) for p in self.model.sparse_parameters()}
        self.sparse = {n for n, p in self.params.items() if id(p) in sparse}

    # -- set-up and checkpoints (rank 0) ----------------------------------------------------------

    def reset(
        self,
        run: dict[str, Any],
        tokenizer: dict[str, Any],
        weights: dict[str, torch.Tensor],
        state: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Start a generation of the run `run` (the run config's dict; `tokenizer`: the tokenizer's)
        from `weights` (a model state dict) and a TrainState dict (optimizers, step, per-task
        counts; None for a fresh run)."""
        if self.model is None:
            self._build(run, tokenizer)
        trainer = self.cfg.trainer
        train_state = TrainState.from_dict(state) if state else TrainState(0)
        self.model.load_state_dict(weights)
        self.step = train_state.step
        self.lr = self.schedule.lr_at(self.step)
        self.optimizers = Optimizers.build(trainer, self.model, self.tasks, self.lr)
        train_state.load_optimizers(self.optimizers)
        self.optimizers.set_lr(self.lr)
        self.updates = {t: train_state.task_updates.get(t, 0) for t in self.tasks}
        self.base = self.step - sum(self.updates.values())  # updates before counting began (a sync checkpoint's)
        self.row_version = {n: torch.zeros(self.params[n].shape[0], dtype=torch.long) for n in self.sparse}
        self.next_checkpoint = (self.step // trainer.checkpoint_every + 1) * trainer.checkpoint_every
        self.window = self._empty_window()
        self.generation += 1
        return self.hello()

    def hello(self) -> dict[str, Any]:
        return {"generation": self.generation, "step": self.step}

    def checkpoint_state(self, generation: int) -> dict[str, Any]:
        """The whole model, the optimizers and the counts; called by rank 0 while every worker waits
        at the checkpoint (no push runs), which moves the next checkpoint on."""
        self._check(generation)
        every = self.cfg.trainer.checkpoint_every
        self.next_checkpoint = (self.step // every + 1) * every
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "encoder_optimizers": [o.state_dict() for o in self.optimizers.encoder],
            "head_optimizers": {t: [o.state_dict() for o in opts] for t, opts in self.optimizers.heads.items()},
            "task_updates": dict(self.updates),
        }

    def stats(self) -> dict[str, Any]:
        """Per task since the last call: updates, staleness (sum, max), seconds waited for pacing;
        with the counts so far and the seconds the window covers."""
        window, self.window = self.window, self._empty_window()
        return {
            "step": self.step,
            "seconds": time.time() - window["started"],
            "updates": dict(self.updates),
            "base": self.base,
            "window": window["tasks"],
        }

    def _empty_window(self) -> dict[str, Any]:
        return {
            "started": time.time(),
            "tasks": {t: {"updates": 0, "staleness_sum": 0, "staleness_max": 0, "waited_s": 0.0} for t in self.tasks},
        }

    # -- the workers' calls -------------------------------------------------------------------------

    def _check(self, generation: int) -> None:
        if generation != self.generation:
            what = "restarted" if self.generation == 0 else f"was reset (generation {self.generation})"
            raise HolderReset(
                f"the parameter holder {what} since this worker connected (generation {generation}): "
                "the worker group restarts from the last checkpoint"
            )

    def _done(self) -> bool:
        return self.step >= self.cfg.trainer.steps

    def _due(self) -> bool:
        """A checkpoint is due, or the run is done (its last checkpoint)."""
        return self._done() or self.step >= self.next_checkpoint

    def _may_apply(self, task: str) -> bool:
        """Pacing: a task waits while it is `async_slack` updates ahead of its share; a due checkpoint
        or the end releases every waiting worker (their ranks meet at the checkpoint)."""
        return self._due() or self._room(task) > 0

    def _condition(self) -> asyncio.Condition:
        """The pacing condition, made on the actor's event loop at its first use."""
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _room(self, task: str) -> float:
        """How many more updates `task` may start now before its workers wait (> 0: it may)."""
        counted = self.step - self.base
        return self.weights[task] * (counted + 1) + self.cfg.trainer.async_slack - self.updates[task]

    async def turn(self, generation: int, task: str, version: int, pull: bool = True) -> dict[str, Any]:
        """Wait until `task` may compute its next update (pacing, or a due checkpoint or the end,
        which release every waiting worker); the reply says the update count, the task's "room" (how
        many more updates it may start before waiting), whether a checkpoint is due or the run is
        done and, with `pull`, carries the weights changed since `version`.
        Waiting before the worker computes, not after, keeps its gradient fresh."""
        self._check(generation)
        arrived = time.time()
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.generation != generation or self._may_apply(task))
            self._check(generation)
            self.window["tasks"][task]["waited_s"] += time.time() - arrived
        reply: dict[str, Any] = {"step": self.step, "done": self._done(), "room": self._room(task), "due": self._due()}
        if pull:  # no await since the check: these weights are those of update `step`
            reply["weights"] = self._weights_since(task, version)
        return reply

    async def push(
        self, generation: int, task: str, grads: dict[str, Wire], version: int, pull: bool
    ) -> dict[str, Any]:
        """Apply one update of `task` computed on the weights of update `version` (unless the run has
        reached trainer.steps: "applied" False), then wait for the task's next turn (see `turn`)."""
        self._check(generation)
        applied = not self._done()
        if applied:
            window = self.window["tasks"][task]
            staleness = self.step - version
            self._apply(task, grads)
            window["updates"] += 1
            window["staleness_sum"] += staleness
            window["staleness_max"] = max(window["staleness_max"], staleness)
        cond = self._condition()
        async with cond:
            cond.notify_all()
        return {**await self.turn(generation, task, version, pull), "applied": applied}

    def _apply(self, task: str, grads: dict[str, Wire]) -> None:
        lr = self.schedule.lr_at(self.step)
        if lr != self.lr:
            self.lr = lr
            self.optimizers.set_lr(lr)
        for name, grad in grads.items():
            param = self.params.get(name)
            if param is None or not shared_or_head(name, task):
                raise KeyError(
                    f"a {task} worker pushed a gradient for {name!r}, not a parameter of the encoder or its head"
                )
            if isinstance(grad, tuple):
                rows, values = grad  # (nnz,), (nnz, D)
                param.grad = torch.sparse_coo_tensor(rows.unsqueeze(0), values, param.shape, check_invariants=False)
            else:
                param.grad = grad
        for opt in self.optimizers.for_task(task):
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.step += 1
        self.updates[task] += 1
        for name, grad in grads.items():
            if isinstance(grad, tuple):
                self.row_version[name][grad[0]] = self.step

    def _weights_since(self, task: str, version: int) -> dict[str, Wire]:
        """The encoder's and `task`'s head's weights: the sparse tables' rows changed after update
        `version`, the dense tensors whole (copies: the reply is serialised after this returns)."""
        out: dict[str, Wire] = {}
        for name, param in self.params.items():
            if not shared_or_head(name, task):
                continue
            if name in self.sparse:
                rows = (self.row_version[name] > version).nonzero().squeeze(1)  # (changed,)
                out[name] = (rows, param.detach()[rows].clone())  # (changed,), (changed, D)
            else:
                out[name] = param.detach().clone()
        return out


def start_holder(cfg) -> Any:
    """The holder as a Ray actor owned by the caller (the driver). Ray restarts it after its process
    dies (up to trainer.max_failures times), empty: see the module's docstring."""
    import ray

    return (
        ray.remote(ParameterHolder)
        .options(num_cpus=0, max_restarts=cfg.trainer.max_failures, max_task_retries=0)
        .remote()
    )


class HolderUpdate(torch.optim.Optimizer):
    """On an async worker, the 'optimizer' of the encoder and the task's head: `step()` (inside the
    shared train_step) takes the step's gradients to the CPU, sparse tables as (indices, values);
    `send()` pushes them to the holder, which applies them with its own optimizers, and loads the
    weights it sends back every `refresh_every` pushes. One update is in flight at a time: `send()`
    returns at once and `receive()` waits for its reply, so that the holder applies an update while
    the worker computes the next (whose staleness then counts the one in flight)."""

    def __init__(self, holder, model, task: str, refresh_every: int):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and shared_or_head(n, task)]
        super().__init__([p for _, p in named], {"lr": 0.0})  # param_groups for zero_grad; the holder has the lr
        self.holder, self.task, self.refresh_every = holder, task, refresh_every
        self.named = dict(named)
        sparse = {id(p) for p in model.sparse_parameters()}
        self.sparse = {n for n, p in self.named.items() if id(p) in sparse}
        self.pending: dict[str, Wire] | None = None
        self.in_flight: Any = None  # the ObjectRef of the reply to the update being applied
        self.generation = self.version = self.pending_version = 0
        self.attempts = 0
        self.pushed = 0  # updates of this worker the holder applied

    def connect(self, pushed: int = 0) -> dict[str, Any]:
        """Join the holder's current generation (after rank 0's reset); `pushed`: this rank's count
        from the checkpoint it resumes."""
        import ray

        info = ray.get(self.holder.hello.remote())
        self.generation, self.version, self.pushed = info["generation"], info["step"], pushed
        return info

    @torch.no_grad()
    def step(self, closure=None):
        grads: dict[str, Wire] = {}
        for name, p in self.named.items():
            if p.grad is None:
                continue
            if name in self.sparse:
                g = p.grad.coalesce()
                grads[name] = (g.indices()[0].cpu(), g.values().float().cpu())  # (nnz,), (nnz, D)
            else:
                grads[name] = p.grad.float().cpu()
        self.pending, self.pending_version = grads, self.version  # the weights these gradients were computed on

    def send(self) -> None:
        """Push the pending update without waiting: the worker computes its next one meanwhile."""
        if self.pending is None:
            raise RuntimeError("send() before step(): no gradients to send")
        if self.in_flight is not None:
            raise RuntimeError("send() while an update is in flight: receive() its reply first")
        self.attempts += 1
        pull = self.attempts % self.refresh_every == 0
        self.in_flight = self.holder.push.remote(self.generation, self.task, self.pending, self.pending_version, pull)
        self.pending = None

    def receive(self) -> dict[str, Any]:
        """The reply to the update in flight, once the holder has applied it and this worker may
        push its next; loads the weights it carries."""
        import ray

        reply = ray.get(self.in_flight)
        self.in_flight = None
        self.pushed += int(reply["applied"])
        return self._take(reply)

    def turn(self) -> dict[str, Any]:
        """Wait for this worker's first turn (after connecting or a checkpoint), with fresh weights."""
        import ray

        return self._take(ray.get(self.holder.turn.remote(self.generation, self.task, self.version)))

    def _take(self, reply: dict[str, Any]) -> dict[str, Any]:
        if "weights" in reply:
            self.load(reply["weights"], reply["step"])
        return reply

    @torch.no_grad()
    def load(self, weights: dict[str, Wire], version: int) -> None:
        for name, value in weights.items():
            p = self.named[name]
            if isinstance(value, tuple):
                rows, values = value
                p[rows.to(p.device)] = values.to(p.device, p.dtype)
            else:
                p.copy_(value)
        self.version = version


def holder_stats_metrics(stats: dict[str, Any], batch_size: int) -> dict[str, float]:
    """MLflow metrics from one `ParameterHolder.stats()` window: per task its update count and
    share so far, and over the window its updates/s, pairs/s (x the stage's batch), mean and max
    staleness and seconds waited for pacing."""
    counted = max(stats["step"] - stats["base"], 1)
    seconds = max(stats["seconds"], 1e-9)
    out: dict[str, float] = {}
    for task, w in stats["window"].items():
        n = w["updates"]
        out.update(
            {
                f"async/{task}/updates": stats["updates"][task],
                f"async/{task}/share": stats["updates"][task] / counted,
                f"async/{task}/updates_per_s": n / seconds,
                f"async/{task}/pairs_per_s": n * batch_size / seconds,
                f"async/{task}/wait_s": w["waited_s"],
            }
        )
        if n:
            out.update(
                {
                    f"async/{task}/staleness_mean": w["staleness_sum"] / n,
                    f"async/{task}/staleness_max": w["staleness_max"],
                }
            )
    return out
