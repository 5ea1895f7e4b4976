"""`convsts jobs list|logs|stop [JOB_ID]`: the Ray job API for jobs that `convsts submit` started.

Address and authentication as for `convsts submit` (--address, RAY_ADDRESS, token files).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from convsts.ray_jobs.runtime.job_api import SubmitError, job_client, status_name, wait_for_job


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="convsts jobs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    address_help = "Ray dashboard address (default: RAY_ADDRESS); before or after the action"
    parser.add_argument("--address", default=None, help=address_help)
    sub = parser.add_subparsers(dest="action", required=True)
    listing = sub.add_parser("list", help="all jobs on the cluster, newest last")
    logs = sub.add_parser("logs", help="a job's logs")
    logs.add_argument("job_id")
    logs.add_argument("--follow", action="store_true", help="stream until the job ends")
    stop = sub.add_parser("stop", help="stop a running job")
    stop.add_argument("job_id")
    for action in (listing, logs, stop):  # `convsts jobs list --address URL` as well as `jobs --address URL list`
        action.add_argument("--address", default=argparse.SUPPRESS, help=address_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        client = job_client(args.address)
    except SubmitError as err:
        print(f"convsts jobs: {err}", file=sys.stderr)
        return 2
    if args.action == "list":
        jobs = sorted(client.list_jobs(), key=lambda j: j.start_time or 0)
        print(f"{'JOB ID':<28} {'STATUS':<10} ENTRYPOINT")
        for job in jobs:
            print(f"{job.submission_id or job.job_id:<28} {status_name(job.status):<10} {job.entrypoint}")
        return 0
    if args.action == "logs":
        if args.follow:
            status = wait_for_job(client, args.job_id)
            return 0 if status_name(status) == "SUCCEEDED" else 1
        print(client.get_job_logs(args.job_id), end="")
        return 0
    stopped = client.stop_job(args.job_id)
    print(f"{args.job_id}: {'stop requested' if stopped else 'not running'}")
    return 0
