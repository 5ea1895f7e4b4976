"""MLflow through an explicit client and run id (no global active run): usable from the driver,
from Ray Train workers and from Tune trials alike."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from convsts.io.redaction import has_credentials, redact
from convsts.ray_jobs.runtime.provenance import git_commit, library_versions, machine

MAX_PARAM_LENGTH = 6000
DIGEST_LENGTH = 16  # of a dataset input's digest (the manifest's sha1, shortened as MLflow shows digests)
ARTIFACT_FOLDER = "mlartifacts"  # beside a local sqlite store's database file
# What a child run takes from its parent: a Tune trial runs in a Ray worker, whose argv is Ray's
# default_worker.py, not the command that started the sweep.
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type", "mlflow.source.git.commit", "convsts.command")


def client(tracking_uri: str):
    """An MLflow client of the store. For a server URL with credentials in it (user:password@),
    MLflow's own "View run ... at: URL" line, printed on stdout when a run ends (from the driver,
    Ray workers and Tune trials alike, each of which makes its client here), is turned off: it
    would print the password. The project's own lines name the run, redacted."""
    from mlflow.tracking import MlflowClient

    if has_credentials(tracking_uri):
        os.environ[SUPPRESS_RUN_LINKS] = "true"
    return MlflowClient(tracking_uri=tracking_uri)


SUPPRESS_RUN_LINKS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"  # MLflow's switch for that line


def artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go: for a local sqlite store, the folder `mlartifacts`
    beside the database file (MLflow's default would be ./mlruns of whatever folder the command ran
    from); for a tracking server, None (the server's own artifact root)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return (Path(tracking_uri[len(prefix) :]).resolve().parent / ARTIFACT_FOLDER).as_uri()


# The columns of a sqlite store that name artifact folders (MLflow 3's schema)
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)


def adopt_local_store(tracking_uri: str) -> None:
    """A local sqlite store copied or moved with its folder keeps naming the artifact folder it was
    made beside (MLflow stores it absolutely): its artifact folders are made the ones beside the
    database now, so a copy's new runs write into the copy (the copy holds the earlier artifacts
    too) and a moved store finds its own. Only this program's `mlartifacts` folders are changed."""
    here = artifact_root(tracking_uri)
    db = Path(tracking_uri[len("sqlite:///") :]) if here else None
    if here is None or db is None or not db.is_file():
        return
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        try:
            found = [row[0] for row in con.execute("SELECT DISTINCT artifact_location FROM experiments")]
        except sqlite3.DatabaseError:  # not an MLflow store yet (MLflow makes its tables on first use)
            return
        for old in found:
            if not old or old == here or not old.startswith("file://") or not old.endswith("/" + ARTIFACT_FOLDER):
                continue
            for table, column in ARTIFACT_COLUMNS:
                with contextlib.suppress(sqlite3.OperationalError):  # a table this MLflow version lacks
                    con.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                        f"WHERE substr({column}, 1, ?) = ? AND substr({column}, ?, 1) IN ('', '/')",
                        (here, len(old) + 1, len(old), old, len(old) + 1),
                    )


# The MLflow UI opens an experiment of this kind on its training runs (MLflow 3's default for an
# untagged experiment is the GenAI overview: traces and a chat assistant).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def experiment_id(tracking_uri: str, name: str) -> str:
    """The experiment `name`, created (of EXPERIMENT_KIND) when it does not exist; in a local store
    copied or moved with its folder, after its artifact folders are made the ones beside it."""
    adopt_local_store(tracking_uri)
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=artifact_root(tracking_uri), tags=EXPERIMENT_KIND)
    except Exception:  # another process created it first
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def start_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
) -> str:
    c = client(tracking_uri)
    source = provenance_tags()
    if parent_run_id:  # a child (a Tune trial in a Ray worker) was made by its parent's command
        parent_tags = c.get_run(parent_run_id).data.tags
        source.update({k: parent_tags[k] for k in SOURCE_TAGS if k in parent_tags})
    all_tags = {k: redact(str(v)) for k, v in {**source, **(tags or {})}.items()}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = c.create_run(experiment_id(tracking_uri, experiment), run_name=redact(run_name) or None, tags=all_tags)
    if params:
        log_params(tracking_uri, run.info.run_id, params)
    return run.info.run_id


