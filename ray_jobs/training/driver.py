"""The driver of a training job: prepared data, tokenizer, datasets, the TorchTrainer, the final
checkpoint and the MLflow run. `run_training` is what `convsts train`, `demo` and `tune` call."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import ray

from convsts.io import storage
from convsts.io.dotted import changed_values, flatten
from convsts.io.errors import ConfigError
from convsts.io.redaction import redact, redact_tree
from convsts.io.storage import resolve_path
from convsts.models.checkpoint import CONFIG_FILE as CHECKPOINT_CONFIG
from convsts.models.checkpoint import (
    build_model,
    head_changes,
    load_model,
    load_train_state,
    read_meta,
    replaced_whole,
    save_model_folder,
    verified_folder,
)
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.evaluation.plots import loss_curves_plot
from convsts.ray_jobs.evaluation.sts import read_stsb_split
from convsts.ray_jobs.runtime.logs import log, train_log_level
from convsts.ray_jobs.runtime.output_lock import holds_output
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.runtime.resources import alive_nodes, check_training_fits
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.runtime.worker_deaths import reporting_worker_deaths
from convsts.ray_jobs.tasks import model_heads, prepared_tasks, trained_tasks
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.tracking.mlflow_model import log_model
from convsts.ray_jobs.tracking.model_card import run_facts, write_card
from convsts.ray_jobs.training.data_feed import build_tokenizer, check_prepared, task_datasets, task_split_data_config
from convsts.ray_jobs.training.lineage import (
    BEST_FOLDER,
    CONTINUES_TAG,
    FINAL_CHECKPOINT,
    MODEL_FOLDER,
    TRAIN_SUMMARY,
    RunStart,
    RunStorage,
    begin,
    chain_runs,
    decide_start,
    join_chain,
    mark_checkpoint,
    new_link,
)
from convsts.ray_jobs.training.loop import SCORE_METRIC
from convsts.ray_jobs.training.parameter_holder import start_holder
from convsts.ray_jobs.training.task_groups import SplitMode, plan_for
from convsts.ray_jobs.training.worker import train_loop_per_worker


@dataclass
class TrainResult:
    checkpoint: Path
    run_id: str
    tracking_uri: str
    seconds: float
    mode: str
    train_rows: dict[str, int]  # rows of each materialized task's training set (SNLI after data.snli_fraction)
    model: Path  # OUT/model: the encoder without optimizer state, with its model card


def prepared_location(cfg: RunConfig, out_dir: str | Path, given: str | Path | None = None) -> str:
    """Prepared shards: `given` (--prepared), else data.prepared_dir, else <out>/prepared; local or a URI."""
    location = str(given or resolve_path(cfg.data.prepared_dir) or Path(out_dir) / "prepared")
    return location if storage.is_uri(location) else str(Path(location).resolve())


def data_digests(manifests: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{task: sha1 of its verified manifest's shard list (names, rows, sizes, sha256)}: what a run
    trained on; a shard replaced by other rows changes it."""
    return {
        name: hashlib.sha1(json.dumps(m["shards"], sort_keys=True).encode()).hexdigest()
        for name, m in manifests.items()
    }


def resume_mismatches(meta: dict[str, Any], cfg: RunConfig) -> list[str]:
    """What differs between a checkpoint (its config.json, `meta`) and the run that would resume
    it: the model, the tokenizer settings, the tasks, a task head of another kind. A built-in head
    the checkpoint lacks is not a difference: it starts fresh (said by check_resumable)."""
    old = meta.get("run_config", {})
    new = redact_tree(cfg.to_dict())  # the checkpoint's copy is redacted
    out = []
    for section in ("model", "tokenizer"):  # a setting added since the checkpoint was written is not a difference
        out += changed_values(
            flatten(old.get(section, {}), f"{section}."),
            flatten(new[section], f"{section}."),
            "this run",
            new_keys=False,
        )
    if sorted(old.get("trainer", {}).get("task_weights", {})) != sorted(cfg.trainer.task_weights):
        out.append(f"tasks={sorted(old['trainer']['task_weights'])} (this run: {sorted(cfg.trainer.task_weights)})")
    out += [f"the {d}" for d in head_changes(meta.get("heads") or {}, model_heads(cfg)).other_kind]
    return out


