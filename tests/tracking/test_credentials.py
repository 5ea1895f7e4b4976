"""Credentials in URIs and addresses are redacted wherever a config, a URI or a log line is written;
unreachable storage and tracking servers are one line, found before the work where they can be."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import zstandard
from testkit.faults import ENV, REPO, run_convsts, run_python, start_python

from convsts.io import errors
from convsts.io.errors import ConfigError
from convsts.ray_jobs.config.loader import load_config

SECRETS = ("AKIAPLANTED", "PlAnTeDsEcReT", "PlAnTeDqUeRy")


PLANTED = "s3://AKIAPLANTED:PlAnTeDsEcReT@bucket/dumps/RC_x.zst?secret_key=PlAnTeDqUeRy&region=eu"


def _leaks(text: str) -> list:
    return [secret for secret in SECRETS if secret in text]


@pytest.mark.parametrize(
    "text, expected",
    [
        (PLANTED, "s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu"),
        ("http://alice:pw@mlflow:5000", "http://***@mlflow:5000"),
        ("gs://b/p?access_token=T1&X-Amz-Signature=S1", "gs://b/p?access_token=***&X-Amz-Signature=***"),
        (
            "s3://bucket/p?endpoint_override=minio:9000&scheme=http",
            "s3://bucket/p?endpoint_override=minio:9000&scheme=http",
        ),
        ("trainer.steps=5 alice@example.com", "trainer.steps=5 alice@example.com"),
        (
            "s3://b/p?secret_key=PlAnTeDqUeRy: Unexpected query parameter",
            "s3://b/p?secret_key=***: Unexpected query parameter",
        ),
        # The user-info ends at the authority's last "@", as URL parsers split it: a password with "@",
        # ":" or quotes is redacted whole.
        ("http://alice:p@ssW0rd@head:8265/api/jobs", "http://***@head:8265/api/jobs"),
        ("'http://alice:pa\"ss'w0rd@head:8265' refused", "'http://***@head:8265' refused"),
        # A URI whose "//" a path library collapsed.
        ("s3:/KEY:SECRET@bucket/x.yaml not found", "s3:/***@bucket/x.yaml not found"),
        ("see http://head:8265 and alice@example.com", "see http://head:8265 and alice@example.com"),
    ],
)
def test_redact_removes_userinfo_and_secret_query_values(text, expected):
    from convsts.io.redaction import redact, redact_tree

    assert redact(text) == expected
    assert redact_tree({"a": [text], text: 1}) == {"a": [expected], expected: 1}


def test_job_commands_print_no_password_of_the_ray_address(tmp_path):
    """`jobs` and `submit` against an address with user-info (nothing listens there): the error line
    names the address without the password, whichever way it is given."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"http://alice:p@ss'W0rd@127.0.0.1:{port}"
    started = [  # each a fresh process, all at once
        start_python("-m", "convsts", *args, env=env)
        for args, env in (
            (["jobs", "list", "--address", address], {}),
            (["jobs", "logs", "some-job", "--address", address], {}),
            (["submit", "--address", address, "train", "--out", str(tmp_path / "o")], {}),
            (["jobs", "list"], {"RAY_ADDRESS": address}),
        )
    ]
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 2, stderr[-2000:]
        assert "ss'W0rd" not in stdout + stderr and "p@ss" not in stdout + stderr
        assert f"http://***@127.0.0.1:{port}" in stderr, stderr[-2000:]


def test_log_lines_and_error_lines_are_redacted(tmp_path):
    import io
    import logging

    from convsts.ray_jobs.runtime.logs import RedactingFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("convsts.test_redaction")
    logger.addHandler(handler)
    try:
        logger.warning("reading %s", PLANTED)
    finally:
        logger.removeHandler(handler)
    assert "s3://***@bucket" in stream.getvalue() and not _leaks(stream.getvalue())
    # A user error that names the URI names it redacted.
    result = run_convsts(
        "prepare", "reddit", "--input", str(tmp_path / "x?secret_key=PlAnTeDqUeRy"), "--out", str(tmp_path / "out")
    )
    assert result.returncode == 2 and "secret_key=***" in result.stderr and not _leaks(result.stderr)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # one subprocess per command
