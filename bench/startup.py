"""How long each command takes to start: `python -m convsts CMD --help` in a fresh interpreter.

  .venv/bin/python bench/startup.py [--repeats 5]

Prints, per command, the median wall time of `--help` over the repeats (the interpreter's own
start included) and which slow libraries its start loads (torch, Ray, MLflow, ...: the import units
tests/cli/test_layering.py's SLOW_UNITS names). A command's library work is imported once its
arguments and config are checked, so `--help`, `--print-config` and a config error cost this much.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from convsts.ray_jobs.cli.commands import COMMANDS  # noqa: E402

LIBRARIES = ("torch", "ray", "ray.data", "ray.train", "ray.tune", "mlflow", "transformers", "matplotlib", "sklearn")
PROBE = (
    "import runpy, sys; sys.argv = ['convsts', *{argv!r}]\n"
    "try:\n    runpy.run_module('convsts', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "print(sorted(m for m in {libraries!r} if m in sys.modules), file=sys.stderr)"
)


def start(argv: list[str]) -> tuple[float, list[str]]:
    """Seconds to run `convsts ARGV` in a fresh interpreter, and the slow libraries it loaded."""
    code = PROBE.format(argv=argv, libraries=LIBRARIES)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - began
    return seconds, ast.literal_eval(done.stderr.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| command | start (median) | slow libraries it loads |")
    print("|---|---|---|")
    for argv in [["--help"], *([name, "--help"] for name in COMMANDS)]:
        runs = [start(argv) for _ in range(args.repeats)]
        loaded = runs[-1][1]
        median = statistics.median(s for s, _ in runs)
        print(f"| `convsts {' '.join(argv)}` | {median:.2f} s | {', '.join(loaded) or 'none'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
