"""The Ray Train side of a training run: the TorchTrainer that keeps Ctrl+C the command's and can
abort its fit, its scaling, run and checkpoint configs, and the fit itself with the async split's
parameter holder."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import ray

from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.runtime.dead_train_runs import record_fit
from convsts.ray_jobs.runtime.logs import train_log_level
from convsts.ray_jobs.runtime.resource_waits import saying_resource_waits
from convsts.ray_jobs.runtime.worker_deaths import reporting_worker_deaths
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training import feed_pipeline
from convsts.ray_jobs.training.lineage import RunStorage
from convsts.ray_jobs.training.loop import SCORE_METRIC
from convsts.ray_jobs.training.parameter_holder import start_holder
from convsts.ray_jobs.training.task_groups import SplitMode
from convsts.ray_jobs.training.worker import train_loop_per_worker

# How long a stopped command waits for Ray Train's controller to abort its worker group before it
# marks its run: inside the grace Ray gives a stopped job's driver (RAY_JOB_STOP_WAIT_TIME_S, 3 s)
# before its SIGKILL, which would leave the run RUNNING. The abort goes on in the controller after.
ABORT_TIMEOUT_S = 1.0


def checkpoint_config(cfg: RunConfig):
    """Ray keeps the last checkpoint, plus the best `keep_checkpoints` by in-training STS-B dev when
    evaluation is on (else the last `keep_checkpoints`)."""
    import ray.train

    if not cfg.trainer.eval_every:
        return ray.train.CheckpointConfig(num_to_keep=cfg.trainer.keep_checkpoints)
    return ray.train.CheckpointConfig(
        num_to_keep=cfg.trainer.keep_checkpoints, checkpoint_score_attribute=SCORE_METRIC, checkpoint_score_order="max"
    )


def fit(
    cfg: RunConfig,
    location: RunStorage,
    loop_config: dict,
    extra_callbacks,
    plan,
    made: Callable[[str], None],
):
    """The TorchTrainer's fit, with the async split's parameter holder for this fit only; `made` is
    given the id Ray Train gave the fit before it starts. A worker group that waits for resources is
    said in one line (saying_resource_waits). On Ctrl+C, SIGTERM or an error the workers stop before
    the run is marked KILLED or FAILED (abort_fit)."""
    uri, run_id = loop_config["tracking_uri"], loop_config["run_id"]
    holder = None
    if plan.mode is SplitMode.ASYNC:
        holder = loop_config["holder"] = start_holder(cfg)
    trainer = torch_trainer(cfg, location, loop_config, extra_callbacks)
    made(trainer.train_run_context.run_id)  # Train V2's run context, made with the trainer
    record_fit(trainer.train_run_context.run_id)  # a later run releases its reservation if this driver dies
    try:
        with (
            tracking.system_metrics(uri, run_id),
            reporting_worker_deaths((feed_pipeline.TASK_NAME,)),
            saying_resource_waits(),
        ):
            return trainer.fit()
    except BaseException:
        trainer.abort_fit()
        raise
    finally:
        if holder is not None:
            ray.kill(holder)


def torch_trainer(cfg: RunConfig, location: RunStorage, loop_config: dict, extra_callbacks: Sequence[Any]):
    import ray.train
    from ray.train.torch import TorchTrainer

    class CommandsTrainer(TorchTrainer):
        """Ray Train's fit() installs a SIGINT handler of its own (and never puts the earlier one
        back), which exits 1 without a word, or 0 once the fit is over: Ctrl+C stays the
        command's, a KeyboardInterrupt that ends the run KILLED in one line (exit 130), once
        abort_fit has stopped the workers."""

        def _register_sigint_handler(self, controller) -> None:
            self.controller = controller  # for abort_fit

        def abort_fit(self) -> None:
            """Stop the fit's worker group (Ray Train's controller aborts it, then ends itself) and
            wait for that, so that no worker logs a step or writes a checkpoint after the command
            has marked its MLflow run KILLED or FAILED."""
            controller = getattr(self, "controller", None)
            if controller is None:
                return
            with contextlib.suppress(ray.exceptions.RayError):  # its end (exit_actor), or a timeout
                ray.get(controller.abort.remote(), timeout=ABORT_TIMEOUT_S)

    return CommandsTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(  # type: ignore[call-arg]  # Train V2's; stubs: V1's
            num_workers=cfg.trainer.ray_num_workers(),  # type: ignore[arg-type]  # (MIN, MAX): V2's elastic group
            elastic_resize_monitor_interval_s=cfg.trainer.resize_interval_s,
            use_gpu=cfg.trainer.use_gpu,
            resources_per_worker={
                k: v for k, v in cfg.trainer.worker_request().items() if k != "GPU"
            },  # use_gpu: its GPU
            placement_strategy=cfg.trainer.placement_strategy,
        ),
        run_config=ray.train.RunConfig(  # type: ignore[call-arg]  # Train V2's (RAY_TRAIN_V2_ENABLED); stubs: V1's
            storage_path=location.root,
            name=location.name,
            checkpoint_config=checkpoint_config(cfg),
            failure_config=ray.train.FailureConfig(max_failures=cfg.trainer.max_failures),
            callbacks=list(extra_callbacks) or None,
            logging_config=ray.train.LoggingConfig(log_level=train_log_level()),
        ),
    )