def test_unreachable_storage_is_one_line_naming_the_uri_for_every_command(tmp_path):
    """Guards: a URI whose store cannot be reached (no server, a wrong endpoint) ended every command in
    pyarrow's OSError traceback. Each command now prints one line naming the URI (credentials
    redacted) and exits 2; the library raises StorageError, an OSError."""
    from convsts.io import storage

    port = _closed_port()  # nothing listens: the connection is refused at once
    base = f"s3://AKIAPLANTED:PlAnTeDsEcReT@bucket/p?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    with pytest.raises(errors.StorageError, match=r"^s3://\*\*\*@bucket/p/reddit\?endpoint_override") as caught:
        storage.is_dir(storage.join(base, "reddit"))
    assert not _leaks(str(caught.value)) and isinstance(caught.value, OSError)
    with pytest.raises(errors.StorageError, match="Unexpected query parameter"):
        storage.is_dir("s3://bucket/p?no_such_option=1")
    commands = (  # each a fresh process, all at once (each waits out the store client's retries)
        ["prepare", "reddit", "--input", storage.join(base, "RC_*.zst"), "--out", str(tmp_path / "p")],
        ["train", "--prepared", base, "--out", str(tmp_path / "t")],
        ["train", "--config", storage.join(base, "x.yaml"), "--out", str(tmp_path / "c")],
    )
    started = [start_python("-m", "convsts", *command) for command in commands]
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        lines = [line for line in stderr.splitlines() if line.startswith("convsts ")]
        assert process.returncode == 2, stderr[-2000:]
        assert "Traceback" not in stderr and not _leaks(stderr + stdout)
        assert len(lines) == 1 and "s3://***@bucket/p" in lines[0] and "NETWORK_CONNECTION" in lines[0], lines


@pytest.mark.slow  # subprocesses beside an S3 server
def test_a_store_that_fails_in_the_middle_of_a_read_is_one_line_and_the_same_command_then_prepares(tmp_path):
    """Guards: a store that stopped answering while a dump was being read (the connection dropped,
    after pyarrow's own retries) ended `convsts prepare` in pyarrow's traceback, which named no
    file. It is now one line naming the file and the byte reached, exit 2, nothing written; the
    same command run again once the store answers prepares the folder."""
    import random
    import string

    from testkit.s3_server import CuttingProxy, s3_endpoint, upload

    rng = random.Random(0)
    rows = [
        {
            "id": f"c{i}",
            "parent_id": f"t1_c{i - 1}" if i % 2 else "t3_x",
            "link_id": f"t3_{i // 2}",
            "author": "someone",
            "subreddit": "test",
            "body": " ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(25)),
        }
        for i in range(3000)
    ]
    dump = tmp_path / "RC_2015-01.zst"
    dump.write_bytes(zstandard.ZstdCompressor().compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows)))
    size = dump.stat().st_size
    assert 300_000 < size < 1 << 20  # one GET reads it: the format check, then the read of its lines
    with s3_endpoint("convsts-data") as s3_env:
        uri = "s3://convsts-data/raw/RC_2015-01.zst"
        upload(dump, uri)
        command = ["-m", "convsts", "prepare", "reddit", "--input", uri, "--out", str(tmp_path / "p")]
        proxy = CuttingProxy(s3_env["AWS_ENDPOINT_URL"], response_bytes=size * 3 // 2)  # half-way into the second read
        try:
            cut = subprocess.run(
                [sys.executable, *command],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=300,
                env={**ENV, **s3_env, "AWS_ENDPOINT_URL": proxy.url},
            )
        finally:
            proxy.close()
        lines = [line for line in cut.stderr.splitlines() if line.startswith("convsts ")]
        assert cut.returncode == 2 and "Traceback" not in cut.stderr, cut.stderr[-3000:]
        assert (
            len(lines) == 1 and f"{uri}: reading stopped at byte " in lines[0] and "NETWORK_CONNECTION" in lines[0]
        ), lines
        assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())
        again = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, cwd=REPO, timeout=300, env={**ENV, **s3_env}
        )
        assert again.returncode == 0, again.stderr[-3000:]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["lines_read"] == len(rows) and manifest["pairs"] == len(rows) // 2


