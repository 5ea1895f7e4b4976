"""`convsts prepare reddit` on pushshift comment dumps against a plain single-process script.

  .venv/bin/python bench/prepare_pushshift.py [--sizes 100000 400000 1600000] [--keep DIR]

For each size N: writes a synthetic monthly dump of N comments in the pushshift schema (25 fields,
real texts from the embedded sample, threads of 5-35 comments, 80% of comments replying to a
comment, 0.5% of lines repeated, 0.1% malformed; zstd), then on that same file runs (--kind dense: a
pair-dense dump, bodies of 20-300 characters drawn from 20,000 real comments and no bot author, so
that about 7 lines in 10 make a pair: the engine's memory at its most pairs per line)

- the reference: one Python process, the zstd stream, `json.loads` per line, convsts' own filters
  (`failing_rule`), the first line of each id, a dict from id to comment for the parent join, the
  hash split (`split_of`), one parquet file;
- `convsts prepare reddit --input DUMP --out DIR` as a user runs it, in a fresh process: a dump up to
  `data.dump_local_bytes` (4 GiB) goes through the streaming engine in that process, without Ray;
- with --ray, also the same command with `data.dump_local_bytes=0`: the distributed path (Ray tasks)
  a larger input takes on a cluster, joined to a Ray instance started first (`ray start --head
  --num-cpus C --object-store-memory M`, with --cpus and --object-store-gib; its start-up is not
  counted), the dump cut into each of --files counts of files (`--files 1 2`: a run from one file, one
  from two); with --nodes N, a cluster of N nodes on this host (a
  head and N-1 worker nodes, each its own raylet and loopback address) sharing out --cpus.

Prints, per size: both rates (lines/s), their ratio (prepare / reference; >= 1 means prepare is the
faster), both pair counts and whether the pairs are the same rows (order-insensitive), and the peak
memory of all processes of the prepare (the command and every process under it, sampled every 0.2 s;
memory-mapped spill files count as they are touched) and of the reference, and the worker crashes the
logs of the Ray instance report (a signal, a fatal error, a worker that died; 0 where no Ray ran).
With --ray, one more table: the distributed path against the streaming engine on the same dump
(lines/s, lines/s per CPU, engine / distributed), the same pairs and shards, the object store's peak
use and what Ray spilled to disk.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_REDDIT = REPO.parent / "shared" / "data" / "reddit"  # the Reddit pairs beside the project (--kind real)
sys.path.insert(0, str(REPO))

FIELDS_EXTRA = (
    "archived", "author_flair_css_class", "author_flair_text", "controversiality", "created_utc",
    "distinguished", "downs", "edited", "gilded", "name", "retrieved_on", "score", "score_hidden",
    "stickied", "subreddit_id", "ups", "author_created_utc", "can_gild", "collapsed",
)  # fmt: skip


AUTHORS = ("alice", "bob", "carol", "dave", "AutoModerator", "erin")  # "dense": no bot, most replies make a pair
DENSE_POOL = 20_000  # --kind dense: the real texts its bodies are drawn from


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def monthly_fields(rng: random.Random, cid: str, link: str, sub: str, author: str, created: int) -> dict:
    """The other fields of a comment as a 2019-2020 monthly dump writes them: mostly the same value
    line after line (nulls, empty lists, false), a timestamp that grows, a small score; with the
    texts, about 1.1 kB a line that zstd's long mode compresses about 8x (the monthly files: 8-10x)."""
    return {
        "all_awardings": [], "associated_award": None, "author_flair_background_color": None,
        "author_flair_css_class": None, "author_flair_richtext": [], "author_flair_template_id": None,
        "author_flair_text": None, "author_flair_text_color": None, "author_flair_type": "text",
        "author_fullname": f"t2_{author.lower()}", "author_patreon_flair": False, "author_premium": False, "awarders": [],
        "collapsed_because_crowd_control": None, "created_utc": created, "gildings": {}, "is_submitter": False,
        "locked": False, "no_follow": rng.random() < 0.7, "permalink": f"/r/{sub}/comments/{link}/{link}_slug/{cid}/",
        "retrieved_on": created + 2_500_000 + rng.randint(0, 9), "score": max(1, int(rng.expovariate(0.3))), "send_replies": True,
        "stickied": False, "subreddit_id": "t5_2qh1i", "top_awarded_type": None, "total_awards_received": 0,
        "treatment_tags": [],
    }  # fmt: skip


