"""What a run's check of a prepared folder costs before Ray starts (`verify_prepared`): a Reddit
folder of `--mib` MiB of shards, checked where `prepare` wrote it (each shard listed at the size
and time the manifest's `shard_times` recorded: nothing of it read) and as a copy with new times
(every shard read whole for its sha256), on local disk and in a bucket of the local S3 server (moto
on 127.0.0.1, as the tests use it).

  .venv/bin/python bench/prepared_check.py [--mib 256] [--repeats 3]

Prints, for each place and way, the median seconds of the check and, in the bucket, the requests
of one check and those that GET a shard (from the server's request log), and the ratio copy / as
written.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from testkit.s3_server import request_log, s3_endpoint  # noqa: E402

BUCKET = "convsts-bench"
ROWS_PER_SHARD = 20_000


def write_folder(root: str, mib: int) -> int:
    """A prepared Reddit folder of about `mib` MiB of train shards (random text: it does not
    compress) and one test shard under `root`, written as `prepare` writes one; its shard count."""
    import numpy as np
    import pandas as pd

    from convsts.datasets.shards import write_frame
    from convsts.io import storage
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.tasks.prepared_folder import write_manifest

    reddit = get_task("reddit")
    rng = np.random.default_rng(0)
    rows = mib * 2**20 // 200  # about 200 bytes a row: two 100-character texts
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype="S1")

    def texts(n: int) -> list[str]:
        chars = letters[rng.integers(0, len(letters), size=(n, 100))]  # (n, 100)
        return [row.tobytes().decode() for row in chars]

    folder = reddit.prepared_dir(root)
    frame = pd.DataFrame({"context": texts(rows), "response": texts(rows)})
    shards = {split: write_frame(part, storage.join(folder, split), ROWS_PER_SHARD) for split, part in
              (("train", frame), ("test", frame.head(100)))}  # fmt: skip
    write_manifest(reddit, folder, {"shards": shards, "pairs": rows + 100, "train_pairs": rows, "test_pairs": 100})
    return len(shards["train"]) + 1


def timed_check(root: str, repeats: int) -> tuple[float, int, int]:
    """(median seconds, requests, shard GETs) of verify_prepared on the Reddit folder under root;
    the requests of one check (the S3 server's request log)."""
    from convsts.ray_jobs.tasks import get_task
    from convsts.ray_jobs.tasks.prepared_folder import verify_prepared

    reddit = get_task("reddit")
    seconds = []
    for _ in range(repeats):
        with request_log() as seen:
            started = time.perf_counter()
            verify_prepared(reddit, root)
            seconds.append(time.perf_counter() - started)
    gets = sum(1 for method, path in seen if method == "GET" and path.endswith(".parquet"))
    return statistics.median(seconds), len(seen), gets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for key in ("mib", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} {getattr(args, key)}: must be 1 or more")
    from convsts.io import storage

    logging.getLogger("convsts").setLevel(logging.WARNING)  # the check's line on a copy, once a repeat
    scratch = Path(tempfile.mkdtemp(prefix="convsts-bench-check-"))
    rows = []
    try:
        with s3_endpoint(BUCKET):
            for place, base in (("local disk", str(scratch)), ("S3 bucket", f"s3://{BUCKET}")):
                written, copy = f"{base}/written", f"{base}/copy"
                shards = write_folder(written, args.mib)
                storage.copy_tree(written, copy)  # file by file: new times, the manifest as it was
                for way, root in (("as written", written), ("copy, new times", copy)):
                    seconds, requests, gets = timed_check(root, args.repeats)
                    rows.append((place, way, shards, seconds, requests if place != "local disk" else None, gets))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"a prepared Reddit folder of {args.mib} MiB, median of {args.repeats} checks (verify_prepared)")
    print("| where | shards | seconds | requests | shard GETs |")
    print("|---|---|---|---|---|")
    for place, way, shards, seconds, requests, gets in rows:
        shown = "" if requests is None else str(requests)
        print(f"| {place}, {way} | {shards} | {seconds:.3f} | {shown} | {shown and gets} |")
    for place in ("local disk", "S3 bucket"):
        written, copy = (r[3] for r in rows if r[0] == place)
        print(f"{place}: copy / as written {copy / written:.1f}x")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    raise SystemExit(main())
