"""Process-level set-up shared by the entry points: Ray connection, MLflow store, logging."""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import signal
import sys
import threading
import traceback
import urllib.parse
import warnings
from pathlib import Path
from typing import Any

import requests

from convsts.io.errors import BadInputError, ConfigError, StorageError, TrackingError
from convsts.io.redaction import redact

log = logging.getLogger("convsts")


class RedactingFilter(logging.Filter):
    """Credentials in URIs (user-info, secret-like query values) never reach a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


VERBOSE_ENV = "CONVSTS_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose() else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


class DropProgressBarHint(logging.Filter):
    """Ray Data warns once per process that progress bars are off: we turned them off."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Progress bars disabled")


RAY_DATA_LOGGING = Path(__file__).with_name("ray_data_logging.yaml")


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` in every worker of an instance that convsts starts or joins:
    RAY_ADDRESS set to the worker's own cluster, so that Ray's helpers which look a cluster up by
    address (Train's placement-group cleaner polls the state API) find this one even when other Ray
    instances run on the machine (without it they print a "Found multiple active Ray instances"
    traceback); then ray_data_defaults and quiet_ray_logs."""
    import ray

    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    ray_data_defaults()
    quiet_ray_logs()


# Ray Data (2.60) lists a parquet folder with a pool of footer-reading actors, 32 by default, each
# its own Python process started for one listing and killed after it; one actor reads 128 footers
# at once. A prepared folder holds tens to thousands of shards: those processes cost a small run
# more CPU than its training (a 4-step run: 65 CPU-seconds with 32, about 52 with 1, on 2 cores).
FOOTER_ACTORS_ENV, FOOTER_ACTORS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1"


def ray_data_defaults() -> None:
    """Ray Data settings read from the environment where a dataset is planned (the driver, a Tune
    trial's process): a user's own value stays."""
    os.environ.setdefault(FOOTER_ACTORS_ENV, FOOTER_ACTORS)


def quiet_ray_logs() -> None:
    """Ray's info logs off the console of this process; with `--verbose`, nothing changes. Run in
    the driver (ensure_ray) and, as Ray's `worker_process_setup_hook`, in every worker process:
    Ray Data's console handler at WARNING (its session log file keeps every record); MLflow's
    store and system-metrics info lines; matplotlib's (a fresh environment's first plot builds its
    font cache and says so); deprecation warnings that Ray raises inside its own code
    (a user cannot act on them). Ray Train's own lines are set by its LoggingConfig
    (train_log_level). Ray Data is not imported here: a worker that never uses it starts without
    it (importing it takes about 1 s a worker, enough for the raylet to warn about slow starts)."""

    if verbose():
        return
    if "ray.data" in sys.modules:  # already configured: set its console handler directly
        for handler in logging.getLogger("ray.data").handlers:
            if handler.get_name() == "console":
                handler.setLevel(logging.WARNING)
                if not any(isinstance(f, DropProgressBarHint) for f in handler.filters):
                    handler.addFilter(DropProgressBarHint())
    else:  # read by Ray Data when it is imported; a config of the user's own wins
        os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(RAY_DATA_LOGGING))
    quiet = ["mlflow.store.db.utils", "mlflow.system_metrics", "alembic", "matplotlib"]
    # Ray Train's per-report line comes from a logger named by its file's path, which its
    # LoggingConfig (keyed on "ray.train") does not reach. The path is found without importing
    # ray.train (which imports Ray Data).
    ray_spec = importlib.util.find_spec("ray")
    if ray_spec is not None and ray_spec.origin:
        quiet.append(str(Path(ray_spec.origin).parent / "train" / "v2" / "_internal" / "execution" / "context.py"))
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")


def train_log_level() -> str:
    """Ray Train's console level (ray.train.LoggingConfig): its per-report lines only with --verbose."""
    return "INFO" if verbose() else "WARNING"


LOCAL_STARTUP_CONCURRENCY = 4  # Python workers a local Ray instance starts at once, at the least
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # Ray Train's switch (ray.train.v2 constants)


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Attach to the cluster at `address`/RAY_ADDRESS, or start a local instance on this machine."""

    import ray

    quiet_ray_logs()
    ray_data_defaults()
    if not verbose():  # the project's own progress lines only; Ray Data's bars redraw with escape codes
        from ray.data import DataContext

        context = DataContext.get_current()  # travels with each dataset to the workers that run it
        context.enable_progress_bars = False
        context.print_on_execution_start = False
    if ray.is_initialized():
        return
    if not (sys.stdout.isatty() and sys.stderr.isatty()):  # a log file, a pipe or a job's log, not a terminal:
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # worker lines without colour codes (a user's own setting wins)
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"logging_level": logging.INFO if verbose() else logging.WARNING, "log_to_driver": True}
    # A submitted job whose own runtime env names a setup hook keeps it (Ray refuses two).
    if "worker_process_setup_hook" not in os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", ""):
        kwargs["runtime_env"] = {"worker_process_setup_hook": f"{__name__}.worker_setup"}
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        _init_ray(ray, address, num_cpus, kwargs)
    finally:
        # Ray's core installs its own SIGTERM handler, which prints a native stack and exits: a
        # command's SIGTERM (`convsts jobs stop`, `kill`, a scheduler) unwinds as Ctrl+C again.
        if isinstance(sigterm, SigtermAsInterrupt) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


def _init_ray(ray, address: str | None, num_cpus: int | None, kwargs: dict[str, Any]) -> None:
    """ray.init: joined to `address`, or a local instance."""
    if address:
        ray.init(address=address, **kwargs)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # The dashboard serves the state API that Train V2's placement-group cleaner polls; it and
        # the job API listen on 127.0.0.1 only. Ray 2.60's own gRPC servers (GCS, raylet, workers)
        # cannot be bound to loopback: they listen on all interfaces and Ray replaces a 127.0.0.1
        # node address with the machine's (ray/_private/services.py, resolve_ip_for_localhost);
        # later Ray releases bind them to the node IP (ray-project/ray#59852). docs/reliability.md.
        # The raylet warns once it has started 4x its worker start-up concurrency (the CPU count) of
        # Python workers; a training run starts about 8 (Train's controller and workers, Ray Data's
        # tasks and actors), which on a 2-CPU machine printed that warning on every run. At least
        # LOCAL_STARTUP_CONCURRENCY concurrent starts keep it for a real excess of workers.
        cpus = num_cpus or os.cpu_count() or 1
        # A local instance's one node is never drained or preempted, so Ray Train's preemption
        # watcher (an actor per run) has nothing to watch; without it the run also loses the
        # `core_worker.cc` line about the watcher's constructor arguments (ray-project/ray#53727).
        # Read by Train's controller, which gets it from this process's environment; a user's own value stays.
        os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
        ray.init(
            num_cpus=num_cpus,
            dashboard_host="127.0.0.1",
            _system_config={"worker_maximum_startup_concurrency": max(LOCAL_STARTUP_CONCURRENCY, cpus)},
            **kwargs,
        )


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
    db = Path(out_dir).resolve() / "mlflow.db"
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


# Expected user errors: one line and exit 2 (run_main), never a traceback.
# A full disk, a quota or the file-size limit: one line naming the file, not a traceback.
# A read-only file system too: where the command had to write (its --out) is the user's to change.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
USER_ERRORS = (
    ConfigError,
    TrackingError,
    BadInputError,
    StorageError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    PermissionError,
)


def find_user_error(exc: BaseException) -> BaseException | None:
    """The expected user error (bad config, bad or missing input) behind `exc`, also when Ray
    wrapped it (a task's error travels as RayTaskError with `.cause`, Ray Data's as UserCodeException)."""
    types, seen, first = USER_ERRORS, set(), None
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        inner = getattr(e, "cause", None)  # Ray's wrapper is an instance of the cause's class too
        if isinstance(e, OSError) and e.errno in DISK_FULL:  # under whatever failed after it (a store's write)
            return e
        if isinstance(e, types):
            if not isinstance(inner, BaseException):
                return e
            first = first or e
        todo += [inner, e.__cause__, e.__context__]
    return first


# Ray Data logs a failed task's traceback (and calls it an internal error) before raising it to
# the caller; for a user error that the command reports in one line, those records are dropped.
RAY_DATA_ERROR_LOGGERS = ("ray.data._internal.execution.streaming_executor_state", "ray.data.exceptions")


class UserErrorLogFilter(logging.Filter):
    """Drops log records about an exception (attached, or being handled while logging) that is an
    expected user error: run_main prints it as one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return exc is None or find_user_error(exc) is None


class SigtermAsInterrupt:
    """The SIGTERM handler of a command: SIGTERM (`convsts jobs stop`, `kill`, `timeout`, a scheduler)
    unwinds as Ctrl+C does (temporary folders removed, the MLflow run ended KILLED). It remembers the
    signal, since a library may raise a KeyboardInterrupt of its own for it (Ray's `ray.get` does)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, frame) -> None:
        self.received = signum
        raise KeyboardInterrupt(signum)


GO_ON = "run the same command again to go on"  # what a stopped command's line advises, unless it says its own


def run_main(command: str, main, argv=None, go_on: str = GO_ON) -> int:
    """Run a command's main: an expected user error prints one line naming the file, row or key
    and exits 2, without a traceback; `--debug` (or CONVSTS_DEBUG=1) shows the traceback instead.
    `--verbose` (or CONVSTS_VERBOSE=1) also shows Ray's progress bars and info logs. Ctrl+C and
    SIGTERM end it with one line, `go_on` saying how to continue, and exit 128 + the signal."""

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("CONVSTS_DEBUG") == "1"
    if "--verbose" in argv:  # Ray's progress bars and info logs too; read by ensure_ray and setup_logging
        os.environ[VERBOSE_ENV] = "1"
    argv = [a for a in argv if a not in ("--debug", "--verbose")]
    if not debug:
        for name in RAY_DATA_ERROR_LOGGERS:
            logging.getLogger(name).addFilter(UserErrorLogFilter())
    sigterm = SigtermAsInterrupt()
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # a handler of the caller's own stays
        signal.signal(signal.SIGTERM, sigterm)
    try:
        return int(main(argv) or 0)
    except KeyboardInterrupt:  # Ctrl+C or SIGTERM: what the command made is cleaned up on the way out
        signum = sigterm.received or signal.SIGINT
        name = signal.Signals(signum).name
        print(f"convsts {command}: stopped by {name}; {go_on}", file=sys.stderr)
        return 128 + signum
    except Exception as exc:
        found = None if debug else find_user_error(exc)
        if found is None:  # the traceback, with any credential a message or URI carried redacted
            print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
            return 1
        message = str(found.args[0] if len(found.args) == 1 and isinstance(found.args[0], str) else found)
        if isinstance(found, OSError) and found.filename and str(found.filename) not in message:
            message = f"{found.filename}: {message}"
        line = redact(message.strip().splitlines()[0])
        print(f"convsts {command}: {line} (--debug shows the traceback)", file=sys.stderr)
        return 2