# How long a stopped command waits for Ray Train's controller to abort its worker group before it
# marks its run: inside the grace Ray gives a stopped job's driver (RAY_JOB_STOP_WAIT_TIME_S, 3 s)
# before its SIGKILL, which would leave the run RUNNING. The abort goes on in the controller after.
ABORT_TIMEOUT_S = 1.0

# What a resume may change without a word: where the checkpoint comes from and where the run logs.
RESUME_UNSAID = ("trainer.resume_from", "trainer.warm_start", "mlflow.")


def other_settings(meta: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The settings outside resume_mismatches' checks in which this run differs from the run that
    wrote the checkpoint (its config.json, `meta`: a batch size, a learning rate, trainer.steps):
    taken, and named."""
    old = flatten(meta.get("run_config", {}))
    new = flatten(redact_tree(cfg.to_dict()))  # the checkpoint's copy is redacted
    checked = ("model.", "tokenizer.", "trainer.task_weights.", *RESUME_UNSAID)
    keep = {k for k in old.keys() & new.keys() if not k.startswith(checked)}
    return changed_values({k: old[k] for k in keep}, {k: new[k] for k in keep}, "this run")


def data_mismatches(meta: dict[str, Any], digests: dict[str, str]) -> list[str]:
    """The prepared data of the run that would resume a checkpoint (its config.json, `meta`), where
    it differs from the data the checkpoint was trained on."""
    trained_on = meta.get("provenance", {}).get("data", {})
    return [
        f"the prepared {task} data differs from the data the checkpoint was trained on"
        for task, digest in digests.items()
        if task in trained_on and trained_on[task] != digest
    ]


def check_initial_weights(cfg: RunConfig) -> None:
    """The checkpoint a run resumes or warm-starts from, checked here, once, in one line, not in
    every worker after Ray has started (the prepared data is compared later: check_resume_data)."""
    if cfg.trainer.resume_from:
        check_resumable(cfg)
    elif cfg.trainer.warm_start:
        check_warm_start(cfg)


def check_warm_start(cfg: RunConfig) -> None:
    """trainer.warm_start's encoder fits this run's model (the same encoder, every tensor the same
    shape), as every worker will load it."""
    warm = load_model(cfg.trainer.warm_start)
    theirs, ours = warm.meta.get("model", {}).get("encoder"), cfg.model.encoder
    where = f"trainer.warm_start: {redact(cfg.trainer.warm_start)}"
    if theirs != ours:
        raise ConfigError(
            f"{where} holds a {theirs} encoder; this run's model.encoder is {ours}: warm-start from a {ours} checkpoint"
        )
    mine = build_model(copy.deepcopy(cfg.model), warm.tokenizer).encoder.state_dict()  # building fills hf_config
    for name, tensor in warm.model.encoder.state_dict().items():
        if name not in mine or mine[name].shape != tensor.shape:
            shape = tuple(mine[name].shape) if name in mine else "no such tensor"
            raise ConfigError(
                f"{where}: its encoder's {name} is {tuple(tensor.shape)}, this run's model makes {shape}; "
                f"set model.{ours}.* as the checkpoint's {CHECKPOINT_CONFIG} has them"
            )


def check_resumable(cfg: RunConfig) -> None:
    """The checkpoint to resume, refused in one line unless it is complete and verified (not an
    upload that stopped midway), of this run's model, tokenizer, tasks and head kinds, and its train
    state readable. A head this run's model has that the checkpoint lacks is one line: it starts
    fresh."""
    checkpoint = cfg.trainer.resume_from
    meta = read_meta(verified_folder(checkpoint))  # read once, from the verified local copy
    differs = resume_mismatches(meta, cfg)
    if differs:
        raise ConfigError(f"cannot resume {redact(checkpoint)}: " + "; ".join(differs))
    load_train_state(checkpoint)
    other = other_settings(meta, cfg)
    if other:
        log.info("resuming %s with other settings than its run's: %s", redact(checkpoint), "; ".join(other))
    changes = head_changes(meta.get("heads") or {}, model_heads(cfg))
    if changes.fresh:
        log.info("%s has no %s head: it starts from its initial weights", redact(checkpoint), ", ".join(changes.fresh))
    if changes.dropped:
        log.info(
            "%s: its %s head is not loaded: this run has no such task", redact(checkpoint), ", ".join(changes.dropped)
        )


def check_resume_data(cfg: RunConfig, digests: dict[str, str]) -> None:
    if cfg.trainer.resume_from:
        differs = data_mismatches(read_meta(cfg.trainer.resume_from), digests)
        if differs:
            raise ConfigError(f"cannot resume {redact(cfg.trainer.resume_from)}: " + "; ".join(differs))


@holds_output("train")  # one run at a time in out_dir, for the whole run
def run_training(
    cfg: RunConfig,
    out_dir: str | Path,
    run_id: str | None = None,
    prepared_dir: str | Path | None = None,
    extra_callbacks: Sequence[Any] = (),
    fresh: bool = False,
    mlflow_uri: str | None = None,
    storage_key: str | None = None,
    prepare_missing: Callable[[RunConfig, str], Any] | None = None,
) -> TrainResult:
    """A run's start is checks -> decision -> actions: every refusal comes before anything in OUT
    or in MLflow is removed, written or changed (docs/reliability.md). Then the datasets and the
    TorchTrainer, fit, OUT/checkpoint and OUT/model. The MLflow run ends FAILED on any error.
    `mlflow_uri`: the tracking URI as the caller resolved (and checked) it; None resolves it here.
    `storage_key`: this run's own folder under an explicit trainer.storage_path (run_storage).
    `prepare_missing(cfg, prepared)`: prepares the tasks' data that `prepared` lacks (the run's
    input, which --fresh keeps; pipelines.inputs.ensure_prepared), called once every check that
    needs no data has passed."""
    out_dir = Path(out_dir).resolve()
    # Checks that read only
    storage.check_bucket(cfg.trainer.storage_path, "trainer.storage_path")
    prepared = prepared_location(cfg, out_dir, prepared_dir)
    if cfg.trainer.eval_every:
        read_stsb_split(cfg, "dev")  # fail here, naming the folder, rather than inside a worker
    uri = mlflow_uri or tracking_uri(cfg.mlflow.tracking_uri, out_dir)  # a server that is not there, before any work
    # The decision: fresh, continuing which checkpoint, or refused
    start = decide_start(out_dir, cfg, fresh, storage_key)
    cfg = start.config(cfg)
    check_initial_weights(cfg)
    tasks = prepared_tasks(cfg)
    manifests = check_prepared(prepared, tasks, cfg, present_only=True)  # the folders there, before Ray starts
    ensure_ray()
    fit_now = check_training_fits(cfg, alive_nodes())  # a layout that fits no node is refused, not left waiting
    if cfg.trainer.elastic:
        log.info("elastic worker group %s: %d fit on the cluster now", list(cfg.trainer.worker_range), fit_now)
    manifests, digests = _all_prepared(cfg, prepared, tasks, manifests, prepare_missing)
    # The actions
    begin(out_dir, start, uri, run_id, redact(cfg.to_yaml()))
    own_run = run_id is None  # a run we start we also end; a caller's run (demo, tune) is theirs to end
    mlflow_run = _open_run(cfg, out_dir, uri, run_id, start)
    log.info("checkpoints: %s", redact(start.storage.uri))
    try:
        _log_prepared_datasets(cfg, prepared, manifests, digests, uri, mlflow_run.run_id)
        tracking.set_tags(uri, mlflow_run.run_id, {"convsts.storage": redact(start.storage.uri)})
        data = PreparedData(manifests, digests)
        result = _train(cfg, out_dir, prepared, mlflow_run, data, extra_callbacks, start)
    except BaseException as err:
        status = tracking.ended_status(err)  # never left RUNNING (a caller's run ends with it)
        try:
            tracking.end_run(uri, mlflow_run.run_id, status)
        except Exception as closing:  # a full disk fails the store's write too: the run's own error comes first
            log.warning("could not mark MLflow run %s %s (%s) after: %s", mlflow_run.run_id, status, closing, err)
        raise
    if own_run:
        tracking.end_run(uri, mlflow_run.run_id)
    return result


def _all_prepared(
    cfg: RunConfig, prepared: str, tasks: dict, checked: dict, prepare_missing: Callable[[RunConfig, str], Any] | None
) -> tuple[dict, dict]:
    """(every task's manifest, their digests): the tasks not `checked` yet prepared where missing
    and checked; a resume's data checked against its checkpoint's."""
    if prepare_missing is not None:
        prepare_missing(cfg, prepared)
    rest = {name: task for name, task in tasks.items() if name not in checked}
    manifests = checked | check_prepared(prepared, rest, cfg)  # complete prepared folders
    digests = data_digests(manifests)
    check_resume_data(cfg, digests)
    return manifests, digests


def _open_run(cfg: RunConfig, out_dir: Path, uri: str, run_id: str | None, start: RunStart) -> TrackedRun:
    """The MLflow run this run logs to (a new one, or the caller's), with the run it continues
    (where this store has it: of another store's, every step is this run's to log), joined to OUT's
    chain before the first step."""
    params = flatten(cfg.to_dict())
    continues = start.continues if start.continues and tracking.run_status(uri, start.continues) else None
    if run_id is None:
        tags = {"convsts.job": "train"} | ({CONTINUES_TAG: continues} if continues else {})  # as MLflow shows it
        run_id = tracking.start_run(uri, cfg.mlflow.experiment, cfg.mlflow.run_name or cfg.name, params, tags=tags)
    elif continues != run_id:  # a trial run again keeps the params of its first start (MLflow's are write-once)
        tracking.log_params(uri, run_id, params)
    join_chain(out_dir, start, new_link(out_dir, run_id, cfg, start.storage))  # before the first step
    return TrackedRun(uri, run_id, continues)


def _log_prepared_datasets(
    cfg: RunConfig, prepared: str, manifests: dict, digests: dict, uri: str, run_id: str
) -> None:
    """The training data as MLflow dataset inputs: digest, source folder and the manifest's counts."""
    profile_keys = ("pairs", "train_pairs", "test_pairs", "inputs", "input")
    tracking.log_datasets(
        uri,
        run_id,
        {
            name: {
                "digest": digests[name],
                "source": storage.join(task.prepared_dir(prepared), "train"),
                "profile": {k: manifests[name].get(k) for k in profile_keys if manifests[name].get(k) is not None},
            }
            for name, task in prepared_tasks(cfg).items()
            if name in manifests
        },
    )


def _log_loss_curves(cfg: RunConfig, uri: str, run_id: str, out_dir: Path) -> None:
    """OUT/loss_curves.png from the per-task metric history along OUT's chain up to this run
    (lineage.chain_runs: each run logged the steps no run before it had), logged under plots/. A run
    the store no longer has adds no points."""
    c = tracking.client(uri)
    path = out_dir / "loss_curves.png"
    path.unlink(missing_ok=True)  # an earlier run's plot is never shown as this run's
    names = [f"{task}/{m}" for task in cfg.trainer.task_weights for m in ("loss", "batch_accuracy")]
    chain = [r for r in chain_runs(out_dir, run_id) if tracking.run_status(uri, r)]
    histories = {}
    for n in names:
        points = {m.step: m.value for earlier in chain for m in c.get_metric_history(earlier, n)}  # newest last
        histories[n] = sorted((step, value) for step, value in points.items() if step <= cfg.trainer.steps)
    if not any(histories.values()):
        return
    loss_curves_plot(
        histories,
        path,
        f"{cfg.name}: {cfg.model.encoder}, {cfg.trainer.steps} steps, "
        f"{cfg.trainer.workers_text()} workers, {cfg.trainer.task_split}",
    )
    tracking.log_artifact(uri, run_id, str(path), "plots")


def checkpoint_config(cfg: RunConfig):
    """Ray keeps the last checkpoint, plus the best `keep_checkpoints` by in-training STS-B dev when
    evaluation is on (else the last `keep_checkpoints`)."""
    import ray.train

    if not cfg.trainer.eval_every:
        return ray.train.CheckpointConfig(num_to_keep=cfg.trainer.keep_checkpoints)
    return ray.train.CheckpointConfig(
        num_to_keep=cfg.trainer.keep_checkpoints, checkpoint_score_attribute=SCORE_METRIC, checkpoint_score_order="max"
    )


class TrackedRun(NamedTuple):
    """The MLflow run a fit logs to: its store, its id, and the run its checkpoint came from (None
    when it starts fresh or that run is in another store)."""

    uri: str
    run_id: str
    continues: str | None


class PreparedData(NamedTuple):
    """What the run trains on: each task's prepared manifest and its data digest."""

    manifests: dict[str, dict[str, Any]]
    digests: dict[str, str]


def _train(
    cfg: RunConfig,
    out_dir: Path,
    prepared: str,
    mlflow_run: TrackedRun,
    data: PreparedData,
    extra_callbacks: Sequence[Any],
    start: RunStart,
) -> TrainResult:
    started, location = time.time(), start.storage
    uri, run_id, manifests, digests = mlflow_run.uri, mlflow_run.run_id, data.manifests, data.digests
    tokenizer = _tokenizer(cfg, prepared)
    datasets = task_datasets(cfg, prepared, tokenizer)
    materialized = [n for n in datasets if trained_tasks(cfg)[n].materialize]
    train_rows = {n: datasets[n].count() for n in materialized}  # materialized: counting is free
    if train_rows:  # the SNLI-fraction sweep plots against data/snli_train_pairs
        tracking.log_metrics(uri, run_id, {f"data/{name}_train_pairs": n for name, n in train_rows.items()})
    plan = _said_plan(cfg)
    loop_config = {"run": cfg.to_dict(), "tokenizer": tokenizer.to_dict(), "datasets": sorted(datasets)}
    # Every step a run of OUT's chain logged is not logged again (a fallback to an older checkpoint too).
    loop_config.update(tracking_uri=uri, run_id=run_id, continues=mlflow_run.continues, earlier_runs=start.earlier_runs)
    loop_config["provenance"] = {"data": digests, "run_id": run_id}  # a checkpoint names the run that wrote it
    result = _fit(cfg, location, loop_config, datasets, extra_callbacks, plan)
    final, best = _keep_checkpoints(cfg, result, out_dir)
    mode = (
        (load_train_state(final) or {}).get("mode", plan.mode) if cfg.trainer.elastic else plan.mode
    )  # the last group's
    seconds = time.time() - started
    tracking.log_metrics(uri, run_id, {"train/seconds": seconds}, cfg.trainer.steps)
    _log_loss_curves(cfg, uri, run_id, out_dir)
    # What users take away: the encoder without optimizer state, with its model card, as the run's
    # MLflow model (the full checkpoint stays in OUT/checkpoint for --resume).
    model_dir = save_model_folder(final, out_dir / MODEL_FOLDER)
    write_card(model_dir, run_facts(cfg.to_dict(), manifests, digests, run_id, uri, seconds))
    model_uri = log_model(uri, run_id, model_dir, cfg.mlflow.register_as, step=cfg.trainer.steps)
    registered = f", registered as {cfg.mlflow.register_as}" if cfg.mlflow.register_as else ""
    log.info("model: %s (MLflow %s%s)", model_dir, model_uri, registered)
    train_json = {
        "checkpoint": str(final),
        "best_checkpoint": str(best) if best else None,
        "model": str(model_dir),
        "mlflow_model": model_uri,
        "mlflow_run_id": run_id,
        "tracking_uri": redact(uri),
        "seconds": round(seconds, 1),
        "task_split_mode": mode,
        "storage": redact(location.uri),
    }
    storage.write_text(out_dir / TRAIN_SUMMARY, json.dumps(train_json, indent=2))
    mark_checkpoint(out_dir, run_id, cfg.trainer.steps)
    return TrainResult(final, run_id, uri, seconds, mode, train_rows, model_dir)


def _fit(cfg: RunConfig, location: RunStorage, loop_config: dict, datasets: dict, extra_callbacks, plan):
    """The TorchTrainer's fit, with the async split's parameter holder for this fit only. On Ctrl+C,
    SIGTERM or an error the workers stop before the run is marked KILLED or FAILED (abort_fit)."""
    uri, run_id = loop_config["tracking_uri"], loop_config["run_id"]
    holder = None
    if plan.mode is SplitMode.ASYNC:
        holder = loop_config["holder"] = start_holder(cfg)
    trainer = _torch_trainer(cfg, location, loop_config, datasets, extra_callbacks)
    try:
        with tracking.system_metrics(uri, run_id), reporting_worker_deaths():
            return trainer.fit()
    except BaseException:
        trainer.abort_fit()
        raise
    finally:
        if holder is not None:
            ray.kill(holder)


def _said_plan(cfg: RunConfig):
    """The task split at trainer.num_workers (an elastic group's MAX), said in one line; an elastic
    group's at MIN beside it (each group Ray starts is planned anew: task_split_data_config, the
    worker)."""
    plan = plan_for(cfg.trainer, cfg.trainer.max_workers)
    if cfg.trainer.elastic:
        low = plan_for(cfg.trainer, cfg.trainer.min_workers)
        log.info("at %d workers: %s; at %d: %s", low.world_size, low.describe(), plan.world_size, plan.describe())
    else:
        log.info("%s", plan.describe())
    return plan


def _tokenizer(cfg: RunConfig, prepared: str):
    """The checkpoint's tokenizer when the run resumes or warm-starts, else one built from the data."""
    init = cfg.trainer.resume_from or cfg.trainer.warm_start
    if init:
        tokenizer = load_model(init).tokenizer
        log.info("tokenizer and initial weights from %s", init)
    else:
        tokenizer = build_tokenizer(cfg, prepared)
    log.info("tokenizer: %s, %d ids", type(tokenizer).__name__, tokenizer.num_words)
    return tokenizer


def _torch_trainer(
    cfg: RunConfig, location: RunStorage, loop_config: dict, datasets: dict, extra_callbacks: Sequence[Any]
):
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
            resources_per_worker={"CPU": cfg.trainer.cpus_per_worker},
            placement_strategy=cfg.trainer.placement_strategy,
        ),
        datasets=datasets,
        dataset_config=task_split_data_config(cfg.trainer),
        run_config=ray.train.RunConfig(  # type: ignore[call-arg]  # Train V2's (RAY_TRAIN_V2_ENABLED); stubs: V1's
            storage_path=location.root,
            name=location.name,
            checkpoint_config=checkpoint_config(cfg),
            failure_config=ray.train.FailureConfig(max_failures=cfg.trainer.max_failures),
            callbacks=list(extra_callbacks) or None,
            logging_config=ray.train.LoggingConfig(log_level=train_log_level()),
        ),
    )


