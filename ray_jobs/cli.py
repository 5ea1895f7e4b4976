"""`convsts <command>`: each command is a module in ray_jobs/ that also runs as `python -m ray_jobs.<command>`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "prepare": ("convsts.ray_jobs.prepare", "raw Reddit / SNLI inputs -> parquet shards + manifest (Ray Data)"),
    "mine-negatives": (
        "convsts.ray_jobs.mine",
        "a prepared folder whose Reddit training pairs carry mined hard negatives",
    ),
    "train": ("convsts.ray_jobs.train", "multitask training on Ray Train"),
    "evaluate": ("convsts.ray_jobs.evaluate", "STS-B, Reddit P@N, SNLI, CQA metrics of a checkpoint or a baseline"),
    "tune": ("convsts.ray_jobs.tune", "Ray Tune sweeps over a space in tune_spaces/ (sts_matrix, snli_fraction)"),
    "submit": ("convsts.ray_jobs.submit", "submit one of these jobs to a Ray cluster (job API) and follow it"),
    "jobs": ("convsts.ray_jobs.jobs", "list, show logs of, or stop jobs on a Ray cluster"),
    "export": ("convsts.ray_jobs.export", "a checkpoint's encoder as ONNX or a sentence-transformers folder"),
    "demo": ("convsts.ray_jobs.demo", "the whole pipeline on the embedded sample"),
}


def usage() -> str:
    lines = [
        "usage: convsts <command> [args] [--debug] [--verbose] | convsts --version",
        "       (convsts <command> --help for its options; --debug or CONVSTS_DEBUG=1 shows tracebacks of",
        "       input and config errors; --verbose also shows Ray's progress bars and info logs)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<15} {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("--version", "-V"):
        from importlib.metadata import version

        print(f"convsts {version('convsts')}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"convsts: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    from convsts.ray_jobs.runtime import run_main

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return run_main(argv[0], module.main, argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
