"""Ray Tune sweeps (the library behind `convsts tune`): a trial is the run config plus a space's
sampled dotted keys (sweeps/trials.py); one MLflow parent run per sweep and one child run per trial;
a sweep's --out records what defines it (sweep.json), so a rerun resumes only the same sweep; what a
finished sweep leaves is sweeps/results.py's.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.basic_variant import BasicVariantGenerator

from convsts.io import storage
from convsts.io.dotted import changed_values, flatten
from convsts.io.errors import ConfigError
from convsts.io.redaction import redact_tree
from convsts.io.storage import is_uri, resolve_path
from convsts.ray_jobs.config.schema import RunConfig
from convsts.ray_jobs.pipelines.inputs import ensure_prepared
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.output_lock import output_lock
from convsts.ray_jobs.runtime.ray_start import ensure_ray
from convsts.ray_jobs.runtime.resources import TRIAL_FUNCTION_CPU, alive_nodes, trials_at_once
from convsts.ray_jobs.runtime.tracking_store import tracking_uri
from convsts.ray_jobs.runtime.worker_deaths import reporting_worker_deaths
from convsts.ray_jobs.sweeps.request import (
    MatrixInputs,
    SweepInterrupted,
    SweepRequest,
    SweepTrialsFailed,
    TrainInputs,
)
from convsts.ray_jobs.sweeps.results import EncodedStsb, close_trial_runs, log_sweep, save_sweep_matrix, sweep_results
from convsts.ray_jobs.sweeps.trials import (
    ParentRun,
    check_space_keys,
    sts_matrix_trial,
    stsb_embeddings_of,
    train_trial,
)
from convsts.ray_jobs.tracking import runs as tracking
from convsts.ray_jobs.training.start_checks import prepared_location
from convsts.tune_spaces import TuneSpace

STATE_FILE = "sweep.json"  # OUT/sweep.json: the parent run id and what defines the sweep (sweep_record), for resumption


def run_sweep(request: SweepRequest) -> dict[str, Any]:
    """The sweep `request` asks for (resumed when out_dir holds the same sweep, unless `fresh`);
    returns the best trial's results (also out_dir/results.json). A trial that still fails after its
    retries ends its MLflow run FAILED and, once the others' results are written, the sweep raises
    SweepTrialsFailed naming it. One run at a time in out_dir, for the whole run (output_lock)."""
    with output_lock(request.out_dir, "tune"):
        return _sweep(request)


def _sweep(request: SweepRequest) -> dict[str, Any]:

    started, space, cfg, out_dir = time.time(), request.space, request.cfg, request.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    check_sweep_inputs(request)
    uri = _sweep_store(cfg, out_dir)
    resources, concurrency = _concurrency(space, cfg)
    concurrency = min(concurrency, request.max_concurrent) if request.max_concurrent else concurrency
    resuming = _resuming(request.experiment_path, out_dir / STATE_FILE, request.fresh)
    param_space = {**space.params(), **request.param_overrides}
    opened = open_sweep(request, uri, resuming.sweep, expected_trials(param_space, request.num_samples), concurrency)
    parent, expected, concurrency = opened.parent, opened.expected_trials, opened.trials_at_once
    trainable, encoded = sweep_trainable(request, parent)
    trainable = tune.with_resources(trainable, resources)
    tuner = _tuner(request, trainable, param_space, SweepSearch(concurrency, cfg.seed, parent), resuming.tune_state)
    log.info("sweep %s: %s trials at once, %s per trial function", space.name, concurrency, resources)
    with reporting_worker_deaths():
        grid = tuner.fit()
    _check_finished(grid, expected, request.experiment_path)
    failed = close_trial_runs(grid, parent, space.max_t)
    if len(failed) == len(grid):
        raise SweepTrialsFailed(f"every trial failed ({', '.join(failed)}); see {request.experiment_path}")
    best = grid.get_best_result(metric=space.metric, mode=space.mode, scope="last")
    results = sweep_results(grid, best, space, cfg.to_dict(), out_dir, encoded)
    results.update(mlflow_run_id=parent.run_id, failed_trials=failed, seconds=round(time.time() - started, 1))
    storage.write_results(out_dir / "results.json", results)
    if encoded is not None:
        save_sweep_matrix(best, out_dir)
    log_sweep(parent, best, space, results, out_dir, failed)
    if failed:
        raise SweepTrialsFailed(
            f"{len(failed)} of {len(grid)} trials failed after {request.max_failures} retries ({', '.join(failed)}); "
            f"their MLflow runs are FAILED; {out_dir / 'results.json'} and the curve hold the other trials"
        )
    return results


def _concurrency(space: TuneSpace, cfg: RunConfig) -> tuple[dict[str, float], int]:
    """(resources of the trial function, trials at once), placed node by node (resources.py)."""
    nodes = alive_nodes()
    if space.objective == "sts_matrix":
        return {"cpu": 1.0}, max(1, int(sum(n.get("CPU", 0.0) for n in nodes)))
    return {"cpu": TRIAL_FUNCTION_CPU}, trials_at_once(cfg, nodes)


def expected_trials(param_space: dict[str, Any], num_samples: int) -> int:
    """num_samples x the size of every grid dimension: what Tune generates for this space."""
    total = num_samples
    for value in param_space.values():
        if isinstance(value, dict) and "grid_search" in value:
            total *= len(value["grid_search"])
    return total


def sweep_record(request: SweepRequest) -> dict[str, Any]:
    """What defines a sweep, as STATE_FILE records it (credentials redacted): the space, its --param
    dimensions, the number of samples, the checkpoint and prepared folder, the base run config
    (with the tracking store its trials log to). A resumed sweep's trials are built from this
    command's config but keep the recorded parameters, so a rerun that differs is refused."""

    def where(path: str | None) -> str:
        return "" if not path else path if is_uri(path) else str(Path(resolve_path(path)).resolve())

    return redact_tree(
        {
            "space": request.space.name,
            "param": request.param_overrides,
            "num_samples": request.num_samples,
            "checkpoint": where(request.inputs.checkpoint if isinstance(request.inputs, MatrixInputs) else None),
            "prepared": where(request.inputs.prepared_dir if isinstance(request.inputs, TrainInputs) else None),
            "config": request.cfg.to_dict(),
        }
    )


