"""Front queue: holds requests while a model has no awake engine, bounded (stdlib only).

Scale from zero drops nothing only if something holds the requests that arrive while no engine
can serve them. SMG does not: with no worker it answers `404 model_not_found` ("No worker
available for model"), seen by running SMG 1.13.0, and its `--queue-size` queues only when its
rate-limit tokens run out. llm-d's Flow Control holds requests at zero replicas the same way this
does (llm-d/llm-d PR #1192).

Every request is forwarded to `--upstream` (the model's router) once `--ready-url` (the router's
`/readiness`: ready once one engine is) answers 200. Until then it is held, at most `--max-held`
requests for at most `--max-hold-seconds` each; a request past either bound gets `429 Too Many
Requests` with `Retry-After: --retry-after` (the predicted seconds until an engine is ready,
https://www.rfc-editor.org/rfc/rfc9110#field.retry-after), never a reset or a bare 503. A forward
answered 503 (an engine that went to sleep between the check and the request: vLLM's
`RetryableRequestError` is "safe for clients to retry", `vllm/exceptions.py`) is held and retried
the same way. Each response streams through as the upstream sends it (server-sent events
included).

`GET /warmstart/held` answers `{"held": H, "in_flight": F, "demand": H + F, ...}`, JSON that
KEDA's `metrics-api` scaler reads by its `valueLocation` (a GJSON path, `getValueFromJSONResponse`
in https://github.com/kedacore/keda/blob/v2.20.2/pkg/scalers/metrics_api_scaler.go). `held`: the
requests waiting for an engine; the standby actuator counts them as waiting, so a held request
wakes a sleeper. `demand` adds the requests forwarded and not yet answered: a model scaled to zero
pods is activated by KEDA when it is above 0, and kept from going back to zero while any request
is held or still being answered.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HELD_PATH = "/warmstart/held"
MAX_BODY_BYTES = 64 * 1024 * 1024
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "content-length"}


class Gate:
    """How many requests are held, and whether the upstream is ready (checked at most every
    `period` seconds, shared by every held request)."""

    def __init__(self, ready_url: str, max_held: int, period: float = 0.2) -> None:
        self.ready_url, self.max_held, self.period = ready_url, max_held, period
        self.lock = threading.Lock()
        self.held = self.in_flight = 0
        self.total_held = self.refused = 0
        self._ready, self._checked = False, 0.0

    def ready(self) -> bool:
        with self.lock:
            if time.monotonic() - self._checked < self.period:
                return self._ready
            self._checked = time.monotonic()
        u = urllib.parse.urlsplit(self.ready_url)
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=2)
            conn.request("GET", u.path or "/")
            ok = conn.getresponse().status == 200
            conn.close()
        except OSError:
            ok = False
        with self.lock:
            self._ready = ok
        return ok

    def enter(self) -> bool:
        with self.lock:
            if self.held >= self.max_held:
                return False
            self.held += 1
            self.total_held += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.held -= 1

    def forwarding(self, delta: int) -> None:
        with self.lock:
            self.in_flight += delta

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"held": self.held, "in_flight": self.in_flight, "demand": self.held + self.in_flight,
                    "total_held": self.total_held, "refused": self.refused}


def handler(gate: Gate, upstream: str, max_hold_s: float, retry_after_s: int) -> type[BaseHTTPRequestHandler]:
    up = urllib.parse.urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, code: int, body: object, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _too_many(self, why: str) -> None:
            with gate.lock:
                gate.refused += 1
            self._json(429, {"error": {"message": f"no engine is ready yet ({why}); retry after {retry_after_s} s",
                                       "type": "rate_limit_error", "code": 429}}, {"Retry-After": str(retry_after_s)})

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == HELD_PATH:
                return self._json(200, gate.counts())
            self._serve(b"")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                return self._json(413, {"error": {"message": "body too large", "type": "invalid_request_error"}})
            self._serve(self.rfile.read(length))

        def _serve(self, body: bytes) -> None:
            deadline = time.monotonic() + max_hold_s
            holding = False
            try:
                while True:
                    if gate.ready():
                        # A forwarded request is in flight, no longer held: `demand` counts it once.
                        if holding:
                            gate.leave()
                            holding = False
                        resp = self._forward(body)
                        if resp is not None:
                            return
                    if not holding:
                        if not gate.enter():
                            return self._too_many(f"{gate.max_held} requests are held already")
                        holding = True
                    if time.monotonic() >= deadline:
                        return self._too_many(f"held {max_hold_s:g} s")
                    time.sleep(gate.period)
            finally:
                if holding:
                    gate.leave()

        def _forward(self, body: bytes) -> bool | None:
            """Send upstream and stream the answer back: True when answered, None to hold and retry
            (the upstream refused the connection or answered 503 before sending a body)."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
            gate.forwarding(1)
            try:
                conn = http.client.HTTPConnection(up.hostname, up.port or 80, timeout=600)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
            except OSError:
                gate.forwarding(-1)
                return None
            try:
                if resp.status == 503:
                    resp.read()
                    return None
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                return True
            finally:
                gate.forwarding(-1)
                conn.close()

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the router's base URL")
    p.add_argument("--ready-url", required=True, help="200 once the upstream has an engine (SMG's /readiness)")
    p.add_argument("--max-held", type=int, default=256)
    p.add_argument("--max-hold-seconds", type=float, default=120.0)
    p.add_argument("--retry-after", type=int, default=30, help="seconds a refused client is told to wait")
    a = p.parse_args(argv)
    gate = Gate(a.ready_url, a.max_held)
    server = ThreadingHTTPServer((a.host, a.port), handler(gate, a.upstream, a.max_hold_seconds, a.retry_after))
    server.daemon_threads = True
    server.request_queue_size = 1024
    print(json.dumps({"event": "warmstart.front_queue_start", "port": server.server_address[1]}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