def write_dump(
    path: Path, comments: int, seed: int = 0, first: int = 0, kind: str = "synthetic", level: int = 3
) -> None:
    """A zstd NDJSON dump of `comments` lines in the pushshift comment schema (comment and thread ids
    from `first` on: dumps written with first far apart share none). `kind`: "synthetic", its other
    fields random numbers (it compresses about 3x), or "monthly", as a monthly dump writes them,
    compressed with zstd's long window as those are (about 8x); "real" and "dense" (--kind's help)
    with a monthly dump's fields, "dense" in zstd's default window. `level`: zstd's."""
    import pandas as pd
    import zstandard

    from convsts.io.storage import sample_dir

    texts = pd.read_parquet(sample_dir() / "reddit_pairs.parquet")
    pool = [str(t) for t in texts["question"]] + [str(t) for t in texts["answer"]]
    words = [w for t in pool for w in t.split()]  # as often as the texts use them
    if kind in ("real", "dense"):  # the 393k Reddit pairs beside the project: real comments, in their order
        shards = sorted(SHARED_REDDIT.glob("*.parquet"))
        if not shards:
            raise SystemExit(f"--kind {kind}: no parquet files in {SHARED_REDDIT}")
        real = pd.concat([pd.read_parquet(f, columns=["question", "answer"]) for f in shards])
        pool = [str(t) for pair in zip(real["question"], real["answer"]) for t in pair]
    if kind == "dense":  # 20,000 of them of 20-300 characters, each drawn again and again
        pool = random.Random(seed).sample(sorted({t for t in pool if 20 <= len(t) <= 300}), DENSE_POOL)
    drawn = iter(range(10**12))

    def body() -> str:
        """A real text. "synthetic": one of the sample's; "monthly": every body its own, as there:
        words of the sample's texts drawn as often as they use them (its few thousand texts,
        repeated, would compress far better than a month's); "real": the real comments beside the
        project one after another (each about twice in 1.6M lines, as far apart as the dump is long)."""
        if kind == "real":
            return pool[next(drawn) % len(pool)]
        if kind == "dense":
            return rng.choice(pool)
        return rng.choice(pool) if kind != "monthly" else " ".join(rng.choices(words, k=len(rng.choice(pool).split())))

    subs = sorted({str(s) for s in texts["subreddit"]}) or ["AskReddit"]
    rng = random.Random(seed)
    written, next_id, link = 0, 10**8 + first, 10**6 + first
    if kind in ("monthly", "real"):  # zstd --long=27, as the monthly files are written
        params = zstandard.ZstdCompressionParameters.from_level(level, window_log=27, enable_ldm=True)
        compressor = zstandard.ZstdCompressor(compression_params=params)
    else:
        compressor = zstandard.ZstdCompressor(level=level)
    created = 1_577_836_800
    with open(path, "wb") as raw, compressor.stream_writer(raw) as out:
        while written < comments:
            link += 1
            sub = rng.choice(subs)
            thread: list[str] = []
            for _ in range(rng.randint(5, 35)):
                if written >= comments:
                    break
                next_id += 1
                cid = _b36(next_id)
                parent = f"t1_{rng.choice(thread)}" if thread and rng.random() < 0.8 else f"t3_{_b36(link)}"
                author = rng.choice(AUTHORS if kind != "dense" else AUTHORS[:4])
                record = {
                    "id": cid,
                    "parent_id": parent,
                    "link_id": f"t3_{_b36(link)}",
                    "author": author,
                    "body": body(),
                    "subreddit": sub,
                }
                created += rng.randint(0, 3)
                if kind != "synthetic":
                    record |= monthly_fields(rng, cid, _b36(link), sub, author, created)
                else:
                    record |= {name: rng.randint(0, 10**9) for name in FIELDS_EXTRA}
                line = json.dumps(record).encode() + b"\n"
                roll = rng.random()
                if roll < 0.001:
                    line = b'{"id": "broken' + b"\n"  # a malformed line
                out.write(line)
                written += 1
                if roll > 0.995 and written < comments:  # a repeated comment (dumps repeat some)
                    out.write(line)
                    written += 1
                thread.append(cid)