def resume_differences(state: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """'KEY=RECORDED (this command: VALUE)' for each part of sweep_record that differs from the one
    in STATE_FILE (a state that records none differs whole)."""
    recorded = state.get("sweep")
    if not isinstance(recorded, dict):
        return [f"{STATE_FILE} records no sweep settings"]
    sections = {
        "--space": "space",
        "--num-samples": "num_samples",
        "--checkpoint": "checkpoint",
        "--prepared": "prepared",
    }
    out = [
        f"{flag} {recorded.get(key)!r} (this command: {record[key]!r})"
        for flag, key in sections.items()
        if recorded.get(key) != record[key]
    ]
    out += changed_values(
        flatten(recorded.get("param", {}), "--param "), flatten(record["param"], "--param "), "this command"
    )
    return out + changed_values(flatten(recorded.get("config", {})), flatten(record["config"]), "this command")


def _unfinished(result_grid, expected: int) -> int:
    """Trials not ended: started but neither terminated nor errored, or never created (Tune
    creates trials lazily, so an interrupted sweep's result grid lacks the ones not yet begun)."""
    ended = result_grid.num_terminated + result_grid.num_errors
    return max(expected, len(result_grid)) - ended


TUNE_STATE = "experiment_state-*.json"  # Ray Tune's state of a sweep's trials, written after its first seconds


class Resuming(NamedTuple):
    """What a sweep into OUT continues."""

    sweep: bool  # the sweep OUT records (its sweep.json: the parent run and what defines it)
    tune_state: bool  # Ray Tune restores its trials from the experiment path


class OpenedSweep(NamedTuple):
    """The MLflow parent run of a sweep, its number of trials and the trials it runs at once."""

    parent: ParentRun
    expected_trials: int
    trials_at_once: int


def _resuming(experiment_path: Path, state_file: Path, fresh: bool) -> Resuming:
    """What this sweep continues (Resuming). A sweep killed before
    Tune wrote its trials' state continues with its parent run and starts Tune over: a restore
    from Tune's first file alone restarts without the search space. With `fresh` both are removed."""
    recorded = state_file.is_file() and not fresh
    restorable = recorded and tune.Tuner.can_restore(str(experiment_path)) and any(experiment_path.glob(TUNE_STATE))
    if not restorable:
        if experiment_path.exists():  # --fresh, or Tune's partial state of a sweep killed in its first seconds
            shutil.rmtree(experiment_path)
        if recorded:
            log.info("%s: Ray Tune had saved no trial state yet; the sweep starts its trials over", state_file)
    return Resuming(recorded, restorable)


def _sweep_store(cfg: RunConfig, out_dir: Path) -> str:
    """The sweep's tracking store, with its experiment created before trials race to create it; Ray started."""
    uri = tracking_uri(cfg.mlflow.tracking_uri, out_dir)
    ensure_ray()
    cfg.mlflow.tracking_uri = uri  # trials log child runs (and their training) into this same store
    tracking.experiment_id(uri, cfg.mlflow.experiment)
    return uri


def _check_finished(grid, expected: int, experiment_path: Path) -> None:
    pending = _unfinished(grid, expected)
    if pending:
        raise SweepInterrupted(
            f"{pending} trial(s) did not finish; rerun the same command to resume (state in {experiment_path})"
        )


class SweepSearch(BasicVariantGenerator):
    """Tune's own sampler, seeded from the run's seed, its trials' ids named by the sweep's parent
    run (`<5 characters of its id>_00000`, ...). Tune saves the sampler (its random state, the
    trials it has made) with its trials' state, so a resumed sweep samples the trials it had not
    yet saved exactly as the first sitting did, under the same ids; a sweep that Tune starts over
    (killed before its first save) makes the same trials again too."""

    def __init__(self, trials_at_once: int, seed: int, parent: ParentRun):
        super().__init__(max_concurrent=trials_at_once, random_state=seed)
        self._uuid_prefix = f"{parent.run_id[:5]}_"  # Tune's own prefix is random (uuid1)


def _tuner(request: SweepRequest, trainable, param_space: dict, search: SweepSearch, resume: bool):
    if resume:
        return tune.Tuner.restore(
            str(request.experiment_path), trainable=trainable, resume_unfinished=True, resume_errored=True
        )
    space = request.space
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            num_samples=request.num_samples,
            search_alg=search,
            scheduler=_scheduler(space),
            # An STS-matrix trial is a short fit on the shared embeddings: starting a process for
            # each (importing torch) costs more than the fit. A train trial keeps its own process.
            reuse_actors=space.objective == "sts_matrix",
        ),
        run_config=tune.RunConfig(
            name=space.name,
            storage_path=str(request.experiment_path.parent),
            failure_config=tune.FailureConfig(max_failures=request.max_failures),
            verbose=1,
        ),
    )


