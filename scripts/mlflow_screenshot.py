"""A screenshot of a run's MLflow page, as a reviewer opens it: `mlflow ui` on the run's store
(127.0.0.1, one worker), headless Chromium on the run page, both stopped by PID.

    python scripts/mlflow_screenshot.py --store sqlite:///runs/demo/mlflow.db --run-id RUN_ID \\
        --png docs/img/mlflow_run.png

Needs Chromium (Debian: `apt-get install chromium`); the project itself does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.time() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s") from None
            time.sleep(1)


def stop(proc: subprocess.Popen) -> None:
    """The process and its group (the server's workers), by PID."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def screenshot(
    store: str, run_id: str, png: Path, size: str = "1400,1800", wait_ms: int = 25000, experiment_page: bool = False
) -> None:
    from mlflow.tracking import MlflowClient

    from convsts.ray_jobs.tracking.runs import run_page

    experiment = MlflowClient(store).get_run(run_id).info.experiment_id
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("mlflow_screenshot: no chromium on PATH (Debian: apt-get install chromium)")
    port = free_port()
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "ui", "--backend-store-uri", store, "--host", "127.0.0.1", "--port", str(port)]
        + ["--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 180)
        url = f"http://127.0.0.1:{port}/{run_page(experiment, None if experiment_page else run_id)}"
        png.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size}"]
                + [f"--virtual-time-budget={wait_ms}", f"--screenshot={png.resolve()}", url],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
                start_new_session=True,
            )
    finally:
        stop(server)
    print(f"{png}: {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="the tracking URI, e.g. sqlite:///runs/demo/mlflow.db")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--size", default="1400,1800", help="window WIDTH,HEIGHT in pixels")
    parser.add_argument("--experiment-page", action="store_true", help="the run's experiment page instead")
    args = parser.parse_args(argv)
    screenshot(args.store, args.run_id, args.png, args.size, experiment_page=args.experiment_page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
