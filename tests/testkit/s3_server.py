"""A real S3-protocol server on 127.0.0.1 for tests: moto's server, in a thread of the test process.

`s3_endpoint()` starts it on a free port and yields the environment that points pyarrow (and the
processes a test starts) at it. The access key values are placeholders the emulator accepts; they
are not credentials of any account.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_endpoint(*buckets: str) -> Iterator[dict[str, str]]:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "convsts-test-placeholder",
        "AWS_SECRET_ACCESS_KEY": "convsts-test-placeholder",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never wait on an instance-metadata endpoint
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def upload(local_path, uri: str) -> None:
    """Copy one local file to an s3:// URI through pyarrow (the same client convsts reads with)."""
    from convsts.io import storage

    fs, inner = storage.resolve(uri)
    with open(local_path, "rb") as src, fs.open_output_stream(inner, compression=None) as dst:
        dst.write(src.read())


def keys(uri_prefix: str) -> list:
    """Every object under an s3:// prefix (recursive), as paths inside the bucket."""
    import pyarrow.fs as pafs

    from convsts.io import storage

    fs, inner = storage.resolve(uri_prefix)
    return sorted(
        i.path
        for i in fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
        if i.type == pafs.FileType.File
    )


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of the S3 server that forwards `response_bytes` of the
    server's answers and then drops every connection, open or new: a store that goes away in the
    middle of a read, after the client's own retries too."""

    def __init__(self, endpoint_url: str, response_bytes: int):
        import threading

        self.upstream = ("127.0.0.1", int(endpoint_url.rsplit(":", 1)[1]))
        self.left, self.cut = response_bytes, threading.Event()
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:  # closed
                return
            if self.cut.is_set():
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        try:
            while not self.cut.is_set():
                data = source.recv(65536)
                if not data:
                    break
                if answers:
                    with self.lock:
                        data, self.left = data[: max(self.left, 0)], self.left - len(data)
                        if self.left <= 0:
                            self.cut.set()
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def close(self) -> None:
        self.cut.set()
        self.sock.close()


@contextlib.contextmanager
def request_log() -> Iterator[list[tuple[str, str]]]:
    """(method, path) of every request the S3 server answers inside the block, from its own request
    log (werkzeug's, one line a request; its own printing handler is set aside meanwhile)."""
    import logging
    import re

    seen: list[tuple[str, str]] = []
    colours = re.compile(r"\x1b\[[0-9;]*m")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = colours.sub("", record.getMessage())
            if '"' in line:
                method, _, rest = line.split('"', 2)[1].partition(" ")
                seen.append((method, rest.rsplit(" ", 1)[0]))

    logger = logging.getLogger("werkzeug")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    for handler in saved[2]:
        logger.removeHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # counted, not printed
    logger.addHandler(collect := Collect())
    try:
        yield seen
    finally:
        logger.removeHandler(collect)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        for handler in saved[2]:
            logger.addHandler(handler)