class KeptCheckpoints(NamedTuple):
    """OUT's copies of a fit's checkpoints: the last one, and the best by STS-B dev (None without
    in-training evaluation)."""

    final: Path
    best: Path | None


def _keep_checkpoints(cfg: RunConfig, result, out_dir: Path) -> KeptCheckpoints:
    """The fit's last checkpoint as OUT/checkpoint and, with in-training evaluation, the best one by
    STS-B dev beside it."""
    if result.checkpoint is None:
        raise RuntimeError(f"training finished without a checkpoint; see {out_dir / 'ray_results'}")
    final = _copy_whole(result.checkpoint, out_dir / FINAL_CHECKPOINT)
    best = None
    if cfg.trainer.eval_every:  # the checkpoint with the best in-training STS-B dev, beside the last
        chosen = result.get_best_checkpoint(SCORE_METRIC, "max")
        if chosen is not None:
            best = _copy_whole(chosen, out_dir / BEST_FOLDER)
            log.info("best checkpoint by %s: %s", SCORE_METRIC, best)
    return KeptCheckpoints(final, best)


def _copy_whole(checkpoint, target: Path) -> Path:
    """A Ray checkpoint copied whole to `target` (replaced_whole: a copy that fails, as on a full disk, leaves
    no half checkpoint there)."""
    with replaced_whole(target) as partial:
        checkpoint.to_directory(str(partial))
    return target