def check_sweep_inputs(request: SweepRequest) -> None:
    """Refuse a sweep that cannot run, before any work. A train sweep's trials warm-start from
    --reddit-checkpoint when it is given (else from trainer.warm_start, or from scratch)."""
    space, cfg = request.space, request.cfg
    storage.check_bucket(cfg.trainer.storage_path, "trainer.storage_path")
    check_space_keys(space, cfg, request.param_overrides)
    if cfg.trainer.elastic and space.objective != "sts_matrix":
        raise ConfigError(
            f"trainer.num_workers={list(cfg.trainer.worker_range)}: a sweep's trials are fixed-size groups side by side "
            "(Ray Tune places each trial whole): give one number"
        )
    if isinstance(request.inputs, MatrixInputs) != (space.objective == "sts_matrix"):
        raise ConfigError(f"space {space.name} ({space.objective}) cannot take {request.inputs}")
    if isinstance(request.inputs, TrainInputs) and request.inputs.reddit_checkpoint:
        cfg.trainer.warm_start = str(Path(request.inputs.reddit_checkpoint).resolve())
    if isinstance(request.inputs, TrainInputs):
        log.info("sweep %s: every trial starts from %s", space.name, cfg.trainer.warm_start or "scratch (seeded)")


def open_sweep(request: SweepRequest, uri: str, resume: bool, expected: int, concurrency: int) -> OpenedSweep:
    """The MLflow parent run, the number of trials and trials at once: the recorded ones of the sweep
    resumed (refused when this command's sweep differs from it), else a new parent run and
    OUT/sweep.json. Ray Tune restores a sweep with the concurrency it was started with, so a
    resumed sweep says so where this command would run a different number at once."""
    space, cfg, out_dir = request.space, request.cfg, request.out_dir
    state_file, record = out_dir / STATE_FILE, sweep_record(request)
    if resume:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        differs = resume_differences(state, record)
        if differs:
            raise ConfigError(
                f"{out_dir} holds an interrupted or finished sweep that this command would resume, "
                f"but it differs: {'; '.join(differs)}; rerun it as it was, pass --fresh to start "
                f"over, or choose another --out"
            )
        log.info("resuming sweep %s (MLflow parent run %s) from %s", space.name, state["parent_run_id"], out_dir)
        started = state.get("trials_at_once", concurrency)
        if started != concurrency:
            log.warning(
                "sweep %s: resumed with the %d trial(s) at once it was started with, not %d (Ray Tune keeps a "
                "restored sweep's concurrency); --fresh starts it over at this command's",
                space.name,
                started,
                concurrency,
            )
        return OpenedSweep(
            ParentRun(uri, cfg.mlflow.experiment, state["parent_run_id"]), state["expected_trials"], started
        )
    parent_run_id = tracking.start_run(
        uri,
        cfg.mlflow.experiment,
        cfg.mlflow.run_name or f"tune-{space.name}",
        {
            **flatten(cfg.to_dict()),
            "tune.space": space.name,
            "tune.objective": space.objective,
            "tune.metric": space.metric,
            "tune.checkpoint": request.inputs.starts_from,
            "tune.param_overrides": repr(record["param"]),
        },
        tags={"convsts.job": "tune", "convsts.space": space.name},
    )
    state = {
        "parent_run_id": parent_run_id,
        "space": space.name,
        "expected_trials": expected,
        "trials_at_once": concurrency,
        "sweep": record,
    }
    storage.write_text(state_file, json.dumps(state, indent=2))
    return OpenedSweep(ParentRun(uri, cfg.mlflow.experiment, parent_run_id), expected, concurrency)