def reference(dump: Path, out: Path) -> tuple[int, float, set]:
    """The plain single-process script: (pairs, seconds, the set of (context, response, split))."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from convsts.datasets.config import RedditFilterConfig
    from convsts.datasets.pushshift import parse_comment
    from convsts.datasets.reddit import failing_rule, split_of
    from convsts.io.compression import open_lines

    cfg, started = RedditFilterConfig(), time.perf_counter()
    comments: dict[str, dict] = {}
    order: list[dict] = []
    with open_lines(str(dump)) as fh:
        for lineno, raw in enumerate(fh, start=1):
            c = parse_comment(raw, lineno == 1)
            if c is None or c["id"] in comments:
                continue
            c["rule"] = failing_rule(c["body"], c["author"], cfg)
            comments[c["id"]] = c
            order.append(c)
    rows = []
    for c in order:
        parent = comments.get(c["parent_id"][3:]) if c["parent_id"].startswith("t1_") else None
        if c["rule"] or parent is None or parent["rule"]:
            continue
        rows.append((parent["body"], c["body"], split_of(c["link_id"], 0.1, "convsts")))
    table = pa.table({"context": [r[0] for r in rows], "response": [r[1] for r in rows], "split": [r[2] for r in rows]})
    pq.write_table(table, out)
    return len(rows), time.perf_counter() - started, set(rows)


def _tree_rss(root: int) -> int:
    """Resident bytes of `root` and every process under it (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


CRASHES = re.compile(rb"SIGABRT|SIGSEGV|Fatal Python error|core dumped|WorkerCrashedError|The worker died")


def crashes(ray_tmp: Path) -> int:
    """Lines of the Ray logs under `ray_tmp` that report a worker crash (a signal, a fatal error, a worker
    that died and whose task was retried)."""
    return sum(len(CRASHES.findall(f.read_bytes())) for f in ray_tmp.rglob("logs/*") if f.is_file())


def run_prepare(
    inputs: list[Path], out: Path, overrides: tuple[str, ...] = (), address: str | None = None
) -> tuple[float, int, int]:
    """`convsts prepare reddit` in a fresh process, joined to the Ray instance at `address` when given:
    (seconds, peak bytes of its process tree, worker crashes in the logs of a Ray instance it started)."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))  # short: Ray's socket paths must fit
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(ray_tmp)}
    env |= {"RAY_ADDRESS": address} if address else {}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    command = [sys.executable, "-m", "convsts", "prepare", "reddit", "--input",
               *map(str, inputs), "--out", str(out), *overrides]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    log = proc.communicate()[0]
    seconds = time.perf_counter() - started
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed:\n{log[-3000:]}")
    crashed = crashes(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return seconds, peak[0], crashed


def _decompressed(dump: Path) -> int:
    import zstandard

    total = 0
    with zstandard.open(dump, "rb") as src:
        while block := src.read(64 << 20):
            total += len(block)
    return total


def split_dump(dump: Path, files: int) -> list[Path]:
    """The dump's lines cut into `files` zstd files of consecutive lines (a thread may span two: its
    parents are then in another file), named so that their order is the dump's."""
    import zstandard

    if files == 1:
        return [dump]
    with zstandard.open(dump, "rb") as src:
        lines = src.read().splitlines(keepends=True)
    paths = [dump.with_name(f"{dump.stem}_part{i:02d}.zst") for i in range(files)]
    for i, path in enumerate(paths):
        with zstandard.open(path, "wb") as out:
            out.write(b"".join(lines[len(lines) * i // files : len(lines) * (i + 1) // files]))
    return paths


def _ray_workers_rss() -> list[tuple[int, int, str]]:
    """(pid, private resident bytes, what it runs) of each Ray worker process on this host
    (`ray::TASK`). Private: RssAnon, without the object store's shared pages that a worker maps as
    it reads or writes objects (counted once, in the store's peak)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            title = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
            if title.startswith(b"ray::"):
                status = (entry / "status").read_text()
                rss = int(status.split("RssAnon:", 1)[1].split()[0]) * 1024
                out.append((int(entry.name), rss, title.split(b"\0")[0].decode(errors="replace")[5:]))
        except (OSError, IndexError, ValueError):
            continue
    return out


class StoreWatch:
    """The object store of the Ray instance at `gcs` while a command runs: its peak use (sampled every
    second, one request to the instance: the bench adds no process), the bytes Ray spilled to disk,
    and the largest peak of one Ray worker process (its tasks; sampled every 0.2 s)."""

    USED = re.compile(r"Plasma memory usage (\d+) MiB")
    SPILLED = re.compile(r"Spilled (\d+) MiB")

    def __init__(self, gcs: str):
        self.gcs, self.peak, self._stop = gcs, 0, threading.Event()
        self.workers: dict[int, tuple[int, set]] = {}  # pid: (peak bytes, the tasks seen running there)
        self.spilled_before = self._stats()[1]
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._sample, self._sample_workers)]
        for thread in self._threads:
            thread.start()

    def _stats(self) -> tuple[int, int]:
        from ray._private.internal_api import memory_summary

        out = memory_summary(address=self.gcs, stats_only=True)
        used, spilled = self.USED.search(out), self.SPILLED.search(out)
        return int(used.group(1)) if used else 0, int(spilled.group(1)) if spilled else 0

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, self._stats()[0])

    def _sample_workers(self) -> None:
        while not self._stop.wait(0.2):
            for pid, rss, task in _ray_workers_rss():
                peak, tasks = self.workers.get(pid, (0, set()))
                self.workers[pid] = (max(peak, rss), tasks | ({task} - {"IDLE"}))

    def stop(self) -> tuple[int, int, str]:
        """(peak MiB in the store, MiB spilled while watched, the largest worker's peak: 'N MiB (TASK)')."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        rss, tasks = max(self.workers.values(), key=lambda v: v[0], default=(0, set()))
        return self.peak, self._stats()[1] - self.spilled_before, f"{rss >> 20:,} MiB (ran {', '.join(sorted(tasks))})"


def prepared_rows(out: Path) -> set:
    import pandas as pd

    rows = set()
    for split in ("train", "test"):
        frame = pd.read_parquet(out / split)
        rows |= set(zip(frame["context"], frame["response"], [split] * len(frame)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=int, default=[100_000, 400_000, 1_600_000])
    parser.add_argument("--keep", help="write the dumps and outputs here (default: a temporary folder)")
    parser.add_argument("--ray", action="store_true", help="also time the distributed path on a running Ray instance")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="the Ray instance's CPUs (--ray)")
    parser.add_argument("--object-store-gib", type=float, default=1.0, help="its object store (--ray)")
    parser.add_argument(
        "--files", nargs="+", type=int, default=[1], help="the dump cut into this many files, a run each (--ray)"
    )
    parser.add_argument(
        "--nodes", type=int, default=1, help="--cpus spread over this many Ray nodes on this host (--ray)"
    )
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference script")
    parser.add_argument(
        "--kind",
        choices=["synthetic", "monthly", "real", "dense"],
        default="synthetic",
        help="the dump's other fields: random numbers (about 3x in zstd) or as a monthly dump's (about 8x); "
        '"real": those of a monthly dump with the real comments in ../shared/data/reddit as the bodies (about 9-10x); '
        '"dense": pair-dense, a monthly dump\'s fields with bodies drawn from 20,000 of those comments of 20-300 '
        "characters and no bot author, so that most of the 80%% of replies to a comment make a pair",
    )
    parser.add_argument(
        "--zstd-level", type=int, default=3, help="the dump's zstd level (higher: smaller, slower to write)"
    )
    args = parser.parse_args()
    if not 1 <= args.zstd_level <= 22:
        parser.error(f"--zstd-level {args.zstd_level}: zstd's levels are 1 to 22")
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-pushshift-"))
    root.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        head = None
        if args.ray:
            head = stack.enter_context(_cluster(args))
        if not args.no_reference:
            print(
                "| comments | path | reference lines/s | prepare lines/s | prepare / reference | pairs (ref, prepare) "
                "| same rows | peak memory, prepare's processes | peak memory, reference | worker crashes |"
            )
            print("|---|---|---|---|---|---|---|---|---|---|")
        rows = []
        for n in args.sizes:
            dump = root / f"RC_{args.kind}_{n}.zst"
            if not dump.exists():
                write_dump(dump, n, kind=args.kind, level=args.zstd_level)
            ratio = _decompressed(dump) / dump.stat().st_size
            print(f"{dump.name}: {dump.stat().st_size / 2**20:,.0f} MiB, {ratio:.1f}x in zstd", flush=True)
            rows.extend(_bench_size(root, dump, n, args, head))
        if args.ray:
            print(f"\nThe distributed path on a running instance ({args.cpus} CPUs on {args.nodes} node(s), object "
                  f"store {args.object_store_gib:g} GiB a node) against the streaming engine:\n")  # fmt: skip
            print("| comments | files | engine lines/s | distributed lines/s | per CPU | distributed / engine "
                  "| same shards | object store peak | spilled | largest worker's private peak |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|---|")
            for n, files, engine_s, ray_s, same, peak, spilled, worker in rows:
                print(f"| {n:,} | {files} | {n / engine_s:,.0f} | {n / ray_s:,.0f} | {n / ray_s / args.cpus:,.0f} "
                      f"| {engine_s / ray_s:.2f} | {'yes' if same else 'NO'} | {peak:,} MiB | {spilled:,} MiB "
                      f"| {worker} |")  # fmt: skip
    return 0


@contextlib.contextmanager
def _cluster(args):
    """A Ray instance started first: one head, or with --nodes N a head and N-1 worker nodes on
    this host (each its own raylet, temp dir and loopback address), --cpus shared out among them."""
    sys.path.insert(0, str(REPO / "tests"))
    from testkit.local_cluster import ray_head, ray_worker_node

    env = {"RAY_AUTH_MODE": "disabled"}
    store = f"--object-store-memory={int(args.object_store_gib * 2**30)}"
    cpus = [args.cpus // args.nodes + (i < args.cpus % args.nodes) for i in range(args.nodes)]
    with contextlib.ExitStack() as stack:
        head = stack.enter_context(ray_head(env, cpus[0], [store]))
        for i, n in enumerate(cpus[1:], start=2):
            stack.enter_context(ray_worker_node(head["gcs"], env, n, ip=f"127.0.0.{i}", options=[store]))
        yield head


def _bench_size(root: Path, dump: Path, n: int, args, head) -> list[tuple]:
    """One size: the reference (unless --no-reference), the streaming engine and, with --ray, the
    distributed path on the dump cut into each of --files; prints a row for each and returns, per
    file count, (n, files, engine s, distributed s, same shards, store peak MiB, spilled MiB, worker)."""
    ref = None if args.no_reference else _reference(root, dump, n)
    runs = [("this process", [dump], 0)] + [("Ray tasks", split_dump(dump, k), k) for k in args.files if head]
    timed = {}
    for path, inputs, files in runs:
        out = root / (f"prepared_{n}_ray{files}" if files else f"prepared_{n}_local")
        if out.exists():
            shutil.rmtree(out)
        watch = StoreWatch(head["gcs"]) if files else None
        overrides = ("data.dump_local_bytes=0",) if files else ()
        prep_s, prep_peak, crashed = run_prepare(inputs, out, overrides, head["gcs"] if watch else None)
        store = watch.stop() if watch else (0, 0, "")
        crashed += crashes(Path(head["temp_dir"])) if watch else 0
        manifest = json.loads((out / "manifest.json").read_text())
        timed[files] = (prep_s, manifest, store)
        label = f"{path}, {files} file(s)" if files else path
        if ref is None:
            print(f"{n:,} comments, {label}: {n / prep_s:,.0f} lines/s ({prep_s:.1f} s), {manifest['pairs']:,} pairs, "
                  f"peak memory {prep_peak / 2**20:,.0f} MiB, worker crashes {crashed}", flush=True)  # fmt: skip
            continue
        ref_pairs, ref_s, ref_rows, ref_peak = ref
        same = prepared_rows(out) == ref_rows
        print(
            f"| {n:,} | {label} | {n / ref_s:,.0f} ({ref_s:.1f} s) | {n / prep_s:,.0f} ({prep_s:.1f} s) "
            f"| {ref_s / prep_s:.2f} | {ref_pairs:,}, {manifest['pairs']:,} | {'yes' if same else 'NO'} "
            f"| {prep_peak / 2**20:,.0f} MiB | {ref_peak / 2**20:,.0f} MiB (this process) | {crashed} |",
            flush=True,
        )
    engine_s, engine_m, _ = timed[0]
    return [
        (n, files, engine_s, ray_s, engine_m["shards"] == m["shards"] and engine_m["pairs"] == m["pairs"], *store)
        for files, (ray_s, m, store) in timed.items()
        if files
    ]


def _reference(root: Path, dump: Path, n: int) -> tuple:
    """The single-process reference script on `dump`: (pairs, seconds, rows, peak bytes of this process)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ref_pairs, ref_s, ref_rows = reference(dump, root / f"reference_{n}.parquet")
    return ref_pairs, ref_s, ref_rows, max(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


if __name__ == "__main__":
    raise SystemExit(main())
