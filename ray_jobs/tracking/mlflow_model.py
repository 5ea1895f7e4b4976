"""The trained encoder as an MLflow model (`pyfunc` flavor): a column `text` of strings in,
embeddings (n, dim) out, as `convsts.models.sentence_encoder.load(folder).encode` gives them.

    mlflow.pyfunc.load_model("runs:/<run id>/model").predict(pd.DataFrame({"text": ["a sentence"]}))
    mlflow models serve -m runs:/<run id>/model --env-manager local --host 127.0.0.1 --port 5001
    curl -s 127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
         -d '{"dataframe_records": [{"text": "a man is playing a guitar"}]}'

Params (per request): batch_size, normalize_embeddings, tuned (the STS matrix, when the model has one).
The model's artifacts are the model folder (convsts.models.checkpoint.save_model_folder); loading it needs
this project installed (`models`, `datasets`), as the pip requirements say.
"""

from __future__ import annotations

import tempfile
from importlib import metadata
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
from mlflow.models import Model, ModelSignature
from mlflow.tracking._tracking_service.utils import _use_tracking_uri
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

from convsts.models.quiet_logging import quiet_loggers
from convsts.models.sentence_encoder import load
from convsts.ray_jobs.tracking import runs as tracking

ARTIFACT = "model"  # runs:/<id>/model
INPUT_COLUMN = "text"
EXAMPLE = ["A man is playing a guitar.", "Two dogs run through a field."]
PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
REQUIREMENTS = ("torch", "numpy", "pandas", "safetensors", "tokenizers", "pyarrow", "transformers")


class EncoderModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined]  # mlflow.pyfunc re-exports it lazily
    """pyfunc wrapper of SentenceEncoder.encode."""

    def load_context(self, context) -> None:
        self.encoder = load(context.artifacts[ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        params = params or {}
        texts = _texts(model_input)
        return self.encoder.encode(
            texts,
            batch_size=int(params.get("batch_size", 256)),
            show_progress_bar=False,
            normalize_embeddings=bool(params.get("normalize_embeddings", True)),
            tuned=bool(params.get("tuned", False)),
        )  # (n, dim)


def _texts(model_input) -> list[str]:
    if isinstance(model_input, pd.DataFrame):
        column = INPUT_COLUMN if INPUT_COLUMN in model_input.columns else model_input.columns[0]
        return [str(t) for t in model_input[column]]
    if isinstance(model_input, (pd.Series, np.ndarray, list, tuple)):
        return [str(t) for t in model_input]
    return [str(model_input)]


def signature(dim: int):
    return ModelSignature(
        inputs=Schema([ColSpec("string", INPUT_COLUMN)]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, dim))]),
        params=ParamSchema(
            [
                ParamSpec("batch_size", "long", 256),
                ParamSpec("normalize_embeddings", "boolean", True),
                ParamSpec("tuned", "boolean", False),
            ]
        ),
    )


def requirements() -> list[str]:
    """The installed versions of what loading the model imports (this project itself aside)."""
    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out


# save_model reports its input-example check and warns about pickled models and pip's version;
# the artifact copy draws a progress bar. The caller logs the one line that matters.
MLFLOW_LOGGERS = ("mlflow.pyfunc", "mlflow.utils.environment", "mlflow.models")


def log_model(tracking_uri: str, run_id: str, folder: str | Path, register_as: str = "", step: int = 0) -> str:
    """Log the model folder as the MLflow 3 LoggedModel `model` of `run_id`, output at `step`, with the
    run's params and its metrics at that step; with `register_as`, also a new version of that registered
    model. A run holds one such model: logged again (after its evaluation), the run's model gets the
    new folder (its card now with the results) and the new metrics, keeping its id and any registered
    version. Returns the run-relative URI `runs:/<run id>/model`."""
    c = tracking.client(tracking_uri)
    run = c.get_run(run_id)
    logged = _run_model(c, run)
    if logged is None:
        logged = _new_model(c, run, folder)
        c.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=step)])
        if register_as:
            register(tracking_uri, run_id, logged.model_id, register_as)
    else:
        _save_artifacts(c, run_id, logged, folder)
    _link_metrics(c, run_id, run.data.metrics, logged.model_id, step)
    return f"runs:/{run_id}/{ARTIFACT}"


def _run_model(c, run):
    """The run's own LoggedModel named `model`, if it has one (else None)."""
    for output in run.outputs.model_outputs if run.outputs else []:
        model = c.get_logged_model(output.model_id)
        if model.name == ARTIFACT and model.source_run_id == run.info.run_id:
            return model
    return None


def _new_model(c, run, folder: str | Path):
    """A new LoggedModel of `run` holding `folder`, finalized READY (FAILED if saving it fails)."""
    logged = c.create_logged_model(
        run.info.experiment_id,
        name=ARTIFACT,
        source_run_id=run.info.run_id,
        params=dict(run.data.params),
        model_type="sentence-encoder",
    )
    try:
        _save_artifacts(c, run.info.run_id, logged, folder)
    except BaseException:
        c.finalize_logged_model(logged.model_id, LoggedModelStatus.FAILED)
        raise
    c.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return logged


def _save_artifacts(c, run_id: str, logged, folder: str | Path) -> None:
    """The pyfunc model of `folder` written as the artifacts of the LoggedModel `logged`."""
    with tempfile.TemporaryDirectory() as tmp, quiet_loggers(MLFLOW_LOGGERS, {PROGRESS_ENV: "false"}):
        local = Path(tmp) / ARTIFACT
        mlflow.pyfunc.save_model(
            str(local),
            python_model=EncoderModel(),
            artifacts={ARTIFACT: str(folder)},
            signature=signature(load(folder).dim),
            pip_requirements=requirements(),
            input_example=pd.DataFrame({INPUT_COLUMN: EXAMPLE}),
            mlflow_model=Model(run_id=run_id, model_id=logged.model_id, artifact_path=logged.artifact_location),
        )
        c.log_model_artifacts(logged.model_id, str(local))


def _link_metrics(c, run_id: str, keys, model_id: str, step: int) -> None:
    """The run's metrics `keys` at `step` (its final evaluation) shown on the model's page too."""
    linked = [
        Metric(m.key, m.value, m.timestamp, m.step, run_id=run_id, model_id=model_id)
        for key in keys
        for m in c.get_metric_history(run_id, key)
        if m.step == step and m.model_id is None
    ]
    for start in range(0, len(linked), 500):
        c.log_batch(run_id, metrics=linked[start : start + 500])


def register(tracking_uri: str, run_id: str, model_id: str, name: str) -> str:
    """A new version of registered model `name` (created when missing) from run `run_id`'s logged
    model `model_id`; returns the version."""
    c = tracking.client(tracking_uri)
    try:
        c.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        c.create_registered_model(name)
    with _use_tracking_uri(tracking_uri):  # the registry looks the model up through the process-wide URI
        return c.create_model_version(name, f"models:/{model_id}", run_id=run_id, model_id=model_id).version
