"""Helpers of the tests of faults and refusals: a command run as a user runs it, dumps
written in the pushshift schema, a zstd file cut short, a tiny checkpoint to damage."""

import json
import os
import subprocess
import sys
from pathlib import Path

import zstandard

from convsts.ray_jobs.config.loader import load_config

REPO = Path(__file__).resolve().parents[2]


ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO / "tests")}


def dump_lines(n: int) -> bytes:
    rows = [
        {
            "id": f"c{i}",
            "parent_id": f"t1_c{i - 1}" if i % 2 else "t3_x",
            "link_id": f"t3_{i // 2}",
            "author": "someone",
            "body": f"comment number {i} with a few words",
            "subreddit": "test",
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def cut_zst(path: Path, share: float = 0.6) -> Path:
    data = zstandard.ZstdCompressor().compress(dump_lines(20000))
    path.write_bytes(data[: int(len(data) * share)])
    return path


def run_convsts(*args, cwd=None, env=None):
    """`python -m convsts ARGS`, as a user (or a Ray job's entrypoint) runs it."""
    return run_python("-m", "convsts", *args, cwd=cwd, env=env)


def run_python(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**ENV, **(env or {})},
        cwd=cwd or REPO,
        timeout=300,
    )


def start_python(*args, cwd=None, env=None) -> subprocess.Popen:
    """run_python started, not waited for: `.communicate()` gives (stdout, stderr)."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**ENV, **(env or {})},
        cwd=cwd or REPO,
    )


def tiny_checkpoint(path: Path, embedding_dim: int = 4) -> Path:
    """A tiny DAN checkpoint with a run config and a train state (step 3)."""
    from convsts.datasets.text import DanTokenizer, count_words
    from convsts.models.checkpoint import TrainState, build_model, save_checkpoint

    cfg = load_config(
        None, ["model.dan.output_dim=6", f"model.dan.embedding_dim={embedding_dim}", "model.dan.hidden_sizes=[4]"]
    )
    tok = DanTokenizer.build(count_words(["a man plays a guitar", "a woman sings"]), cfg.tokenizer)
    return save_checkpoint(path, build_model(cfg.model, tok).eval(), tok, cfg.to_dict(), train_state=TrainState(3))