def provenance_tags() -> dict[str, str]:
    """What made a run: the project's commit (MLflow's own source tags), the entry command, library
    versions, the machine."""

    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":  # `python -m convsts CMD` (a job's entrypoint) is the `convsts` command
        program = "convsts"
    tags = {
        "mlflow.source.name": program,
        "mlflow.source.type": "LOCAL",
        "convsts.command": " ".join([program, *sys.argv[1:]])[:MAX_PARAM_LENGTH],
    }
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    tags.update({f"convsts.version.{name}": version for name, version in library_versions().items()})
    tags.update({f"convsts.machine.{name}": value for name, value in machine().items()})
    return tags


@contextlib.contextmanager
def system_metrics(tracking_uri: str, run_id: str, interval_s: float = 10.0):
    """MLflow's own system metrics (system/cpu_utilization_percentage, memory, disk, network; GPU when
    present) logged to `run_id` while the block runs; nothing when psutil is not installed."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import (
            SystemMetricsMonitor,
        )
    except ImportError:
        yield
        return
    try:
        monitor = SystemMetricsMonitor(
            run_id, sampling_interval=interval_s, resume_logging=True, tracking_uri=tracking_uri
        )
    except ImportError:  # psutil missing
        yield
        return
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


def log_datasets(
    tracking_uri: str, run_id: str, datasets: Mapping[str, Mapping[str, Any]], context: str = "training"
) -> None:
    """MLflow dataset inputs: {name: {"digest", "source" (a URI or path), "profile" (row counts ...)}}."""

    from mlflow.entities import (
        Dataset,
        DatasetInput,
        InputTag,
    )

    items = []
    for name, d in datasets.items():
        source = redact(str(d["source"]))
        source_type = source.split("://", 1)[0] if "://" in source else "local"
        items.append(
            DatasetInput(
                Dataset(
                    name=name,
                    digest=str(d["digest"])[:DIGEST_LENGTH],
                    source_type=source_type,
                    source=json.dumps({"uri": source}),
                    profile=redact(json.dumps(d.get("profile", {}))),
                ),
                tags=[InputTag("mlflow.data.context", context)],
            )
        )
    if items:
        client(tracking_uri).log_inputs(run_id, datasets=items)


def param_values(params: Mapping[str, Any]) -> dict[str, str]:
    """Params as a run stores them: text, credentials redacted, cut to MLflow's length."""
    return {str(k): redact(str(v))[:MAX_PARAM_LENGTH] for k, v in params.items()}


def log_params(tracking_uri: str, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in param_values(params).items()]
    c = client(tracking_uri)
    for start in range(0, len(items), 100):
        c.log_batch(run_id, params=items[start : start + 100])


def log_metrics(tracking_uri: str, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    """Finite numeric values only; MLflow metric names may not contain ':' or other odd characters."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [
        Metric(metric_name(k), float(v), now, step)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and math.isfinite(float(v))
    ]
    c = client(tracking_uri)
    for start in range(0, len(items), 500):
        c.log_batch(run_id, metrics=items[start : start + 500])


def last_logged_steps(tracking_uri: str, run_id: str) -> dict[str, int]:
    """{metric: the highest step logged} of a run: what a restarted training has already logged
    ({} where the store has no such run). One request: the run's latest metrics, which every MLflow
    store keeps at each metric's highest step, carry that step (its metric histories are not read)."""
    run = _stored_run(tracking_uri, run_id)
    if run is None:
        return {}
    return {m.key: m.step for m in run.data.to_proto().metrics}


def chain_logged(uri: str, run_id: str, chain: Sequence[str | None], until: int | None) -> dict[str, int]:
    """{metric: the highest step logged} by the runs of OUT's chain before this one (`chain`: the run
    it continues first), each read in one request, once per fit (the driver's, for every rank).
    With other settings than its checkpoint's run (a new trajectory), the chain's history ends at the
    checkpoint's step (`until`): the run logs every step after it."""
    logged: dict[str, int] = {}
    for earlier in dict.fromkeys(chain):
        if uri and earlier and earlier != run_id:
            for key, step in last_logged_steps(uri, earlier).items():
                step = step if until is None else min(step, until)
                logged[key] = max(step, logged.get(key, -1))
    return logged


def latest_value(tracking_uri: str, run_id: str, key: str) -> float | None:
    """A run's value of metric `key` at its highest step (None where the store has no such run or metric)."""
    run = _stored_run(tracking_uri, run_id)
    return None if run is None else run.data.metrics.get(key)


def metric_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in name)


