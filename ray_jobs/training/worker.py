"""The Ray Train worker: wires the Ray-free TrainLoop to Ray Train (its tasks' streams, device,
checkpoints, reports) and to MLflow. Resumes from `ray.train.get_checkpoint()` after a restart."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from convsts.datasets.text import tokenizer_from_dict
from convsts.io.redaction import redact_tree
from convsts.models.checkpoint import Checkpoint, TrainState, folder_name, save_checkpoint
from convsts.ray_jobs.config.loader import from_dict
from convsts.ray_jobs.evaluation.sts import StsDevProbe
from convsts.ray_jobs.tasks import trained_tasks
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.async_loop import AsyncTrainLoop
from convsts.ray_jobs.training.data_feed import batch_encoder, feed_order, task_shards
from convsts.ray_jobs.training.dealt_stream import DealtStream
from convsts.ray_jobs.training.feed_dealer import CpuShare
from convsts.ray_jobs.training.local_feed import LocalStream
from convsts.ray_jobs.training.loop import WORKERS_METRIC, LoopHooks, TrainLoop
from convsts.ray_jobs.training.start_weights import initial_model, restore
from convsts.ray_jobs.training.task_groups import SplitMode, from_rank_0, plan_for


def print_once(line: str) -> None:
    """One progress line on the worker's real stdout (Ray forwards it to the driver). Ray Train
    patches `print` in workers to also log each line through the root logger, which would print every
    line twice."""
    out = sys.__stdout__ or sys.stdout  # None only where Python started without a stdout
    out.write(line + "\n")
    out.flush()


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """One worker; a function of `loop_config` (resolved run config, tokenizer, MLflow run, datasets)."""
    import ray.train
    import ray.train.torch

    cfg = from_dict(loop_config["run"])
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    plan = plan_for(cfg.trainer, world)
    device = ray.train.torch.get_device()
    tokenizer = tokenizer_from_dict(loop_config["tokenizer"])
    checkpoint = ray.train.get_checkpoint()
    model, state = restored_model(cfg, tokenizer, checkpoint, loop_config.get("hashed", ()))
    # What the run itself has logged (after a restart: the steps it replays), read once by rank 0.
    own = from_rank_0(own_logged(loop_config) if rank == 0 else None, world)
    by_ray = ray_restart(own, checkpoint)
    # The same MLflow run goes on: Ray Train started its group again, or a trial run again continues its own checkpoint.
    restarted = by_ray or loop_config.get("continues") == loop_config.get("run_id")
    model.to(device).train()

    open_stream = stream_factory(cfg, plan, rank, tokenizer, device, loop_config["listings"])
    hooks = worker_hooks(loop_config, cfg, model, tokenizer, rank, own)
    if plan.mode is SplitMode.ASYNC:
        holder = loop_config["holder"]
        loop: TrainLoop = AsyncTrainLoop(cfg, model, plan, rank, open_stream, holder, tokenizer, hooks, state)
    else:
        loop = TrainLoop(cfg, model, plan, rank, open_stream, hooks, state)
    if rank == 0:
        _announce(loop_config, plan, world, device, loop.step, restarted=restarted, own=own)
        before = previous_size(loop_config, state, restarted)
        if before is not None and before != world:
            print_once(resize_line(before, plan, loop.step, by_ray=by_ray))
    try:
        loop.run()
    finally:  # together: a dealer's stop waits for its pipeline to shut down (about 2 s)
        with ThreadPoolExecutor(max_workers=max(1, len(loop.streams))) as closing:
            list(closing.map(lambda stream: stream.close(), loop.streams.values()))


def stream_factory(cfg, plan, rank: int, tokenizer, device, listings: dict[str, Any]):
    """open_stream(task, batch_size, position) for the rank's tasks (TrainLoop's StreamFactory): from
    each task's Ray Data pipeline through its dealer (trainer.feed=ray_data; named per group start,
    the same name on every rank), or read by the rank itself (local; an async group's ranks go at
    their own pace, which one dealer cannot follow)."""
    tasks = trained_tasks(cfg)
    orders = {
        name: feed_order(cfg, name, task_shards(tasks[name], cfg, listings[name]), tokenizer.pad_id)
        for name in plan.tasks_of(rank)
    }
    feed = "local" if plan.mode is SplitMode.ASYNC else cfg.trainer.feed
    group = from_rank_0(uuid.uuid4().hex[:12], plan.world_size) if feed == "ray_data" else ""
    # An elastic group below its MAX leaves the CPUs it may grow into to its next workers.
    cpus = CpuShare(
        len(plan.tasks), cfg.trainer.max_workers - plan.world_size, tuple(cfg.trainer.worker_request().items())
    )
    if rank == 0 and feed != cfg.trainer.feed:
        print_once(f"[convsts rank 0] {plan.mode} task split: each rank reads its own data (trainer.feed=local)")

    def open_stream(task: str, batch_size: int, position: dict[str, Any]):
        ranks = plan.ranks_of(task)
        share, encode = (
            (ranks.index(rank), len(ranks)),
            batch_encoder(tasks[task], tokenizer, cfg.tokenizer.max_words, cfg),
        )
        if feed == "ray_data":
            name = f"{group}-{task}-{position.get('epoch', 0)}-{position.get('rows', 0)}-{batch_size}"
            return DealtStream(
                task, name, orders[task], encode, batch_size, share, device, position, rank == ranks[0],
                cpus,
            )  # fmt: skip
        return LocalStream(task, orders[task], encode, batch_size, share, device, position, cfg.trainer.feed_processes)

    return open_stream


def own_logged(loop_config: dict[str, Any]) -> dict[str, int]:
    """{metric: the highest step logged} by this run so far ({} at its first start, where the driver
    has logged no step of the loop). After a restart (a lost worker or node, a resize, a
    FailureConfig retry, from a checkpoint or before the first one), it holds the group's size at its
    steps (train/workers)."""
    uri, run_id = loop_config.get("tracking_uri"), loop_config.get("run_id")
    return tracking.last_logged_steps(uri, run_id) if uri and run_id else {}


def ray_restart(own: dict[str, int], checkpoint) -> bool:
    """Whether Ray Train started this worker group again within its fit (a lost worker or node, a
    resize, a FailureConfig retry): from its last registered checkpoint, or, before the first one,
    from the run's start, once the run has logged a step (`own`, own_logged: its group size is logged
    with every step)."""
    return checkpoint is not None or WORKERS_METRIC in own


def previous_size(loop_config: dict[str, Any], state: TrainState | None, restarted: bool) -> int | None:
    """The size of the group this one follows: after a restart the run's last logged train/workers
    (a group may grow before it checkpoints, going on from a checkpoint of an earlier size), else the
    checkpoint's world size; None for a fresh start."""
    uri, run_id = loop_config.get("tracking_uri"), loop_config.get("run_id")
    if restarted and uri and run_id:
        logged = tracking.latest_value(uri, run_id, WORKERS_METRIC)
        if logged is not None:
            return int(logged)
    return state.world_size if state is not None else None


