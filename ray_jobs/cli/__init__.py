"""`convsts <command>` (also `python -m convsts <command>`, what a Ray job's entrypoint runs): each
command is a module of this package, listed in `commands.COMMANDS`."""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import version

from convsts.ray_jobs.cli.commands import COMMANDS
from convsts.ray_jobs.runtime.entry import GO_ON, run_main


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
        print(f"convsts {version('convsts')}")
        return 0
    if argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"; did you mean `convsts {close[0]}`?" if close else f"; commands: {', '.join(COMMANDS)}"
        print(f"convsts: unknown command {argv[0]!r}{hint} (convsts --help lists them)", file=sys.stderr)
        return 2

    module = importlib.import_module(COMMANDS[argv[0]][0])
    return run_main(argv[0], module.main, argv[1:], getattr(module, "GO_ON", GO_ON))  # a command's own advice
