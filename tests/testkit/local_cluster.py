"""A real Ray head (`ray start --head`, own temp dir) and a real MLflow server, both on 127.0.0.1,
for tests; each is stopped by its own process ids (never `ray stop`, which ends every Ray process
on the machine)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from convsts.io.processes import alive, start_time
from convsts.ray_jobs.runtime.reaper import instance_processes

BIN = Path(sys.executable).parent


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct ports free now: each socket stays bound until all are chosen (one at a time, the
    kernel may hand out a port it has just handed out, and two Ray components then collide)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def pids_matching(marker: str) -> list[int]:
    """Processes whose command line contains `marker`, plus all their descendants (the reaper's own rule)."""
    return sorted(instance_processes(marker, set()))


def run_watching(
    command: list[str], marker: str, timeout: float, **kwargs
) -> tuple[subprocess.CompletedProcess, dict[int, int]]:
    """`command` run to its exit, its stdout and stderr captured as text, and every process (pid: start
    time) that named `marker` (a Ray instance's temp dir) or descended from one while it ran: sampled
    every half second, so that an actor whose process title hides the marker is seen while its raylet
    is its parent. Killed after `timeout` seconds."""
    seen: dict[int, int] = {}
    deadline = time.time() + timeout
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs) as proc:
        texts: dict[int, str] = {}
        pumps = [
            threading.Thread(target=lambda i=i, s=s: texts.__setitem__(i, s.read()))
            for i, s in enumerate((proc.stdout, proc.stderr))
        ]
        for pump in pumps:
            pump.start()
        while proc.poll() is None:
            if time.time() > deadline:
                proc.kill()
            for pid in instance_processes(marker, set()) - seen.keys() - {proc.pid}:
                if (started := start_time(pid)) is not None:
                    seen[pid] = started
            time.sleep(0.5)
        for pump in pumps:
            pump.join()
    return subprocess.CompletedProcess(command, proc.returncode, texts[0], texts[1]), seen


def still_running(seen: dict[int, int], seconds: float = 60) -> list[str]:
    """The command lines of the processes of `seen` (pid: start time) still running after up to
    `seconds`: an ended Ray instance's processes end with it."""

    def left() -> list[int]:
        return [pid for pid, started in seen.items() if alive(pid) and start_time(pid) == started]

    deadline = time.time() + seconds
    while left() and time.time() < deadline:
        time.sleep(0.5)
    lines = []
    for pid in left():
        with contextlib.suppress(OSError):  # it ended just now
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes()[:100].decode(errors="replace"))
    return lines


def ray_processes(prefix: bytes) -> list[int]:
    """Processes of the test session's local Ray instance whose command line starts with `prefix`
    (b"ray::RayTrainWorker", b"ray::ParameterHolder")."""
    from ray._private.worker import _global_node

    return node_processes({"temp_dir": _global_node.get_session_dir_path()}, prefix)