def resize_line(before: int, plan, step: int, by_ray: bool) -> str:
    """The one line of a group that goes on at another size than the checkpoint's: from which size to
    which, why, and the new task split."""
    if not by_ray:
        why = "this run's trainer.num_workers"
    elif plan.world_size < before:
        why = "fewer workers fit: a worker or its node was lost"
    else:
        why = "more workers fit: Ray's resize check found room"
    return f"[convsts rank 0] worker group resized from {before} to {plan.world_size} at step {step} ({why}); {plan.describe()}"


def restored_model(cfg, tokenizer, checkpoint, hashed=()):
    """(the model, its train state): from Ray Train's checkpoint after a restart or from --resume,
    whichever is further on (a trial run again resumes its own newest complete checkpoint, which Ray
    may not have registered), else fresh (seeded: identical on every rank) or warm-started."""
    fresh = checkpoint is None and not cfg.trainer.resume_from  # else a checkpoint's weights replace these
    model = initial_model(cfg, tokenizer, warm_start=fresh, hashed=hashed)
    if checkpoint is not None:
        with checkpoint.as_directory() as ckpt_dir:
            resumed = Checkpoint.at(cfg.trainer.resume_from).step if cfg.trainer.resume_from else -1
            if Checkpoint.at(ckpt_dir).step >= resumed:
                return model, restore(model, checkpoint_dir=ckpt_dir)
    return model, restore(model, resume_from=cfg.trainer.resume_from or None, hashed=hashed)


