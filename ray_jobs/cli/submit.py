"""`convsts submit <job> [job args]`: run `python -m convsts <job>` on a Ray cluster via the job API.

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
import sys
from collections.abc import Sequence

from convsts.io.redaction import redact
from convsts.ray_jobs.runtime.job_api import (
    DEFAULT_RUNTIME_ENV,
    JOBS,
    SubmitError,
    job_address,
    status_name,
    submit,
    wait_for_job,
)


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
    print(f"submitted {job_id} to {redact(job_address(args.address))}", flush=True)
    if args.no_wait:
        return 0
    try:
        status = wait_for_job(client, job_id)
    except KeyboardInterrupt:
        print(f"\nstopped following {job_id}; it keeps running (convsts jobs stop {job_id} to end it)")
        return 130
    print(f"job {job_id}: {status_name(status)}")
    return 0 if status_name(status) == "SUCCEEDED" else 1