def test_an_unreachable_tracking_server_is_refused_before_any_work(tmp_path):
    """With MLFLOW_TRACKING_URI at a server that is not there, each command makes one request before
    any work and refuses in one line, credentials redacted (MLflow's own client would retry for
    minutes after the work, then print the URI's password in a traceback)."""
    url = f"http://alice:PlAnTeDsEcReT@127.0.0.1:{_closed_port()}"
    commands = (["evaluate", "--baseline", "bow", "--out", str(tmp_path / "e")],
                ["train", "--out", str(tmp_path / "t"), "trainer.steps=0"])  # fmt: skip
    started = [start_python("-m", "convsts", *command, env={"MLFLOW_TRACKING_URI": url}) for command in commands]
    for command, process in zip(commands, started, strict=True):
        stdout, stderr = process.communicate(timeout=120)
        lines = [line for line in stderr.splitlines() if line.startswith("convsts ")]
        assert process.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
        assert (
            len(lines) == 1
            and "MLFLOW_TRACKING_URI: no MLflow tracking server answers at http://***@127.0.0.1" in lines[0]
        )
        assert not _leaks(stderr + stdout)
        assert not (tmp_path / command[command.index("--out") + 1] / "prepared").exists()  # refused before prepare
    from convsts.ray_jobs.runtime.tracking_store import check_tracking_server

    for broken in ("http://", "http://alice:PlAnTeDsEcReT@[bad", "https://host:notaport"):  # were requests' tracebacks
        with pytest.raises(ConfigError, match="is not a valid tracking server URL") as caught:
            check_tracking_server(broken, "MLFLOW_TRACKING_URI")
        assert not _leaks(str(caught.value))


def _self_signed_certificate(folder: Path) -> tuple:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


def test_a_tracking_server_behind_a_self_signed_certificate_is_not_refused(tmp_path):
    """The reachability check is not a TLS check: a server whose certificate this client does not
    trust answered, and MLflow's own settings (MLFLOW_TRACKING_INSECURE_TLS, ..._CERT_PATH) decide."""
    import http.server
    import ssl
    import threading

    from convsts.ray_jobs.runtime.tracking_store import check_tracking_server

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*_self_signed_certificate(tmp_path))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_tracking_server(f"https://127.0.0.1:{server.server_address[1]}", "MLFLOW_TRACKING_URI")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ConfigError, match="no MLflow tracking server answers at https://127.0.0.1"):
        check_tracking_server(f"https://127.0.0.1:{server.server_address[1]}", "MLFLOW_TRACKING_URI")


def test_an_unexpected_error_prints_its_traceback_with_credentials_redacted():
    """Guards: an error run_main does not expect (not a user error) printed Python's own traceback,
    with whatever URI its message held. It prints the traceback redacted and exits 1."""
    code = (
        "from convsts.ray_jobs.runtime.entry import run_main\n"
        "def main(argv):\n"
        f"    raise RuntimeError('request to {PLANTED} failed')\n"
        "raise SystemExit(run_main('x', main, []))\n"
    )
    result = run_python("-c", code)
    assert (
        result.returncode == 1
        and "Traceback" in result.stderr
        and "RuntimeError: request to s3://***@bucket" in result.stderr
    )
    assert not _leaks(result.stderr)


def test_submit_keeps_credentials_out_of_the_job_spec(monkeypatch):
    from convsts.ray_jobs.runtime.job_api import SubmitError, build_runtime_env, entrypoint

    with pytest.raises(SubmitError, match=r"carries credentials") as refused:
        entrypoint("prepare", ["reddit", "--input", PLANTED])
    assert "s3://***@bucket" in str(refused.value) and not _leaks(str(refused.value))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:PlAnTeDsEcReT@mlflow.example:5000")
    env = build_runtime_env(None)
    assert env["env_vars"]["MLFLOW_TRACKING_URI"] == "https://mlflow.example:5000"
    assert not _leaks(json.dumps(env))


