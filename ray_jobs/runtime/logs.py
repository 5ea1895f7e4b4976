"""The console and log files of every entry point: the `convsts` logger, credentials redacted from every record, Ray's and Ray Data's own chatter kept quiet, Ray Train's log level."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from pathlib import Path

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