def log_artifacts(tracking_uri: str, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
    client(tracking_uri).log_artifacts(run_id, local_dir, artifact_path)


def log_artifact(tracking_uri: str, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
    client(tracking_uri).log_artifact(run_id, local_path, artifact_path)


def set_tags(tracking_uri: str, run_id: str, tags: dict[str, str]) -> None:
    c = client(tracking_uri)
    for k, v in tags.items():
        c.set_tag(run_id, k, redact(str(v)))


NOTE_TAG = "mlflow.note.content"  # the run's description, shown (as markdown) at the top of its page
NOTE_LIMIT = 8000  # MLflow's longest tag value


def describe_run(tracking_uri: str, run_id: str, markdown: str, full: str = "results.md") -> None:
    """The run's description: `markdown` (a results table), cut at MLflow's tag limit with a pointer
    to `full` (an artifact of the run)."""
    if len(markdown) > NOTE_LIMIT:
        tail = f"\n\n(cut here: the whole table is the artifact {full})"
        markdown = markdown[: NOTE_LIMIT - len(tail)].rsplit("\n", 1)[0] + tail
    set_tags(tracking_uri, run_id, {NOTE_TAG: markdown})


def _stored_run(tracking_uri: str, run_id: str):
    """The run, or None where the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        return client(tracking_uri).get_run(run_id)
    except MlflowException:
        return None


def run_status(tracking_uri: str, run_id: str) -> str | None:
    """A run's status (RUNNING, FINISHED, FAILED, KILLED), or None where the store has no such run."""
    run = _stored_run(tracking_uri, run_id)
    return run.info.status if run else None


def run_params(tracking_uri: str, run_id: str) -> dict[str, str] | None:
    """A run's params, or None where the store has no such run."""
    run = _stored_run(tracking_uri, run_id)
    return dict(run.data.params) if run else None


def delete_run(tracking_uri: str, run_id: str) -> None:
    """Moves a run to MLflow's deleted lifecycle (searches and the UI leave it out; `mlflow gc` removes it)."""
    client(tracking_uri).delete_run(run_id)


def run_tags(tracking_uri: str, run_id: str) -> dict[str, str] | None:
    """A run's tags, or None where the store has no such run."""
    run = _stored_run(tracking_uri, run_id)
    return dict(run.data.tags) if run else None


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(tracking_uri).set_terminated(run_id, status=status)


def ended_status(err: BaseException) -> str:
    """The status of a run that `err` ended: KILLED when a person stopped it (Ctrl+C, or SIGTERM from
    `convsts jobs stop`, `kill` or a scheduler, which the commands raise as KeyboardInterrupt),
    else FAILED."""
    return "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"


def ui_command(tracking_uri: str) -> str:
    """The command that opens the MLflow UI on a store; one worker process (MLflow's default of 4
    did not come up on a busy 2-core machine)."""
    return f"mlflow ui --backend-store-uri {redact(tracking_uri)} --host 127.0.0.1 --port 5000 --workers 1"


def run_page(experiment_id: str, run_id: str | None = None) -> str:
    """The UI's path (after host:port/) of a run's page (or its experiment's), opened on training
    runs: MLflow 3's UI takes the GenAI or machine-learning view from its own toggle (default
    GenAI) or this URL parameter, before the experiment's kind tag."""
    return f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "") + "?workflowType=machine_learning"


def find_run(tracking_uri: str, experiment: str, tags: Mapping[str, str]) -> str | None:
    """The newest run of `experiment` whose tags equal `tags`, or None."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = c.search_runs(
        [exp.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0].info.run_id if runs else None


def child_runs(tracking_uri: str, experiment: str, parent_run_id: str) -> list:
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return c.search_runs(
        [exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=10_000
    )
