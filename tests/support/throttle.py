"""A TCP proxy on 127.0.0.1 that slows or stalls chosen connections, for the streamer's stall tests.

The Run:ai streamer's S3 client (the AWS CRT) watches each connection's throughput, not each
request's: a connection whose rate stays under `minimum_throughput_bytes_per_second` for
`allowable_throughput_failure_interval_seconds` is shut down
(https://github.com/awslabs/aws-c-http/blob/main/include/aws/http/connection.h,
`aws_http_connection_monitoring_options`). So the fault sits at the TCP level, below HTTP: bytes
pass unchanged both ways (SigV4 stays valid), and only the server-to-client direction of a chosen
connection is paced.

A connection is chosen once `after_bytes` have passed server-to-client on it (the response of a
small request, a listing or a header read, goes through untouched), for at most `times`
connections. A chosen connection is then paced at `rate_bytes_per_s` for `for_s` seconds and runs
at full speed afterwards; `rate_bytes_per_s=0` is a dead connection: open, nothing delivered,
until the client closes it or the proxy stops. The listening socket binds port 0, so the port is
the kernel's free one by construction; stop() closes every socket.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time


@dataclasses.dataclass
class Pace:
    """How chosen connections are paced."""

    rate_bytes_per_s: int
    for_s: float
    after_bytes: int = 1 << 20
    times: int = 1


class ThrottleProxy:
    def __init__(self, upstream_port: int, pace: Pace | None = None) -> None:
        self.upstream_port = upstream_port
        self.pace = pace
        self.chosen = 0          # connections paced so far
        self.connections = 0     # connections accepted
        self.closed_by_client_while_paced = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ThrottleProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for s in [self.listener, *self._socks]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            conn = _Conn(client, upstream)
            with self._lock:
                self.connections += 1
                self._socks += [client, upstream]
            threading.Thread(target=self._up, args=(conn,), daemon=True).start()
            threading.Thread(target=self._down, args=(conn,), daemon=True).start()

    def _choose(self) -> bool:
        with self._lock:
            if self.pace is None or self.chosen >= self.pace.times:
                return False
            self.chosen += 1
            return True

    def _up(self, conn: "_Conn") -> None:
        """Client to server, never paced; an end here while the other way is paced is the client
        hanging up on a slow or dead connection."""
        try:
            while not self._stop.is_set():
                data = conn.client.recv(1 << 16)
                if not data:
                    break
                conn.upstream.sendall(data)
        except OSError:
            pass
        if conn.paced_until is not None and time.monotonic() < conn.paced_until:
            with self._lock:
                self.closed_by_client_while_paced += 1
        conn.close()

    def _down(self, conn: "_Conn") -> None:
        passed = 0
        pace = self.pace
        try:
            while not self._stop.is_set() and not conn.closed.is_set():
                if pace is not None and conn.paced_until is None and passed >= pace.after_bytes \
                        and self._choose():
                    conn.paced_until = time.monotonic() + pace.for_s
                if pace is not None and conn.paced_until is not None and time.monotonic() < conn.paced_until:
                    if pace.rate_bytes_per_s == 0:  # dead: hold everything back
                        conn.closed.wait(0.05)
                        continue
                    data = conn.upstream.recv(max(1, pace.rate_bytes_per_s // 10))
                    if not data:
                        break
                    conn.client.sendall(data)
                    passed += len(data)
                    time.sleep(len(data) / pace.rate_bytes_per_s)
                    continue
                data = conn.upstream.recv(1 << 16)
                if not data:
                    break
                conn.client.sendall(data)
                passed += len(data)
        except OSError:
            pass
        conn.close()


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.paced_until: float | None = None
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