def worker_hooks(
    loop_config: dict[str, Any], cfg, model, tokenizer, rank: int, own: dict[str, int] | None = None
) -> LoopHooks:
    """The loop's ties to Ray and MLflow: metrics to the run, checkpoints reported to Ray Train
    (with the model, tokenizer, run config and provenance), the STS-B dev probe on rank 0."""
    import ray.train

    uri, run_id = loop_config.get("tracking_uri"), loop_config.get("run_id")
    # After a restart (a lost node, a resize, FailureConfig) the loop replays the steps since its
    # checkpoint, or since the run's start before its first checkpoint: each metric is logged once per
    # step, so the points the run already holds are not logged again (a first start's run holds only
    # what the driver logged, never a step of the loop). A run that continues an earlier one of OUT's
    # chain replays the steps the chain logged after its checkpoint (a fallback to an older run's
    # checkpoint, an older checkpoint named): across the chain's MLflow runs each step is logged once
    # (exact resume makes the values equal). With other settings than its checkpoint's run (a new
    # trajectory) the chain's history ends at the checkpoint's step (tracking.runs.chain_logged).
    logged = dict(loop_config.get("chain_logged") or {})  # the chain's earlier runs', read once by the driver
    for key, step in (own_logged(loop_config) if own is None else own).items():  # the run's own (rank 0's read)
        logged[key] = max(step, logged.get(key, -1))

    raylet = os.getppid()  # a Ray worker is its node's raylet's child

    def stop_if_orphaned() -> None:
        """A worker whose raylet has gone (its node lost, or its command SIGKILLed with its own local
        instance) ends here, before it logs a step or writes a checkpoint for a run nobody drives;
        Ray would end it only seconds later."""
        if os.getppid() != raylet:
            os._exit(1)

    def log(metrics: dict[str, float], step: int) -> None:
        stop_if_orphaned()
        if uri and run_id:
            new = {k: v for k, v in metrics.items() if step > logged.get(tracking.metric_name(k), -1)}
            tracking.log_metrics(uri, run_id, new, step)

    def report(step: int, metrics: dict[str, float], train_state: TrainState | None) -> None:
        stop_if_orphaned()
        if train_state is None:
            ray.train.report({**metrics, "step": step}, checkpoint=None)
            return
        run, provenance = redact_tree(loop_config["run"]), redact_tree(loop_config["provenance"])
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(tmp, model, tokenizer, run, train_state, provenance)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({**metrics, "step": step}, checkpoint=checkpoint, checkpoint_dir_name=folder_name(step))

    evaluate = StsDevProbe(cfg, tokenizer).evaluate if rank == 0 and cfg.trainer.eval_every else None
    return LoopHooks(log=log, checkpoint=report, evaluate=evaluate, progress=print_once)


def _announce(
    loop_config: dict[str, Any], plan, world: int, device, step: int, restarted: bool, own: dict[str, int]
) -> None:
    """Rank 0's line of what only a worker knows (the task split itself is the driver's line), the
    run's tags at every start (the split's mode at this size), the restart step after a restart and
    the steps it replays without logging them again."""
    uri, run_id = loop_config.get("tracking_uri"), loop_config.get("run_id")
    threads = torch.get_num_threads()
    print_once(f"[convsts rank 0] world size {world}; device {device}; torch threads {threads}; start step {step}")
    if uri and run_id:  # at every start: an elastic group's mode follows its size
        tracking.set_tags(uri, run_id, {"task_split_mode": plan.mode, "torch_threads": str(threads)})
    replayed = max(own.values(), default=0) if restarted else 0
    if replayed > step:
        print_once(
            f"[convsts rank 0] steps {step + 1}-{replayed} are replayed from step {step}; the run logged them "
            f"before, so they are not logged again (train/workers there stays the earlier group's size)"
        )
    # The restart is an event, logged directly: hooks.log drops points at steps the run already holds, so a
    # second resume from the same checkpoint would vanish.
    if restarted and uri and run_id:
        tracking.log_metrics(uri, run_id, {"train/restarted_at_step": step}, step)
