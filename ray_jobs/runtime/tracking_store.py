"""The MLflow tracking store a command writes to, checked before any work: a server that answers, a database whose driver is installed, never a bare folder (MLflow's file store)."""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

import requests

from convsts.io.errors import ConfigError
from convsts.io.redaction import redact
from convsts.ray_jobs.runtime.run_folder import RunFolder

TRACKING_PROBE_TIMEOUT_S = 10.0  # one request before any work; MLflow's own client retries for minutes


def tracking_uri(configured: str, out_dir: str | Path | None) -> str:
    """MLFLOW_TRACKING_URI, else the configured URI, else a sqlite store in the output folder. A
    tracking server's URI is checked reachable first, so a run does not do its work and then spend
    MLflow's retries (minutes) on a server that is not there."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env or configured:
        uri, where = (env, "MLFLOW_TRACKING_URI") if env else (configured, "mlflow.tracking_uri")
        check_tracking_server(uri, where)
        check_database_driver(uri, where)
        check_file_store(uri, where)
        return uri
    if out_dir is None:
        raise ValueError("no MLflow tracking URI: set mlflow.tracking_uri or MLFLOW_TRACKING_URI, or give --out")
    db = RunFolder(Path(out_dir).resolve()).tracking_db
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


MLFLOW_API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"  # JSON from any MLflow server


def check_tracking_server(uri: str, where: str) -> None:
    """Two requests to an http(s) tracking server, before any work: it answers (a server that cannot
    be connected to is a ConfigError naming the URI, credentials redacted), and it answers MLflow's
    REST API in JSON (a web server that is not MLflow is refused; one that asks for credentials, or a
    TLS handshake MLflow settles itself, passes)."""
    if not uri.startswith(("http://", "https://")):
        return

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=TRACKING_PROBE_TIMEOUT_S)
        answer = requests.get(uri.rstrip("/") + MLFLOW_API_PROBE, timeout=TRACKING_PROBE_TIMEOUT_S)
    except requests.exceptions.SSLError:  # it answered; TLS is MLflow's to settle (MLFLOW_TRACKING_INSECURE_TLS, ...)
        return
    except requests.exceptions.InvalidURL as err:
        raise ConfigError(f"{where}: {redact(uri)} is not a valid tracking server URL ({redact(str(err))})") from None
    except (requests.ConnectionError, requests.Timeout) as err:
        reason = type(err).__name__
        cause = err.args[0] if err.args else None
        if cause is not None and getattr(cause, "reason", None) is not None:  # urllib3's error inside requests'
            reason = str(cause.reason).split(": ", 1)[-1]
        raise ConfigError(
            f"{where}: no MLflow tracking server answers at {redact(uri)} ({redact(reason)}); start it, "
            f"or point {where} at a running one (unset, runs log to a sqlite store in --out)"
        ) from None
    if answer.status_code in (401, 403):  # MLflow behind authentication: MLflow's client sends the credentials
        return
    try:
        speaks_mlflow = isinstance(answer.json(), dict)
    except ValueError:
        speaks_mlflow = False
    if not speaks_mlflow:
        kind = answer.headers.get("content-type", "no content type").split(";")[0]
        raise ConfigError(
            f"{where}: the server at {redact(uri)} is not an MLflow tracking server (its REST API answered "
            f"HTTP {answer.status_code} with {kind}, not MLflow's JSON); check the URL and port"
        )


DATABASE_STORES = ("postgresql", "mysql", "mssql")  # MLflow's SQLAlchemy stores whose driver is a separate install


def check_database_driver(uri: str, where: str) -> None:
    """A database tracking store (postgresql://, mysql+pymysql://, ...) whose Python driver is not
    installed is a ConfigError naming it, before any work (MLflow would fail at its first write)."""
    if uri.split("://", 1)[0].split("+", 1)[0] not in DATABASE_STORES:
        return
    from sqlalchemy.engine import (
        make_url,
    )

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ImportError as err:
        raise ConfigError(
            f"{where}: the store {redact(uri)} needs the database driver {err.name or err} (not installed here): "
            f"install it (postgresql://: psycopg or psycopg2-binary; mysql://: mysqlclient or PyMySQL; or name one: postgresql+DRIVER://)"
        ) from None


MLFLOW_NAMED_STORES = ("databricks", "databricks-uc", "uc")  # URIs without a scheme that are not a folder


FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"  # MLflow's own switch: its file store is refused unless true


def check_file_store(uri: str, where: str) -> None:
    """A folder (a path, or file://) as the tracking store is a ConfigError before any work: this
    MLflow refuses its file store unless MLFLOW_ALLOW_FILE_STORE is true, and would say so in a
    traceback when the run opens its MLflow run."""
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme not in ("", "file") or uri in MLFLOW_NAMED_STORES:
        return
    if os.environ.get(FILE_STORE_OPT_IN, "").lower() in ("true", "1"):
        return
    raise ConfigError(
        f"{where}: {redact(uri)} is a folder, MLflow's file store, which this MLflow no longer opens: "
        f"use a sqlite file (sqlite:///PATH/mlflow.db) or a tracking server, or set {FILE_STORE_OPT_IN}=true"
    )