def sweep_trainable(request: SweepRequest, parent: ParentRun) -> tuple[Any, EncodedStsb | None]:
    """The trial function with its shared inputs bound, and for an sts_matrix sweep its STS-B,
    encoded once here (a train sweep prepares its data once here instead)."""
    space, cfg = request.space, request.cfg
    shared = dict(base=cfg.to_dict(), fixed=space.fixed, parent=parent)
    if isinstance(request.inputs, MatrixInputs):
        log.info("encoding STS-B train/dev/test once with %s", request.inputs.checkpoint)
        frames, embeddings = stsb_embeddings_of(request.inputs.checkpoint, cfg)
        encoded = EncodedStsb(frames, embeddings, request.inputs.checkpoint)
        return tune.with_parameters(sts_matrix_trial, embeddings=embeddings, **shared), encoded
    prepared = prepared_location(cfg, request.out_dir, request.inputs.prepared_dir)
    ensure_prepared(cfg, prepared)
    trials_dir = str(request.out_dir / "trials")
    return tune.with_parameters(train_trial, prepared=str(prepared), trials_dir=trials_dir, **shared), None


def _scheduler(space: TuneSpace):
    if space.scheduler != "asha":
        return None

    return ASHAScheduler(
        time_attr="training_iteration",
        metric=space.metric,
        mode=space.mode,
        max_t=space.max_t,
        grace_period=max(1, min(5, space.max_t // 4)),
        reduction_factor=3,
    )
