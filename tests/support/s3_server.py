"""A real S3-compatible server for the object-store checkpoint tests: moto's server mode (`moto[server]`), run as
its own process on a free local port. It speaks the S3 REST API that s3fs/botocore use, needs no network and no
credentials of any cloud, and the trainer reaches it the way it reaches MinIO or Ceph: AWS_ENDPOINT_URL.

HoldingRelay sits between the trainer and the server and stops forwarding a request whose bytes contain a given
pattern (a PUT of one shard): the upload is then frozen half-way for as long as the test wants, so a SIGKILL lands
in the middle of it every time, not by luck of timing.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from ftjob_local.procs import kill_tree

from support.wait import wait_until

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, tmp: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "moto.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._answers, timeout=60, what="the moto S3 server")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"moto server exited {self.proc.returncode}: {Path(self.log.name).read_text()}"
            )
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """What a trainer process needs to reach the server (the standard variables, nothing ftjob-specific)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def bucket(self) -> str:
        """A new empty bucket; returns its s3:// URL."""
        import boto3  # moto's own dependency

        name = f"ckpt-{uuid.uuid4().hex[:12]}"
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=name)
        return f"s3://{name}"

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(
            key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            client_kwargs={"endpoint_url": self.endpoint},
            use_listings_cache=False,
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()


class HoldingRelay:
    """A TCP relay to `target_port` that forwards everything, except that once the client's bytes contain
    `pattern` that connection stops being forwarded (and `held` is set) until close()."""

    def __init__(self, target_port: int, pattern: bytes):
        self.target_port, self.pattern = target_port, pattern
        self.held = threading.Event()
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: bool) -> None:
        tail = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if watch and self.pattern in tail + data:
                    self.held.set()
                    self.closing.wait()  # frozen: the request never reaches the server
                    return
                tail = data[-len(self.pattern) :]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closing.set()
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass


def objects(server: S3Server, url: str) -> dict[str, int]:
    """Every object under url: path relative to it -> size."""
    fs = server.fs()
    base = url.removeprefix("s3://").rstrip("/")
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        return {}
    return {p[len(base) :].lstrip("/"): int(i["size"]) for p, i in found.items()}