@pytest.mark.slow
def test_a_planted_secret_appears_in_no_log_param_or_artifact(sample_prepared, ray_session, tmp_path):
    from mlflow.tracking import MlflowClient
    from testkit.tiny import TINY_TRAIN

    scratch, out = tmp_path / "cwd", tmp_path / "run"
    scratch.mkdir()
    env = {
        **ENV,
        "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",  # MLflow's own setting: samples within a short run
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
    }  # as in a fresh environment: the first plot builds matplotlib's font cache
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "convsts",
            "train",
            "--out",
            str(out),
            "--prepared",
            str(sample_prepared),
            "trainer.task_weights={snli: 1.0}",
            *TINY_TRAIN,
            "trainer.num_workers=1",  # ranks are not this test's guarantee
            f"data.reddit_inputs=[{PLANTED}]",
            f"mlflow.run_name=run-from-{PLANTED}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=scratch,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not _leaks(result.stdout + result.stderr)
    output = result.stdout + result.stderr
    assert (
        output.count("[convsts rank 0] step 4/4 ") == 1
    )  # each progress line once (Ray Train's print patch doubled them)
    assert output.count("task split mode=") == 1 and output.count("[convsts rank 0] world size 1; device cpu") == 1
    assert "(RayTrainWorker pid=" in output and "\x1b[" not in output  # worker lines, uncoloured in a captured log
    # Without --verbose, Ray Data's, Ray Train's, MLflow's and matplotlib's info lines stay off the console, in
    # the driver and in every Ray worker (the job's worker_process_setup_hook).
    for chatter in (
        "execution finished",
        "Progress bars disabled",
        "Reporting training result",
        "Checkpoint successfully created",
        "Setting up process group",
        "Creating initial MLflow database",
        "Started monitoring system metrics",
        "RayDeprecationWarning",
        "generated new fontManager",
    ):
        assert chatter not in output, chatter
    # Every file the run wrote (checkpoint config.json, train.json, Ray's results, MLflow's store
    # and artifacts wherever they landed), read as bytes.
    files = [p for root in (out, scratch) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in files)
    for path in files:
        data = path.read_bytes()
        assert not [s for s in SECRETS if s.encode() in data], path
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    run = client.get_run(json.loads((out / "train.json").read_text())["mlflow_run_id"])
    assert run.data.params["data.reddit_inputs"] == "['s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu']"
    assert not _leaks(json.dumps([run.data.params, run.data.tags, run.info.run_name]))
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["run_config"]["data"]["reddit_inputs"] == ["s3://***@bucket/dumps/RC_x.zst?secret_key=***&region=eu"]
    # Nothing lands in the working directory: the sqlite store's artifacts live beside it.
    assert not list(scratch.iterdir())
    assert (out / "mlartifacts").is_dir() and (out / "config.yaml").is_file()
    # Provenance: the commit, the entry command (its secret masked), library versions, the machine.

    tags = run.data.tags
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head:
        assert tags["mlflow.source.git.commit"].split("-")[0] == head
    assert tags["mlflow.source.name"] == "convsts" and tags["convsts.command"].startswith("convsts train ")
    assert "--prepared" in tags["convsts.command"]
    assert tags["convsts.version.torch"] == torch.__version__ and tags["convsts.machine.cpu_count"] == str(
        os.cpu_count()
    )
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}  # the prepared data as MLflow inputs
    assert set(inputs) == {"snli"} and json.loads(inputs["snli"].profile)["pairs"] > 0
    assert len(inputs["snli"].digest) == 16 and not _leaks(json.dumps([d.profile for d in inputs.values()]))
    assert (
        "system/cpu_utilization_percentage" in run.data.metrics
        and "system/system_memory_usage_megabytes" in run.data.metrics
    )


def test_a_store_that_fails_after_the_work_loses_no_results_and_what_can_be_checked_first_is(tmp_path):
    """An evaluation whose MLflow store fails at its first write (a file that is not a database) keeps
    its results.json and says so in one line; a web server that is not MLflow, an experiment name MLflow
    refuses and a database store without its driver are refused before any work."""
    import http.server
    import threading

    from convsts.ray_jobs.runtime.tracking_store import tracking_uri

    (tmp_path / "not_a_db.db").write_bytes(b"this is not an sqlite database, only bytes " * 100)
    out = tmp_path / "e"
    late = run_convsts("evaluate", "--baseline", "bow", "--out", str(out), "data.cqa_test=''",
                f"mlflow.tracking_uri=sqlite:///{tmp_path / 'not_a_db.db'}")  # fmt: skip
    lines = [line for line in late.stderr.splitlines() if line.startswith("convsts ")]
    assert late.returncode == 2 and len(lines) == 1 and "Traceback" not in late.stderr, late.stderr[-3000:]
    assert f"the results are in {out / 'results.json'} and results.md" in lines[0] and "did not take them" in lines[0]
    results = json.loads((out / "results.json").read_text())
    assert -1 <= results["stsb/test/pearson"] <= 1 and "mlflow_run_id" not in results

    class NotMlflow(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ConfigError, match="is not an MLflow tracking server .*HTTP 404 with text/html"):
            tracking_uri(url, None)
    finally:
        server.shutdown()
    for name, length in (("", 0), ("x" * 600, 600)):
        with pytest.raises(ConfigError, match=f"'mlflow.experiment': must be 1 to 500 characters, got {length}"):
            load_config(None, [f"mlflow.experiment={name}" if name else "mlflow.experiment=''"])
    with pytest.raises(ConfigError, match="needs the database driver .* \\(not installed here\\)") as refused:
        tracking_uri("postgresql://alice:PlAnTeDsEcReT@127.0.0.1:5432/mlflow", None)
    assert "PlAnTeD" not in str(refused.value)
    for folder in ("file:///tmp/mlruns", "./mlruns", "/tmp/mlruns"):
        with pytest.raises(ConfigError, match="is a folder, MLflow's file store, which this MLflow no longer opens"):
            tracking_uri(folder, None)
