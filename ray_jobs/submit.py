"""`convsts submit <job> [job args]`: run `python -m ray_jobs.<job>` on a Ray cluster via the job API.

  convsts submit train --config configs/dan_multitask.yaml --out /mnt/runs/r1 [--address http://HEAD:8265]

submit's own options (--address, --runtime-env, --python, --submission-id, --no-wait) may stand
before or after the job name; everything else after the job name goes to the job.

The project folder is the job's working_dir and cluster/runtime_env.yaml (or --runtime-env FILE)
its runtime environment; MLFLOW_TRACKING_URI is passed on when set (without any user:password
in it). Credentials never travel in a job spec, which the dashboard shows to anyone: arguments that
carry them are refused, and the cluster provides them instead (docs/cluster.md, "Credentials"). Logs are streamed until the
job ends and the exit status is the job's (0 = SUCCEEDED). `convsts jobs list|logs|stop` wrap the
rest of the job API.

Address: --address, else RAY_ADDRESS, else http://127.0.0.1:8265. Authentication: when the
cluster uses Ray's token authentication, the token is read as Ray reads it (RAY_AUTH_TOKEN,
RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); with RAY_AUTH_MODE unset, a token that is present is sent.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convsts.datasets.storage import has_credentials, redact, strip_credentials
from convsts.ray_jobs.cli import COMMANDS
from convsts.ray_jobs.job_api import SubmitError, explain, job_address, job_client, status_name, wait_for_job
from convsts.ray_jobs.provenance import COMMIT_ENV, git_commit
from convsts.ray_jobs.runtime import log

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNTIME_ENV = PROJECT_ROOT / "cluster" / "runtime_env.yaml"
# The commands that run as cluster jobs: job name -> the module its entrypoint runs (`python -m MODULE`).
JOBS = {name: COMMANDS[name][0] for name in ("prepare", "mine-negatives", "train", "evaluate", "tune", "demo")}
AGENT_WAIT_S = 120.0
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME")


def load_runtime_env(path: str | Path | None) -> dict[str, Any]:
    import yaml

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
    return " ".join([python, "-m", JOBS[job], *map(shlex.quote, args)])


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


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--address", default=None, help="Ray dashboard address (default: RAY_ADDRESS)")
    parser.add_argument("--runtime-env", default=None, help=f"runtime_env YAML (default: {DEFAULT_RUNTIME_ENV.name})")
    parser.add_argument("--python", default="python", help="the interpreter on the cluster that runs the job")
    parser.add_argument("--submission-id", default=None)
    parser.add_argument("--no-wait", action="store_true", help="print the job id and return at once")
    parser.add_argument("job", choices=list(JOBS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the job's own arguments")
    return parser


# submit's own options, taken wherever they stand: `convsts submit train --config C --address URL`
# sends --address to submit, not to the job (no job has options of these names). name -> takes a value
OWN_OPTIONS = {"--address": True, "--runtime-env": True, "--python": True, "--submission-id": True, "--no-wait": False}


def own_options_first(argv: Sequence[str]) -> list:
    """argv with submit's own options moved in front of the job name."""
    argv = list(argv)
    job_at = next((i for i, a in enumerate(argv) if a in JOBS), len(argv))
    head, tail, moved = argv[:job_at], argv[job_at:], []
    i = 0
    while i < len(tail):
        name = tail[i].split("=", 1)[0]
        if name in OWN_OPTIONS and tail[i] != "--":
            takes = OWN_OPTIONS[name] and "=" not in tail[i]
            moved += tail[i : i + 1 + takes]
            del tail[i : i + 1 + takes]
            continue
        if tail[i] == "--":
            break
        i += 1
    return head + moved + tail


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(own_options_first(sys.argv[1:] if argv is None else argv))
    try:
        client, job_id = submit(args.job, args.args, args.address, args.runtime_env, args.python, args.submission_id)
    except SubmitError as err:
        print(f"convsts submit: {err}", file=sys.stderr)
        return 2
    print(f"submitted {job_id} to {job_address(args.address)}", flush=True)
    if args.no_wait:
        return 0
    try:
        status = wait_for_job(client, job_id)
    except KeyboardInterrupt:
        print(f"\nstopped following {job_id}; it keeps running (convsts jobs stop {job_id} to end it)")
        return 130
    print(f"job {job_id}: {status_name(status)}")
    return 0 if status_name(status) == "SUCCEEDED" else 1


if __name__ == "__main__":
    from convsts.ray_jobs.runtime import run_main

    raise SystemExit(run_main("submit", main))
