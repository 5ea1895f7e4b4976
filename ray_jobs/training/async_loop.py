"""The worker loop of asynchronous task groups (trainer.task_split=async), without Ray Train: each
rank trains its one task with the shared `train_step`, whose encoder-and-head 'optimizer' is a
`HolderUpdate`, and pushes every update to the parameter holder (training/parameter_holder.py). The step
count is the holder's (every task's updates together). Ranks meet only at the checkpoints the holder
calls (every trainer.checkpoint_every updates, and at trainer.steps); rank 0 then saves the holder's
weights, optimizers and per-task counts with every rank's stream position, in the format of a
synchronous run's checkpoint."""

from __future__ import annotations

import time
from typing import Any

import torch

from convsts.models.checkpoint import TrainState
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.training.loop import NON_FINITE_ADVICE, LoopHooks, NonFiniteLossError, StreamFactory, TrainLoop
from convsts.ray_jobs.training.parameter_holder import HolderUpdate, holder_stats_metrics
from convsts.ray_jobs.training.task_groups import TaskPlan
from convsts.ray_jobs.training.train_step import Optimizers, train_step


class AsyncTrainLoop(TrainLoop):
    def __init__(
        self,
        cfg: RunConfig,
        model,
        plan: TaskPlan,
        rank: int,
        open_stream: StreamFactory,
        holder,
        tokenizer,
        hooks: LoopHooks | None = None,
        state: TrainState | None = None,
    ):
        (self.task,) = plan.tasks_of(rank)
        self.holder = holder
        self.update = HolderUpdate(holder, model, self.task, cfg.trainer.async_refresh_every)
        super().__init__(
            cfg,
            model,
            plan,
            rank,
            open_stream,
            hooks,
            state,
            optimizers=Optimizers(encoder=[self.update], heads={self.task: []}),
        )
        import ray

        if rank == 0:  # every (re)start: the holder begins a generation from this run's starting point
            ray.get(
                holder.reset.remote(
                    cfg.to_dict(), tokenizer.to_dict(), model.state_dict(), state.to_dict() if state else None
                )
            )
        self.combiner.barrier()  # no rank pushes to a holder that rank 0 has not reset
        self.update.connect(state.pushed_of(rank, plan.world_size) if state else 0)
        self.logged = self.evaluated = self.step

    def _crossed(self, every: int, since: int) -> bool:
        return self.step // every > since // every

    def run(self) -> int:
        """Train until the holder's count reaches trainer.steps. With trainer.async_overlap, while
        a task keeps up with its share (room for two more updates), the worker computes its next
        update while the holder applies the last; otherwise, and when the task is about to wait for
        its share, it takes its turn first, so that its gradient is computed on fresh weights."""
        trainer = self.cfg.trainer
        if self.step >= trainer.steps:  # resumed at the end (or trainer.steps=0): nothing to push
            self.save({})
            return self.step
        run_start = time.time()
        self.ahead = self._may_overlap(self.update.turn())
        in_flight = None  # (loss, accuracy, pairs) of the update the holder is applying
        while True:
            if in_flight is not None and not self.ahead:
                if self._receive(in_flight, run_start):
                    return self.step
                in_flight = None
            stage = self.schedule.at(self.step)
            if stage is not self.stage:
                self.stage = stage
                self.streams = self._reopened(stage.batch_size)
            batch = self.next_batch(self.task)
            loss, accuracy = train_step(
                self.model,
                self.tasks[self.task],
                batch,
                self.optimizers,
                self.combiner,
                trainer.grad_clip,
                trainer.precision,
            )
            if not bool(torch.isfinite(loss)):  # never pushed: the holder's weights stay finite
                raise NonFiniteLossError(
                    f"non-finite {self.task} loss ({float(loss)}) on rank {self.rank} after update "
                    f"{self.step}: training stopped; {NON_FINITE_ADVICE}"
                )
            if in_flight is not None and self._receive(in_flight, run_start):
                return self.step  # the update just computed is not needed
            self.update.send()
            in_flight = (loss, accuracy, stage.batch_size * len(self.plan.ranks_of(self.task)))

    def _may_overlap(self, reply: dict[str, Any]) -> bool:
        """Whether to compute the next update before the reply to the last (trainer.async_overlap,
        and room in the task's share for both)."""
        return self.cfg.trainer.async_overlap and reply["room"] >= 2

    def _receive(self, in_flight: tuple[Any, Any, int], run_start: float) -> bool:
        """Take the reply to the update in flight; save when a checkpoint is due. True at the end."""
        reply = self.update.receive()
        metrics = self._applied(reply, *in_flight, run_start)
        self.ahead = self._may_overlap(reply)
        if reply["due"]:  # a checkpoint, or the end (every rank's last reply is due)
            self.save(metrics)
            if reply["done"]:
                return True
            self.ahead = self._may_overlap(self.update.turn())
        return False

    def _applied(self, reply: dict[str, Any], loss, accuracy, pairs: int, run_start: float) -> dict[str, float]:
        """Count a reply's update; log and evaluate when the holder's count crossed an interval."""
        trainer = self.cfg.trainer
        self.step = reply["step"]
        if reply["applied"]:
            self.window.add(self.task, loss, accuracy, pairs)
        metrics: dict[str, float] = {}
        if self._crossed(trainer.log_every, self.logged) or reply["done"]:
            metrics = self._log_window(run_start)
            self.logged = self.step
        if (
            trainer.eval_every
            and self.hooks.evaluate is not None
            and self.rank == 0
            and self._crossed(trainer.eval_every, self.evaluated)
        ):
            self.evaluated = self.step
            self._evaluate()
        return metrics

    def _log_window(self, run_start: float) -> dict[str, float]:
        self.lr = self.schedule.lr_at(self.step)  # the holder's lr at this update (logged by rank 0)
        metrics = super()._log_window(run_start)
        if self.rank == 0:
            import ray

            extra = holder_stats_metrics(ray.get(self.holder.stats.remote()), self.stage.batch_size)
            self.hooks.log(extra, self.step)
            metrics.update(extra)
        return metrics

    def save(self, metrics: dict[str, float]) -> None:
        """Every rank stops pushing and meets here; rank 0 takes the holder's state (which moves its
        next checkpoint on) before any rank pushes again."""
        import ray

        gathered = self.combiner.gather_objects(
            {"position": {t: s.position() for t, s in self.streams.items()}, "pushed": self.update.pushed}
        )
        state = None
        if self.rank == 0:
            snap: dict[str, Any] = ray.get(self.holder.checkpoint_state.remote(self.update.generation))
            self.model.load_state_dict(snap["model"])  # what the checkpoint holds: the holder's weights
            self.update.version = snap["step"]
            self.step = snap["step"]
            state = TrainState(
                snap["step"],
                snap["encoder_optimizers"],
                snap["head_optimizers"],
                [g["position"] for g in gathered],
                self.plan.world_size,
                self.plan.mode,
                snap["task_updates"],
                [g["pushed"] for g in gathered],
                task_ranks=self.plan.ranks_by_task(),
            )
        self.combiner.barrier()
        self._checkpoint(metrics, state)
