"""The Ray job API client shared by `convsts submit` and `convsts jobs`: address, token
authentication as Ray reads it, clear refusals, following a job to its end, and the job spec
`convsts submit` sends (the entrypoint `python -m convsts <job>`, the runtime_env with the
project folder as working_dir, credentials kept out of both)."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from convsts.io.redaction import has_credentials, redact, strip_credentials
from convsts.ray_jobs.runtime.logs import log
from convsts.ray_jobs.runtime.provenance import COMMIT_ENV, git_commit

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


class SubmitError(RuntimeError):
    """The job API could not be reached or refused the request."""


def job_address(address: str | None) -> str:
    address = address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if address.startswith("ray://") or not address.startswith(("http://", "https://")):
        # The job API speaks HTTP to the dashboard; a bare host:port means that.
        host = address.split("://")[-1]
        address = f"http://{host}"
    return address


def configure_auth() -> str:
    """RAY_AUTH_MODE for this client: as set, else "token" when a token is present, else "disabled"."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if not mode:
        mode = "token" if _token_source() else "disabled"
        os.environ["RAY_AUTH_MODE"] = mode
        if mode == "token" and "ray._raylet" in sys.modules:
            # Ray reads RAY_AUTH_MODE into its config when first imported; refresh it, as Ray's own
            # token set-up does (ray._private.authentication.authentication_token_setup).
            from ray._raylet import (  # type: ignore[attr-defined]  # compiled; no stub names it
                Config,
            )

            Config.initialize("")
    return mode


def job_client(address: str | None = None):
    from ray.job_submission import (
        JobSubmissionClient,
    )

    configure_auth()
    url = job_address(address)
    try:
        return JobSubmissionClient(url)
    except Exception as err:  # connection refused, 401/403, ...
        raise SubmitError(explain(err, url)) from None


def _token_source() -> str | None:
    """Where this client's token comes from, as Ray reads it; None when it has none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    candidate = Path(path) if path else Path.home() / ".ray" / "auth_token"
    if candidate.is_file() and candidate.stat().st_size > 0:
        return str(candidate)
    return None


def explain(err: Exception, url: str) -> str:
    """One line for a job API error: the address and the error with credentials redacted."""
    url, text = redact(url), redact(f"{type(err).__name__}: {err}").splitlines()[0]
    if "uthenticat" in text or "401" in text or "403" in text:
        source = _token_source()
        if source and os.environ.get("RAY_AUTH_MODE") != "disabled":
            return (
                f"the Ray cluster at {url} rejected the token this client sent (from {source}): it is not "
                f"the cluster's token; use the one in the head node's ~/.ray/auth_token ({text})"
            )
        return (
            f"the Ray cluster at {url} refused this client ({text}). It uses token authentication and no "
            f"token was sent: set RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, and RAY_AUTH_MODE=token"
        )
    return f"cannot reach the Ray job API at {url}: {text}"


async def _tail(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def wait_for_job(client, job_id: str, stream: bool = True, poll_s: float = 1.0, timeout_s: float | None = None):
    from ray.job_submission import (
        JobStatus,
    )

    if stream:
        asyncio.run(_tail(client, job_id))
    started = time.time()
    while True:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return status
        if timeout_s is not None and time.time() - started > timeout_s:
            raise TimeoutError(f"job {job_id} still {status} after {timeout_s} s")
        time.sleep(poll_s)


def status_name(status) -> str:
    return str(getattr(status, "value", status))


PROJECT_ROOT = Path(__file__).resolve().parents[2]


DEFAULT_RUNTIME_ENV = PROJECT_ROOT / "cluster" / "runtime_env.yaml"


# The commands that run as cluster jobs; a job's entrypoint is `python -m convsts JOB ARGS`.
JOBS = ("prepare", "mine-negatives", "train", "evaluate", "tune", "demo")


AGENT_WAIT_S = 120.0


FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")


def load_runtime_env(path: str | Path | None) -> dict[str, Any]:
    path = Path(path) if path else DEFAULT_RUNTIME_ENV
    if not path.is_file():
        raise FileNotFoundError(f"runtime_env file not found: {path}")
    env = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(env, dict):
        raise ValueError(f"{path}: a runtime_env must be a mapping")
    return env


def build_runtime_env(path: str | Path | None, working_dir: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The job's runtime_env; forwarded variables lose any credentials (the dashboard shows them)."""
    env = load_runtime_env(path)
    env.setdefault("working_dir", str(working_dir))
    env_vars = dict(env.get("env_vars") or {})
    for name in FORWARDED_ENV:
        value = os.environ.get(name)
        if value and name not in env_vars:
            if has_credentials(value):
                value = strip_credentials(value)
                log.warning(
                    "%s: its credentials are not forwarded into the job (a job's runtime_env is visible "
                    "in the dashboard); the cluster must provide MLFLOW_TRACKING_USERNAME / "
                    "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), see docs/cluster.md",
                    name,
                )
            env_vars[name] = value
    for name, value in env_vars.items():
        if has_credentials(str(value)):
            raise SubmitError(
                f"runtime_env variable {name} carries credentials ({redact(str(value))}); a job's "
                f"runtime_env is visible in the dashboard: provide them on the cluster (docs/cluster.md)"
            )
    commit = git_commit()  # the job's working copy is no git checkout: its runs record the commit sent
    if commit:
        env_vars.setdefault(COMMIT_ENV, commit)
    env["env_vars"] = {k: str(v) for k, v in env_vars.items()}
    return env


def entrypoint(job: str, args: Sequence[str], python: str = "python") -> str:
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}: expected one of {', '.join(JOBS)}")
    for arg in args:
        if has_credentials(arg):
            raise SubmitError(
                f"argument {redact(arg)!r} carries credentials, and a job's entrypoint is visible in "
                f"the dashboard and its logs: give the cluster the credentials instead (for S3: "
                f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an instance role; see docs/cluster.md)"
            )
    return " ".join([python, "-m", "convsts", job, *map(shlex.quote, args)])


def submit(
    job: str,
    args: Sequence[str],
    address: str | None = None,
    runtime_env: str | None = None,
    python: str = "python",
    submission_id: str | None = None,
) -> tuple[Any, str]:
    client = job_client(address)
    env = build_runtime_env(runtime_env)
    command = entrypoint(job, args, python)
    deadline = time.time() + AGENT_WAIT_S
    while True:
        try:
            job_id = client.submit_job(
                entrypoint=command, runtime_env=env, submission_id=submission_id, metadata={"convsts.job": job}
            )
            return client, job_id
        except Exception as err:
            # A head that has just started answers before its job agent is up: wait for it.
            if "No available agent" in str(err) and time.time() < deadline:
                time.sleep(2.0)
                continue
            raise SubmitError(explain(err, job_address(address))) from None
