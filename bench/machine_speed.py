"""How fast this machine is at what the test suite spends its time on, in one line.

  .venv/bin/python bench/machine_speed.py

The slow tier's time is process starts (docs/performance.md: a fit is about 50 core-seconds of
interpreters importing Ray, torch and MLflow), and the same machine type runs about the same unit
tier in anything from 2.5 to 5 minutes on different days. So a suite's time says little
without its machine's speed: scripts/test.sh prints this line first, and docs/performance.md gives
it beside each measured run. Two fresh interpreters at once (the suite runs two pytest-xdist
processes) each import what a Ray Train worker imports (`ray.train.torch`: Ray, Ray Train, Ray Data,
pandas, torch); the line gives their mean CPU seconds and the pair's wall seconds, and the CPU
seconds of hashing 256 MiB (the core alone, no imports)."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time

PROBE = (
    "import json, time\n"
    "began = time.process_time()\n"
    "import ray.train.torch  # noqa: F401\n"
    "print(json.dumps(time.process_time() - began))\n"
)
HASHED = 256 << 20


def imports() -> tuple[float, float]:
    """(mean CPU seconds of the two interpreters' imports, wall seconds of the pair)."""
    began = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("machine_speed: the import probe failed (`import ray.train.torch` in a fresh interpreter)")
    seconds = [json.loads(out) for out in outputs]
    return sum(seconds) / len(seconds), time.perf_counter() - began


def hashing() -> float:
    """CPU seconds to sha256 HASHED bytes in memory."""
    block = bytes(range(256)) * (1 << 12)  # 1 MiB
    digest = hashlib.sha256()
    began = time.process_time()
    for _ in range(HASHED // len(block)):
        digest.update(block)
    return time.process_time() - began


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    cpu, wall = imports()
    print(
        f"machine speed: importing ray.train.torch took {cpu:.2f} CPU s in each of two fresh interpreters "
        f"({wall:.2f} s for the pair); sha256 of 256 MiB {hashing():.2f} CPU s"
    )


if __name__ == "__main__":
    main()
