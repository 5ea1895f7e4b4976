"""The trained encoder as an MLflow model (`pyfunc` flavor): a column `text` of strings in,
embeddings (n, dim) out, as `models.load(folder).encode` gives them.

    mlflow.pyfunc.load_model("runs:/<run id>/model").predict(pd.DataFrame({"text": ["a sentence"]}))
    mlflow models serve -m runs:/<run id>/model --env-manager local --host 127.0.0.1 --port 5001
    curl -s 127.0.0.1:5001/invocations -H 'Content-Type: application/json' \\
         -d '{"dataframe_records": [{"text": "a man is playing a guitar"}]}'

Params (per request): batch_size, normalize_embeddings, tuned (the STS matrix, when the model has one).
The model's artifacts are the model folder (models.checkpoint.save_model_folder); loading it needs
this project installed (`models`, `datasets`), as the pip requirements say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import List, Optional

import mlflow.pyfunc
import numpy as np
import pandas as pd

from ray_jobs import tracking

ARTIFACT = "model"  # runs:/<id>/model
INPUT_COLUMN = "text"
EXAMPLE = ["A man is playing a guitar.", "Two dogs run through a field."]
PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
REQUIREMENTS = ("torch", "numpy", "pandas", "safetensors", "tokenizers", "pyarrow", "transformers")


class EncoderModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of SentenceEncoder.encode."""

    def load_context(self, context) -> None:
        from models import load

        self.encoder = load(context.artifacts[ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params: Optional[dict] = None) -> np.ndarray:
        params = params or {}
        texts = _texts(model_input)
        return self.encoder.encode(texts, batch_size=int(params.get("batch_size", 256)), show_progress_bar=False,
                                   normalize_embeddings=bool(params.get("normalize_embeddings", True)),
                                   tuned=bool(params.get("tuned", False)))  # (n, dim)


def _texts(model_input) -> List[str]:
    if isinstance(model_input, pd.DataFrame):
        column = INPUT_COLUMN if INPUT_COLUMN in model_input.columns else model_input.columns[0]
        return [str(t) for t in model_input[column]]
    if isinstance(model_input, (pd.Series, np.ndarray, list, tuple)):
        return [str(t) for t in model_input]
    return [str(model_input)]


def signature(dim: int):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

    return ModelSignature(
        inputs=Schema([ColSpec("string", INPUT_COLUMN)]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, dim))]),
        params=ParamSchema([ParamSpec("batch_size", "long", 256), ParamSpec("normalize_embeddings", "boolean", True),
                            ParamSpec("tuned", "boolean", False)]),
    )


def requirements() -> List[str]:
    """The installed versions of what loading the model imports (this project itself aside)."""
    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out


@contextlib.contextmanager
def _quiet_mlflow():
    """save_model reports its input-example check and warns about pickled models and pip's version;
    the artifact copy draws a progress bar. The caller logs the one line that matters."""
    loggers = [logging.getLogger(n) for n in ("mlflow.pyfunc", "mlflow.utils.environment", "mlflow.models")]
    levels = [lg.level for lg in loggers]
    bar = os.environ.get(PROGRESS_ENV)
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    os.environ[PROGRESS_ENV] = "false"
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if bar is None:
            os.environ.pop(PROGRESS_ENV, None)
        else:
            os.environ[PROGRESS_ENV] = bar


def log_model(tracking_uri: str, run_id: str, folder: str | Path, register_as: str = "") -> str:
    """Log the model folder as the run's MLflow model (artifact `model`); with `register_as`, also a
    new version of that registered model. Returns the model URI."""
    from models import load

    dim = load(folder).dim
    with tempfile.TemporaryDirectory() as tmp, _quiet_mlflow():
        local = Path(tmp) / ARTIFACT
        mlflow.pyfunc.save_model(str(local), python_model=EncoderModel(), artifacts={ARTIFACT: str(folder)},
                                 signature=signature(dim), input_example=pd.DataFrame({INPUT_COLUMN: EXAMPLE}),
                                 pip_requirements=requirements())
        tracking.log_artifacts(tracking_uri, run_id, str(local), ARTIFACT)
    uri = f"runs:/{run_id}/{ARTIFACT}"
    if register_as:
        register(tracking_uri, run_id, register_as)
    return uri


def register(tracking_uri: str, run_id: str, name: str) -> str:
    """A new version of registered model `name` (created when missing) from the run's model; returns the version."""
    c = tracking.client(tracking_uri)
    try:
        c.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        c.create_registered_model(name)
    source = f"{c.get_run(run_id).info.artifact_uri}/{ARTIFACT}"
    return c.create_model_version(name, source, run_id=run_id).version
