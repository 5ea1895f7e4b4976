"""Reading a checkpoint folder from a bucket: the project's reader against boto3, on the local S3 server.

  .venv/bin/python bench/storage_io.py [--mib 300] [--repeats 3]

Writes a checkpoint-shaped folder of `--mib` MiB (a third as model.safetensors, two thirds as
train_state.pt, plus config.json, tokenizer.json and manifest.json) to the local S3 server (moto, on
127.0.0.1, as the tests use it), then reads it whole to local disk, alternately through the
project's reader (`datasets.cache.local_copy`, what `--resume s3://...`, `evaluate --checkpoint`
and `sentence_encoder.load` use) and through boto3's `download_file` (its managed parallel download), and
prints the median time of each, their ratio (boto3 / ours: >= 0.8 is the target) and the requests
each made per file (from the server's request log). The bound per file of S bytes: about S / 8 MiB + 2.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from testkit.s3_server import request_log, s3_endpoint, upload  # noqa: E402

from convsts.io import cache  # noqa: E402

BUCKET = "convsts-bench"
PART = 8 * 2**20


def files_of(total_mib: int) -> dict[str, int]:
    """{name: bytes} of a checkpoint-shaped folder of about total_mib MiB."""
    total = total_mib * 2**20
    return {
        "config.json": 4_000,
        "tokenizer.json": 214_550,
        "model.safetensors": total // 3,
        "train_state.pt": total - total // 3,
        "manifest.json": 600,
    }


def requests_per_file(seen: list[tuple[str, str]]) -> Counter:
    return Counter(path.rsplit("/", 1)[-1] for _, path in seen if "/ckpt/" in path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = files_of(args.mib)
    scratch = Path(tempfile.mkdtemp(prefix="convsts-bench-storage-"))
    os.environ["TMPDIR"] = str(scratch)  # local_copy's cache, removed at the end
    tempfile.tempdir = None
    try:
        with s3_endpoint(BUCKET) as env:
            import boto3

            for name, size in sizes.items():
                (scratch / name).write_bytes(os.urandom(size))
                upload(scratch / name, f"s3://{BUCKET}/ckpt/{name}")
            client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
            ours, theirs, our_requests, their_requests = [], [], Counter(), Counter()
            for repeat in range(args.repeats):
                shutil.rmtree(scratch / "convsts-bench", ignore_errors=True)  # a cold cache each time
                with request_log() as seen:
                    started = time.perf_counter()
                    local = cache.local_copy(f"s3://{BUCKET}/ckpt", "bench")
                    ours.append(time.perf_counter() - started)
                our_requests = requests_per_file(seen)
                assert all((local / n).stat().st_size == s for n, s in sizes.items())
                shutil.rmtree(local)
                target = scratch / f"boto3-{repeat}"
                target.mkdir()
                with request_log() as seen:
                    started = time.perf_counter()
                    for name in sizes:
                        client.download_file(BUCKET, f"ckpt/{name}", str(target / name))
                    theirs.append(time.perf_counter() - started)
                their_requests = requests_per_file(seen)
                shutil.rmtree(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    print(f"checkpoint folder of {sum(sizes.values()) / 2**20:.0f} MiB on the local S3 server, {args.repeats} repeats")
    print(f"{'file':<20}{'MiB':>8}{'bound':>7}{'ours':>7}{'boto3':>7}   requests (HEAD + GET)")
    within = True
    for name, size in sizes.items():
        bound = math.ceil(size / PART) + 2
        within &= our_requests[name] <= bound
        print(f"{name:<20}{size / 2**20:>8.1f}{bound:>7}{our_requests[name]:>7}{their_requests[name]:>7}")
    print(f"convsts (cache.local_copy)   median {ours_s:6.2f} s   {sum(sizes.values()) / 2**20 / ours_s:7.0f} MiB/s")
    print(
        f"boto3 download_file          median {theirs_s:6.2f} s   {sum(sizes.values()) / 2**20 / theirs_s:7.0f} MiB/s"
    )
    print(f"ratio boto3 / convsts: {theirs_s / ours_s:.2f} (target >= 0.8); requests within the bound: {within}")
    return 0 if within else 1


if __name__ == "__main__":
    raise SystemExit(main())
