"""The Ray job API client shared by `convsts submit` and `convsts jobs`: address, token
authentication as Ray reads it, clear refusals, and following a job to its end."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from convsts.datasets.storage import redact

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
            from ray._raylet import Config

            Config.initialize("")
    return mode


def job_client(address: str | None = None):
    from ray.job_submission import JobSubmissionClient

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
    text = redact(f"{type(err).__name__}: {err}").splitlines()[0]
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
    from ray.job_submission import JobStatus

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
