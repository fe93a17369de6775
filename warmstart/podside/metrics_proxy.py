"""A metrics-only port for a vLLM pod: serves `GET /metrics` from vLLM's own endpoint, and nothing else.

vLLM serves its Prometheus metrics at `/metrics` on its serving port
(https://docs.vllm.ai/en/latest/usage/metrics.html), so a scraper admitted on that port could call
the completions API too, bypassing the router. This sidecar listens on a port of its own:

    python3 metrics_proxy.py --port 8001 --upstream http://127.0.0.1:8000/metrics \
        [--host 0.0.0.0] [--timeout 5] [--max-bytes 33554432]

- `GET /metrics` (any query string): fetches the upstream within `--timeout` seconds in all
  (connect, headers and body: a watchdog closes the socket at the deadline) and at most
  `--max-bytes` of body, forwarding the client's `Accept` header so the exposition format is
  negotiated between Prometheus and vLLM (text 0.0.4 or OpenMetrics:
  https://prometheus.io/docs/instrumenting/exposition_formats/), and answers with the upstream's
  body and `Content-Type`. The body is fetched identity-encoded (http.client's default
  `Accept-Encoding: identity`). Upstream refused, failing or oversized: 502; past the deadline: 504.
- `GET /healthz`: 200, without calling the upstream (the container's own probe).
- Any other path: 404; another method on these paths: 405. Neither calls the upstream.
SIGTERM or SIGINT: shuts down within a second and exits 0. One stderr line per upstream error, none
per request. Standard library only: it runs with the vLLM image's python3.
"""

from __future__ import annotations

import argparse
import http.client
import signal
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PATHS = ("/metrics", "/healthz")


class UpstreamError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def fetch(upstream: urllib.parse.SplitResult, accept: str | None, timeout: float, max_bytes: int) -> tuple[bytes, str]:
    """(body, content type) of one upstream GET, or UpstreamError (502 or 504)."""
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection(upstream.hostname, upstream.port or 80, timeout=timeout)
    watchdog = None
    try:
        conn.connect()
        sock = conn.sock
        # The socket timeout bounds each read; the watchdog bounds them all together.
        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, (sock,))
        watchdog.daemon = True
        watchdog.start()
        conn.request("GET", upstream.path or "/", headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        if resp.status != 200:
            raise UpstreamError(502, f"upstream answered {resp.status}")
        declared = resp.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise UpstreamError(502, f"upstream body of {declared} bytes exceeds {max_bytes}")
        body = bytearray()
        while chunk := resp.read(65536):
            body += chunk
            if len(body) > max_bytes:
                raise UpstreamError(502, f"upstream body exceeds {max_bytes} bytes")
        if time.monotonic() >= deadline:  # cut short by the watchdog: the body may be truncated
            raise UpstreamError(504, f"upstream did not answer within {timeout:g} s")
        return bytes(body), resp.getheader("Content-Type") or DEFAULT_CONTENT_TYPE
    except (OSError, http.client.HTTPException) as exc:
        if isinstance(exc, socket.timeout) or time.monotonic() >= deadline:
            raise UpstreamError(504, f"upstream did not answer within {timeout:g} s") from None
        raise UpstreamError(502, f"upstream unreachable: {type(exc).__name__}: {exc}") from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        conn.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def make_handler(upstream: urllib.parse.SplitResult, timeout: float, max_bytes: int) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30  # an idle or slow client frees its thread

        def do_GET(self) -> None:  # noqa: N802
            path = urllib.parse.urlsplit(self.path).path
            if path not in PATHS:
                return self._reply(404, b"not found\n", close=True)
            if path == "/healthz":
                return self._reply(200, b"ok\n")
            try:
                body, ctype = fetch(upstream, self.headers.get("Accept"), timeout, max_bytes)
            except UpstreamError as exc:
                sys.stderr.write(f"metrics-proxy: {exc.status}: {exc.reason}\n")
                sys.stderr.flush()
                return self._reply(exc.status, f"{exc.reason}\n".encode())
            self._reply(200, body, ctype)

        def __getattr__(self, name: str):  # every other method: do_POST, do_HEAD, do_FOO, ...
            if not name.startswith("do_"):
                raise AttributeError(name)
            return self._not_allowed

        def _not_allowed(self) -> None:
            known = urllib.parse.urlsplit(self.path).path in PATHS
            self._reply(405 if known else 404, b"method not allowed\n" if known else b"not found\n", close=True,
                        extra={"Allow": "GET"} if known else None, body=self.command != "HEAD")

        def _reply(self, code: int, data: bytes, ctype: str = "text/plain; charset=utf-8", close: bool = False,
                   extra: dict | None = None, body: bool = True) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            if close:  # a request body we did not read must not be parsed as the next request
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # no line per request
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:8000/metrics")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds for the whole upstream fetch")
    p.add_argument("--max-bytes", type=int, default=32 * 1024 * 1024)
    a = p.parse_args(argv)
    upstream = urllib.parse.urlsplit(a.upstream)
    if upstream.scheme != "http" or not upstream.hostname or a.timeout <= 0 or a.max_bytes <= 0:
        p.error("--upstream must be an http:// URL; --timeout and --max-bytes must be positive")
    server = ThreadingHTTPServer((a.host, a.port), make_handler(upstream, a.timeout, a.max_bytes))
    server.daemon_threads = True  # an in-flight fetch never holds the exit
    stop = lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
