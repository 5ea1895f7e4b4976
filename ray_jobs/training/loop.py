"""The training loop of one worker, without Ray: stages, task draws, steps, metric windows,
in-training evaluation and checkpoints. Ray Train (worker.py) gives it its data streams and the
hooks that report to Ray and MLflow; tests and benchmarks give it in-memory streams."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from convsts.models.checkpoint import TrainState
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.sts import StsDevProbe
from convsts.ray_jobs.tasks import trained_tasks
from convsts.ray_jobs.training.metric_window import MetricWindow, format_eta
from convsts.ray_jobs.training.schedule import StageSchedule
from convsts.ray_jobs.training.task_groups import GradientCombiner, SplitMode, TaskPlan, draw_task, plan_tasks
from convsts.ray_jobs.training.train_state import positions_of, repeated_rows, rng_state, set_rng_state
from convsts.ray_jobs.training.train_step import Optimizers, train_step

# open_stream(task, batch_size, position) -> an iterator of batches with .position() (a position as
# .position() gave it, or {} for the start) and .opening_rows_read (the rows of the shards read for
# its first batch once it has given it; None for batches not read from shards)
StreamFactory = Callable[[str, int, dict[str, Any]], Iterator[dict[str, torch.Tensor]]]


SCORE_METRIC = StsDevProbe.METRIC  # ranks checkpoints when in-training evaluation is on
WORKERS_METRIC = "train/workers"  # the group's size at each logged step (an elastic group's changes)
NOT_EVALUATED = -1.0  # the score of a checkpoint written before the first evaluation (Pearson's floor)


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss."""


NON_FINITE_ADVICE = "lower the learning rate, set trainer.grad_clip, or resume from an earlier checkpoint"


def _no_log(metrics: dict[str, float], step: int) -> None:
    return None


def _no_checkpoint(step: int, metrics: dict[str, float], state: TrainState | None) -> None:
    return None


@dataclass
class LoopHooks:
    log: Callable[[dict[str, float], int], None] = _no_log  # metrics at a step (MLflow)
    checkpoint: Callable[[int, dict[str, float], TrainState | None], None] = (
        _no_checkpoint  # every rank calls it; rank 0 gets the state
    )
    evaluate: Callable[[Any], dict[str, float]] | None = None  # rank 0, every trainer.eval_every steps
    progress: Callable[[str], None] = lambda line: print(line, flush=True)  # a progress line


def saved_plan(cfg: RunConfig, state: TrainState, plan: TaskPlan) -> TaskPlan:
    """The plan of the group that wrote `state`, rebuilt from the run's settings, for a state written
    before each task's ranks were kept in it (TrainState.task_ranks): `plan` at the same size, else
    the weights' plan at its size (an elastic group resized, or a resume on another count)."""
    if state.world_size == plan.world_size:
        return plan
    return plan_tasks(cfg.trainer.task_weights, state.world_size, split=cfg.trainer.task_split)


