"""Process-level set-up shared by the entry points: Ray connection, MLflow store, logging."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

log = logging.getLogger("convsts")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> None:
    """Attach to the cluster at `address`/RAY_ADDRESS, or start a local instance on this machine."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # The dashboard (127.0.0.1) serves the state API that Train V2's placement-group cleaner polls.
        ray.init(num_cpus=num_cpus, **kwargs)


def tracking_uri(configured: str, out_dir: Optional[str | Path]) -> str:
    """MLFLOW_TRACKING_URI, else the configured URI, else a sqlite store in the output folder."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if configured:
        return configured
    if out_dir is None:
        raise ValueError("no MLflow tracking URI: set mlflow.tracking_uri or MLFLOW_TRACKING_URI, or give --out")
    db = Path(out_dir).resolve() / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"