def start_train(ray_session, out: Path, args: list[str]) -> subprocess.Popen:
    """`python -m convsts train --out OUT ARGS` against the test session's Ray instance, its
    output (stdout and stderr) in one text pipe."""
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    return subprocess.Popen(
        [sys.executable, "-m", "convsts", "train", "--out", str(out), *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def poll_until(predicate, proc: subprocess.Popen, seconds: float, every: float = 0.3):
    """`predicate()`'s first true value, polled every `every` seconds while `proc` runs; None when
    `proc` exits or `seconds` pass first."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return None


def stop_pids(pids: list[int], grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        if not any(alive(p) for p in pids):
            return


def _wait_http(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.time() + timeout_s
    last: Exception | None = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
                if r.status < 500:
                    return
        except urllib.error.HTTPError as err:  # 401 still means the server is up
            if err.code < 500:
                return
            last = err
        except Exception as err:  # noqa: BLE001 - not up yet
            last = err
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s: {last}")


def _ray_env(env: dict[str, str]) -> dict[str, str]:
    full_env = {
        **os.environ,
        **env,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    full_env.pop("RAY_ADDRESS", None)
    return full_env


def _own_ports(ip: str) -> list[str]:
    """Ports each raylet of a cluster on one host needs for itself (Ray's fixed defaults collide).
    The single ports are free ones the kernel hands out (32768 and up); the workers' range lies
    below them, 400 ports per loopback address, so it never holds one of them."""
    low = 20000 + int(ip.rsplit(".", 1)[1]) % 25 * 400
    agent, agent_grpc, metrics, runtime_env, node_manager, object_manager = free_ports(6)
    return [
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--min-worker-port={low}",
        f"--max-worker-port={low + 399}",
    ]


@contextlib.contextmanager
def ray_worker_node(
    gcs_address: str, env: dict[str, str], num_cpus: int = 1, ip: str = "127.0.0.2", options: Sequence[str] = ()
) -> Iterator[dict[str, str]]:
    """One more node of a cluster on this host: `ray start --address=GCS` with its own temp dir,
    ports and loopback address `ip` (and `options`, as ray_head's; a driver on this host then joins the head's raylet, never a
    worker node's, as on a real cluster); yields {"temp_dir": ...}. kill_node(node) SIGKILLs its
    raylet, as a lost machine."""
    temp_dir = tempfile.mkdtemp(prefix="cvnode", dir="/tmp")
    cmd = [str(BIN / "ray"), "start", f"--address={gcs_address}", f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}"]
    cmd.append(f"--node-ip-address={ip}")
    try:
        done = subprocess.run(
            [*cmd, *_own_ports(ip), *options], env=_ray_env(env), capture_output=True, text=True, timeout=180
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray start (worker node) failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        yield {"temp_dir": temp_dir}
    finally:
        stop_pids(pids_matching(temp_dir))


def node_processes(node: dict[str, str], prefix: bytes) -> list[int]:
    """A cluster node's processes whose command line starts with `prefix` (b"ray::RayTrainWorker")."""
    out = []
    for pid in pids_matching(node["temp_dir"]):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(prefix):
                out.append(pid)
    return out


def kill_node(node: dict[str, str]) -> None:
    """SIGKILL a node's raylet and everything under it: the node is lost."""
    pids = pids_matching(node["temp_dir"])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def ray_head(env: dict[str, str], num_cpus: int = 2, options: Sequence[str] = ()) -> Iterator[dict[str, str]]:
    """`ray start --head` with a private temp dir (and `options`, e.g. --object-store-memory=N); yields
    {"address": dashboard URL, "gcs": the address worker nodes and drivers join, "temp_dir": ...}."""
    temp_dir = tempfile.mkdtemp(prefix="cvray", dir="/tmp")  # short: Ray's unix sockets live under it
    gcs = ""
    dashboard_port, gcs_port, agent, agent_grpc, metrics, runtime_env, client_server = free_ports(7)
    full_env = {
        **os.environ,
        **env,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    full_env.pop("RAY_ADDRESS", None)
    cmd = [
        str(BIN / "ray"),
        "start",
        "--head",
        f"--port={gcs_port}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}",
        f"--num-cpus={num_cpus}",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        "--include-dashboard=true",
        # Fixed default ports (agent 52365, metrics, ...) collide with another Ray on the machine.
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--ray-client-server-port={client_server}",
        *options,
    ]
    try:
        done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        address = f"http://127.0.0.1:{dashboard_port}"
        _wait_http(f"{address}/api/version", 120)
        found = re.search(r"--address='([^']+)'", done.stdout + done.stderr)
        gcs = found.group(1) if found else ""
        yield {"address": address, "gcs": gcs, "temp_dir": temp_dir}
    finally:
        # The head's Ray Client server names the GCS address, not the temp dir, on its command line.
        stop_pids(pids_matching(temp_dir) + (pids_matching(f"ray.util.client.server --address={gcs}") if gcs else []))


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """`mlflow server` (sqlite backend, proxied artifacts) on 127.0.0.1; yields its URL."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        stdout=open(root / "server.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/health", 180)
        yield url
    finally:
        stop_pids(sorted({proc.pid, *pids_matching(str(root / "mlflow.db"))}), grace_s=15)
        proc.wait(timeout=30)