class TrainLoop:
    def __init__(
        self,
        cfg: RunConfig,
        model,
        plan: TaskPlan,
        rank: int,
        open_stream: StreamFactory,
        hooks: LoopHooks | None = None,
        state: TrainState | None = None,
        optimizers: Optimizers | None = None,
    ):
        """`optimizers`: given by a loop whose updates are applied elsewhere (async); else built
        here and loaded from `state`."""
        self.cfg, self.model, self.plan, self.rank = cfg, model, plan, rank
        self.hooks = hooks or LoopHooks()
        self.open_stream = open_stream
        self.tasks = trained_tasks(cfg)
        self.my_tasks = plan.tasks_of(rank)
        self.leaders = {t: plan.leader(t) for t in plan.tasks}
        self.combiner = GradientCombiner(plan, rank)
        self.schedule = StageSchedule(
            cfg.trainer.stages, cfg.trainer.warmup_steps, cfg.trainer.lr_decay, cfg.trainer.steps
        )
        self.start = self.step = state.step if state else 0
        self.stage = self.schedule.at(self.step)
        self.lr = self.schedule.lr_at(self.step)
        self.optimizers = optimizers or Optimizers.build(cfg.trainer, model, self.my_tasks, self.lr)
        positions: dict[str, dict[str, Any]] = {}
        if state:
            if optimizers is None:
                state.load_optimizers(self.optimizers)
                self.optimizers.set_lr(self.lr)
            positions = self._positions(state, saved_plan(cfg, state, plan))
        self.streams = self._open_streams(self.stage.batch_size, positions)
        self.resumed = {
            t: p
            for t, p in positions.items()
            if t in self.streams
            and (p.get("epoch") or p.get("rows"))
            and not getattr(self.streams[t], "order_changed", None)
        }
        self.task_gen = torch.Generator().manual_seed(cfg.seed)
        if state and state.task_draws is not None:  # the draws go on where they stopped
            self.task_gen.set_state(state.task_draws)
        elif state:  # a checkpoint without the draws' state
            self.task_gen.manual_seed(cfg.seed + self.start)
        if state:
            set_rng_state(state.rng_of(rank, plan.world_size, cfg.seed))
        self.window = MetricWindow(plan.tasks)
        # Non-finite losses are flagged on the device (no sync per step) and checked at every log
        # line, evaluation and checkpoint: a diverged model is never saved or scored.
        self.window_steps: list = []  # (step, task) of the steps since the last check
        self.bad = torch.zeros((), dtype=torch.bool)
        self.last_eval: dict[str, float] = {}  # rank 0's latest in-training evaluation

    def _positions(self, state, saved) -> dict[str, dict[str, Any]]:
        """The rank's tasks' positions in `state`; each task's leader says in one line which rows
        come again (an async group resumed at other ranks) or that the state holds none of it."""
        rank, plan = self.rank, self.plan
        positions = positions_of(state, rank, plan, saved)
        for task, line in repeated_rows(state, plan, saved).items():
            if self.leaders[task] == rank:
                self.hooks.progress(f"[convsts rank {rank}] {line}")
        for task in self.my_tasks:
            if task not in positions and state.step and self.leaders[task] == rank:
                self.hooks.progress(
                    f"[convsts rank {rank}] {task}: the checkpoint (step {state.step}) holds no position of "
                    f"this task's data (it was not trained then): its data starts at epoch 0"
                )
        return positions

    def _open_streams(self, batch_size: int, positions: dict[str, dict[str, Any]]):
        """Each of the rank's tasks' streams from its position; a task's leader says in one line where
        a position counted rows of another order than the task's now (the stream starts the epoch over)."""
        streams = {t: self.open_stream(t, batch_size, positions.get(t, {})) for t in self.my_tasks}
        for task, stream in streams.items():
            changed = getattr(stream, "order_changed", None)
            if changed and self.leaders[task] == self.rank:
                self.hooks.progress(f"[convsts rank {self.rank}] {changed}")
        return streams

    def _reopened(self, batch_size: int):
        """The streams at a new stage's batch size, each going on from its position."""
        positions = {t: s.position() for t, s in self.streams.items()}
        for stream in self.streams.values():
            getattr(stream, "close", lambda: None)()
        return self._open_streams(batch_size, positions)

    def next_batch(self, task: str):
        """`task`'s next batch; the first of a task that goes on from a position is said by its
        leader: where in its epoch's order, and the rows of its shards read to reach it."""
        batch = next(self.streams[task])
        position = self.resumed.pop(task, None)
        read = self.streams[task].opening_rows_read
        if position is not None and read is not None and self.leaders[task] == self.rank:
            self.hooks.progress(
                f"[convsts rank {self.rank}] {task}: goes on at row {position.get('rows', 0)} of epoch "
                f"{position.get('epoch', 0)}'s order; read {read} rows of its shards to reach it"
            )
        return batch

    def _next_task(self) -> str:
        return draw_task(self.plan, self.task_gen) if self.plan.mode is SplitMode.TASK_SAMPLING else self.my_tasks[0]

    def check_finite(self) -> None:
        """Raise naming the first step (and its task) whose loss was not finite since the last check.
        Every rank checks at the same steps and learns whether any rank saw one, so all stop together
        (a rank that went on into a checkpoint's collectives would wait forever)."""
        if self.combiner.any_rank(self.bad):
            for (step, task), loss in self.window_steps:
                if not bool(torch.isfinite(loss)):
                    raise NonFiniteLossError(
                        f"non-finite {task} loss ({float(loss)}) at step {step}: training stopped; {NON_FINITE_ADVICE}"
                    )
            others = [t for t in self.plan.tasks if t not in self.my_tasks]
            raise NonFiniteLossError(
                f"non-finite loss on another rank ({', '.join(others)}) by step {self.step}: "
                f"training stopped; {NON_FINITE_ADVICE}"
            )
        self.window_steps.clear()

    def save(self, metrics: dict[str, float]) -> None:
        """Collect the train state on rank 0 (collectives: every rank calls this) and hand it to the hook."""
        self.combiner.sync_heads(self.model.heads)
        gathered = self.combiner.gather_objects(
            {
                "heads": {
                    t: [o.state_dict() for o in self.optimizers.heads[t]]
                    for t in self.my_tasks
                    if self.leaders[t] == self.rank
                },
                "position": {t: s.position() for t, s in self.streams.items()},
                "rng": rng_state(),
            }
        )
        state = None
        if self.rank == 0:
            head_states: dict[str, Any] = {}
            for g in gathered:
                head_states.update(g["heads"])
            state = TrainState(
                self.step,
                [o.state_dict() for o in self.optimizers.encoder],
                head_states,
                [g["position"] for g in gathered],
                self.plan.world_size,
                self.plan.mode,
                task_draws=self.task_gen.get_state(),
                rng=[g["rng"] for g in gathered],
                task_ranks=self.plan.ranks_by_task(),
            )
        self._checkpoint(metrics, state)

    def _checkpoint(self, metrics: dict[str, float], state: TrainState | None) -> None:
        """Hand the checkpoint to the hook (every rank; rank 0 with the state)."""
        if self.hooks.evaluate is not None:  # every checkpoint is ranked by the latest in-training evaluation
            metrics = {**metrics, SCORE_METRIC: self.last_eval.get(SCORE_METRIC, NOT_EVALUATED)}
        self.hooks.checkpoint(self.step, metrics, state)

    def _evaluate(self) -> None:
        """Rank 0's in-training evaluation: said, logged, and kept to rank the next checkpoints."""
        assert self.hooks.evaluate is not None, "evaluated where no evaluation hook is set"
        self.last_eval = self.hooks.evaluate(self.model)
        self.hooks.progress(
            f"[convsts rank 0] step {self.step} " + " ".join(f"{k} {v:.4f}" for k, v in self.last_eval.items())
        )
        self.hooks.log(self.last_eval, self.step)

    def _log_window(self, run_start: float) -> dict[str, float]:
        trainer = self.cfg.trainer
        metrics = self.window.summary([t for t in self.my_tasks if self.leaders[t] == self.rank])
        if self.rank == 0:
            metrics["step_time_s"] = self.window.seconds() / trainer.log_every
            metrics["lr"] = self.lr
            metrics[WORKERS_METRIC] = self.plan.world_size
        if metrics:
            eta = (time.time() - run_start) / (self.step - self.start) * (trainer.steps - self.step)
            shown = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if "/" in k and k != WORKERS_METRIC)
            self.hooks.progress(
                f"[convsts rank {self.rank}] step {self.step}/{trainer.steps} {shown} eta {format_eta(eta)}"
            )
            self.hooks.log(metrics, self.step)
        self.window.reset()
        return metrics

    def run(self) -> int:
        """Train to trainer.steps; returns the last step."""
        trainer = self.cfg.trainer
        if self.step >= trainer.steps:
            self.save({})
            return self.step
        run_start = time.time()
        while self.step < trainer.steps:
            stage = self.schedule.at(self.step)
            if stage is not self.stage:
                self.stage = stage
                self.streams = self._reopened(stage.batch_size)
            lr = self.schedule.lr_at(self.step)
            if lr != self.lr:  # a stage change, or a warm-up step
                self.lr = lr
                self.optimizers.set_lr(lr)
            name = self._next_task()
            batch = self.next_batch(name)
            loss, accuracy = train_step(
                self.model,
                self.tasks[name],
                batch,
                self.optimizers,
                self.combiner,
                trainer.grad_clip,
                trainer.precision,
            )
            self.step += 1
            self.bad = self.bad.to(loss.device) | ~torch.isfinite(loss)
            self.window_steps.append(((self.step, name), loss))
            self.window.add(name, loss, accuracy, stage.batch_size * len(self.plan.ranks_of(name)))
            metrics: dict[str, float] = {}
            # The same on every rank: the finiteness check is a collective.
            eval_step = bool(trainer.eval_every) and self.step % trainer.eval_every == 0
            saving = self.step % trainer.checkpoint_every == 0 or self.step == trainer.steps
            logging = self.step % trainer.log_every == 0 or self.step == trainer.steps
            if logging or eval_step or saving:
                self.check_finite()
            if logging:
                metrics = self._log_window(run_start)
            if eval_step and self.hooks.evaluate is not None and self.rank == 0:
                self._evaluate()
            if saving:
                self.save(metrics)
        return self.step
