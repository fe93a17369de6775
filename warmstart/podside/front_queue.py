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
whose connection is refused, or that is answered 503 (an engine that went to sleep between the
check and the request: vLLM's `RetryableRequestError` is "safe for clients to retry",
`vllm/exceptions.py`), is held and retried the same way; one that failed after it was sent is
answered 502 and never sent twice. Every method is passed on (the OpenAI API's DELETEs
included), bodies of a Content-Length or chunked, each response streamed through as the
upstream sends it (server-sent events included).

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
# Longest wait for the router's next bytes (per socket read, not per request): a streamed answer
# keeps sending; a generation that sends nothing for this long is cut.
UPSTREAM_TIMEOUT_S = 600
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
            self._proxy()

        # Every method of the OpenAI API (GET, POST, DELETE: `DELETE /v1/responses/{id}`,
        # https://platform.openai.com/docs/api-reference/responses/delete) and the rest HTTP
        # defines, passed on as they come.
        def do_POST(self) -> None:
            self._proxy()

        do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_POST

        def _proxy(self) -> None:
            if self.headers.get("Upgrade"):
                # A protocol switch (a WebSocket) is not carried through the queue.
                return self._json(501, {"error": {"message": "protocol upgrades are not served through the front "
                                                  "queue", "type": "invalid_request_error"}})
            body = self._body()
            if body is not None:
                self._serve(body)

        def _body(self) -> bytes | None:
            """The request's body, within MAX_BODY_BYTES (None: answered 400/413 already)."""
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                out = bytearray()
                while True:
                    size_line = self.rfile.readline(128)
                    try:
                        size = int(size_line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        self._json(400, {"error": {"message": "malformed chunked body", "type": "invalid_request_error"}})
                        return None
                    if size == 0:
                        while self.rfile.readline(8192).strip():  # trailers, then the blank line
                            pass
                        return bytes(out)
                    if len(out) + size > MAX_BODY_BYTES:
                        self.close_connection = True
                        self._json(413, {"error": {"message": "body too large", "type": "invalid_request_error"}})
                        return None
                    out += self.rfile.read(size)
                    self.rfile.readline(8)  # the chunk's CRLF
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._json(400, {"error": {"message": "bad Content-Length", "type": "invalid_request_error"}})
                return None
            if length > MAX_BODY_BYTES or length < 0:
                self.close_connection = True
                self._json(413, {"error": {"message": "body too large", "type": "invalid_request_error"}})
                return None
            return self.rfile.read(length)

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
                        if self._forward(body):
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

        def _forward(self, body: bytes) -> bool:
            """Send upstream and stream the answer back. True when the client has its answer; False
            to hold and try again, only where the upstream cannot have acted on the request: the
            connection was refused, or it answered 503 (an engine that went to sleep between the
            check and the request: vLLM's `RetryableRequestError` is "safe for clients to retry",
            `vllm/exceptions.py`). Once the request may have reached the upstream (it was sent and
            the connection then failed), it is never sent again: a completion must not run twice,
            so the client gets 502."""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            gate.forwarding(1)
            conn = http.client.HTTPConnection(up.hostname, up.port or 80, timeout=UPSTREAM_TIMEOUT_S)
            try:
                try:
                    conn.connect()
                except OSError:
                    return False  # nothing was sent
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                except OSError as exc:
                    self._json(502, {"error": {"message": f"the router failed mid-request ({type(exc).__name__}); "
                                               "it was not retried, as it may have run", "type": "api_error"}})
                    return True
                if resp.status == 503:
                    resp.read()
                    return False
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                if self.command == "HEAD" or resp.status in (204, 304):
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return True
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
